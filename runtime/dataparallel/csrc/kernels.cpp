// Reduction kernels with run-time dispatch: the image targets generic x86-64,
// so the baseline build stays portable and an AVX2 copy is used when the CPU has it.
#include "kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace shoal {
namespace base {
#include "kernels_impl.h"
}  // namespace base

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2")
namespace avx2 {
#include "kernels_impl.h"
}  // namespace avx2
#pragma GCC pop_options
#endif

void reduce_into(DType dtype, ReduceOp op, void* out, const void* const* srcs, int nsrc,
                 std::size_t count, int divisor, void* copy) {
  if (count == 0) return;
#if defined(__x86_64__)
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  if (has_avx2) return avx2::reduce_dispatch(dtype, op, out, srcs, nsrc, count, divisor, copy);
#endif
  base::reduce_dispatch(dtype, op, out, srcs, nsrc, count, divisor, copy);
}

}  // namespace shoal
