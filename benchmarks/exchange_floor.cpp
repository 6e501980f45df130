// The two-core floor of a shared-memory allreduce: two processes run the
// cheapest schedule we know for a float32 sum, with nothing else (no
// futexes, no slot reuse checks, no slicing, no error handling). Each rank:
//   post:   copies the half its peer reduces into shared memory;
//   reduce: sums its own half (its buffer + the peer's posted half) into its
//           buffer and into shared memory;
//   gather: copies the peer's reduced half into its buffer.
// Per rank, 1/2 of the buffer crosses cores twice (the peer's input half and
// the peer's result half): an allreduce cannot move less between two ranks.
// Usage: exchange_floor BYTES [CHUNK_BYTES]; prints microseconds per allreduce.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

using Clock = std::chrono::steady_clock;

static double us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

int main(int argc, char** argv) {
  const std::size_t bytes = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1u << 20;
  const std::size_t chunk = (argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 256u << 10) / 4;
  const std::size_t n = bytes / 4, half = n / 2;
  char* shared = static_cast<char*>(mmap(nullptr, 8192 + 4 * bytes, PROT_READ | PROT_WRITE,
                                         MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  auto* posted = reinterpret_cast<std::atomic<long>*>(shared);
  auto* reduced = reinterpret_cast<std::atomic<long>*>(shared + 4096);
  float* slot[2] = {reinterpret_cast<float*>(shared + 8192),
                    reinterpret_cast<float*>(shared + 8192 + bytes)};
  float* result[2] = {reinterpret_cast<float*>(shared + 8192 + 2 * bytes),
                      reinterpret_cast<float*>(shared + 8192 + 3 * bytes)};
  const pid_t child = fork();
  const int me = child == 0 ? 1 : 0, peer = 1 - me;
  float* buf = static_cast<float*>(std::aligned_alloc(64, bytes));
  for (std::size_t i = 0; i < n; ++i) buf[i] = 1.0f;
  const std::size_t mine = me * half, theirs = peer * half;
  const std::size_t chunks = (half + chunk - 1) / chunk;
  const int iters = 2000, rounds = 5;
  double best = 1e30, phase[3] = {0, 0, 0};
  long generation = 0;
  for (int round = 0; round < rounds; ++round) {
    double t[3] = {0, 0, 0};
    const auto start = Clock::now();
    for (int it = 0; it < iters; ++it, ++generation) {
      const long base = generation * (long)chunks;
      const auto a = Clock::now();
      for (std::size_t c = 0; c < chunks; ++c) {
        const std::size_t lo = c * chunk, k = std::min(chunk, half - lo);
        std::memcpy(slot[me] + theirs + lo, buf + theirs + lo, k * 4);
        posted[me * 8].store(base + (long)c + 1, std::memory_order_release);
      }
      const auto b = Clock::now();
      for (std::size_t c = 0; c < chunks; ++c) {
        const std::size_t lo = c * chunk, k = std::min(chunk, half - lo);
        while (posted[peer * 8].load(std::memory_order_acquire) < base + (long)c + 1) {
        }
        float* own = buf + mine + lo;
        const float* other = slot[peer] + mine + lo;
        float* out = result[me] + mine + lo;
        for (std::size_t i = 0; i < k; ++i) out[i] = own[i] = own[i] + other[i];
        reduced[me * 8].store(base + (long)c + 1, std::memory_order_release);
      }
      const auto d = Clock::now();
      for (std::size_t c = 0; c < chunks; ++c) {
        const std::size_t lo = c * chunk, k = std::min(chunk, half - lo);
        while (reduced[peer * 8].load(std::memory_order_acquire) < base + (long)c + 1) {
        }
        std::memcpy(buf + theirs + lo, result[peer] + theirs + lo, k * 4);
      }
      const auto e = Clock::now();
      t[0] += us(a, b), t[1] += us(b, d), t[2] += us(d, e);
    }
    const double per = us(start, Clock::now()) / iters;
    if (per < best) {
      best = per;
      for (int i = 0; i < 3; ++i) phase[i] = t[i] / iters;
    }
  }
  if (me == 0) {
    std::printf("%zu bytes: %.1f us (post %.1f, reduce %.1f, gather %.1f)\n", bytes, best,
                phase[0], phase[1], phase[2]);
    waitpid(child, nullptr, 0);
  }
  return 0;
}
