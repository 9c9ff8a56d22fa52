// The vocabulary of the collectives layer: operations, reductions, algorithms.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "common/dtype.h"

namespace rdmaflow {

// Element-wise reductions. kAvg is a sum followed by one division by the world
// size (floating types: multiply by 1/n in the accumulation type; integer
// types: truncating division, i.e. rounding toward zero, as C++ does).
enum class ReduceOp : uint8_t { kSum, kProd, kMin, kMax, kAvg };

inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kAvg};

std::string_view reduce_op_name(ReduceOp op);  // "sum", "prod", "min", "max", "avg"
std::optional<ReduceOp> parse_reduce_op(std::string_view name);

enum class CollectiveKind : uint8_t {
  kAllreduce,
  kReduceScatter,
  kAllgather,
  kBroadcast,
  kReduce,
  kBarrier,
  kAlltoall,
};

inline constexpr CollectiveKind kAllCollectives[] = {
    CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllgather,
    CollectiveKind::kBroadcast, CollectiveKind::kReduce,        CollectiveKind::kBarrier,
    CollectiveKind::kAlltoall};

// "allreduce", "reduce_scatter", ...
std::string_view collective_name(CollectiveKind kind);
// The knob that forces an algorithm: "RDMAFLOW_ALLREDUCE_ALGO", ...
const char* collective_algo_env(CollectiveKind kind);

// Algorithms: the id of a row of the registry (collectives/algorithms/registry.h),
// which holds each one's name, aliases, collectives, scratch and cost.
enum class Algorithm : uint8_t {
  kAuto,               // chosen by the cost model
  kRing,               // ring reduce-scatter + allgather, chunked and pipelined
  kTree,               // binomial tree (pipelined by chunks)
  kDoubleBinaryTree,   // two complementary binary trees, each carrying half the data
  kRabenseifner,       // recursive halving reduce-scatter + recursive doubling allgather
  kRecursiveDoubling,  // log2(n) full-size exchanges, for tiny messages
  kPairwise,           // alltoall: n-1 pairwise exchange steps
  kDissemination,      // barrier: ceil(log2 n) rounds of zero-payload notifies
  kDirect,             // allgather, allreduce: every rank writes its block to every other at once
  kHier,  // allreduce: reduce-scatter within hosts, allreduce between, allgather within
};

// "auto", or the algorithm's name in the registry ("ring", "tree", "dbtree", ...).
std::string_view algorithm_name(Algorithm algo);
// Accepts "auto" and every name and alias of the registry ("binomial",
// "recursive_doubling", ...).
std::optional<Algorithm> parse_algorithm(std::string_view name);

// Whether the registry row of `algo` implements `kind` (kAuto: always).
bool algorithm_supports(Algorithm algo, CollectiveKind kind);

// True for types a reduction accepts (every type but bool).
bool reducible_dtype(DataType t);

}  // namespace rdmaflow
