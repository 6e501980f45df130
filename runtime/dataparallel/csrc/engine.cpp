// The process-wide core state behind shoal/core.h: one communicator, one
// queue of collectives in program order, and the background thread that packs
// queued allreduces into fusion buffers and executes them, so that reduction
// overlaps the framework's backward pass.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "comm.h"
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
  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  std::weak_ptr<Engine> engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

enum class Kind { AllReduce, Broadcast, AllGather, Reduce, Barrier };

struct Item {
  Kind kind;
  void* data = nullptr;
  const void* send = nullptr;
  std::size_t count = 0;  // elements (allreduce/reduce) or bytes (broadcast/allgather)
  DType dtype = DType::UInt8;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  bool flush_after = false;
  std::shared_ptr<WorkImpl> work;
  std::size_t bytes() const { return count * dtype_size(dtype); }
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  Engine(const Config& cfg, int epoch) : comm_(cfg, epoch), threshold_(cfg.fusion_bytes) {}
  ~Engine() { stop(); }

  void start() { worker_ = std::thread([this] { loop(); }); }
  const Topology& topo() const { return comm_.topo(); }

  WorkPtr submit(Item item) {
    item.work = std::make_shared<WorkImpl>(weak_from_this());
    WorkPtr handle = item.work;
    std::lock_guard<std::mutex> lk(mu_);
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
  void flush() {
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
      std::exception_ptr error = std::make_exception_ptr(comm_.fail(e));
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
      case Kind::AllReduce: return comm_.allreduce(it.data, it.count, it.dtype, it.op, "allreduce");
      case Kind::Broadcast: return comm_.broadcast(it.data, it.count, it.root);
      case Kind::AllGather: return comm_.allgather(it.send, it.data, it.count);
      case Kind::Reduce: return comm_.reduce(it.data, it.count, it.dtype, it.op, it.root);
      case Kind::Barrier: return comm_.barrier();
    }
  }

  Comm comm_;
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

std::mutex g_mu;
std::shared_ptr<Engine> g_engine;
int g_epoch = 0;

std::shared_ptr<Engine> engine() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_engine) throw Error(Error::Kind::Usage, "shoal collectives are not initialized: call init() first");
  return g_engine;
}

void check_root(int root, const char* name) {
  const int size = engine()->topo().size;
  if (root < 0 || root >= size)
    throw Error(Error::Kind::Usage, std::string(name) + ": root must be in [0, " +
                                        std::to_string(size - 1) + "] (got " + std::to_string(root) + ")");
}

}  // namespace

const Topology& init() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_engine) {
    auto e = std::make_shared<Engine>(Config::from_env(), g_epoch++);
    e->start();
    g_engine = std::move(e);
  }
  return g_engine->topo();
}

bool is_initialized() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_engine != nullptr;
}

const Topology& topology() { return engine()->topo(); }

void shutdown() {
  std::shared_ptr<Engine> e;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    e.swap(g_engine);
  }
  if (e) e->stop();
}

WorkPtr allreduce_async(void* data, std::size_t count, DType dtype, ReduceOp op) {
  Item it{Kind::AllReduce};
  it.data = data, it.count = count, it.dtype = dtype, it.op = op;
  return engine()->submit(std::move(it));
}

void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
  Item it{Kind::AllReduce};
  it.data = data, it.count = count, it.dtype = dtype, it.op = op;
  engine()->run(std::move(it));
}

static Item broadcast_item(void* data, std::size_t bytes, int root) {
  check_root(root, "broadcast");
  Item it{Kind::Broadcast};
  it.data = data, it.count = bytes, it.root = root;
  return it;
}
WorkPtr broadcast_async(void* data, std::size_t bytes, int root) {
  return engine()->submit(broadcast_item(data, bytes, root));
}
void broadcast(void* data, std::size_t bytes, int root) { engine()->run(broadcast_item(data, bytes, root)); }

static Item allgather_item(const void* send, void* recv, std::size_t bytes) {
  Item it{Kind::AllGather};
  it.send = send, it.data = recv, it.count = bytes;
  return it;
}
WorkPtr allgather_async(const void* send, void* recv, std::size_t bytes_per_rank) {
  return engine()->submit(allgather_item(send, recv, bytes_per_rank));
}
void allgather(const void* send, void* recv, std::size_t bytes_per_rank) {
  engine()->run(allgather_item(send, recv, bytes_per_rank));
}

static Item reduce_item(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  check_root(root, "reduce");
  Item it{Kind::Reduce};
  it.data = data, it.count = count, it.dtype = dtype, it.op = op, it.root = root;
  return it;
}
WorkPtr reduce_async(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  return engine()->submit(reduce_item(data, count, dtype, op, root));
}
void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  engine()->run(reduce_item(data, count, dtype, op, root));
}

void barrier() { engine()->run(Item{Kind::Barrier}); }

void flush() { engine()->flush(); }

}  // namespace shoal
