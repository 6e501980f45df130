// Host shared segment (see shm.h).
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <new>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "net.h"

namespace shoal {

namespace {
constexpr uint32_t kMagic = 0x5348414Cu;  // "SHAL"
constexpr int kMaxLocal = 256;
constexpr int kMaxAbortRanks = 32;

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* ts) {
  // Shared (not PRIVATE) futex: the word lives in memory mapped by several processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ts, nullptr, 0);
}

}  // namespace

bool process_gone(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  // A killed child not yet reaped by its parent is a zombie: gone as well.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  char state = line[close + 2];
  return state == 'Z' || state == 'X';
}

namespace {

std::string join(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}
}  // namespace

struct alignas(64) RankState {
  std::atomic<uint64_t> counter[3];
  std::atomic<uint64_t> address;
  std::atomic<int32_t> can_read;
};

struct HostSegment::Control {
  uint32_t magic;
  uint32_t local_size;
  uint64_t slot_bytes;
  uint32_t depth;
  alignas(64) std::atomic<uint32_t> futex_word;
  std::atomic<uint32_t> waiters;
  alignas(64) std::atomic<int32_t> abort_claim;  // 1 once a rank writes the failure below
  std::atomic<int32_t> abort_rank;               // its origin, stored last: -1 until complete
  int32_t abort_kind;
  int32_t abort_nranks;
  int32_t abort_ranks[kMaxAbortRanks];
  char abort_message[512];
  RankState ranks[kMaxLocal];
};

HostSegment::HostSegment(const std::string& name, bool create, int local_rank,
                         std::vector<LocalPeer> peers, std::size_t slot_bytes, int depth,
                         int timeout_ms, std::size_t extra_bytes)
    : name_(name),
      local_rank_(local_rank),
      peers_(std::move(peers)),
      slot_bytes_(slot_bytes),
      depth_(depth),
      timeout_ms_(timeout_ms) {
  const int local_size = (int)peers_.size();
  if (local_size > kMaxLocal)
    throw Error(Error::Kind::Usage, "more than " + std::to_string(kMaxLocal) + " ranks on a host");
  const unsigned cores = std::thread::hardware_concurrency();
  // Spinning only pays when every local rank has a core of its own.
  spin_ = (cores == 0 || (unsigned)local_size <= cores) ? 20000 : 50;
  if (const char* v = std::getenv("SHOAL_SPIN")) spin_ = std::atoi(v);
  const std::size_t ctl_bytes = (sizeof(Control) + 4095) & ~std::size_t(4095);
  const std::size_t slots = (std::size_t)depth_ * (std::size_t)local_size * slot_bytes_;
  map_bytes_ = ctl_bytes + slots + extra_bytes;
  int fd;
  if (create) {
    shm_unlink(name_.c_str());  // a stale segment of a crashed run with the same job id
    fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && ftruncate(fd, (off_t)map_bytes_) != 0) {
      int e = errno;
      close(fd);
      shm_unlink(name_.c_str());
      errno = e;
      fd = -1;
    }
  } else {
    fd = shm_open(name_.c_str(), O_RDWR, 0600);
  }
  if (fd < 0)
    throw Error(Error::Kind::System, "shared memory " + name_ + ": " + std::strerror(errno));
  void* p = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    throw Error(Error::Kind::System, "mmap " + name_ + ": " + std::strerror(errno));
  base_ = static_cast<char*>(p);
  ctl_ = reinterpret_cast<Control*>(base_);
  data_ = base_ + ctl_bytes;
  extra_ = data_ + slots;
  if (create) {
    new (ctl_) Control();
    ctl_->local_size = (uint32_t)local_size;
    ctl_->slot_bytes = slot_bytes_;
    ctl_->depth = (uint32_t)depth_;
    ctl_->abort_claim.store(0);
    ctl_->abort_rank.store(-1);
    for (int i = 0; i < kMaxLocal; ++i) {
      for (auto& c : ctl_->ranks[i].counter) c.store(0);
      ctl_->ranks[i].address.store(0);
      ctl_->ranks[i].can_read.store(0);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    ctl_->magic = kMagic;
  } else if (ctl_->magic != kMagic || ctl_->local_size != (uint32_t)local_size ||
             ctl_->slot_bytes != slot_bytes_ || ctl_->depth != (uint32_t)depth_) {
    throw Error(Error::Kind::Usage, "shared memory " + name_ +
                                        " does not match this job (different SHOAL_JOB_ID "
                                        "or chunk size or depth on this host?)");
  }
}

HostSegment::~HostSegment() {
  if (base_ != nullptr) munmap(base_, map_bytes_);
}

void HostSegment::unlink() { shm_unlink(name_.c_str()); }

char* HostSegment::slot(int set, int local_rank) const {
  return data_ + ((std::size_t)set * peers_.size() + (std::size_t)local_rank) * slot_bytes_;
}

// Spinning ranks watch the counters themselves; the futex word only moves when
// someone sleeps on it, so a publish costs one store, not a contended RMW.
// (Sequentially consistent order: a sleeper registers in `waiters` before it
// re-reads the counters, a publisher stores its counter before it reads
// `waiters`; one of the two sees the other.)
void HostSegment::publish(Counter which, uint64_t value) {
  ctl_->ranks[local_rank_].counter[(int)which].store(value);
  if (ctl_->waiters.load() > 0) {
    ctl_->futex_word.fetch_add(1);
    futex(&ctl_->futex_word, FUTEX_WAKE, INT32_MAX, nullptr);
  }
}

uint64_t HostSegment::get(Counter which, int local_rank) const {
  return ctl_->ranks[local_rank].counter[(int)which].load(std::memory_order_acquire);
}

uint64_t HostSegment::min(Counter which) const {
  uint64_t m = UINT64_MAX;
  for (std::size_t i = 0; i < peers_.size(); ++i) m = std::min(m, get(which, (int)i));
  return m;
}

void HostSegment::set_address(uint64_t address) { ctl_->ranks[local_rank_].address.store(address); }
uint64_t HostSegment::address(int local_rank) const { return ctl_->ranks[local_rank].address.load(); }
void HostSegment::set_can_read(bool ok) { ctl_->ranks[local_rank_].can_read.store(ok ? 1 : 0); }
bool HostSegment::can_read(int local_rank) const { return ctl_->ranks[local_rank].can_read.load() == 1; }

uint32_t HostSegment::version() const {
  uint64_t v = ctl_->futex_word.load();  // moved by abort() too
  for (std::size_t i = 0; i < peers_.size(); ++i)
    for (const auto& c : ctl_->ranks[i].counter) v += c.load();
  return (uint32_t)v;
}

bool HostSegment::failure(Failure& out) const {
  const int origin = ctl_->abort_rank.load(std::memory_order_acquire);
  if (origin < 0) return false;
  out.kind = static_cast<Error::Kind>(ctl_->abort_kind);
  out.ranks.assign(ctl_->abort_ranks, ctl_->abort_ranks + ctl_->abort_nranks);
  out.message = ctl_->abort_message;
  out.origin = origin;
  return true;
}

void HostSegment::check_abort() const {
  Failure f;
  if (failure(f)) throw f.error(peers_[local_rank_].global_rank);
}

void HostSegment::abort(const Failure& f) {
  // The first failure wins; its message is the one every local rank reports.
  int32_t unclaimed = 0;
  if (!ctl_->abort_claim.compare_exchange_strong(unclaimed, 1)) return;
  ctl_->abort_kind = static_cast<int32_t>(f.kind);
  ctl_->abort_nranks = (int32_t)std::min<std::size_t>(f.ranks.size(), kMaxAbortRanks);
  for (int i = 0; i < ctl_->abort_nranks; ++i) ctl_->abort_ranks[i] = f.ranks[i];
  std::memset(ctl_->abort_message, 0, sizeof ctl_->abort_message);
  std::strncpy(ctl_->abort_message, f.message.c_str(), sizeof ctl_->abort_message - 1);
  ctl_->abort_rank.store(f.origin, std::memory_order_release);
  ctl_->futex_word.fetch_add(1);
  futex(&ctl_->futex_word, FUTEX_WAKE, INT32_MAX, nullptr);
}

void HostSegment::check_liveness(const std::vector<int>& lagging, const std::string& op,
                                 uint32_t seen) const {
  for (int i : lagging) {
    // A rank publishes before it exits: the version is read after its death was
    // seen, so a change means it published after `lagging` was computed.
    if (process_gone(peers_[i].pid) && version() == seen) {
      const int r = peers_[i].global_rank;
      throw Error(Error::Kind::PeerLost,
                  op + ": rank " + std::to_string(r) + " (pid " + std::to_string(peers_[i].pid) +
                      ") exited before completing it",
                  {r});
    }
  }
}

void HostSegment::set_timeout(int timeout_ms, const std::string& note) {
  timeout_note_ = note;
  timeout_ms_.store(timeout_ms);
}

void HostSegment::wait_change(uint32_t seen, const std::vector<int>& lagging,
                              const std::string& op, std::chrono::steady_clock::time_point since) {
  for (int i = 0; i < spin_; ++i) {
    if (version() != seen) return;
    cpu_relax();
  }
  check_abort();
  // A few yields before sleeping: on a shared core the peer may be runnable.
  for (int i = 0; i < 4; ++i) {
    std::this_thread::yield();
    if (version() != seen) return;
  }
  ctl_->waiters.fetch_add(1);
  const uint32_t word = ctl_->futex_word.load();
  if (version() == seen) {
    timespec ts{0, 20 * 1000 * 1000};
    futex(&ctl_->futex_word, FUTEX_WAIT, word, &ts);
  }
  ctl_->waiters.fetch_sub(1);
  check_abort();
  // `lagging` was computed before `seen`'s counters moved: once any rank
  // published, it may be stale, and a rank that published its last part and
  // exited has completed, not died. The caller recomputes it.
  if (version() != seen) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_liveness_ > std::chrono::milliseconds(200)) {
    last_liveness_ = now;
    check_liveness(lagging, op, seen);
  }
  // A local peer that lags but lives may itself be waiting for a rank further away (a
  // frozen or cut-off rank on another host), and its own time-out names that rank. Give it a
  // tenth of the time-out (at most 2 s) to publish its failure (check_abort) before naming it.
  const int timeout_ms = timeout_ms_.load();
  const int grace_ms = std::min(timeout_ms / 10, 2000);
  if (now - since > std::chrono::milliseconds(timeout_ms + grace_ms)) {
    std::vector<int> missing;
    for (int i : lagging) missing.push_back(peers_[i].global_rank);
    throw Error(Error::Kind::Timeout,
                net::timed_out(op, timeout_ms, "waiting for ranks [" + join(missing) + "]",
                               timeout_note_),
                missing);
  }
}

}  // namespace shoal
