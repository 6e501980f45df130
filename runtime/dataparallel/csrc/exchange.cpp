// Reduce-scatter, reduce, all-to-all, gather and scatter (see comm.h): each
// moves only the bytes its result needs.
//
// Reduce-scatter (and reduce, its first half) reads peers' buffers directly
// inside a host: local rank j reduces, from every local buffer, the blocks of
// the ranks with local rank j on every host (one column), in local-rank order;
// across hosts each host's partial of a block goes once to the host that owns
// it, over the same-local-rank mesh, and is folded in host order. Every rank
// thus reads (L - 1) blocks per host and sends (H - 1) partials: half of what
// an allreduce moves. Where peers' memory cannot be read, it falls back to an
// allreduce of a copy.
//
// All-to-all, gather and scatter are point-to-point transfers on the
// communicator's own tag (inside a host read in place from the sender's buffer
// into the receiver's), all posted before any is waited for.
#include "comm.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "kernels.h"
#include "net.h"
#include "slicing.h"

namespace shoal {

namespace {
// Tags below zero are the communicator's own; users' tags are >= 0.
constexpr int kCollectiveTag = -2;

// Waits for every handle (none is left reading or writing a buffer), then
// returns the first error.
std::exception_ptr settle_all(std::vector<WorkPtr>& handles) {
  std::exception_ptr first;
  for (auto& h : handles) {
    try {
      h->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  return first;
}

void wait_all(std::vector<WorkPtr>& handles) {
  if (auto error = settle_all(handles)) std::rethrow_exception(error);
}
}  // namespace

// Every rank's `send` holds the blocks of all ranks (`blocks`, element ranges
// by rank); `out` receives this rank's reduced block.
//
// The partials bound for other hosts are staged for this call only: they are
// as large as the message (a block per host), unlike an allreduce's batches
// of chunks, and a buffer kept for the next call would stay resident between
// steps. A rank alone on its host stages nothing it can avoid: its partials
// are its own buffer, sent from where they lie, and one other host's partial
// of its block arrives straight into `out` (its own stays in `send`).
void Comm::reduce_blocks(const char* send, char* out, const std::vector<Range>& blocks,
                         DType dtype, ReduceOp op, const std::string& name) {
  const Topology& t = job_.topo;
  const int L = t.local_size, me = t.local_rank, H = t.num_hosts, host = t.host_index;
  const std::size_t es = dtype_size(dtype);
  const int divisor = op == ReduceOp::Average ? t.size : 1;
  const Range mine = blocks[t.rank];
  const uint64_t g = ++chunks_;
  if (L > 1) {
    seg_->set_address(reinterpret_cast<uint64_t>(send));
    seg_->publish(Counter::Posted, g);
    wait_counter(Counter::Posted, g, name);
  }
  // Alone on its host (and `out` apart from `send`), the first other host's
  // partial lands in `out`.
  const std::size_t total = blocks.empty() ? 0 : blocks.back().hi * es;
  const bool into_out = L == 1 && H > 1 && (out + mine.size() * es <= send || out >= send + total);
  const int into_out_from = into_out ? (host == 0 ? 1 : 0) : -1;
  const std::size_t piece = std::max<std::size_t>(1, cfg_.chunk_bytes / es);
  if (L > 1) pieces_.resize((std::size_t)L * piece * es);
  // This call's staging, uninitialised: every byte is written before it is read.
  std::vector<std::unique_ptr<char[]>> staging;
  auto stage = [&](std::size_t bytes) {
    staging.emplace_back(new char[std::max<std::size_t>(1, bytes)]);
    return staging.back().get();
  };
  std::vector<const char*> partial(H);
  std::vector<const void*> srcs(std::max(L, H));
  for (int h = 0; h < H; ++h) {
    const Range b = blocks[job_.host_ranks[h][me]];
    if (L == 1 && (h != host || into_out)) {
      partial[h] = send + b.lo * es;
      continue;
    }
    char* dst = h == host ? out : stage(b.size() * es);
    partial[h] = dst;
    for (std::size_t lo = 0; lo < b.size(); lo += piece) {
      const std::size_t n = std::min(piece, b.size() - lo);
      const std::size_t at = (b.lo + lo) * es;
      for (int j = 0; j < L; ++j) {
        if (j == me) {
          srcs[j] = send + at;
          continue;
        }
        char* buf = pieces_.data() + (std::size_t)j * piece * es;
        read_peer(j, seg_->address(j) + at, buf, n * es, name);
        srcs[j] = buf;
      }
      reduce_into(dtype, op, dst + lo * es, srcs.data(), L, n, H == 1 ? divisor : 1);
    }
  }
  if (L > 1) {  // no local peer reads this rank's buffer any more
    seg_->publish(Counter::Reduced, g);
    wait_counter(Counter::Reduced, g, name);
    seg_->publish(Counter::Gathered, g);
  }
  if (H == 1) return;
  std::vector<net::Transfer> xfer;
  for (int h = 0; h < H; ++h) {
    if (h == host) {
      srcs[h] = partial[h];
      continue;
    }
    const int peer = job_.global(job_.host_ranks[h][me]);
    char* into = h == into_out_from ? out : stage(mine.size() * es);
    srcs[h] = into;
    xfer.push_back({job_.mesh[h], const_cast<char*>(partial[h]),
                    blocks[job_.host_ranks[h][me]].size() * es, true, peer});
    xfer.push_back({job_.mesh[h], into, mine.size() * es, false, peer});
  }
  net::run(xfer, cfg_.timeout_ms, name, [this] { seg_->check_abort(); }, cfg_.timeout_note);
  reduce_into(dtype, op, out, srcs.data(), H, mine.size(), divisor);
}

bool Comm::reads_peers() const { return job_.topo.local_size == 1 || single_copy_; }

void Comm::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype,
                          ReduceOp op) {
  const std::size_t es = dtype_size(dtype);
  const int size = cfg_.size;
  if (size == 1) return (void)std::memmove(recv, send, count * es);
  if (count == 0) return;
  if (!reads_peers()) {  // an allreduce of a copy; this rank keeps its block
    std::vector<char> all(static_cast<const char*>(send),
                          static_cast<const char*>(send) + count * es * size);
    allreduce(all.data(), count * size, dtype, op, "reduce_scatter");
    return (void)std::memcpy(recv, all.data() + cfg_.rank * count * es, count * es);
  }
  std::vector<Range> blocks(size);
  for (int r = 0; r < size; ++r) blocks[r] = {r * count, (r + 1) * count};
  reduce_blocks(static_cast<const char*>(send), static_cast<char*>(recv), blocks, dtype, op,
                "reduce_scatter");
}

// The reduce-scatter of balanced blocks, then the blocks to the root.
void Comm::reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) {
  if (root < 0 || root >= cfg_.size)
    throw Error(Error::Kind::Usage, "reduce: root " + std::to_string(root) + " is not a rank");
  if (cfg_.size == 1 || count == 0) return;
  const std::size_t es = dtype_size(dtype);
  char* base = static_cast<char*>(data);
  if (!reads_peers()) {
    if (cfg_.rank == root) return allreduce(data, count, dtype, op, "reduce");
    std::vector<char> copy(base, base + count * es);
    return allreduce(copy.data(), count, dtype, op, "reduce");
  }
  std::vector<Range> blocks(cfg_.size);
  for (int r = 0; r < cfg_.size; ++r) blocks[r] = part(count, cfg_.size, r, es);
  const Range mine = blocks[cfg_.rank];
  std::vector<char> block(mine.size() * es);
  reduce_blocks(base, block.data(), blocks, dtype, op, "reduce");
  std::vector<WorkPtr> handles;
  if (cfg_.rank != root) {
    if (!block.empty()) handles.push_back(p2p().send(block.data(), block.size(), root, kCollectiveTag));
  } else {
    for (int r = 0; r < cfg_.size; ++r)
      if (r != root && blocks[r].size() > 0)
        handles.push_back(p2p().recv(base + blocks[r].lo * es, blocks[r].size() * es, r, kCollectiveTag));
  }
  wait_all(handles);
  if (cfg_.rank == root && !block.empty()) std::memcpy(base + mine.lo * es, block.data(), block.size());
}

void Comm::alltoall(const char* send, const std::vector<std::size_t>& send_counts,
                    const std::vector<std::size_t>& send_offsets, char* recv,
                    const std::vector<std::size_t>& recv_counts,
                    const std::vector<std::size_t>& recv_offsets) {
  const int me = cfg_.rank;
  // A rank whose own sizes disagree still takes part (the others go on), then fails.
  const bool mismatch = send_counts[me] != recv_counts[me];
  std::vector<WorkPtr> handles;
  for (int r = 0; r < cfg_.size; ++r)
    if (r != me && recv_counts[r] > 0)
      handles.push_back(p2p().recv(recv + recv_offsets[r], recv_counts[r], r, kCollectiveTag));
  for (int k = 1; k < cfg_.size; ++k) {  // staggered, so that ranks do not all start at rank 0
    const int r = (me + k) % cfg_.size;
    if (send_counts[r] > 0)
      handles.push_back(p2p().send(send + send_offsets[r], send_counts[r], r, kCollectiveTag));
  }
  if (!mismatch) std::memmove(recv + recv_offsets[me], send + send_offsets[me], send_counts[me]);
  const std::exception_ptr error = settle_all(handles);
  if (error && !mismatch) std::rethrow_exception(error);
  if (mismatch) {
    const std::string r = std::to_string(job_.global(me));
    throw Error(Error::Kind::Usage, "alltoall: rank " + r + " sent " + std::to_string(send_counts[me]) +
                                        " bytes to rank " + r + ", which expected " +
                                        std::to_string(recv_counts[me]));
  }
}

void Comm::gather(const void* send, void* recv, std::size_t bytes, int root) {
  char* out = static_cast<char*>(recv);
  std::vector<WorkPtr> handles;
  if (cfg_.rank == root) {
    for (int r = 0; r < cfg_.size; ++r)
      if (r != root && bytes > 0) handles.push_back(p2p().recv(out + r * bytes, bytes, r, kCollectiveTag));
    std::memmove(out + root * bytes, send, bytes);
  } else if (bytes > 0) {
    handles.push_back(p2p().send(send, bytes, root, kCollectiveTag));
  }
  wait_all(handles);
}

void Comm::scatter(const void* send, void* recv, std::size_t bytes, int root) {
  const char* in = static_cast<const char*>(send);
  std::vector<WorkPtr> handles;
  if (cfg_.rank == root) {
    for (int r = 0; r < cfg_.size; ++r)
      if (r != root && bytes > 0) handles.push_back(p2p().send(in + r * bytes, bytes, r, kCollectiveTag));
    std::memmove(recv, in + root * bytes, bytes);
  } else if (bytes > 0) {
    handles.push_back(p2p().recv(recv, bytes, root, kCollectiveTag));
  }
  wait_all(handles);
}

}  // namespace shoal
