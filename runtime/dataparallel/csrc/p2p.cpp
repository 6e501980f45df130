// Point-to-point transfers (see p2p.h).
#include "p2p.h"

#include "net.h"

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>

namespace shoal {

namespace {

constexpr std::size_t kInline = 16u << 10;  // bytes carried in one slot
constexpr int kSlots = 8;                    // slots per ordered pair of local ranks
constexpr uint64_t kAcks = 64;               // address sends in flight per pair
constexpr int kSpins = 2000;                 // progress rounds before a waiter sleeps

enum Kind : uint32_t { kEager = 1, kFirst = 2, kMore = 3, kAddress = 4 };

struct alignas(64) Slot {
  std::atomic<uint32_t> full;  // 1 from posting until the receiver drained it
  uint32_t kind;
  int32_t tag;
  uint32_t len;    // payload bytes in this slot
  uint64_t total;  // the message's bytes
  uint64_t addr;   // kAddress: where the sender's bytes are
  uint64_t id;     // kAddress: acknowledged by storing id + 1 in acks[id % kAcks]
  char payload[kInline];
};

struct Box {  // from one local rank to another
  Slot slots[kSlots];
  alignas(64) std::atomic<uint64_t> acks[kAcks];
};

struct alignas(64) Bell {  // rung when something arrives for its rank
  std::atomic<uint32_t> word;
  std::atomic<uint32_t> sleepers;
};

struct Header {  // of a message on a connection
  int32_t tag;
  int32_t unused;
  uint64_t bytes;
};

Bell* bells(char* area) { return reinterpret_cast<Bell*>(area); }
Box* box(char* area, int L, int from, int to) {
  char* boxes = area + sizeof(Bell) * (std::size_t)L;
  return reinterpret_cast<Box*>(boxes) + ((std::size_t)from * L + to);
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ts, nullptr, 0);
}

}  // namespace

// ---- transfers ------------------------------------------------------------------

struct P2P::Op : Work {
  P2P* p2p;
  bool is_send;
  int peer;  // rank in the communicator (-1: any source)
  int tag;
  char* data;
  std::size_t bytes;
  std::size_t posted = 0;  // local sends: bytes posted so far
  uint64_t id = 0;         // address sends: the acknowledgement to wait for
  int from = -1;           // receives: the source that matched
  std::atomic<bool> done{false};
  std::exception_ptr error;
  std::vector<std::function<void()>> callbacks;
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();

  Op(P2P* p, bool send, int pr, int t, char* d, std::size_t b)
      : p2p(p), is_send(send), peer(pr), tag(t), data(d), bytes(b) {}
  bool test() override { return done.load(std::memory_order_acquire); }
  void wait() override {
    p2p->wait(*this);
    if (error) std::rethrow_exception(error);
  }
  void when_done(std::function<void()> callback) override {
    {
      std::lock_guard<std::mutex> lk(p2p->mu_);
      if (!done.load()) return callbacks.push_back(std::move(callback));
    }
    callback();
  }
  int source() override { return is_send ? peer : from; }
  bool cancel() override { return p2p->cancel(*this); }
  // With mu_ held. Callbacks run here: they must not call back into P2P.
  void finish(std::exception_ptr e = nullptr) {
    if (done.load()) return;
    error = std::move(e);
    done.store(true, std::memory_order_release);
    --p2p->open_;
    for (auto& c : callbacks) c();
    callbacks.clear();
  }
};

struct P2P::Message {
  int source;
  int tag;
  std::size_t total;
  std::size_t got = 0;
  std::vector<char> data;  // unexpected: its bytes so far
  bool address = false;    // only the sender's address came (local, large)
  uint64_t addr = 0, id = 0;
  std::shared_ptr<Op> recv;  // the receive it matched
};

struct P2P::Link {
  int fd;
  int peer;
  std::deque<std::shared_ptr<Op>> sends;
  Header out{};
  std::size_t out_done = 0;  // header and payload bytes of sends.front() written
  Header in{};
  std::size_t in_header = 0;
  std::shared_ptr<Message> incoming;
  bool broken = false;
};

std::size_t P2P::area_bytes(int L) {
  return sizeof(Bell) * (std::size_t)L + sizeof(Box) * (std::size_t)L * (std::size_t)L;
}

P2P::P2P(const Job& job, const Config& cfg, HostSegment& seg, std::vector<int> links,
         bool can_read)
    : job_(job), cfg_(cfg), seg_(seg), can_read_(can_read) {
  const Topology& t = job.topo;
  L_ = t.local_size, me_ = t.local_rank;
  area_ = seg.extra();
  local_of_.assign(t.size, -1);
  for (int j = 0; j < L_; ++j) local_of_[job.host_ranks[t.host_index][j]] = j;
  outbox_.resize(L_);
  next_slot_.assign(L_, 0), drained_.assign(L_, 0), next_id_.assign(L_, 0);
  assembling_.resize(L_);
  links_.resize(t.size);
  for (int r = 0; r < t.size; ++r)
    if (links[r] >= 0) links_[r] = std::unique_ptr<Link>(new Link{links[r], r});
  thread_ = std::thread([this] { background(); });
}

P2P::~P2P() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  pending_cv_.notify_all();
  thread_.join();
}

WorkPtr P2P::send(const void* data, std::size_t bytes, int peer, int tag) {
  auto op = std::make_shared<Op>(this, true, peer, tag, static_cast<char*>(const_cast<void*>(data)),
                                 bytes);
  enqueue(op);
  return op;
}

WorkPtr P2P::recv(void* data, std::size_t bytes, int peer, int tag) {
  auto op = std::make_shared<Op>(this, false, peer, tag, static_cast<char*>(data), bytes);
  enqueue(op);
  return op;
}

void P2P::enqueue(const std::shared_ptr<Op>& op) {
  const int size = job_.topo.size;
  if (op->peer < (op->is_send ? 0 : -1) || op->peer >= size || op->peer == job_.topo.rank)
    throw Error(Error::Kind::Usage, std::string(op->is_send ? "send" : "recv") + ": peer " +
                                        std::to_string(op->peer) + " is not another rank of the " +
                                        std::to_string(size) + "-rank communicator");
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++open_;
    if (!op->is_send) {
      auto it = std::find_if(unexpected_.begin(), unexpected_.end(), [&](const auto& m) {
        return (op->peer < 0 || m->source == op->peer) && m->tag == op->tag;
      });
      if (it == unexpected_.end()) {
        posted_.push_back(op);
      } else {
        auto m = *it;
        unexpected_.erase(it);
        bind(m, op);
      }
    } else if (links_[op->peer]) {
      links_[op->peer]->sends.push_back(op);
    } else {
      outbox_[local_of_[op->peer]].push_back(op);
    }
    progress();  // eager sends complete here, on the caller's thread
    if (!background_awake_ && open_ > 0) {
      background_awake_ = true;
      pending_cv_.notify_all();
    }
  }
}

bool P2P::cancel(Op& op) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = std::find_if(posted_.begin(), posted_.end(), [&](const auto& p) { return p.get() == &op; });
  if (it == posted_.end()) return false;  // a send, or a receive a message already matched
  auto held = *it;  // finish() may run callbacks that drop the last other reference
  posted_.erase(it);
  held->finish(std::make_exception_ptr(Error(
      Error::Kind::Cancelled, "recv: cancelled before a message matched it (rank " +
                              std::to_string(cfg_.global_rank) + ", tag " + std::to_string(op.tag) +
                              ")")));
  ring(me_);  // a thread waiting on it looks again
  return true;
}

// ---- matching -------------------------------------------------------------------

// A message has started to arrive: it goes to the first matching receive, or waits.
void P2P::deliver(const std::shared_ptr<Message>& m) {
  auto it = std::find_if(posted_.begin(), posted_.end(), [&](const auto& op) {
    return (op->peer < 0 || op->peer == m->source) && op->tag == m->tag;
  });
  if (it == posted_.end()) {
    if (!m->address) m->data.resize(m->total);
    unexpected_.push_back(m);
    return;
  }
  auto op = *it;
  posted_.erase(it);
  bind(m, op);
}

void P2P::bind(const std::shared_ptr<Message>& m, const std::shared_ptr<Op>& op) {
  op->from = m->source;
  if (m->total != op->bytes) {
    op->finish(std::make_exception_ptr(Error(
        Error::Kind::Usage, "recv: rank " + std::to_string(job_.global(m->source)) + " sent " +
                                std::to_string(m->total) + " bytes to rank " +
                                std::to_string(cfg_.global_rank) + ", which expected " +
                                std::to_string(op->bytes) +
                                (m->tag >= 0 ? " (tag " + std::to_string(m->tag) + ")" : ""))));
    // The message is dropped; a sender waiting for it to be read is released.
    if (m->address) acknowledge(*m);
    return;
  }
  m->recv = op;
  if (m->got > 0) std::memcpy(op->data, m->data.data(), m->got);
  m->data = std::vector<char>();
  if (m->address) return read_address(*m);
  if (m->got == m->total) op->finish();
}

void P2P::fill(Message& m, const char* bytes, std::size_t n) {
  char* to = m.recv ? m.recv->data : m.data.data();
  if (m.recv && m.recv->done) to = nullptr;  // refused (size): drop
  if (to != nullptr && n > 0) std::memcpy(to + m.got, bytes, n);
  m.got += n;
  if (m.got == m.total && m.recv) m.recv->finish();
}

// A bound address-only message: the bytes come straight from the sender.
void P2P::read_address(Message& m) {
  const int local = local_of_[m.source];
  char* dst = m.recv->data;
  uint64_t remote = m.addr;
  std::size_t left = m.total;
  while (left > 0) {
    iovec l{dst, left}, r{reinterpret_cast<void*>(remote), left};
    const ssize_t n = process_vm_readv(seg_.pid(local), &l, 1, &r, 1, 0);
    if (n <= 0) {
      const int g = job_.global(m.source);
      m.recv->finish(std::make_exception_ptr(
          Error(Error::Kind::PeerLost, "recv: reading rank " + std::to_string(g) +
                                           "'s message failed (its process exited?)", {g})));
      return;
    }
    dst += n, remote += (uint64_t)n, left -= (std::size_t)n;
  }
  acknowledge(m);
  m.got = m.total;
  m.recv->finish();
}

void P2P::acknowledge(const Message& m) {
  const int local = local_of_[m.source];
  box(area_, L_, local, me_)->acks[m.id % kAcks].store(m.id + 1, std::memory_order_release);
  ring(local);
}

// ---- inside a host --------------------------------------------------------------

void P2P::drain(int s) {
  Box* b = box(area_, L_, s, me_);
  for (;;) {
    Slot& slot = b->slots[drained_[s] % kSlots];
    if (slot.full.load(std::memory_order_acquire) == 0) return;
    const int source = job_.host_ranks[job_.topo.host_index][s];
    if (slot.kind == kMore) {
      if (assembling_[s]) fill(*assembling_[s], slot.payload, slot.len);
    } else {
      auto m = std::make_shared<Message>();
      m->source = source, m->tag = slot.tag, m->total = slot.total;
      m->address = slot.kind == kAddress;
      m->addr = slot.addr, m->id = slot.id;
      deliver(m);
      if (!m->address) fill(*m, slot.payload, slot.len);
      assembling_[s] = m->got < m->total && !m->address ? m : nullptr;
    }
    if (assembling_[s] && assembling_[s]->got == assembling_[s]->total) assembling_[s] = nullptr;
    slot.full.store(0, std::memory_order_release);
    ++drained_[s];
    ring(s);  // the sender may be waiting for this slot
  }
}

// Posts what fits of a local send; true once it is wholly posted.
bool P2P::post(Op& op) {
  const int d = local_of_[op.peer];
  Box* b = box(area_, L_, me_, d);
  const bool address = can_read_ && op.bytes > kInline;
  do {
    Slot& slot = b->slots[next_slot_[d] % kSlots];
    if (slot.full.load(std::memory_order_acquire) != 0) return false;
    if (address && next_id_[d] >= kAcks &&
        b->acks[next_id_[d] % kAcks].load(std::memory_order_acquire) != next_id_[d] - kAcks + 1)
      return false;  // that acknowledgement slot is still in use
    const std::size_t n = address ? 0 : std::min(kInline, op.bytes - op.posted);
    slot.kind = address ? kAddress : op.posted > 0 ? kMore : n == op.bytes ? kEager : kFirst;
    slot.tag = op.tag, slot.len = (uint32_t)n, slot.total = op.bytes;
    slot.addr = reinterpret_cast<uint64_t>(op.data);
    if (address) op.id = slot.id = next_id_[d]++;
    if (n > 0) std::memcpy(slot.payload, op.data + op.posted, n);
    slot.full.store(1, std::memory_order_release);
    ++next_slot_[d];
    op.posted = address ? op.bytes : op.posted + n;
    ring(d);
  } while (op.posted < op.bytes);
  return true;
}

void P2P::ring(int local) {
  Bell& bell = bells(area_)[local];
  bell.word.fetch_add(1);
  if (bell.sleepers.load() > 0) futex(&bell.word, FUTEX_WAKE, INT32_MAX, nullptr);
}

uint32_t P2P::bell() const { return bells(area_)[me_].word.load(); }

// ---- across hosts -----------------------------------------------------------------

void P2P::pump(Link& k) {
  if (k.broken) return;
  try {
    while (!k.sends.empty()) {  // writes: header, then payload, one send at a time
      Op& op = *k.sends.front();
      if (k.out_done == 0) k.out = {op.tag, 0, op.bytes};
      const std::size_t total = sizeof(Header) + op.bytes;
      while (k.out_done < total) {
        const bool head = k.out_done < sizeof(Header);
        const char* from = head ? reinterpret_cast<const char*>(&k.out) + k.out_done
                                : op.data + (k.out_done - sizeof(Header));
        const std::size_t want = head ? sizeof(Header) - k.out_done : total - k.out_done;
        const ssize_t n = ::send(k.fd, from, want, MSG_NOSIGNAL);
        if (n > 0) k.out_done += (std::size_t)n;
        else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        else throw std::runtime_error(n == 0 ? "closed" : std::strerror(errno));
      }
      if (k.out_done < total) break;
      k.out_done = 0;
      auto done = k.sends.front();
      k.sends.pop_front();
      done->finish();
    }
    for (;;) {  // reads: a header, then its payload into the matched buffer
      if (!k.incoming) {
        const ssize_t n = ::recv(k.fd, reinterpret_cast<char*>(&k.in) + k.in_header,
                                 sizeof(Header) - k.in_header, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        if (n <= 0) throw std::runtime_error(n == 0 ? "closed" : std::strerror(errno));
        k.in_header += (std::size_t)n;
        if (k.in_header < sizeof(Header)) continue;
        k.in_header = 0;
        auto m = std::make_shared<Message>();
        m->source = k.peer, m->tag = k.in.tag, m->total = k.in.bytes;
        deliver(m);
        if (m->total > 0) k.incoming = m;
        else if (m->recv) m->recv->finish();
        continue;
      }
      Message& m = *k.incoming;
      const bool into_recv = m.recv && !m.recv->done;
      std::vector<char> sink;
      char* to = into_recv ? m.recv->data + m.got : m.recv ? nullptr : m.data.data() + m.got;
      if (to == nullptr) sink.resize(std::min<std::size_t>(m.total - m.got, 1 << 16)), to = sink.data();
      const std::size_t want = to == sink.data() ? sink.size() : m.total - m.got;
      const ssize_t n = ::recv(k.fd, to, want, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      if (n <= 0) throw std::runtime_error(n == 0 ? "closed" : std::strerror(errno));
      m.got += (std::size_t)n;
      if (m.got == m.total) {
        if (into_recv) m.recv->finish();
        k.incoming = nullptr;
      }
    }
  } catch (const std::runtime_error& e) {
    k.broken = true;
    const int g = job_.global(k.peer);
    fail_ops(k.peer, Error(Error::Kind::PeerLost, "point-to-point: connection to rank " +
                                                      std::to_string(g) + " lost (" + e.what() + ")",
                           {g}));
  }
}

// ---- progress -----------------------------------------------------------------------

void P2P::progress() {
  for (int s = 0; s < L_; ++s)
    if (s != me_) drain(s);
  for (int d = 0; d < L_; ++d) {
    auto& q = outbox_[d];
    while (!q.empty() && !q.front()->done && post(*q.front())) {
      auto op = q.front();
      q.pop_front();
      if (can_read_ && op->bytes > kInline) awaiting_ack_.push_back(op);  // read in place
      else op->finish();
    }
    while (!q.empty() && q.front()->done) q.pop_front();
  }
  for (auto it = awaiting_ack_.begin(); it != awaiting_ack_.end();) {
    Op& op = **it;
    const uint64_t ack = box(area_, L_, me_, local_of_[op.peer])->acks[op.id % kAcks].load();
    if (ack == op.id + 1 || op.done) {
      op.finish();
      it = awaiting_ack_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& k : links_)
    if (k) pump(*k);
  if (open_ > 0) check_peers();
}

// A local peer that is gone can no longer send or read; its transfers fail.
void P2P::check_peers() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_check_ < std::chrono::milliseconds(200)) return;
  last_check_ = now;
  for (int j = 0; j < L_; ++j) {
    if (j == me_ || !process_gone(seg_.pid(j))) continue;
    const int r = job_.host_ranks[job_.topo.host_index][j], g = job_.global(r);
    drain(j);  // what it posted before it exited is still delivered
    fail_ops(r, Error(Error::Kind::PeerLost, "point-to-point: rank " + std::to_string(g) + " (pid " +
                                                 std::to_string(seg_.pid(j)) + ") exited", {g}));
  }
}

// Fails the transfers that need `peer` (receives from any source only if nothing else can come).
void P2P::fail_ops(int peer, const Error& e) {
  auto error = std::make_exception_ptr(e);
  auto needs = [&](const std::shared_ptr<Op>& op) { return !op->done && op->peer == peer; };
  for (auto& q : outbox_)
    for (auto& op : q)
      if (needs(op)) op->finish(error);
  for (auto& op : awaiting_ack_)
    if (needs(op)) op->finish(error);
  if (links_[peer]) {
    for (auto& op : links_[peer]->sends) op->finish(error);
    links_[peer]->sends.clear();
    if (links_[peer]->incoming && links_[peer]->incoming->recv) links_[peer]->incoming->recv->finish(error);
  }
  const int local = local_of_[peer];
  if (local >= 0 && assembling_[local] && assembling_[local]->recv) assembling_[local]->recv->finish(error);
  for (auto it = posted_.begin(); it != posted_.end();) {
    if ((*it)->peer == peer) (*it)->finish(error), it = posted_.erase(it);
    else ++it;
  }
}

void P2P::wait_for_bell(uint32_t seen, int ms) {
  bool links = false;
  for (auto& k : links_) links = links || (k && !k->broken);
  if (links) {  // sockets and the bell: poll the sockets, briefly
    std::vector<pollfd> fds;
    for (auto& k : links_)
      if (k && !k->broken) fds.push_back({k->fd, (short)(POLLIN | (k->sends.empty() ? 0 : POLLOUT)), 0});
    poll(fds.data(), fds.size(), std::min(ms, 1));
    return;
  }
  Bell& b = bells(area_)[me_];
  b.sleepers.fetch_add(1);
  if (b.word.load() == seen) {
    timespec ts{0, (long)ms * 1000000L};
    futex(&b.word, FUTEX_WAIT, seen, &ts);
  }
  b.sleepers.fetch_sub(1);
}

void P2P::wait(Op& op) {
  int spins = 0;
  while (!op.test()) {
    const uint32_t seen = bell();
    if (mu_.try_lock()) {
      progress();
      mu_.unlock();
      if (op.test()) break;
    }
    if (std::chrono::steady_clock::now() - op.since > std::chrono::milliseconds(cfg_.timeout_ms)) {
      std::lock_guard<std::mutex> lk(mu_);
      // A receive that timed out before any message matched it leaves the posted list:
      // a later message must not land in a buffer its owner has given up on.
      posted_.erase(std::remove_if(posted_.begin(), posted_.end(),
                                   [&](const auto& p) { return p.get() == &op; }),
                    posted_.end());
      const int g = op.peer < 0 ? -1 : job_.global(op.peer);
      op.finish(std::make_exception_ptr(Error(
          Error::Kind::Timeout,
          net::timed_out(std::string(op.is_send ? "send to" : "recv from") + " rank " +
                             (g < 0 ? std::string("(any)") : std::to_string(g)),
                         cfg_.timeout_ms, "waiting for it", cfg_.timeout_note),
          g < 0 ? std::vector<int>{} : std::vector<int>{g})));
      break;
    }
    if (++spins < kSpins) {
      std::this_thread::yield();
      continue;
    }
    wait_for_bell(seen, 10);
  }
}

// Drives the transfers nobody waits on. Once woken it stays awake, looking
// every millisecond, until nothing was pending for kLinger: a burst of
// transfers (each completed by the thread that waits on it) then costs no
// wake-up per transfer.
void P2P::background() {
  constexpr auto kLinger = std::chrono::milliseconds(50);
  std::unique_lock<std::mutex> lk(mu_);
  auto last_busy = std::chrono::steady_clock::now();
  for (;;) {
    pending_cv_.wait(lk, [this] { return stopping_ || background_awake_; });
    if (stopping_) return;
    progress();
    const auto now = std::chrono::steady_clock::now();
    if (open_ > 0) last_busy = now;
    if (open_ == 0 && now - last_busy > kLinger) {
      background_awake_ = false;
      continue;
    }
    // A timed sleep, not the bell: a ring is for the waiting threads, and waking
    // this one too would cost a context switch per message.
    pending_cv_.wait_for(lk, std::chrono::milliseconds(1));
  }
}

}  // namespace shoal
