// Deterministic inputs and locally computed references for the collectives
// tests. Inputs are small integers (exactly representable in every type, and
// sums/products that stay exact even in f16/bf16), so every result is exact
// except kAvg of floating types, which is checked with a tolerance.
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/types.h"
#include "common/dtype.h"

namespace rdmaflow::test {

// The collectives hier implements (collectives/algorithms/hier.cc, hier_ops.cc).
inline constexpr CollectiveKind kHierKinds[] = {
    CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllgather,
    CollectiveKind::kBroadcast, CollectiveKind::kReduce,        CollectiveKind::kBarrier};

inline bool is_float(DataType t) {
  return t == DataType::kF32 || t == DataType::kF64 || t == DataType::kF16 || t == DataType::kBF16;
}

// The value rank `rank` contributes at element i (seed varies it per call).
inline double input_value(DataType t, ReduceOp op, int rank, size_t i, uint32_t seed) {
  const uint64_t h = (static_cast<uint64_t>(rank) * 7919u + i * 104729u + seed * 31u) % 1000003u;
  if (op == ReduceOp::kProd) {
    if (t == DataType::kU8) return static_cast<double>(1 + h % 3);
    static const double kVals[] = {-2, -1, 1, 2, 1, -1};
    return kVals[h % 6];
  }
  if (t == DataType::kU8) return static_cast<double>(h % 31);
  return static_cast<double>(static_cast<int64_t>(h % 17) - 8);
}

inline void store(DataType t, void* buf, size_t i, double v) {
  switch (t) {
    case DataType::kF32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DataType::kF64:
      static_cast<double*>(buf)[i] = v;
      break;
    case DataType::kF16:
      static_cast<Eigen::half*>(buf)[i] = Eigen::half(static_cast<float>(v));
      break;
    case DataType::kBF16:
      static_cast<Eigen::bfloat16*>(buf)[i] = Eigen::bfloat16(static_cast<float>(v));
      break;
    case DataType::kI32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(static_cast<int64_t>(v));
      break;
    case DataType::kI64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kU8:
    case DataType::kBool:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff);
      break;
    case DataType::kI8:
      static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(static_cast<int64_t>(v));
      break;
  }
}

inline double load(DataType t, const void* buf, size_t i) {
  switch (t) {
    case DataType::kF32:
      return static_cast<const float*>(buf)[i];
    case DataType::kF64:
      return static_cast<const double*>(buf)[i];
    case DataType::kF16:
      return static_cast<float>(static_cast<const Eigen::half*>(buf)[i]);
    case DataType::kBF16:
      return static_cast<float>(static_cast<const Eigen::bfloat16*>(buf)[i]);
    case DataType::kI32:
      return static_cast<const int32_t*>(buf)[i];
    case DataType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::kU8:
    case DataType::kBool:
      return static_cast<const uint8_t*>(buf)[i];
    case DataType::kI8:
      return static_cast<const int8_t*>(buf)[i];
  }
  return 0;
}

inline void fill_input(DataType t, ReduceOp op, int rank, uint32_t seed, void* buf, size_t count,
                       size_t offset = 0) {
  for (size_t i = 0; i < count; ++i) store(t, buf, i, input_value(t, op, rank, offset + i, seed));
}

// The reduction of element i over `world` ranks, as the library defines it.
inline double reduced_value(DataType t, ReduceOp op, int world, size_t i, uint32_t seed) {
  if (!is_float(t)) {
    int64_t acc = static_cast<int64_t>(input_value(t, op, 0, i, seed));
    for (int r = 1; r < world; ++r) {
      const int64_t v = static_cast<int64_t>(input_value(t, op, r, i, seed));
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          acc += v;
          break;
        case ReduceOp::kProd:
          acc *= v;
          break;
        case ReduceOp::kMin:
          acc = std::min(acc, v);
          break;
        case ReduceOp::kMax:
          acc = std::max(acc, v);
          break;
      }
    }
    if (t == DataType::kU8) acc &= 0xff;  // wraps like the kernel
    if (op == ReduceOp::kAvg) acc /= world;
    return static_cast<double>(acc);
  }
  double acc = input_value(t, op, 0, i, seed);
  for (int r = 1; r < world; ++r) {
    const double v = input_value(t, op, r, i, seed);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == ReduceOp::kAvg) acc /= world;
  return acc;
}

inline bool close_enough(DataType t, ReduceOp op, double want, double got) {
  if (op != ReduceOp::kAvg || !is_float(t)) return want == got;
  double rel = 1e-6;
  if (t == DataType::kF64) rel = 1e-12;
  if (t == DataType::kF16) rel = 2e-3;
  if (t == DataType::kBF16) rel = 1.6e-2;
  return std::fabs(want - got) <= rel * std::max(1.0, std::fabs(want));
}

// Counts mismatches of buf[0..count) against reduced values starting at
// element `offset`; fills `first` with a description of the first one.
inline size_t count_wrong_reduced(DataType t, ReduceOp op, int world, uint32_t seed,
                                  const void* buf, size_t count, size_t offset,
                                  std::string* first = nullptr) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const double want = reduced_value(t, op, world, offset + i, seed);
    const double got = load(t, buf, i);
    if (!close_enough(t, op, want, got)) {
      if (wrong == 0 && first) {
        *first = "element " + std::to_string(offset + i) + ": want " + std::to_string(want) +
                 " got " + std::to_string(got);
      }
      ++wrong;
    }
  }
  return wrong;
}

// Mismatches of buf[0..count) against rank `rank`'s input starting at `offset`.
inline size_t count_wrong_input(DataType t, ReduceOp op, int rank, uint32_t seed, const void* buf,
                                size_t count, size_t offset, std::string* first = nullptr) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const double want = input_value(t, op, rank, offset + i, seed);
    double w = want;
    if (t == DataType::kU8) w = static_cast<double>(static_cast<int64_t>(want) & 0xff);
    const double got = load(t, buf, i);
    if (w != got) {
      if (wrong == 0 && first) {
        *first = "element " + std::to_string(offset + i) + " (from rank " + std::to_string(rank) +
                 "): want " + std::to_string(w) + " got " + std::to_string(got);
      }
      ++wrong;
    }
  }
  return wrong;
}

// Elements of the input and output buffers of one call.
inline size_t input_elems(CollectiveKind k, size_t count, int world) {
  switch (k) {
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAlltoall:
      return count * world;
    default:
      return count;
  }
}
inline size_t output_elems(CollectiveKind k, size_t count, int world) {
  switch (k) {
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAlltoall:
      return count * world;
    default:
      return count;
  }
}

// Fills rank `rank`'s input for one call.
inline void make_input(CollectiveKind k, DataType t, ReduceOp op, int rank, int world,
                       uint32_t seed, void* in, size_t count) {
  fill_input(t, op, rank, seed, in, input_elems(k, count, world));
  (void)world;
}

// Mismatches in rank `rank`'s output of one call (0 when the rank's output is
// not significant, e.g. a non-root of reduce).
inline size_t check_output(CollectiveKind k, DataType t, ReduceOp op, int rank, int world, int root,
                           uint32_t seed, const void* out, size_t count,
                           std::string* first = nullptr) {
  const size_t es = dtype_size(t);
  const auto* o = static_cast<const std::byte*>(out);
  size_t wrong = 0;
  switch (k) {
    case CollectiveKind::kAllreduce:
      return count_wrong_reduced(t, op, world, seed, out, count, 0, first);
    case CollectiveKind::kReduce:
      return rank == root ? count_wrong_reduced(t, op, world, seed, out, count, 0, first) : 0;
    case CollectiveKind::kReduceScatter:
      return count_wrong_reduced(t, op, world, seed, out, count, rank * count, first);
    case CollectiveKind::kBroadcast:
      return count_wrong_input(t, op, root, seed, out, count, 0, first);
    case CollectiveKind::kAllgather:
      for (int b = 0; b < world; ++b) {
        wrong += count_wrong_input(t, op, b, seed, o + b * count * es, count, 0,
                                   wrong == 0 ? first : nullptr);
      }
      return wrong;
    case CollectiveKind::kAlltoall:
      for (int b = 0; b < world; ++b) {
        wrong += count_wrong_input(t, op, b, seed, o + b * count * es, count, rank * count,
                                   wrong == 0 ? first : nullptr);
      }
      return wrong;
    case CollectiveKind::kBarrier:
      return 0;
  }
  return 0;
}

}  // namespace rdmaflow::test
