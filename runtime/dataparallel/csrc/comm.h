// The communicator: executes one collective at a time, synchronously, over the
// host's shared segment and the inter-host mesh.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap.h"
#include "net.h"
#include "p2p.h"
#include "shm.h"
#include "shoal/core.h"
#include "slicing.h"

namespace shoal {

class Comm {
 public:
  // Builds the communicator over `boot` (nullptr for a single rank);
  // `advertised`: where peers on other hosts reach this rank.
  Comm(const Config& config, Bootstrap* boot, const std::string& advertised);
  ~Comm();
  const Topology& topo() const { return job_.topo; }
  const Config& config() const { return cfg_; }

  void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, const char* name);
  void broadcast(void* data, std::size_t bytes, int root);
  void allgather(const void* send, void* recv, std::size_t bytes_per_rank);
  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root);
  void barrier();
  // exchange.cpp: reduce-scatter, all-to-all, gather, scatter (byte counts and
  // offsets by rank, as core.h's Group describes them).
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  void alltoall(const char* send, const std::vector<std::size_t>& send_counts,
                const std::vector<std::size_t>& send_offsets, char* recv,
                const std::vector<std::size_t>& recv_counts,
                const std::vector<std::size_t>& recv_offsets);
  void gather(const void* send, void* recv, std::size_t bytes, int root);
  void scatter(const void* send, void* recv, std::size_t bytes, int root);
  // Bounds this communicator's operations from now on by `timeout_ms` (> 0;
  // otherwise the value stays), and time-out errors say `note` (Group::set_timeout).
  void set_timeout(int timeout_ms, const std::string& note);
  // The communicator's point-to-point transfers (started on first use).
  P2P& p2p();
  // The failure this rank reports after `seen` broke a collective: the root
  // cause as this host agrees on it (a peer on another host that failed first
  // says why in a notice). Publishes it to the local ranks and sends it to the
  // peers on other hosts.
  Error fail(const Error& seen);

 private:
  // Slot sets of an operation's chunks, and the chunk that used each set last.
  static constexpr uint64_t kUnused = UINT64_MAX;
  struct Plan {
    std::vector<int> set;
    std::vector<uint64_t> previous;  // kUnused when the set is fresh
  };
  Plan plan(uint64_t first_chunk, std::size_t chunks);
  // A slot set is free once every local rank gathered `previous`, the chunk
  // that used it last (kUnused: never used).
  bool set_free(uint64_t previous) const {
    return previous == kUnused || seg_->min(Counter::Gathered) > previous;
  }
  bool probe_single_copy();
  // Local ranks may read each other's buffers (or there is no other local rank).
  bool reads_peers() const;
  void reduce_blocks(const char* send, char* out, const std::vector<Range>& blocks,
                     DType dtype, ReduceOp op, const std::string& name);
  void read_peer(int local, uint64_t remote, void* local_buf, std::size_t bytes, const std::string& name);
  [[noreturn]] void peer_read_failed(int local, int err, const std::string& name);
  void wait_counter(Counter which, uint64_t target, const std::string& name);
  void allreduce_single_copy(char* data, std::size_t count, DType dtype, ReduceOp op,
                             const std::string& name);
  std::vector<int> lagging(uint64_t copy, uint64_t posted_needs, uint64_t reduced_needs,
                           uint64_t end, uint64_t copy_needs) const;
  struct Slice {
    char* data;
    std::size_t count;
  };
  // The host's columns of an allgather (each rank's blocks from every host).
  void local_allgather(char* out, std::size_t bytes_per_rank);
  void local_allgather_direct(char* out, std::size_t bytes_per_rank);
  // Root's block of a broadcast to the other local ranks, through the slots.
  void local_broadcast(char* data, std::size_t bytes, int local_root);
  void exchange_whole(char* buf, std::size_t count, DType dtype, ReduceOp op, int divisor,
                      const std::string& name);
  // Reduces this rank's slices of a batch of chunks with the same local rank
  // on every other host.
  void inter_host(const std::vector<Slice>& slices, DType dtype, ReduceOp op, int divisor,
                  const std::string& name);

  Failure root_cause(const Error& seen);
  // The notice thread: the only reader of the control connections. It
  // publishes a peer's failure notice on this host at once, whatever the
  // local ranks are doing (inside a collective, or between two).
  void watch_peers();
  void stop_watching();

  Config cfg_;
  Job job_;
  std::vector<net::Control> control_;  // per host index: notices from my peer there
  std::thread watcher_;
  std::mutex p2p_mu_;
  std::unique_ptr<P2P> p2p_;
  int wake_fd_ = -1;  // eventfd: ends the notice thread
  std::unique_ptr<HostSegment> seg_;
  uint64_t chunks_ = 0;  // chunks reduced since init: the counters' origin
  std::vector<uint64_t> last_use_;  // per slot set: the last chunk that used it
  int next_set_ = 0;
  bool single_copy_ = false;  // every local rank can read its peers' memory
  uint64_t probe_word_ = 0;
  std::vector<char> pieces_;
  std::vector<char> scratch_;
  std::vector<std::vector<char>> out_, in_;  // inter-host staging, per host
};

}  // namespace shoal
