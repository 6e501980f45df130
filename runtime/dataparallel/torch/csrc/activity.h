// The backend's operations as the profiler reads them (shoal.profiler.hooks).
//
// DistributedDataParallel issues its buckets' allreduces from its C++ reducer and
// waits on their futures in C++: no Python wrapper sees them. With profiling on
// (SHOAL_PROFILER_DIR set in the environment) every operation of this backend
// leaves one record here when its work object goes, which is after any wait on
// it: the profiler takes them in batches (take()). Off, the cost is one branch.
//
// Times are microseconds since the epoch (the clock Python's time.time() reads).
// `started` is when the core's thread could begin the operation: its issue, or
// the end of the group's previous operation (one communicator runs its
// operations in order), so ended - started is the operation's own time, not the
// queue's. `exposed` is how long a thread waited on the work in wait(): the
// whole operation when it ran on the caller's thread (eager), -1 when nobody
// waited through wait() (DDP's futures: the profiler estimates that part).

#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace shoal_torch {

inline int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline bool activity_on() {
  static const bool on = [] {
    const char* dir = std::getenv("SHOAL_PROFILER_DIR");
    return dir != nullptr && *dir != '\0';
  }();
  return on;
}

struct Activity {
  std::string name;         // torch's operation, lower case: allreduce, _allgather_base, send...
  std::string mode;         // eager (the caller's thread), queued (the core's), transfer (p2p)
  int64_t issued = 0;
  int64_t started = 0;
  int64_t ended = 0;        // 0: never completed (not recorded)
  int64_t exposed = -1;
  int64_t bytes = 0;
  bool across_hosts = false;
  bool ok = true;
};

// Bounded: a job that profiles without anyone taking the records (a script that
// imported the backend with the profiler's hooks off) keeps at most kLimit.
class ActivityLog {
 public:
  static constexpr size_t kLimit = size_t{1} << 18;

  static ActivityLog& instance() {
    static ActivityLog* log = new ActivityLog();  // lives with the process: works end late
    return *log;
  }

  void record(Activity activity) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (records_.size() >= kLimit) {
      ++dropped_;
      return;
    }
    records_.push_back(std::move(activity));
  }

  // The records since the last call, and how many were dropped meanwhile.
  std::pair<std::vector<Activity>, uint64_t> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Activity> out;
    out.swap(records_);
    return {std::move(out), std::exchange(dropped_, 0)};
  }

 private:
  std::mutex mutex_;
  std::vector<Activity> records_;
  uint64_t dropped_ = 0;
};

}  // namespace shoal_torch
