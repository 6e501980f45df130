// Allgather (see comm.h): every block travels once per hop, never through a sum.
//
// Across hosts, each rank first swaps its own block with the ranks of the same
// local rank on the other hosts (one block per host over the mesh). Then, inside
// each host, every rank posts the blocks it holds (its own and those it
// received: one "column" of H blocks) chunk by chunk into its slots, and copies
// the other local ranks' columns out, pipelined over the slot sets.
#include "comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "net.h"

namespace shoal {

void Comm::allgather(const void* send, void* recv, std::size_t bytes_per_rank) {
  const Topology& t = job_.topo;
  char* out = static_cast<char*>(recv);
  const std::size_t B = bytes_per_rank;
  if (out + cfg_.rank * B != send) std::memmove(out + cfg_.rank * B, send, B);
  if (cfg_.size == 1 || B == 0) return;
  if (t.num_hosts > 1) {
    std::vector<net::Transfer> xfer;
    for (int h = 0; h < t.num_hosts; ++h) {
      if (h == t.host_index) continue;
      const int peer = job_.host_ranks[h][t.local_rank];
      xfer.push_back({job_.mesh[h], out + cfg_.rank * B, B, true, job_.global(peer)});
      xfer.push_back({job_.mesh[h], out + (std::size_t)peer * B, B, false, job_.global(peer)});
    }
    net::run(xfer, cfg_.timeout_ms, "allgather", [this] { seg_->check_abort(); }, cfg_.timeout_note);
  }
  if (t.local_size == 1) return;
  // Large gathers read the local peers' columns straight from their buffers.
  if (single_copy_ && B * (std::size_t)cfg_.size >= std::min<std::size_t>(cfg_.single_copy_bytes, 256u << 10))
    return local_allgather_direct(out, B);
  local_allgather(out, B);
}

// Every local rank's column (its blocks from every host) is in place in its
// output: each rank copies the other columns from their owners' outputs (one
// copy), then waits until no peer reads its own.
void Comm::local_allgather_direct(char* out, std::size_t B) {
  const int L = job_.topo.local_size, me = job_.topo.local_rank;
  const std::string name = "allgather";
  const uint64_t g = ++chunks_;
  seg_->set_address(reinterpret_cast<uint64_t>(out));
  seg_->publish(Counter::Posted, g);
  wait_counter(Counter::Posted, g, name);
  for (int k = 1; k < L; ++k) {
    const int j = (me + k) % L;  // staggered: ranks do not all read one peer at once
    for (int h = 0; h < job_.topo.num_hosts; ++h) {
      const std::size_t at = (std::size_t)job_.host_ranks[h][j] * B;
      read_peer(j, seg_->address(j) + at, out + at, B, name);
    }
  }
  seg_->publish(Counter::Reduced, g);
  seg_->publish(Counter::Gathered, g);
  wait_counter(Counter::Gathered, g, name);
}

// Byte `offset` of local rank j's column lives in the block of host
// offset / B; `visit` gets the contiguous pieces of [offset, offset + n).
template <typename Visit>
static void column_pieces(const Job& job, int j, std::size_t B, std::size_t offset, std::size_t n,
                          Visit visit) {
  while (n > 0) {
    const std::size_t h = offset / B, within = offset % B, take = std::min(n, B - within);
    visit((std::size_t)job.host_ranks[h][j] * B + within, take);
    offset += take, n -= take;
  }
}

void Comm::local_allgather(char* out, std::size_t B) {
  const int L = job_.topo.local_size, me = job_.topo.local_rank;
  const std::size_t column = B * (std::size_t)job_.topo.num_hosts, per = cfg_.chunk_bytes;
  const uint64_t g0 = chunks_, end = g0 + (column + per - 1) / per;
  const Plan p = plan(g0, (std::size_t)(end - g0));
  auto len = [&](uint64_t g) { return std::min(per, column - (g - g0) * per); };
  auto slot = [&](uint64_t g, int j) { return seg_->slot(p.set[g - g0], j); };
  const std::string name = "allgather";
  auto since = std::chrono::steady_clock::now();
  seg_->publish(Counter::Reduced, end);
  uint64_t posted = g0, gathered = g0;
  while (gathered < end) {
    const uint32_t seen = seg_->version();
    const uint64_t previous = posted < end ? p.previous[posted - g0] : kUnused;
    if (gathered < posted && seg_->min(Counter::Posted) > gathered) {
      for (int j = 0; j < L; ++j) {
        if (j == me) continue;
        const char* from = slot(gathered, j);
        column_pieces(job_, j, B, (gathered - g0) * per, len(gathered),
                      [&](std::size_t at, std::size_t n) { std::memcpy(out + at, from, n), from += n; });
      }
      seg_->publish(Counter::Gathered, ++gathered);
    } else if (posted < end && set_free(previous)) {
      char* to = slot(posted, me);
      column_pieces(job_, me, B, (posted - g0) * per, len(posted),
                    [&](std::size_t at, std::size_t n) { std::memcpy(to, out + at, n), to += n; });
      seg_->publish(Counter::Posted, ++posted);
    } else {
      std::vector<int> behind;
      for (int j = 0; j < L; ++j) {
        if (j == me) continue;
        const bool waits_post = gathered < posted && seg_->get(Counter::Posted, j) <= gathered;
        const bool waits_slot = posted < end && previous != kUnused &&
                                seg_->get(Counter::Gathered, j) <= previous;
        if (waits_post || waits_slot) behind.push_back(j);
      }
      seg_->wait_change(seen, behind, name, since);
      continue;
    }
    since = std::chrono::steady_clock::now();
  }
  chunks_ = end;
}

}  // namespace shoal
