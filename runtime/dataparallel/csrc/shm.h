// The host's shared segment: rings of per-rank slots that every local rank can
// read, per-rank progress counters, and the blocking wait for a peer's
// progress (spin briefly, then futex on shared memory).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "failure.h"
#include "shoal/core.h"

namespace shoal {

// Whether a process is gone (exited, or a zombie not yet reaped).
bool process_gone(int pid);

struct LocalPeer {
  int global_rank;
  int pid;
};

// Progress counters, in chunks since init, one set per local rank.
enum class Counter { Posted = 0, Reduced = 1, Gathered = 2 };

class HostSegment {
 public:
  // Local rank 0 creates (create=true) before the others open. `depth` slot
  // sets: how many chunks a rank may run ahead of the slowest local rank.
  // `extra_bytes`: an area after the slots for point-to-point mailboxes (extra()).
  HostSegment(const std::string& name, bool create, int local_rank,
              std::vector<LocalPeer> peers, std::size_t slot_bytes, int depth, int timeout_ms,
              std::size_t extra_bytes = 0);
  ~HostSegment();
  HostSegment(const HostSegment&) = delete;
  HostSegment& operator=(const HostSegment&) = delete;

  // Removes the name once every local rank has mapped it: nothing leaks if a rank dies.
  void unlink();
  std::size_t slot_bytes() const { return slot_bytes_; }
  uint64_t depth() const { return (uint64_t)depth_; }
  int local_size() const { return (int)peers_.size(); }
  int global_rank(int local) const { return peers_[local].global_rank; }
  char* extra() const { return extra_; }
  // The slot of `local_rank` in slot set `set` (< depth()).
  char* slot(int set, int local_rank) const;
  // Publishes one of this rank's counters and wakes waiters.
  void publish(Counter which, uint64_t value);
  uint64_t get(Counter which, int local_rank) const;
  uint64_t min(Counter which) const;
  // Single copy: where this rank's buffer of the current operation lives, and
  // whether this rank can read its local peers' memory (process_vm_readv).
  void set_address(uint64_t address);
  uint64_t address(int local_rank) const;
  void set_can_read(bool ok);
  bool can_read(int local_rank) const;
  int pid(int local_rank) const { return peers_[local_rank].pid; }
  // Changes whenever any local rank publishes: read it before deciding to wait.
  uint32_t version() const;
  // Blocks until the version differs from `seen` or a poll interval passed.
  // Throws PeerLost if one of `lagging` (local ranks being waited for) is
  // gone, Timeout naming them once `since` is older than the timeout, or the
  // error another local rank published with abort().
  void wait_change(uint32_t seen, const std::vector<int>& lagging, const std::string& op,
                   std::chrono::steady_clock::time_point since);
  // The time-out of waits from now on, and where it comes from (net::timed_out).
  void set_timeout(int timeout_ms, const std::string& note);
  // Tells the other local ranks that a rank failed, so they fail at once too.
  // The first failure published on the host wins; later ones are dropped.
  void abort(const Failure& failure);
  // The failure published on this host, if any.
  bool failure(Failure& out) const;
  // Throws the published failure (from a local rank, or from another host
  // through the communicator's notice thread).
  void check_abort() const;
  // Throws PeerLost naming the first of `locals` (local ranks) that is gone,
  // unless the version moved from `seen` (`locals` may be stale then).
  void check_liveness(const std::vector<int>& locals, const std::string& op, uint32_t seen) const;

 private:
  struct Control;

  std::string name_;
  int local_rank_;
  std::vector<LocalPeer> peers_;
  std::size_t slot_bytes_;
  int depth_;
  std::atomic<int> timeout_ms_;
  std::string timeout_note_ = "SHOAL_COLLECTIVE_TIMEOUT";
  int spin_;
  std::size_t map_bytes_ = 0;
  char* base_ = nullptr;
  Control* ctl_ = nullptr;
  char* data_ = nullptr;
  char* extra_ = nullptr;
  std::chrono::steady_clock::time_point last_liveness_{};
};

}  // namespace shoal
