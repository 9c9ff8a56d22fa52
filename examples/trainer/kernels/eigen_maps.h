// Eigen views of row-major f32 tensors, shared by the kernels.
#pragma once

#include <Eigen/Core>

#include "examples/trainer/tensor.h"

namespace rdmaflow::exec {

using MatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<MatrixF, Eigen::Unaligned>;
using ConstMatrixMap = Eigen::Map<const MatrixF, Eigen::Unaligned>;
using VectorMap = Eigen::Map<Eigen::VectorXf, Eigen::Unaligned>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf, Eigen::Unaligned>;
using ArrayMap = Eigen::Map<Eigen::ArrayXf, Eigen::Unaligned>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf, Eigen::Unaligned>;

inline ConstMatrixMap matrix(const TensorView& t) {
  return ConstMatrixMap(t.as<const float>(), t.dim(0), t.dim(1));
}
inline MatrixMap mutable_matrix(const TensorView& t) {
  return MatrixMap(t.as<float>(), t.dim(0), t.dim(1));
}
inline ConstArrayMap flat(const TensorView& t) {
  return ConstArrayMap(t.as<const float>(), t.elements());
}
inline ArrayMap mutable_flat(const TensorView& t) {
  return ArrayMap(t.as<float>(), t.elements());
}

}  // namespace rdmaflow::exec
