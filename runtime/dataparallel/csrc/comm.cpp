// Communicator set-up and the collectives built on allreduce (see comm.h).
// The allreduce paths are in allreduce.cpp (inside a host) and interhost.cpp
// (between hosts).
#include "comm.h"

#include <errno.h>
#include <sys/uio.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <thread>

#include "net.h"

namespace shoal {

namespace {

std::string shm_name(const Config& c, int epoch) {
  std::string raw = "shoal-" + c.job_id + "-" + c.host + "-" + std::to_string(epoch);
  std::string name = "/";
  for (char ch : raw) name += std::isalnum((unsigned char)ch) || ch == '-' ? ch : '_';
  return name.substr(0, 250);
}

// How long a rank whose data connection dropped waits for the peer's notice:
// a failing peer sends it before it exits, so it is normally already there.
constexpr int kNoticeWaitMs = 1000;
// How long a silent close is tolerated while this rank waits on its own host.
// A peer that leaves without shutdown() (os._exit) after its last collective
// looks like a death; the local ranks that still finish that collective need
// no more than a scheduling delay.
constexpr auto kSilentCloseGrace = std::chrono::milliseconds(1000);


}  // namespace

Comm::Comm(const Config& config, int epoch) : cfg_(config) {
  if (cfg_.size == 1) {
    job_.topo.host = cfg_.host;
    return;
  }
  job_ = rendezvous(cfg_);
  try {
    const Topology& t = job_.topo;
    std::vector<LocalPeer> peers;
    for (int r : job_.host_ranks[t.host_index]) peers.push_back({r, job_.table[r].pid});
    const std::string name = shm_name(cfg_, epoch);
    if (t.local_rank == 0)
      seg_ = std::make_unique<HostSegment>(name, true, 0, peers, cfg_.chunk_bytes, cfg_.depth, cfg_.timeout_ms);
    job_.barrier(cfg_.timeout_ms);
    if (t.local_rank != 0)
      seg_ = std::make_unique<HostSegment>(name, false, t.local_rank, peers, cfg_.chunk_bytes,
                                           cfg_.depth, cfg_.timeout_ms);
    job_.barrier(cfg_.timeout_ms);
    if (t.local_rank == 0) seg_->unlink();
    // Single copy only if every local rank can read its peers (containers may forbid it).
    probe_word_ = 0x5348304C50524F42ull;
    seg_->set_address(reinterpret_cast<uint64_t>(&probe_word_));
    job_.barrier(cfg_.timeout_ms);
    seg_->set_can_read(probe_single_copy());
    job_.barrier(cfg_.timeout_ms);
    // Large messages read peers directly, on one host and across hosts alike.
    single_copy_ = cfg_.single_copy_bytes > 0;
    for (int j = 0; j < t.local_size; ++j) single_copy_ = single_copy_ && seg_->can_read(j);
  } catch (...) {
    if (seg_ && job_.topo.local_rank == 0) seg_->unlink();  // never leak the name
    job_.close_all();
    throw;
  }
  // The rendezvous connections are only needed for setup.
  net::close_fd(job_.master_fd);
  job_.master_fd = -1;
  for (int& fd : job_.member_fds) net::close_fd(fd), fd = -1;
  for (std::size_t h = 0; h < job_.control.size(); ++h)
    control_.emplace_back(job_.control[h], job_.host_ranks[h][job_.topo.local_rank]);
  if (!control_.empty()) seg_->set_watch([this] { watch_peers(); });
}

Comm::~Comm() {
  // Peers on other hosts tell a clean shutdown from a death by this.
  for (const net::Control& c : control_) net::send_goodbye(c.fd());
  job_.close_all();
}

Error Comm::fail(const Error& seen) {
  if (!seg_) return seen;
  const int me = job_.topo.rank;
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
// connection before it exited. A killed peer closes both without a word, and
// then it is the root cause itself.
Failure Comm::root_cause(const Error& seen) {
  Failure mine = Failure::of(seen, job_.topo.rank);
  const bool lost = seen.kind() == Error::Kind::PeerLost;
  if (!lost && seen.kind() != Error::Kind::Timeout) return mine;
  for (net::Control& c : control_) {
    if (c.fd() < 0) continue;
    const auto& r = seen.ranks();
    const bool named = std::find(r.begin(), r.end(), c.peer()) != r.end();
    // A local rank seen dead is a root cause: nothing to ask the other hosts.
    if (lost && !named) continue;
    c.receive(lost ? std::min(cfg_.timeout_ms, kNoticeWaitMs) : 0);
    if (c.failure()) return *c.failure();
  }
  return mine;
}

// Runs while this rank waits, in shared memory or on TCP (through
// HostSegment::check_abort): a failure on another host reaches this host even
// when no local rank is talking to that host at the time.
void Comm::watch_peers() {
  for (net::Control& c : control_) {
    if (c.fd() < 0) continue;
    c.receive(0);
    if (c.failure()) {
      seg_->abort(*c.failure());
    } else if (c.closed() && !c.goodbye() &&
               std::chrono::steady_clock::now() - c.closed_at() > kSilentCloseGrace) {
      const int p = c.peer();
      seg_->abort({Error::Kind::PeerLost, {p},
                   "connection to rank " + std::to_string(p) + " on host '" +
                       job_.table[p].host + "' lost (its process exited)",
                   job_.topo.rank});
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

void Comm::reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  if (root < 0 || root >= cfg_.size)
    throw Error(Error::Kind::Usage, "reduce: root " + std::to_string(root) + " is not a rank");
  if (cfg_.size == 1) return;
  if (cfg_.rank == root) return allreduce(data, count, dtype, op, "reduce");
  std::vector<char> copy(static_cast<char*>(data), static_cast<char*>(data) + count * dtype_size(dtype));
  allreduce(copy.data(), count, dtype, op, "reduce");
}

void Comm::barrier() {
  int32_t token = 0;
  allreduce(&token, 1, DType::Int32, ReduceOp::Sum, "barrier");
}

}  // namespace shoal
