// Element-wise reduction kernels: the arithmetic of every collective.
#pragma once

#include <cstddef>

#include "shoal/core.h"

namespace shoal {

// out[i] = srcs[0][i] (op) srcs[1][i] (op) ... in that fixed order, so the bits
// never depend on arrival timing. fp16/bf16 accumulate in fp32 and round once.
// When divisor > 1 the result is divided by it (Average's last stage).
// `out` may alias one of `srcs`. A non-null `copy` receives the result too, in
// the same pass (a rank's own slice, for its peers to gather).
void reduce_into(DType dtype, ReduceOp op, void* out, const void* const* srcs, int nsrc,
                 std::size_t count, int divisor, void* copy = nullptr);

}  // namespace shoal
