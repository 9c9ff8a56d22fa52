#include "collectives/reduce_kernels.h"

#include <Eigen/Core>
#include <cstdint>
#include <limits>

namespace rdmaflow {
namespace {

template <typename T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// Types Eigen reduces natively (float, double, integers).
template <typename T>
void reduce_native(ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  const auto n = static_cast<Eigen::Index>(count);
  ArrayMap<T> d(static_cast<T*>(dst), n);
  ConstArrayMap<T> x(static_cast<const T*>(a), n);
  ConstArrayMap<T> y(static_cast<const T*>(b), n);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if constexpr (std::is_integral_v<T> && sizeof(T) < sizeof(int)) {
        // Eigen promotes narrow integers through int; keep the wrap explicit.
        d = (x.template cast<int>() + y.template cast<int>()).template cast<T>();
      } else if constexpr (std::is_signed_v<T> && std::is_integral_v<T>) {
        // Signed overflow is UB in C++; add as unsigned (two's complement wrap).
        using U = std::make_unsigned_t<T>;
        d = (x.template cast<U>() + y.template cast<U>()).template cast<T>();
      } else {
        d = x + y;
      }
      break;
    case ReduceOp::kProd:
      if constexpr (std::is_integral_v<T> && sizeof(T) < sizeof(int)) {
        d = (x.template cast<int>() * y.template cast<int>()).template cast<T>();
      } else if constexpr (std::is_signed_v<T> && std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        d = (x.template cast<U>() * y.template cast<U>()).template cast<T>();
      } else {
        d = x * y;
      }
      break;
    case ReduceOp::kMin:
      d = x.min(y);
      break;
    case ReduceOp::kMax:
      d = x.max(y);
      break;
  }
}

// f16 / bf16: widen to f32, combine, round once.
template <typename H>
void reduce_half(ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  const auto n = static_cast<Eigen::Index>(count);
  ArrayMap<H> d(static_cast<H*>(dst), n);
  ConstArrayMap<H> x(static_cast<const H*>(a), n);
  ConstArrayMap<H> y(static_cast<const H*>(b), n);
  auto xf = x.template cast<float>();
  auto yf = y.template cast<float>();
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      d = (xf + yf).template cast<H>();
      break;
    case ReduceOp::kProd:
      d = (xf * yf).template cast<H>();
      break;
    case ReduceOp::kMin:
      d = xf.min(yf).template cast<H>();
      break;
    case ReduceOp::kMax:
      d = xf.max(yf).template cast<H>();
      break;
  }
}

template <typename T>
void scale_native(void* dst, size_t count, int world) {
  ArrayMap<T> d(static_cast<T*>(dst), static_cast<Eigen::Index>(count));
  if constexpr (std::is_floating_point_v<T>) {
    d *= T(1) / static_cast<T>(world);
  } else if constexpr (sizeof(T) < sizeof(int)) {
    d = (d.template cast<int>() / world).template cast<T>();
  } else {
    d /= static_cast<T>(world);
  }
}

template <typename H>
void scale_half(void* dst, size_t count, int world) {
  ArrayMap<H> d(static_cast<H*>(dst), static_cast<Eigen::Index>(count));
  d = (d.template cast<float>() * (1.0f / static_cast<float>(world))).template cast<H>();
}

template <typename T>
void fill_native(ReduceOp op, void* dst, size_t count) {
  ArrayMap<T> d(static_cast<T*>(dst), static_cast<Eigen::Index>(count));
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      d.setConstant(T(0));
      break;
    case ReduceOp::kProd:
      d.setConstant(T(1));
      break;
    case ReduceOp::kMin:
      d.setConstant(std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                         : std::numeric_limits<T>::max());
      break;
    case ReduceOp::kMax:
      d.setConstant(std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                         : std::numeric_limits<T>::lowest());
      break;
  }
}

template <typename H>
void fill_half(ReduceOp op, void* dst, size_t count) {
  ArrayMap<H> d(static_cast<H*>(dst), static_cast<Eigen::Index>(count));
  float v = 0.0f;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      v = 0.0f;
      break;
    case ReduceOp::kProd:
      v = 1.0f;
      break;
    case ReduceOp::kMin:
      v = std::numeric_limits<float>::infinity();
      break;
    case ReduceOp::kMax:
      v = -std::numeric_limits<float>::infinity();
      break;
  }
  d.setConstant(H(v));
}

}  // namespace

void reduce_buffers(DataType type, ReduceOp op, void* dst, const void* a, const void* b,
                    size_t count) {
  if (count == 0) return;
  switch (type) {
    case DataType::kF32:
      return reduce_native<float>(op, dst, a, b, count);
    case DataType::kF64:
      return reduce_native<double>(op, dst, a, b, count);
    case DataType::kF16:
      return reduce_half<Eigen::half>(op, dst, a, b, count);
    case DataType::kBF16:
      return reduce_half<Eigen::bfloat16>(op, dst, a, b, count);
    case DataType::kI32:
      return reduce_native<int32_t>(op, dst, a, b, count);
    case DataType::kI64:
      return reduce_native<int64_t>(op, dst, a, b, count);
    case DataType::kU8:
      return reduce_native<uint8_t>(op, dst, a, b, count);
    case DataType::kI8:
      return reduce_native<int8_t>(op, dst, a, b, count);
    case DataType::kBool:
      return;  // refused earlier by reducible_dtype()
  }
}

void scale_average(DataType type, void* dst, size_t count, int world) {
  if (count == 0 || world <= 1) return;
  switch (type) {
    case DataType::kF32:
      return scale_native<float>(dst, count, world);
    case DataType::kF64:
      return scale_native<double>(dst, count, world);
    case DataType::kF16:
      return scale_half<Eigen::half>(dst, count, world);
    case DataType::kBF16:
      return scale_half<Eigen::bfloat16>(dst, count, world);
    case DataType::kI32:
      return scale_native<int32_t>(dst, count, world);
    case DataType::kI64:
      return scale_native<int64_t>(dst, count, world);
    case DataType::kU8:
      return scale_native<uint8_t>(dst, count, world);
    case DataType::kI8:
      return scale_native<int8_t>(dst, count, world);
    case DataType::kBool:
      return;
  }
}

void fill_identity(DataType type, ReduceOp op, void* dst, size_t count) {
  if (count == 0) return;
  switch (type) {
    case DataType::kF32:
      return fill_native<float>(op, dst, count);
    case DataType::kF64:
      return fill_native<double>(op, dst, count);
    case DataType::kF16:
      return fill_half<Eigen::half>(op, dst, count);
    case DataType::kBF16:
      return fill_half<Eigen::bfloat16>(op, dst, count);
    case DataType::kI32:
      return fill_native<int32_t>(op, dst, count);
    case DataType::kI64:
      return fill_native<int64_t>(op, dst, count);
    case DataType::kU8:
    case DataType::kBool:
      return fill_native<uint8_t>(op, dst, count);
    case DataType::kI8:
      return fill_native<int8_t>(op, dst, count);
  }
}

}  // namespace rdmaflow
