// Communicator set-up and the collectives built on allreduce (see comm.h).
// The allreduce paths are in allreduce.cpp (inside a host) and interhost.cpp
// (between hosts).
#include "comm.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <thread>

#include "net.h"

namespace shoal {

namespace {

// Unique on the machine while its creator lives (pid, and a counter for the
// creator's communicators); unlinked as soon as every local rank mapped it.
std::string segment_name(const Config& c) {
  static std::atomic<uint64_t> serial{0};
  std::string raw = "shoal-" + c.job_id.substr(0, 64) + "-" + std::to_string(getpid()) + "-" +
                    std::to_string(serial++);
  std::string name = "/";
  for (char ch : raw) name += std::isalnum((unsigned char)ch) || ch == '-' ? ch : '_';
  return name;
}

// How long a rank whose data connection dropped waits for the peer's notice:
// a failing peer sends it before it exits, so it is normally already there.
constexpr int kNoticeWaitMs = 1000;

}  // namespace

Comm::Comm(const Config& config, Bootstrap* boot, const std::string& advertised) : cfg_(config) {
  if (cfg_.size == 1) {
    job_.topo.host = cfg_.host;
    job_.topo.global_rank = cfg_.global_rank;
    return;
  }
  job_ = rendezvous(cfg_, *boot, advertised);
  try {
    const Topology& t = job_.topo;
    std::vector<LocalPeer> peers;
    for (int r : job_.host_ranks[t.host_index]) peers.push_back({job_.global(r), job_.table[r].pid});
    // Each host's local rank 0 creates its segment and names it to the others.
    const std::string mine = t.local_rank == 0 ? segment_name(cfg_) : std::string();
    if (t.local_rank == 0)
      seg_ = std::make_unique<HostSegment>(mine, true, 0, peers, cfg_.chunk_bytes, cfg_.depth,
                                           cfg_.timeout_ms, P2P::area_bytes(t.local_size));
    const auto names = boot->allgather(mine);
    if (t.local_rank != 0)
      seg_ = std::make_unique<HostSegment>(names[job_.host_ranks[t.host_index][0]], false,
                                           t.local_rank, peers, cfg_.chunk_bytes, cfg_.depth,
                                           cfg_.timeout_ms, P2P::area_bytes(t.local_size));
    boot->barrier();
    if (t.local_rank == 0) seg_->unlink();
    // Single copy only if every local rank can read its peers (containers may forbid it).
    probe_word_ = 0x5348304C50524F42ull;
    seg_->set_address(reinterpret_cast<uint64_t>(&probe_word_));
    boot->barrier();
    seg_->set_can_read(probe_single_copy());
    boot->barrier();
    // Large messages read peers directly, on one host and across hosts alike.
    single_copy_ = cfg_.single_copy_bytes > 0;
    for (int j = 0; j < t.local_size; ++j) single_copy_ = single_copy_ && seg_->can_read(j);
  } catch (...) {
    if (seg_ && job_.topo.local_rank == 0) seg_->unlink();  // never leak the name
    job_.close_all();
    throw;
  }
  for (std::size_t h = 0; h < job_.control.size(); ++h)
    control_.emplace_back(job_.control[h], job_.global(job_.host_ranks[h][job_.topo.local_rank]));
  if (job_.topo.num_hosts > 1) {
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) {
      job_.close_all();
      throw Error(Error::Kind::System, std::string("eventfd: ") + std::strerror(errno));
    }
    watcher_ = std::thread([this] { watch_peers(); });
  }
}

Comm::~Comm() {
  p2p_.reset();
  stop_watching();
  // Peers on other hosts tell a clean shutdown from a death by this.
  for (const net::Control& c : control_) net::send_goodbye(c.fd());
  job_.close_all();
}

P2P& Comm::p2p() {
  std::lock_guard<std::mutex> lk(p2p_mu_);
  if (cfg_.size == 1) throw Error(Error::Kind::Usage, "point-to-point: the communicator has one rank");
  if (!p2p_) {
    const int L = job_.topo.local_size;
    // SHOAL_SINGLE_COPY_BYTES=0 keeps transfers off peers' memory here too.
    bool readable = L > 1 && cfg_.single_copy_bytes > 0;
    for (int j = 0; j < L; ++j) readable = readable && seg_->can_read(j);
    std::vector<int> links = job_.links;
    links.resize(cfg_.size, -1);
    p2p_ = std::make_unique<P2P>(job_, cfg_, *seg_, links, readable);
  }
  return *p2p_;
}

void Comm::set_timeout(int timeout_ms, const std::string& note) {
  if (timeout_ms > 0) cfg_.timeout_ms = timeout_ms;
  cfg_.timeout_note = note;
  if (seg_) seg_->set_timeout(cfg_.timeout_ms, note);
}

void Comm::stop_watching() {
  if (!watcher_.joinable()) return;
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof one) < 0) {}  // an eventfd write only fails on overflow
  watcher_.join();
  net::close_fd(wake_fd_);
  wake_fd_ = -1;
}

Error Comm::fail(const Error& seen) {
  if (!seg_) return seen;
  const int me = cfg_.global_rank;
  Failure verdict;
  if (!seg_->failure(verdict)) {
    const Failure mine = root_cause(seen);
    seg_->abort(mine);
    // Another local rank may have won the race and still be writing its failure.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    while (!seg_->failure(verdict)) {
      if (std::chrono::steady_clock::now() > until) {
        verdict = mine;
        break;
      }
      std::this_thread::yield();
    }
  }
  for (const net::Control& c : control_) net::send_failure(c.fd(), verdict);
  return verdict.error(me);
}

// A lost data connection or a timeout naming my peer on another host may be
// the echo of an earlier failure there: the peer then said why on the control
// connection before it exited, and the notice thread published it here. A
// killed peer closes both without a word, and then it is the root cause itself.
Failure Comm::root_cause(const Error& seen) {
  Failure mine = Failure::of(seen, cfg_.global_rank);
  const bool lost = seen.kind() == Error::Kind::PeerLost;
  if (!lost && seen.kind() != Error::Kind::Timeout) return mine;
  bool remote = false;
  for (const net::Control& c : control_) {
    const auto& r = seen.ranks();
    remote = remote || std::find(r.begin(), r.end(), c.peer()) != r.end();
  }
  // A local rank seen dead is a root cause: nothing to hear from the other hosts.
  if (!remote) return mine;
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(lost ? std::min(cfg_.timeout_ms, kNoticeWaitMs) : 0);
  Failure heard;
  do {
    if (seg_->failure(heard)) return heard;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (std::chrono::steady_clock::now() < until);
  return mine;
}

// Whether a peer that closes its connections without a word died or had
// completed its part is left to the ranks that need its bytes (their data
// connection reports it) and to its own host (which sees its counters): a
// rank that sent its part of the last collective and exited (os._exit, no
// goodbye) has completed it.
void Comm::watch_peers() {
  for (;;) {
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
    std::vector<net::Control*> watched;
    for (net::Control& c : control_) {
      if (c.fd() < 0 || c.closed() || c.failure()) continue;
      fds.push_back({c.fd(), POLLIN, 0});
      watched.push_back(&c);
    }
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;
    for (std::size_t i = 0; i < watched.size(); ++i) {
      if (fds[i + 1].revents == 0) continue;
      watched[i]->receive(0);
      if (watched[i]->failure()) seg_->abort(*watched[i]->failure());
    }
  }
}

bool Comm::probe_single_copy() {
  const int L = job_.topo.local_size;
  if (L < 2) return false;
  const int peer = (job_.topo.local_rank + 1) % L;
  uint64_t value = 0;
  iovec local{&value, sizeof value};
  iovec remote{reinterpret_cast<void*>(seg_->address(peer)), sizeof value};
  const ssize_t n = process_vm_readv(seg_->pid(peer), &local, 1, &remote, 1, 0);
  return n == (ssize_t)sizeof value && value == probe_word_;
}

void Comm::barrier() {
  int32_t token = 0;
  allreduce(&token, 1, DType::Int32, ReduceOp::Sum, "barrier");
}

}  // namespace shoal
