// Collective algorithms (see comm.h).
//
// allreduce, per chunk of at most SHOAL_SHM_CHUNK_BYTES:
//   1. each local rank copies its chunk into its slot of the shared segment;
//   2. small chunks on one host: every rank reduces the whole chunk from all
//      slots (one handshake). Otherwise each local rank reduces its own slice
//      of the chunk from all slots, in local-rank order (reduce-scatter);
//   3. across hosts, each local rank exchanges only its slice with the ranks of
//      the same local rank on the other hosts (balanced, as Herring does): the
//      slice is split in one part per host, each host reduces its part in host
//      order and sends it back;
//   4. every rank copies all reduced slices out (allgather).
// Fixed reduction orders make the bits independent of timing and identical on
// every rank. Two slot sets alternate, so a rank reuses a slot only after every
// peer has finished reading it (they have posted the next chunk).
#include "comm.h"

#include <algorithm>
#include <cstring>

#include "kernels.h"
#include "net.h"

namespace shoal {

namespace {

std::string shm_name(const Config& c, int epoch) {
  std::string raw = "shoal-" + c.job_id + "-" + c.host + "-" + std::to_string(epoch);
  std::string name = "/";
  for (char ch : raw) name += std::isalnum((unsigned char)ch) || ch == '-' ? ch : '_';
  return name.substr(0, 250);
}

// Slice boundaries: equal parts, rounded to whole cache lines.
struct Range {
  std::size_t lo, hi;
  std::size_t size() const { return hi - lo; }
};
Range part(std::size_t n, int parts, int index, std::size_t esize) {
  const std::size_t align = std::max<std::size_t>(1, 64 / esize);
  std::size_t per = (n + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  return {std::min(n, per * index), std::min(n, per * (index + 1))};
}

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
      seg_ = std::make_unique<HostSegment>(name, true, 0, peers, cfg_.chunk_bytes, cfg_.timeout_ms);
    job_.barrier(cfg_.timeout_ms);
    if (t.local_rank != 0)
      seg_ = std::make_unique<HostSegment>(name, false, t.local_rank, peers, cfg_.chunk_bytes,
                                           cfg_.timeout_ms);
    job_.barrier(cfg_.timeout_ms);
    if (t.local_rank == 0) seg_->unlink();
  } catch (...) {
    job_.close_all();
    throw;
  }
  // The rendezvous connections are only needed for setup.
  net::close_fd(job_.master_fd);
  job_.master_fd = -1;
  for (int& fd : job_.member_fds) net::close_fd(fd), fd = -1;
}

Comm::~Comm() { job_.close_all(); }

void Comm::abort(const Error& error) {
  if (seg_) seg_->abort(error);
}

void Comm::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, const char* name) {
  if (cfg_.size == 1) return;
  const std::size_t esize = dtype_size(dtype);
  const std::size_t per_chunk = cfg_.chunk_bytes / esize;
  char* p = static_cast<char*>(data);
  for (std::size_t done = 0; done < count; done += per_chunk) {
    const std::size_t n = std::min(per_chunk, count - done);
    chunk(p + done * esize, n, dtype, op, name);
  }
}

void Comm::chunk(char* data, std::size_t n, DType dtype, ReduceOp op, const std::string& name) {
  const Topology& t = job_.topo;
  const std::size_t es = dtype_size(dtype);
  const std::size_t bytes = n * es;
  const uint64_t s = step_++;
  const int bs = (int)(s % 2);
  const int L = t.local_size;
  // Averages divide once, at the stage that completes the sum.
  const int divisor = op == ReduceOp::Average ? t.size : 1;
  if (s >= 2) seg_->wait_all(2 * s - 1, name);
  std::memcpy(seg_->slot(bs, t.local_rank), data, bytes);
  seg_->post(2 * s + 1);
  seg_->wait_all(2 * s + 1, name);
  std::vector<const void*> srcs(L);
  if (t.num_hosts == 1 && bytes <= cfg_.small_bytes) {
    for (int j = 0; j < L; ++j) srcs[j] = seg_->slot(bs, j);
    reduce_into(dtype, op, data, srcs.data(), L, n, divisor);
    seg_->post(2 * s + 2);
    return;
  }
  const Range mine = part(n, L, t.local_rank, es);
  char* out = seg_->slot(bs, t.local_rank) + mine.lo * es;
  for (int j = 0; j < L; ++j) srcs[j] = seg_->slot(bs, j) + mine.lo * es;
  reduce_into(dtype, op, out, srcs.data(), L, mine.size(), t.num_hosts == 1 ? divisor : 1);
  if (t.num_hosts > 1) inter_host(out, mine.size(), dtype, op, divisor, name);
  seg_->post(2 * s + 2);
  seg_->wait_all(2 * s + 2, name);
  for (int j = 0; j < L; ++j) {
    const Range r = part(n, L, j, es);
    std::memcpy(data + r.lo * es, seg_->slot(bs, j) + r.lo * es, r.size() * es);
  }
}

void Comm::inter_host(char* slice, std::size_t m, DType dtype, ReduceOp op, int divisor,
                      const std::string& name) {
  const Topology& t = job_.topo;
  const int H = t.num_hosts, me = t.host_index;
  const std::size_t es = dtype_size(dtype);
  const Range own = part(m, H, me, es);
  const std::size_t own_bytes = own.size() * es;
  if (scratch_.size() < own_bytes * H) scratch_.resize(own_bytes * H);
  auto peer_rank = [&](int h) { return job_.host_ranks[h][t.local_rank]; };
  auto check = [this] { seg_->check_abort(); };
  std::vector<net::Transfer> xfer;
  for (int h = 0; h < H; ++h) {
    if (h == me) continue;
    const Range r = part(m, H, h, es);
    xfer.push_back({job_.mesh[h], slice + r.lo * es, r.size() * es, true, peer_rank(h)});
    xfer.push_back({job_.mesh[h], scratch_.data() + h * own_bytes, own_bytes, false, peer_rank(h)});
  }
  net::run(xfer, cfg_.timeout_ms, name, check);
  std::vector<const void*> srcs(H);
  for (int h = 0; h < H; ++h)
    srcs[h] = h == me ? static_cast<const void*>(slice + own.lo * es) : scratch_.data() + h * own_bytes;
  reduce_into(dtype, op, slice + own.lo * es, srcs.data(), H, own.size(), divisor);
  xfer.clear();
  for (int h = 0; h < H; ++h) {
    if (h == me) continue;
    const Range r = part(m, H, h, es);
    xfer.push_back({job_.mesh[h], slice + own.lo * es, own_bytes, true, peer_rank(h)});
    xfer.push_back({job_.mesh[h], slice + r.lo * es, r.size() * es, false, peer_rank(h)});
  }
  net::run(xfer, cfg_.timeout_ms, name, check);
}

void Comm::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= cfg_.size)
    throw Error(Error::Kind::Usage, "broadcast: root " + std::to_string(root) + " is not a rank");
  if (cfg_.size == 1) return;
  // A sum of zeros and root's bytes is root's bytes, bit for bit.
  if (cfg_.rank != root) std::memset(data, 0, bytes);
  allreduce(data, bytes, DType::UInt8, ReduceOp::Sum, "broadcast");
}

void Comm::allgather(const void* send, void* recv, std::size_t bytes_per_rank) {
  std::vector<char> mine(static_cast<const char*>(send),
                         static_cast<const char*>(send) + bytes_per_rank);
  char* out = static_cast<char*>(recv);
  std::memset(out, 0, bytes_per_rank * cfg_.size);
  std::memcpy(out + bytes_per_rank * cfg_.rank, mine.data(), bytes_per_rank);
  if (cfg_.size == 1) return;
  allreduce(out, bytes_per_rank * cfg_.size, DType::UInt8, ReduceOp::Sum, "allgather");
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
