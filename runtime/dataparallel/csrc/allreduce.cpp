// Allreduce inside a host, and the local stages of allreduce across hosts.
//
// Large allreduces (SHOAL_SINGLE_COPY_BYTES and up) take the single-copy path
// when every local rank may read its peers' memory (process_vm_readv, probed
// at init), or when the group has one rank per host (nothing to read): each
// rank reduces its slice straight from its peers' buffers, in cache-sized
// pieces; across hosts each batch of reduced pieces goes to the
// other hosts while it is still in cache (interhost.cpp); then every rank
// copies the other slices from their owners' buffers. Otherwise, and for
// smaller messages, allreduce works per chunk of at most SHOAL_SHM_CHUNK_BYTES:
//   1. copy: each local rank copies its chunk into its slot of the segment
//      (on one host, all but its own slice: it reduces that from its buffer);
//   2. reduce: small messages (SHOAL_SMALL_BYTES) take a single handshake:
//      every rank reduces the whole chunk from all slots. Otherwise each local
//      rank reduces its own slice of the chunk, in local-rank order
//      (reduce-scatter);
//   3. across hosts, each local rank exchanges only its slice with the ranks of
//      the same local rank on the other hosts (balanced, as Herring does): the
//      slice is split in one part per host, each host reduces its part in host
//      order and sends it back;
//   4. gather: every rank copies the other reduced slices out.
// The stages are pipelined over SHOAL_SHM_DEPTH slot sets: a rank that would
// wait for a peer copies further chunks ahead instead, and sleeps only when no
// stage of any chunk can proceed. A rank that runs while its peers are
// descheduled (ranks share cores with each other and with the framework)
// thus does a window of work per wake-up instead of one chunk.
// Fixed reduction orders make the bits independent of timing and identical on
// every rank.
#include "comm.h"

#include <algorithm>
#include <errno.h>
#include <sys/uio.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "kernels.h"
#include "slicing.h"

namespace shoal {

namespace {
constexpr int kHot = 4;
}  // namespace

void Comm::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, const char* name) {
  if (cfg_.size == 1 || count == 0) return;
  const Topology& t = job_.topo;
  const int L = t.local_size, me = t.local_rank;
  const std::size_t es = dtype_size(dtype);
  // A group with one rank per host has no peer to read: its buffer goes to the other
  // hosts straight from the caller's memory, never through the segment's slots (which
  // would stay resident, depth x chunk bytes, once a large allreduce cycled them).
  const bool alone = L == 1 && cfg_.single_copy_bytes > 0;
  if ((single_copy_ || alone) && count * es >= cfg_.single_copy_bytes)
    return allreduce_single_copy(static_cast<char*>(data), count, dtype, op, name);
  const std::size_t per_chunk = cfg_.chunk_bytes / es;
  const uint64_t g0 = chunks_, end = g0 + (count + per_chunk - 1) / per_chunk;
  // Averages divide once, at the stage that completes the sum.
  const int divisor = op == ReduceOp::Average ? t.size : 1;
  const bool whole = count * es <= cfg_.small_bytes;
  // One host: a rank's own slice never goes through the segment; it reduces
  // from its buffer and posts only what the peers reduce (one copy less).
  const bool direct = t.num_hosts == 1 && !whole;
  char* base = static_cast<char*>(data);
  const Plan p = plan(g0, (std::size_t)(end - g0));
  auto set = [&](uint64_t g) { return p.set[g - g0]; };
  auto at = [&](uint64_t g) { return base + (g - g0) * per_chunk * es; };
  // Across hosts, slices travel in batches of whole chunks (fewer round trips,
  // each a wake-up of a peer); batch boundaries are fixed so that peers agree.
  const uint64_t batch =
      t.num_hosts > 1 && !whole ? std::min<uint64_t>(cfg_.batch_chunks, seg_->depth()) : 1;
  auto reduce_until = [&](uint64_t g) { return std::min(end, g0 + ((g - g0) / batch + 1) * batch); };
  auto len = [&](uint64_t g) { return std::min(per_chunk, count - (g - g0) * per_chunk); };
  // Posts a chunk into this rank's slot (direct: all but its own slice).
  auto post = [&](uint64_t g) {
    const std::size_t n = len(g);
    if (!direct) return (void)std::memcpy(seg_->slot(set(g), me), at(g), n * es);
    for (int j = 0; j < L; ++j) {
      const Range r = part(n, L, j, es);
      if (j != me) std::memcpy(seg_->slot(set(g), me) + r.lo * es, at(g) + r.lo * es, r.size() * es);
    }
  };
  std::vector<const void*> srcs(L);
  uint64_t copy = g0, reduce = g0, gather = g0;  // the next chunk of each stage
  auto since = std::chrono::steady_clock::now();
  const std::string op_name = name;
  // Later stages first, so that a chunk is finished while it is still in cache;
  // a rank copies ahead only while it would otherwise wait.
  while (gather < end) {
    const uint32_t seen = seg_->version();
    if (gather < reduce && seg_->min(Counter::Reduced) > gather) {
      const std::size_t n = len(gather);
      for (int j = 0; j < L; ++j) {
        if (direct && j == me) continue;
        const Range r = part(n, L, j, es);
        std::memcpy(at(gather) + r.lo * es, seg_->slot(set(gather), j) + r.lo * es, r.size() * es);
      }
      seg_->publish(Counter::Gathered, ++gather);
    } else if (reduce < copy && seg_->min(Counter::Posted) >= reduce_until(reduce)) {
      if (whole) {
        const std::size_t n = len(reduce);
        for (int j = 0; j < L; ++j) srcs[j] = seg_->slot(set(reduce), j);
        reduce_into(dtype, op, at(reduce), srcs.data(), L, n, t.num_hosts == 1 ? divisor : 1);
        gather = ++reduce;
        seg_->publish(Counter::Gathered, gather);
        // Small messages across hosts: every local rank exchanges the whole
        // host sum with its peers (one round trip, no second local handshake).
        if (t.num_hosts > 1) exchange_whole(at(reduce - 1), n, dtype, op, divisor, op_name);
      } else {
        const uint64_t until = reduce_until(reduce);
        std::vector<Slice> slices;
        for (; reduce < until && direct; ++reduce) {
          const Range mine = part(len(reduce), L, me, es);
          char* own = at(reduce) + mine.lo * es;
          for (int j = 0; j < L; ++j)
            srcs[j] = j == me ? own : seg_->slot(set(reduce), j) + mine.lo * es;
          reduce_into(dtype, op, own, srcs.data(), L, mine.size(), divisor,
                      seg_->slot(set(reduce), me) + mine.lo * es);
        }
        for (; reduce < until; ++reduce) {
          const Range mine = part(len(reduce), L, me, es);
          char* out = seg_->slot(set(reduce), me) + mine.lo * es;
          for (int j = 0; j < L; ++j) srcs[j] = seg_->slot(set(reduce), j) + mine.lo * es;
          reduce_into(dtype, op, out, srcs.data(), L, mine.size(), t.num_hosts == 1 ? divisor : 1);
          slices.push_back({out, mine.size()});
        }
        if (t.num_hosts > 1) inter_host(slices, dtype, op, divisor, op_name);
        seg_->publish(Counter::Reduced, reduce);
      }
    } else if (copy < end && set_free(p.previous[copy - g0])) {
      post(copy);
      seg_->publish(Counter::Posted, ++copy);
    } else {
      const uint64_t needs = copy < end ? p.previous[copy - g0] : kUnused;
      const uint64_t posted_needs = reduce < copy ? reduce_until(reduce) : 0;
      seg_->wait_change(seen, lagging(copy, posted_needs, gather < reduce ? gather + 1 : 0, end, needs),
                        op_name, since);
      continue;
    }
    since = std::chrono::steady_clock::now();
  }
  chunks_ = end;
}

// Operations of at most kHot chunks cycle through the same few slot sets, so
// their slots stay in cache; larger ones use the whole window. Every rank
// computes the same plan, so all agree on which chunk uses which set.
Comm::Plan Comm::plan(uint64_t first_chunk, std::size_t chunks) {
  const int limit = chunks <= (std::size_t)kHot ? std::min(kHot, (int)seg_->depth()) : (int)seg_->depth();
  if (last_use_.empty()) last_use_.assign(seg_->depth(), kUnused);
  Plan p;
  p.set.resize(chunks);
  p.previous.resize(chunks);
  for (std::size_t i = 0; i < chunks; ++i) {
    const int s = (int)((next_set_ + i) % (std::size_t)limit);
    p.set[i] = s;
    p.previous[i] = last_use_[s];
    last_use_[s] = first_chunk + i;
  }
  next_set_ = (int)((next_set_ + chunks) % (std::size_t)limit);
  return p;
}

// The local ranks this rank is waiting for: those behind in the earliest
// blocked stage (a rank that never posted also holds up every later stage).
// `posted_needs`/`reduced_needs` are 0 when that stage is not blocked.
std::vector<int> Comm::lagging(uint64_t copy, uint64_t posted_needs, uint64_t reduced_needs,
                               uint64_t end, uint64_t copy_needs) const {
  std::vector<int> stage[3];
  for (int j = 0; j < seg_->local_size(); ++j) {
    if (j == job_.topo.local_rank) continue;
    if (seg_->get(Counter::Posted, j) < posted_needs) stage[0].push_back(j);
    if (seg_->get(Counter::Reduced, j) < reduced_needs) stage[1].push_back(j);
    if (copy < end && copy_needs != kUnused && seg_->get(Counter::Gathered, j) <= copy_needs)
      stage[2].push_back(j);
  }
  for (auto& s : stage)
    if (!s.empty()) return s;
  return {};
}

void Comm::read_peer(int local, uint64_t remote, void* into, std::size_t bytes,
                     const std::string& name) {
  char* dst = static_cast<char*>(into);
  while (bytes > 0) {
    iovec l{dst, bytes};
    iovec r{reinterpret_cast<void*>(remote), bytes};
    const ssize_t n = process_vm_readv(seg_->pid(local), &l, 1, &r, 1, 0);
    if (n <= 0) peer_read_failed(local, n < 0 ? errno : EFAULT, name);
    dst += n, remote += (uint64_t)n, bytes -= (std::size_t)n;
  }
}

// A peer's buffer stays mapped until every rank gathered, so a failed read
// means the peer is dying (its memory is torn down before it becomes a
// zombie: EFAULT or ESRCH) or aborted. Wait briefly for either to show.
[[noreturn]] void Comm::peer_read_failed(int local, int err, const std::string& name) {
  const int rank = seg_->global_rank(local);
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(std::min(cfg_.timeout_ms, 5000));
  do {
    seg_->check_abort();
    seg_->check_liveness({local}, name, seg_->version());
    if (err == ESRCH)  // the process no longer exists
      throw Error(Error::Kind::PeerLost, name + ": rank " + std::to_string(rank) + " exited", {rank});
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (std::chrono::steady_clock::now() < until);
  throw Error(Error::Kind::System, name + ": reading rank " + std::to_string(rank) +
                                       "'s buffer failed: " + std::strerror(err), {rank});
}

void Comm::wait_counter(Counter which, uint64_t target, const std::string& name) {
  const auto since = std::chrono::steady_clock::now();
  for (;;) {
    const uint32_t seen = seg_->version();
    if (seg_->min(which) >= target) return;
    std::vector<int> behind;
    for (int j = 0; j < seg_->local_size(); ++j)
      if (j != job_.topo.local_rank && seg_->get(which, j) < target) behind.push_back(j);
    seg_->wait_change(seen, behind, name, since);
  }
}

// Large messages, when local ranks may read each other's memory (or a rank is
// alone on its host): each rank reduces its slice straight from its peers'
// buffers (through cache-sized pieces), then copies the other slices from their
// owners' buffers. One copy of the data instead of three, and three handshakes
// per operation.
void Comm::allreduce_single_copy(char* data, std::size_t count, DType dtype, ReduceOp op,
                                 const std::string& name) {
  const Topology& t = job_.topo;
  const int L = t.local_size, me = t.local_rank;
  const std::size_t es = dtype_size(dtype);
  const uint64_t g = ++chunks_;  // one step of the counters
  seg_->set_address(reinterpret_cast<uint64_t>(data));
  seg_->publish(Counter::Posted, g);
  wait_counter(Counter::Posted, g, name);
  const Range mine = part(count, L, me, es);
  const std::size_t piece = std::max<std::size_t>(1, cfg_.chunk_bytes / es);
  pieces_.resize((std::size_t)L * piece * es);
  std::vector<const void*> srcs(L);
  // Across hosts, the reduced pieces travel in batches (as in the chunk path)
  // while the local peers keep reducing theirs.
  const int H = t.num_hosts;
  const uint64_t batch = std::max<uint64_t>(1, cfg_.batch_chunks);
  uint64_t batched = 0;
  Slice pending{nullptr, 0};
  for (std::size_t lo = mine.lo; lo < mine.hi; lo += piece) {
    const std::size_t n = std::min(piece, mine.hi - lo);
    if (L > 1) {  // alone on its host, the buffer already holds the host's sum
      for (int j = 0; j < L; ++j) {
        if (j == me) {
          srcs[j] = data + lo * es;
          continue;
        }
        char* buf = pieces_.data() + (std::size_t)j * piece * es;
        read_peer(j, seg_->address(j) + lo * es, buf, n * es, name);
        srcs[j] = buf;
      }
      reduce_into(dtype, op, data + lo * es, srcs.data(), L, n,
                  op == ReduceOp::Average && H == 1 ? t.size : 1);
    }
    if (H == 1) continue;
    // Batch boundaries depend only on the slice, so the peers on other hosts
    // agree; a batch leaves while it is still in cache.
    if (batched == 0) pending = {data + lo * es, 0};
    pending.count += n;
    if (++batched == batch || lo + piece >= mine.hi) {
      inter_host({pending}, dtype, op, op == ReduceOp::Average ? t.size : 1, name);
      batched = 0;
    }
  }
  seg_->publish(Counter::Reduced, g);
  wait_counter(Counter::Reduced, g, name);
  for (int j = 0; j < L; ++j) {
    if (j == me) continue;
    const Range r = part(count, L, j, es);
    read_peer(j, seg_->address(j) + r.lo * es, data + r.lo * es, r.size() * es, name);
  }
  seg_->publish(Counter::Gathered, g);
  // The caller may reuse the buffer on return: wait until no peer reads it.
  wait_counter(Counter::Gathered, g, name);
}

}  // namespace shoal
