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

std::string_view algorithm_name(Algorithm algo) {
  switch (algo) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kTree:
      return "tree";
    case Algorithm::kDoubleBinaryTree:
      return "dbtree";
    case Algorithm::kRabenseifner:
      return "rabenseifner";
    case Algorithm::kRecursiveDoubling:
      return "rd";
    case Algorithm::kPairwise:
      return "pairwise";
    case Algorithm::kDissemination:
      return "dissemination";
    case Algorithm::kDirect:
      return "direct";
  }
  return "?";
}

std::optional<Algorithm> parse_algorithm(std::string_view name) {
  for (Algorithm a :
       {Algorithm::kAuto, Algorithm::kRing, Algorithm::kTree, Algorithm::kDoubleBinaryTree,
        Algorithm::kRabenseifner, Algorithm::kRecursiveDoubling, Algorithm::kPairwise,
        Algorithm::kDissemination, Algorithm::kDirect}) {
    if (algorithm_name(a) == name) return a;
  }
  if (name == "binomial" || name == "binomial_tree") return Algorithm::kTree;
  if (name == "double_binary_tree" || name == "double_tree") return Algorithm::kDoubleBinaryTree;
  if (name == "recursive_doubling") return Algorithm::kRecursiveDoubling;
  if (name == "halving_doubling" || name == "rhd") return Algorithm::kRabenseifner;
  return std::nullopt;
}

bool algorithm_supports(Algorithm algo, CollectiveKind kind) {
  using K = CollectiveKind;
  switch (algo) {
    case Algorithm::kAuto:
      return true;
    case Algorithm::kRing:
      return kind == K::kAllreduce || kind == K::kReduceScatter || kind == K::kAllgather ||
             kind == K::kBroadcast || kind == K::kReduce;
    case Algorithm::kTree:
      return kind == K::kAllreduce || kind == K::kBroadcast || kind == K::kReduce ||
             kind == K::kBarrier;
    case Algorithm::kDoubleBinaryTree:
      return kind == K::kAllreduce;
    case Algorithm::kRabenseifner:
      return kind == K::kAllreduce || kind == K::kReduceScatter || kind == K::kReduce;
    case Algorithm::kRecursiveDoubling:
      return kind == K::kAllreduce || kind == K::kAllgather || kind == K::kReduceScatter;
    case Algorithm::kPairwise:
      return kind == K::kAlltoall;
    case Algorithm::kDissemination:
      return kind == K::kBarrier;
    case Algorithm::kDirect:
      return kind == K::kAllgather || kind == K::kAllreduce;
  }
  return false;
}

bool reducible_dtype(DataType t) {
  return t != DataType::kBool;
}

}  // namespace rdmaflow
