// The references' names for rdmaflow's types and reductions, for
// bench/collectives: Open MPI's datatypes and ops, Gloo's reduction functions
// and typed buffer setters. Null (MPI_DATATYPE_NULL, nullptr) where the
// reference has none.
#pragma once

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>

#include "collectives/types.h"

namespace rdmaflow::bench {

inline MPI_Datatype mpi_type(DataType t) {
  switch (t) {
    case DataType::kF32:
      return MPI_FLOAT;
    case DataType::kF64:
      return MPI_DOUBLE;
    case DataType::kI32:
      return MPI_INT32_T;
    case DataType::kI64:
      return MPI_INT64_T;
    case DataType::kU8:
      return MPI_UINT8_T;
    default:
      return MPI_DATATYPE_NULL;
  }
}

inline MPI_Op mpi_op(ReduceOp r) {
  switch (r) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kProd:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    default:
      return MPI_OP_NULL;
  }
}

template <typename T>
gloo::AllreduceOptions::Func gloo_fn(ReduceOp r) {
  using F = void (*)(void*, const void*, const void*, size_t);
  switch (r) {
    case ReduceOp::kSum:
      return static_cast<F>(&gloo::sum<T>);
    case ReduceOp::kProd:
      return static_cast<F>(&gloo::product<T>);
    case ReduceOp::kMin:
      return static_cast<F>(&gloo::min<T>);
    case ReduceOp::kMax:
      return static_cast<F>(&gloo::max<T>);
    default:
      return nullptr;
  }
}

inline gloo::AllreduceOptions::Func gloo_reduce_fn(DataType t, ReduceOp r) {
  switch (t) {
    case DataType::kF32:
      return gloo_fn<float>(r);
    case DataType::kF64:
      return gloo_fn<double>(r);
    case DataType::kI32:
      return gloo_fn<int32_t>(r);
    case DataType::kI64:
      return gloo_fn<int64_t>(r);
    case DataType::kU8:
      return gloo_fn<uint8_t>(r);
    default:
      return nullptr;
  }
}

template <typename Opts>
void gloo_set(Opts& o, DataType type, void* in, size_t in_elems, void* out, size_t out_elems) {
  const size_t es = dtype_size(type);
  // Gloo's typed setters only pick the element size; pass bytes as u8 when
  // the size matches no C++ type it knows.
  switch (es) {
    case 1:
      o.setInput(static_cast<uint8_t*>(in), in_elems);
      o.setOutput(static_cast<uint8_t*>(out), out_elems);
      break;
    case 2:
      o.setInput(static_cast<uint16_t*>(in), in_elems);
      o.setOutput(static_cast<uint16_t*>(out), out_elems);
      break;
    case 4:
      o.setInput(static_cast<float*>(in), in_elems);
      o.setOutput(static_cast<float*>(out), out_elems);
      break;
    default:
      o.setInput(static_cast<double*>(in), in_elems);
      o.setOutput(static_cast<double*>(out), out_elems);
      break;
  }
}

}  // namespace rdmaflow::bench
