#include "collectives/algorithms/registry.h"

#include <string>

#include "collectives/topology.h"

namespace rdmaflow {

size_t temp_elems(const CollArgs& a, Algorithm algo) {
  const size_t n = static_cast<size_t>(a.world);
  switch (a.kind) {
    case CollectiveKind::kAllreduce:
      return algo == Algorithm::kRecursiveDoubling || (algo == Algorithm::kDirect && a.in == a.out)
                 ? a.count
                 : 0;
    case CollectiveKind::kReduceScatter:
      return (algo == Algorithm::kRecursiveDoubling ? 2 : 1) * n * a.count;
    case CollectiveKind::kReduce:
      return a.count;
    case CollectiveKind::kAlltoall:
      return a.in == a.out ? n * a.count : 0;
    case CollectiveKind::kBarrier:
      return static_cast<size_t>(ceil_log2(a.world)) + 2;  // one-byte tokens
    case CollectiveKind::kAllgather:
    case CollectiveKind::kBroadcast:
      return 0;
  }
  return 0;
}

Status build_program(const CollArgs& a, Algorithm algo, Program& p) {
  using K = CollectiveKind;
  using A = Algorithm;
  switch (a.kind) {
    case K::kAllreduce:
      if (algo == A::kRing) return ring_allreduce(a, p), Status::ok();
      if (algo == A::kTree) return tree_allreduce(a, p), Status::ok();
      if (algo == A::kDoubleBinaryTree) return dbtree_allreduce(a, p), Status::ok();
      if (algo == A::kRabenseifner) return rabenseifner_allreduce(a, p), Status::ok();
      if (algo == A::kRecursiveDoubling) return rd_allreduce(a, p), Status::ok();
      if (algo == A::kDirect) return direct_allreduce(a, p), Status::ok();
      break;
    case K::kReduceScatter:
      if (algo == A::kRing) return ring_reduce_scatter(a, p), Status::ok();
      if (algo == A::kRabenseifner) return rabenseifner_reduce_scatter(a, p), Status::ok();
      if (algo == A::kRecursiveDoubling) return rd_reduce_scatter(a, p), Status::ok();
      break;
    case K::kAllgather:
      if (algo == A::kRing) return ring_allgather(a, p), Status::ok();
      if (algo == A::kRecursiveDoubling) return rd_allgather(a, p), Status::ok();
      if (algo == A::kDirect) return direct_allgather(a, p), Status::ok();
      break;
    case K::kBroadcast:
      if (algo == A::kRing) return ring_broadcast(a, p), Status::ok();
      if (algo == A::kTree) return tree_broadcast(a, p), Status::ok();
      break;
    case K::kReduce:
      if (algo == A::kRing) return ring_reduce(a, p), Status::ok();
      if (algo == A::kTree) return tree_reduce(a, p), Status::ok();
      if (algo == A::kRabenseifner) return rabenseifner_reduce(a, p), Status::ok();
      break;
    case K::kBarrier:
      if (algo == A::kDissemination) return dissemination_barrier(a, p), Status::ok();
      if (algo == A::kTree) return tree_barrier(a, p), Status::ok();
      break;
    case K::kAlltoall:
      if (algo == A::kPairwise) return pairwise_alltoall(a, p), Status::ok();
      break;
  }
  return RDMAFLOW_ERROR(Code::kInvalidArgument, std::string(collective_name(a.kind)), -1,
                        "algorithm '" + std::string(algorithm_name(algo)) +
                            "' does not implement " + std::string(collective_name(a.kind)));
}

}  // namespace rdmaflow
