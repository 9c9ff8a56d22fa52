// Element-wise reduction kernels, written as Eigen array expressions over
// mapped buffers so Eigen vectorizes them (SSE/AVX packets where the type has
// them). No collective reduces with a hand loop.
//
// Precision: f16 and bf16 are widened to f32, combined, and rounded back once
// per kernel call. A collective that combines n contributions over n-1 hops
// therefore rounds n-1 times (as NCCL does); error bounds in the tests allow
// for it. Integer sums and products wrap modulo 2^bits (two's complement).
#pragma once

#include <cstddef>

#include "collectives/types.h"
#include "common/dtype.h"

namespace rdmaflow {

// dst[i] = a[i] (op) b[i] for i < count. `dst` may alias `a` or `b` exactly
// (in place), never partially. kAvg combines like kSum; finish with
// scale_average().
void reduce_buffers(DataType type, ReduceOp op, void* dst, const void* a, const void* b,
                    size_t count);

// dst[i] = dst[i] / world: the final step of kAvg. Floating types multiply by
// 1/world in their accumulation type (f32 for f16/bf16); integer types divide
// and truncate toward zero.
void scale_average(DataType type, void* dst, size_t count, int world);

// The neutral element of `op` written into dst[0..count) (0 for sum/avg, 1 for
// prod, the type's max for min, its lowest for max). Used by the tests and by
// ranks that contribute nothing to a block.
void fill_identity(DataType type, ReduceOp op, void* dst, size_t count);

}  // namespace rdmaflow
