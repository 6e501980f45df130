// Allreduce between hosts (see comm.h): each local rank exchanges its slice
// with the ranks of the same local rank on the other hosts, over TCP.
#include "comm.h"

#include <cstring>

#include "kernels.h"
#include "net.h"
#include "slicing.h"

namespace shoal {

void Comm::exchange_whole(char* buf, std::size_t n, DType dtype, ReduceOp op, int divisor,
                          const std::string& name) {
  const Topology& t = job_.topo;
  const int H = t.num_hosts, me = t.host_index;
  const std::size_t bytes = n * dtype_size(dtype);
  if (scratch_.size() < bytes * H) scratch_.resize(bytes * H);
  std::vector<net::Transfer> xfer;
  std::vector<const void*> srcs(H);
  for (int h = 0; h < H; ++h) {
    srcs[h] = h == me ? static_cast<const void*>(buf) : scratch_.data() + h * bytes;
    if (h == me) continue;
    const int peer = job_.global(job_.host_ranks[h][t.local_rank]);
    xfer.push_back({job_.mesh[h], buf, bytes, true, peer});
    xfer.push_back({job_.mesh[h], scratch_.data() + h * bytes, bytes, false, peer});
  }
  net::run(xfer, cfg_.timeout_ms, name, [this] { seg_->check_abort(); }, cfg_.timeout_note);
  reduce_into(dtype, op, buf, srcs.data(), H, n, divisor);
}

void Comm::inter_host(const std::vector<Slice>& slices, DType dtype, ReduceOp op, int divisor,
                      const std::string& name) {
  const Topology& t = job_.topo;
  const int H = t.num_hosts, me = t.host_index;
  const std::size_t es = dtype_size(dtype);
  out_.resize(H);
  in_.resize(H);
  auto peer = [&](int h) { return job_.global(job_.host_ranks[h][t.local_rank]); };
  auto bytes_of = [&](int h) {
    std::size_t b = 0;
    for (const Slice& s : slices) b += part(s.count, H, h, es).size() * es;
    return b;
  };
  // One slice (the single-copy path): its parts go out and come back in
  // place, without staging copies.
  const bool one = slices.size() == 1;
  auto in_place = [&](int h) { return slices[0].data + part(slices[0].count, H, h, es).lo * es; };
  // Phase 1: part h of every slice to host h; every host's copy of my part back.
  std::vector<net::Transfer> xfer;
  for (int h = 0; h < H; ++h) {
    if (h == me) continue;
    in_[h].resize(bytes_of(me));
    if (one) {
      xfer.push_back({job_.mesh[h], in_place(h), bytes_of(h), true, peer(h)});
      xfer.push_back({job_.mesh[h], in_[h].data(), in_[h].size(), false, peer(h)});
      continue;
    }
    out_[h].resize(bytes_of(h));
    std::size_t off = 0;
    for (const Slice& s : slices) {
      const Range r = part(s.count, H, h, es);
      std::memcpy(out_[h].data() + off, s.data + r.lo * es, r.size() * es);
      off += r.size() * es;
    }
    xfer.push_back({job_.mesh[h], out_[h].data(), out_[h].size(), true, peer(h)});
    xfer.push_back({job_.mesh[h], in_[h].data(), in_[h].size(), false, peer(h)});
  }
  auto check = [this] { seg_->check_abort(); };
  net::run(xfer, cfg_.timeout_ms, name, check, cfg_.timeout_note);
  // My part of each slice, reduced in host order; packed for phase 2.
  if (!one) out_[me].resize(bytes_of(me));
  std::vector<const void*> srcs(H);
  std::size_t off = 0;
  for (const Slice& s : slices) {
    const Range own = part(s.count, H, me, es);
    for (int h = 0; h < H; ++h)
      srcs[h] = h == me ? static_cast<const void*>(s.data + own.lo * es) : in_[h].data() + off;
    reduce_into(dtype, op, s.data + own.lo * es, srcs.data(), H, own.size(), divisor);
    if (!one) std::memcpy(out_[me].data() + off, s.data + own.lo * es, own.size() * es);
    off += own.size() * es;
  }
  // Phase 2: my reduced parts to every host; theirs into the slices.
  xfer.clear();
  for (int h = 0; h < H; ++h) {
    if (h == me) continue;
    if (one) {
      xfer.push_back({job_.mesh[h], in_place(me), bytes_of(me), true, peer(h)});
      xfer.push_back({job_.mesh[h], in_place(h), bytes_of(h), false, peer(h)});
      continue;
    }
    in_[h].resize(bytes_of(h));
    xfer.push_back({job_.mesh[h], out_[me].data(), out_[me].size(), true, peer(h)});
    xfer.push_back({job_.mesh[h], in_[h].data(), in_[h].size(), false, peer(h)});
  }
  net::run(xfer, cfg_.timeout_ms, name, check, cfg_.timeout_note);
  if (one) return;
  for (int h = 0; h < H; ++h) {
    if (h == me) continue;
    std::size_t pos = 0;
    for (const Slice& s : slices) {
      const Range r = part(s.count, H, h, es);
      std::memcpy(s.data + r.lo * es, in_[h].data() + pos, r.size() * es);
      pos += r.size() * es;
    }
  }
}

}  // namespace shoal
