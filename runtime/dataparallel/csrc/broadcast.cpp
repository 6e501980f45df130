// Broadcast (see comm.h): root's bytes travel once, never through a sum.
//
// Across hosts, root sends each block to the rank of the same local rank on
// every other host (its host's local root); inside each host, the local root
// posts the block's chunks into its slots and the other local ranks copy them
// out, pipelined over the slot sets. Blocks keep the local stage close behind
// the network: the local ranks of another host start after one block, not
// after the whole buffer.
#include "comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "net.h"

namespace shoal {

namespace {
constexpr std::size_t kBlockBytes = 4u << 20;
}  // namespace

void Comm::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= cfg_.size)
    throw Error(Error::Kind::Usage, "broadcast: root " + std::to_string(root) + " is not a rank");
  if (cfg_.size == 1 || bytes == 0) return;
  const Topology& t = job_.topo;
  int root_host = 0, local_root = 0;
  for (int h = 0; h < t.num_hosts; ++h) {
    const auto& ranks = job_.host_ranks[h];
    const auto it = std::find(ranks.begin(), ranks.end(), root);
    if (it != ranks.end()) root_host = h, local_root = (int)(it - ranks.begin());
  }
  char* base = static_cast<char*>(data);
  for (std::size_t lo = 0; lo < bytes; lo += kBlockBytes) {
    const std::size_t n = std::min(kBlockBytes, bytes - lo);
    if (t.num_hosts > 1 && t.local_rank == local_root) {
      std::vector<net::Transfer> xfer;
      for (int h = 0; h < t.num_hosts; ++h) {
        const int peer = job_.global(job_.host_ranks[h][local_root]);
        if (cfg_.rank == root && h != root_host)
          xfer.push_back({job_.mesh[h], base + lo, n, true, peer});
        else if (cfg_.rank != root && h == root_host)
          xfer.push_back({job_.mesh[h], base + lo, n, false, peer});
      }
      net::run(xfer, cfg_.timeout_ms, "broadcast", [this] { seg_->check_abort(); }, cfg_.timeout_note);
    }
    if (t.local_size > 1) local_broadcast(base + lo, n, local_root);
  }
}

// The counters keep their meaning for the other collectives: every rank ends
// with Posted, Reduced and Gathered at the same chunk count.
void Comm::local_broadcast(char* data, std::size_t bytes, int local_root) {
  const int me = job_.topo.local_rank;
  const std::size_t per = cfg_.chunk_bytes;
  const uint64_t g0 = chunks_, end = g0 + (bytes + per - 1) / per;
  const Plan p = plan(g0, (std::size_t)(end - g0));
  auto chunk = [&](uint64_t g) { return data + (g - g0) * per; };
  auto len = [&](uint64_t g) { return std::min(per, bytes - (g - g0) * per); };
  const std::string name = "broadcast";
  auto since = std::chrono::steady_clock::now();
  if (me != local_root) seg_->publish(Counter::Posted, end);
  seg_->publish(Counter::Reduced, end);
  for (uint64_t g = g0; g < end;) {
    const uint32_t seen = seg_->version();
    char* slot = seg_->slot(p.set[g - g0], local_root);
    const uint64_t previous = p.previous[g - g0];
    std::vector<int> behind;
    if (me == local_root) {
      if (set_free(previous)) {
        std::memcpy(slot, chunk(g), len(g));
        ++g;
        seg_->publish(Counter::Posted, g);
        seg_->publish(Counter::Gathered, g);
        since = std::chrono::steady_clock::now();
        continue;
      }
      for (int j = 0; j < seg_->local_size(); ++j)
        if (seg_->get(Counter::Gathered, j) <= previous) behind.push_back(j);
    } else {
      if (seg_->get(Counter::Posted, local_root) > g) {
        std::memcpy(chunk(g), slot, len(g));
        seg_->publish(Counter::Gathered, ++g);
        since = std::chrono::steady_clock::now();
        continue;
      }
      behind.push_back(local_root);
    }
    seg_->wait_change(seen, behind, name, since);
  }
  chunks_ = end;
}

}  // namespace shoal
