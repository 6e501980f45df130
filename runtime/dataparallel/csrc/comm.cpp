// Collective algorithms (see comm.h).
//
// Large allreduces (SHOAL_SINGLE_COPY_BYTES and up) take the single-copy path
// when every local rank may read its peers' memory (process_vm_readv, probed
// at init): see allreduce_single_copy. Otherwise, and for smaller messages,
// allreduce works per chunk of at most SHOAL_SHM_CHUNK_BYTES (cache-sized):
//   1. copy: each local rank copies its chunk into its slot of the segment;
//   2. reduce: on one host, when the message is small or there are only two
//      local ranks, every rank reduces the whole chunk from all slots (a single
//      handshake). Otherwise each local rank reduces its own slice of the chunk
//      from all slots, in local-rank order (reduce-scatter);
//   3. across hosts, each local rank exchanges only its slice with the ranks of
//      the same local rank on the other hosts (balanced, as Herring does): the
//      slice is split in one part per host, each host reduces its part in host
//      order and sends it back;
//   4. gather: every rank copies all reduced slices out.
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
constexpr uint64_t kUnused = UINT64_MAX;
constexpr int kHot = 4;

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
    // Across hosts the batched chunk pipeline measured faster: one host only.
    single_copy_ = t.num_hosts == 1 && cfg_.single_copy_bytes > 0;
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
}

Comm::~Comm() { job_.close_all(); }

void Comm::abort(const Error& error) {
  if (seg_) seg_->abort(error);
}

void Comm::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, const char* name) {
  if (cfg_.size == 1 || count == 0) return;
  const Topology& t = job_.topo;
  const int L = t.local_size, me = t.local_rank;
  const std::size_t es = dtype_size(dtype);
  if (single_copy_ && count * es >= cfg_.single_copy_bytes)
    return allreduce_single_copy(static_cast<char*>(data), count, dtype, op, name);
  const std::size_t per_chunk = cfg_.chunk_bytes / es;
  const uint64_t g0 = chunks_, end = g0 + (count + per_chunk - 1) / per_chunk;
  // Averages divide once, at the stage that completes the sum.
  const int divisor = op == ReduceOp::Average ? t.size : 1;
  const bool small = count * es <= cfg_.small_bytes;
  const bool whole = small || (t.num_hosts == 1 && L <= 2);
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
    } else if (copy < end && (p.previous[copy - g0] == kUnused ||
                              seg_->min(Counter::Gathered) > p.previous[copy - g0])) {
      // A slot set is free once every rank gathered the chunk that used it last.
      std::memcpy(seg_->slot(set(copy), me), at(copy), len(copy) * es);
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
    seg_->check_liveness({local}, name);
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

// Large messages on one host, when local ranks may read each other's memory:
// each rank reduces its slice straight from its peers' buffers (through
// cache-sized pieces), then copies the other slices from their owners'
// buffers. One copy of the data instead of three, and three handshakes per
// operation.
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
  for (std::size_t lo = mine.lo; lo < mine.hi; lo += piece) {
    const std::size_t n = std::min(piece, mine.hi - lo);
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
                op == ReduceOp::Average ? t.size : 1);
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
    const int peer = job_.host_ranks[h][t.local_rank];
    xfer.push_back({job_.mesh[h], buf, bytes, true, peer});
    xfer.push_back({job_.mesh[h], scratch_.data() + h * bytes, bytes, false, peer});
  }
  net::run(xfer, cfg_.timeout_ms, name, [this] { seg_->check_abort(); });
  reduce_into(dtype, op, buf, srcs.data(), H, n, divisor);
}

void Comm::inter_host(const std::vector<Slice>& slices, DType dtype, ReduceOp op, int divisor,
                      const std::string& name) {
  const Topology& t = job_.topo;
  const int H = t.num_hosts, me = t.host_index;
  const std::size_t es = dtype_size(dtype);
  out_.resize(H);
  in_.resize(H);
  auto peer = [&](int h) { return job_.host_ranks[h][t.local_rank]; };
  auto bytes_of = [&](int h) {
    std::size_t b = 0;
    for (const Slice& s : slices) b += part(s.count, H, h, es).size() * es;
    return b;
  };
  // Phase 1: part h of every slice to host h; every host's copy of my part back.
  std::vector<net::Transfer> xfer;
  for (int h = 0; h < H; ++h) {
    if (h == me) continue;
    out_[h].resize(bytes_of(h));
    in_[h].resize(bytes_of(me));
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
  net::run(xfer, cfg_.timeout_ms, name, check);
  // My part of each slice, reduced in host order; packed for phase 2.
  out_[me].resize(bytes_of(me));
  std::vector<const void*> srcs(H);
  std::size_t off = 0;
  for (const Slice& s : slices) {
    const Range own = part(s.count, H, me, es);
    for (int h = 0; h < H; ++h)
      srcs[h] = h == me ? static_cast<const void*>(s.data + own.lo * es) : in_[h].data() + off;
    reduce_into(dtype, op, s.data + own.lo * es, srcs.data(), H, own.size(), divisor);
    std::memcpy(out_[me].data() + off, s.data + own.lo * es, own.size() * es);
    off += own.size() * es;
  }
  // Phase 2: my reduced parts to every host; theirs into the slices.
  xfer.clear();
  for (int h = 0; h < H; ++h) {
    if (h == me) continue;
    in_[h].resize(bytes_of(h));
    xfer.push_back({job_.mesh[h], out_[me].data(), out_[me].size(), true, peer(h)});
    xfer.push_back({job_.mesh[h], in_[h].data(), in_[h].size(), false, peer(h)});
  }
  net::run(xfer, cfg_.timeout_ms, name, check);
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
