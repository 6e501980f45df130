// The communicators behind shoal/core.h: each one (the world, every group) is
// an Engine: its Comm, one queue of collectives in program order, and the
// background thread that packs queued allreduces into fusion buffers and
// executes them, so that reduction overlaps the framework's backward pass.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "comm.h"
#include "net.h"
#include "shoal/core.h"

namespace shoal {

std::size_t dtype_size(DType d) {
  switch (d) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::UInt8: return 1;
  }
  throw Error(Error::Kind::Usage, "unknown dtype");
}

const char* dtype_name(DType d) {
  static const char* names[] = {"float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"};
  return names[static_cast<int>(d)];
}

const char* op_name(ReduceOp op) {
  static const char* names[] = {"sum", "average", "min", "max", "product"};
  return names[static_cast<int>(op)];
}

namespace {

class Engine;

class WorkImpl : public Work {
 public:
  explicit WorkImpl(std::weak_ptr<Engine> engine) : engine_(std::move(engine)) {}
  bool test() override {
    std::lock_guard<std::mutex> lk(mu_);
    return done_;
  }
  void wait() override;
  void when_done(std::function<void()> callback) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!done_) return callbacks_.push_back(std::move(callback));
    }
    callback();
  }
  void finish(std::exception_ptr error) {
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
      error_ = std::move(error);
      callbacks.swap(callbacks_);
    }
    cv_.notify_all();
    for (auto& callback : callbacks) callback();
  }

 private:
  std::weak_ptr<Engine> engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::vector<std::function<void()>> callbacks_;
};

enum class Kind { AllReduce, Broadcast, AllGather, Reduce, Barrier, ReduceScatter, AllToAll, Gather, Scatter };

struct Item {
  Kind kind;
  void* data = nullptr;
  const void* send = nullptr;
  std::size_t count = 0;  // elements (allreduce/reduce) or bytes (broadcast/allgather)
  DType dtype = DType::UInt8;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  Group::Sizes send_counts, send_offsets, recv_counts, recv_offsets;  // all-to-all
  bool flush_after = false;
  std::shared_ptr<WorkImpl> work;
  std::size_t bytes() const { return count * dtype_size(dtype); }
};

class Engine : public Group, public std::enable_shared_from_this<Engine> {
 public:
  Engine(const Config& cfg, Bootstrap* boot, const std::string& advertised)
      : comm_(std::make_unique<Comm>(cfg, boot, advertised)), topo_(comm_->topo()),
        threshold_(cfg.fusion_bytes) {}
  ~Engine() override { destroy(); }

  void start() { worker_ = std::thread([this] { loop(); }); }
  const Topology& topology() const override { return topo_; }

  WorkPtr allreduce_async(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    return submit(allreduce_item(data, count, dtype, op));
  }
  void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    run(allreduce_item(data, count, dtype, op));
  }
  WorkPtr broadcast_async(void* data, std::size_t bytes, int root) override {
    return submit(broadcast_item(data, bytes, root));
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    run(broadcast_item(data, bytes, root));
  }
  WorkPtr allgather_async(const void* send, void* recv, std::size_t bytes_per_rank) override {
    return submit(allgather_item(send, recv, bytes_per_rank));
  }
  void allgather(const void* send, void* recv, std::size_t bytes_per_rank) override {
    run(allgather_item(send, recv, bytes_per_rank));
  }
  WorkPtr reduce_async(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    return submit(reduce_item(data, count, dtype, op, root));
  }
  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    run(reduce_item(data, count, dtype, op, root));
  }
  void barrier() override { run(Item{Kind::Barrier}); }
  WorkPtr send_async(const void* data, std::size_t bytes, int peer, int tag) override {
    return live().p2p().send(data, bytes, peer, user_tag(tag));
  }
  WorkPtr recv_async(void* data, std::size_t bytes, int peer, int tag) override {
    return live().p2p().recv(data, bytes, peer, user_tag(tag));
  }
  WorkPtr reduce_scatter_async(const void* send, void* recv, std::size_t count, DType dtype,
                               ReduceOp op) override {
    return submit(reduce_scatter_item(send, recv, count, dtype, op));
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                      ReduceOp op) override {
    run(reduce_scatter_item(send, recv, count, dtype, op));
  }
  WorkPtr alltoall_async(const void* send, Sizes sc, Sizes so, void* recv, Sizes rc,
                         Sizes ro) override {
    return submit(alltoall_item(send, std::move(sc), std::move(so), recv, std::move(rc), std::move(ro)));
  }
  void alltoall(const void* send, Sizes sc, Sizes so, void* recv, Sizes rc, Sizes ro) override {
    run(alltoall_item(send, std::move(sc), std::move(so), recv, std::move(rc), std::move(ro)));
  }
  WorkPtr gather_async(const void* send, void* recv, std::size_t bytes, int root) override {
    return submit(rooted_item(Kind::Gather, send, recv, bytes, root, "gather"));
  }
  void gather(const void* send, void* recv, std::size_t bytes, int root) override {
    run(rooted_item(Kind::Gather, send, recv, bytes, root, "gather"));
  }
  WorkPtr scatter_async(const void* send, void* recv, std::size_t bytes, int root) override {
    return submit(rooted_item(Kind::Scatter, send, recv, bytes, root, "scatter"));
  }
  void scatter(const void* send, void* recv, std::size_t bytes, int root) override {
    run(rooted_item(Kind::Scatter, send, recv, bytes, root, "scatter"));
  }

  void set_timeout(int timeout_ms, const std::string& note) override {
    live().set_timeout(timeout_ms, note);
  }

  bool idle() override {
    std::lock_guard<std::mutex> lk(mu_);
    return queue_.empty() && !busy_ && !broken_;
  }

  void destroy() override {
    stop();
    std::lock_guard<std::mutex> lk(mu_);
    if (!destroyed_) destroyed_ = std::make_exception_ptr(
        Error(Error::Kind::Usage, "this shoal communicator was destroyed"));
    comm_.reset();
  }

  WorkPtr submit(Item item) {
    item.work = std::make_shared<WorkImpl>(weak_from_this());
    WorkPtr handle = item.work;
    std::lock_guard<std::mutex> lk(mu_);
    if (destroyed_) std::rethrow_exception(destroyed_);
    if (broken_) {
      item.work->finish(broken_);
      return handle;
    }
    queue_.push_back(std::move(item));
    cv_.notify_all();
    return handle;
  }

  // Synchronous collectives run on the caller's thread when nothing is queued
  // (no hand-off latency for small messages); otherwise after the queue.
  void run(Item item) {
    std::unique_lock<std::mutex> lk(mu_);
    if (destroyed_) std::rethrow_exception(destroyed_);
    if (broken_) std::rethrow_exception(broken_);
    if (queue_.empty() && !busy_) {
      busy_ = true;
      lk.unlock();
      std::exception_ptr error = execute_guarded(item);
      lk.lock();
      busy_ = false;
      // Only the worker waits for busy_ to drop, and only with work queued:
      // waking it for nothing costs two context switches per collective.
      if (!queue_.empty() || stopping_) cv_.notify_all();
      if (error) std::rethrow_exception(error);
      return;
    }
    item.flush_after = true;
    lk.unlock();
    submit(std::move(item))->wait();
  }

  // Closes the open fusion buffer: a cut after the last call issued so far.
  void flush() override {
    std::lock_guard<std::mutex> lk(mu_);
    if (!queue_.empty()) queue_.back().flush_after = true;
    cv_.notify_all();
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

 private:
  // How many queued items form the next batch, or 0 if it may still grow. The
  // decision depends only on the sequence of calls, so all ranks agree.
  std::size_t ready_batch() const {
    if (queue_.empty()) return 0;
    const Item& first = queue_.front();
    if (first.kind != Kind::AllReduce || first.flush_after) return 1;
    std::size_t bytes = first.bytes();
    if (bytes >= threshold_) return 1;
    std::size_t n = 1;
    for (; n < queue_.size(); ++n) {
      const Item& next = queue_[n];
      if (next.kind != Kind::AllReduce || next.dtype != first.dtype || next.op != first.op ||
          bytes + next.bytes() > threshold_)
        return n;
      bytes += next.bytes();
      if (next.flush_after || bytes >= threshold_) return n + 1;
    }
    return stopping_ ? n : 0;
  }

  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      std::size_t n = 0;
      cv_.wait(lk, [&] {
        if (busy_) return false;
        n = ready_batch();
        return n > 0 || (stopping_ && queue_.empty());
      });
      if (n == 0) return;
      std::vector<Item> batch;
      for (std::size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      busy_ = true;
      lk.unlock();
      std::exception_ptr error = execute_batch(batch);
      for (Item& it : batch) it.work->finish(error);
      lk.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::exception_ptr execute_batch(std::vector<Item>& batch) {
    if (batch.size() == 1) return execute_guarded(batch[0]);
    std::size_t total = 0;
    for (const Item& it : batch) total += it.bytes();
    if (fusion_.size() < total) fusion_.resize(total);
    std::size_t off = 0;
    for (const Item& it : batch) std::memcpy(fusion_.data() + off, it.data, it.bytes()), off += it.bytes();
    Item fused = batch[0];
    fused.data = fusion_.data();
    fused.count = total / dtype_size(fused.dtype);
    std::exception_ptr error = execute_guarded(fused);
    if (error) return error;
    off = 0;
    for (const Item& it : batch) std::memcpy(it.data, fusion_.data() + off, it.bytes()), off += it.bytes();
    return nullptr;
  }

  std::exception_ptr execute_guarded(const Item& it) {
    try {
      execute(it);
      return nullptr;
    } catch (const Error& e) {
      if (e.kind() == Error::Kind::Usage) return std::current_exception();
      // A peer failed or vanished: report the root cause this host agrees
      // on, tell the local ranks and the other hosts, fail what is queued.
      std::exception_ptr error = std::make_exception_ptr(comm_->fail(e));
      std::deque<Item> dropped;
      {
        std::lock_guard<std::mutex> lk(mu_);
        broken_ = error;
        dropped.swap(queue_);
      }
      for (Item& d : dropped) d.work->finish(error);
      return error;
    } catch (...) {
      return std::current_exception();
    }
  }

  void execute(const Item& it) {
    switch (it.kind) {
      case Kind::AllReduce: return comm_->allreduce(it.data, it.count, it.dtype, it.op, "allreduce");
      case Kind::Broadcast: return comm_->broadcast(it.data, it.count, it.root);
      case Kind::AllGather: return comm_->allgather(it.send, it.data, it.count);
      case Kind::Reduce: return comm_->reduce(it.data, it.count, it.dtype, it.op, it.root);
      case Kind::Barrier: return comm_->barrier();
      case Kind::ReduceScatter:
        return comm_->reduce_scatter(it.send, it.data, it.count, it.dtype, it.op);
      case Kind::AllToAll:
        return comm_->alltoall(static_cast<const char*>(it.send), it.send_counts, it.send_offsets,
                               static_cast<char*>(it.data), it.recv_counts, it.recv_offsets);
      case Kind::Gather: return comm_->gather(it.send, it.data, it.count, it.root);
      case Kind::Scatter: return comm_->scatter(it.send, it.data, it.count, it.root);
    }
  }

  static int user_tag(int tag) {
    if (tag < 0) throw Error(Error::Kind::Usage, "tags must be >= 0 (got " + std::to_string(tag) + ")");
    return tag;
  }
  static Item reduce_scatter_item(const void* send, void* recv, std::size_t count, DType dtype,
                                  ReduceOp op) {
    Item it{Kind::ReduceScatter};
    it.send = send, it.data = recv, it.count = count, it.dtype = dtype, it.op = op;
    return it;
  }
  Item alltoall_item(const void* send, Sizes sc, Sizes so, void* recv, Sizes rc, Sizes ro) const {
    const std::size_t n = (std::size_t)topo_.size;
    if (sc.size() != n || so.size() != n || rc.size() != n || ro.size() != n)
      throw Error(Error::Kind::Usage, "alltoall: counts and offsets need " + std::to_string(n) +
                                          " entries each");
    Item it{Kind::AllToAll};
    it.send = send, it.data = recv;
    it.send_counts = std::move(sc), it.send_offsets = std::move(so);
    it.recv_counts = std::move(rc), it.recv_offsets = std::move(ro);
    return it;
  }
  Item rooted_item(Kind kind, const void* send, void* recv, std::size_t bytes, int root,
                   const char* name) const {
    check_root(root, name);
    Item it{kind};
    it.send = send, it.data = recv, it.count = bytes, it.root = root;
    return it;
  }

  Comm& live() {
    std::lock_guard<std::mutex> lk(mu_);
    if (destroyed_) std::rethrow_exception(destroyed_);
    return *comm_;
  }

  void check_root(int root, const char* name) const {
    if (root < 0 || root >= topo_.size)
      throw Error(Error::Kind::Usage, std::string(name) + ": root must be in [0, " +
                                          std::to_string(topo_.size - 1) + "] (got " +
                                          std::to_string(root) + ")");
  }
  static Item allreduce_item(void* data, std::size_t count, DType dtype, ReduceOp op) {
    Item it{Kind::AllReduce};
    it.data = data, it.count = count, it.dtype = dtype, it.op = op;
    return it;
  }
  Item broadcast_item(void* data, std::size_t bytes, int root) const {
    check_root(root, "broadcast");
    Item it{Kind::Broadcast};
    it.data = data, it.count = bytes, it.root = root;
    return it;
  }
  static Item allgather_item(const void* send, void* recv, std::size_t bytes) {
    Item it{Kind::AllGather};
    it.send = send, it.data = recv, it.count = bytes;
    return it;
  }
  Item reduce_item(void* data, std::size_t count, DType dtype, ReduceOp op, int root) const {
    check_root(root, "reduce");
    Item it{Kind::Reduce};
    it.data = data, it.count = count, it.dtype = dtype, it.op = op, it.root = root;
    return it;
  }

  std::unique_ptr<Comm> comm_;
  Topology topo_;
  std::exception_ptr destroyed_;
  std::size_t threshold_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::exception_ptr broken_;
  std::vector<char> fusion_;
  std::thread worker_;
};

void WorkImpl::wait() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_) {
      if (error_) std::rethrow_exception(error_);
      return;
    }
  }
  if (auto engine = engine_.lock()) engine->flush();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

// ---- creating communicators --------------------------------------------------

std::string advertise(const Config& c, const Bootstrap& boot) {
  if (c.rank == 0 || !c.interface.empty()) return c.reachable_address();
  return boot.local_address();  // the address that reached rank 0
}

// Rank 0 listens first (`listen_fd`, bound), so its contact is never stale.
std::shared_ptr<Engine> start_engine(const Config& c, int listen_fd, const std::string& addr,
                                     int port) {
  std::shared_ptr<Engine> e;
  if (c.size == 1) {
    net::close_fd(listen_fd);
    e = std::make_shared<Engine>(c, nullptr, std::string());
  } else {
    Bootstrap boot(c, listen_fd, addr, port);
    e = std::make_shared<Engine>(c, &boot, advertise(c, boot));
  }
  e->start();
  return e;
}

// `share` is called on every member, even alone: new_group's non-members take
// part in the parent's broadcast that carries the contact.
std::shared_ptr<Engine> start_shared(const Config& c, const Share& share) {
  if (c.size == 1) {
    share("-");
    return start_engine(c, -1, "", 0);
  }
  int listen_fd = -1;
  std::string contact;
  if (c.rank == 0) {
    try {
      const std::string addr = c.reachable_address();
      listen_fd = net::listen_on(c.interface.empty() ? std::string() : addr, 0, 1024);
      contact = contact_of(addr, net::bound_port(listen_fd));
    } catch (const Error& e) {
      // Published in the contact's place: the other members fail at once, not at a time-out.
      share("!" + std::string(e.what()));
      throw;
    }
  }
  std::string addr;
  int port = 0;
  try {
    contact = share(contact);
    parse_contact(contact, addr, port);
  } catch (...) {
    net::close_fd(listen_fd);
    throw;
  }
  return start_engine(c, listen_fd, addr, port);
}

std::mutex g_mu;
std::shared_ptr<Engine> g_engine;

std::shared_ptr<Engine> engine() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_engine) throw Error(Error::Kind::Usage, "shoal collectives are not initialized: call init() first");
  return g_engine;
}

}  // namespace

const Topology& init() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_engine) {
    const Config c = Config::from_env();
    const int listen_fd = c.rank == 0 && c.size > 1 ? net::listen_on("", c.master_port, 1024) : -1;
    g_engine = start_engine(c, listen_fd, c.master_addr, c.master_port);
  }
  return g_engine->topology();
}

const Topology& init_from(int rank, int size, const Share& share) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_engine) g_engine = start_shared(Config::from_env().member(rank, size, rank), share);
  return g_engine->topology();
}

bool is_initialized() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_engine != nullptr;
}

const Topology& topology() { return engine()->topology(); }

GroupPtr world() { return engine(); }

void shutdown() {
  std::shared_ptr<Engine> e;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    e.swap(g_engine);
  }
  if (e) e->destroy();
}

GroupPtr create_group(int rank, int size, int global_rank, const Share& share) {
  return start_shared(Config::from_env().member(rank, size, global_rank), share);
}

GroupPtr new_group(const GroupPtr& parent, const std::vector<int>& ranks) {
  const Topology& pt = parent->topology();
  std::vector<bool> seen(pt.size, false);
  int mine = -1;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= pt.size || seen[r])
      throw Error(Error::Kind::Usage, "new_group: ranks must be unique and in [0, " +
                                          std::to_string(pt.size - 1) + "] (got " +
                                          std::to_string(r) + ")");
    seen[r] = true;
    if (r == pt.rank) mine = (int)i;
  }
  if (ranks.empty()) throw Error(Error::Kind::Usage, "new_group: no ranks");
  // Group rank 0's contact travels as a broadcast on the parent, which every
  // parent rank joins; members then set up among themselves.
  char contact[192] = {0};
  auto share = [&](const std::string& mine_contact) {
    std::strncpy(contact, mine_contact.c_str(), sizeof contact - 1);
    parent->broadcast(contact, sizeof contact, ranks[0]);
    return std::string(contact);
  };
  if (mine < 0) {
    share(std::string());
    return nullptr;
  }
  return create_group(mine, (int)ranks.size(), pt.global_rank, share);
}

WorkPtr allreduce_async(void* data, std::size_t count, DType dtype, ReduceOp op) {
  return engine()->allreduce_async(data, count, dtype, op);
}
void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
  engine()->allreduce(data, count, dtype, op);
}
WorkPtr broadcast_async(void* data, std::size_t bytes, int root) {
  return engine()->broadcast_async(data, bytes, root);
}
void broadcast(void* data, std::size_t bytes, int root) { engine()->broadcast(data, bytes, root); }
WorkPtr allgather_async(const void* send, void* recv, std::size_t bytes_per_rank) {
  return engine()->allgather_async(send, recv, bytes_per_rank);
}
void allgather(const void* send, void* recv, std::size_t bytes_per_rank) {
  engine()->allgather(send, recv, bytes_per_rank);
}
WorkPtr reduce_async(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  return engine()->reduce_async(data, count, dtype, op, root);
}
void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  engine()->reduce(data, count, dtype, op, root);
}
void barrier() { engine()->barrier(); }
void flush() { engine()->flush(); }

}  // namespace shoal
