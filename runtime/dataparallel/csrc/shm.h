// The host's shared segment: per-rank slots that every local rank can read,
// progress counters, and the blocking wait on them (spin briefly, then futex).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shoal/core.h"

namespace shoal {

struct LocalPeer {
  int global_rank;
  int pid;
};

class HostSegment {
 public:
  // Local rank 0 creates (create=true) before the others open.
  HostSegment(const std::string& name, bool create, int local_rank,
              std::vector<LocalPeer> peers, std::size_t slot_bytes, int timeout_ms);
  ~HostSegment();
  HostSegment(const HostSegment&) = delete;
  HostSegment& operator=(const HostSegment&) = delete;

  // Removes the name once every local rank has mapped it: nothing leaks if a rank dies.
  void unlink();
  std::size_t slot_bytes() const { return slot_bytes_; }
  char* slot(int bufset, int local_rank) const;
  // Publishes this rank's progress counter and wakes waiters.
  void post(uint64_t value);
  // Blocks until every local rank's counter reached `target`. Throws Timeout
  // (naming the ranks that did not arrive), PeerLost (a waited-for process is
  // gone) or the error another local rank published with abort().
  void wait_all(uint64_t target, const std::string& op);
  // Tells the other local ranks that this rank failed, so they fail at once too.
  void abort(const Error& error);
  void check_abort() const;

 private:
  struct Control;
  bool arrived(uint64_t target) const;
  void check_liveness(uint64_t target, const std::string& op) const;

  std::string name_;
  int local_rank_;
  std::vector<LocalPeer> peers_;
  std::size_t slot_bytes_;
  int timeout_ms_;
  int spin_;
  std::size_t map_bytes_ = 0;
  char* base_ = nullptr;
  Control* ctl_ = nullptr;
  char* data_ = nullptr;
};

}  // namespace shoal
