#include "collectives/types.h"

#include <string>

namespace rdmaflow {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "?";
}

std::optional<ReduceOp> parse_reduce_op(std::string_view name) {
  for (ReduceOp op : kAllReduceOps) {
    if (reduce_op_name(op) == name) return op;
  }
  if (name == "product") return ReduceOp::kProd;
  if (name == "mean") return ReduceOp::kAvg;
  return std::nullopt;
}

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce:
      return "allreduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllgather:
      return "allgather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kReduce:
      return "reduce";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kAlltoall:
      return "alltoall";
  }
  return "?";
}

const char* collective_algo_env(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce:
      return "RDMAFLOW_ALLREDUCE_ALGO";
    case CollectiveKind::kReduceScatter:
      return "RDMAFLOW_REDUCE_SCATTER_ALGO";
    case CollectiveKind::kAllgather:
      return "RDMAFLOW_ALLGATHER_ALGO";
    case CollectiveKind::kBroadcast:
      return "RDMAFLOW_BROADCAST_ALGO";
    case CollectiveKind::kReduce:
      return "RDMAFLOW_REDUCE_ALGO";
    case CollectiveKind::kBarrier:
      return "RDMAFLOW_BARRIER_ALGO";
    case CollectiveKind::kAlltoall:
      return "RDMAFLOW_ALLTOALL_ALGO";
  }
  return "";
}

bool reducible_dtype(DataType t) {
  return t != DataType::kBool;
}

}  // namespace rdmaflow
