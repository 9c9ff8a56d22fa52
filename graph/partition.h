// Partitioning: one subgraph per rank, with a Send/Recv pair on every edge
// that crosses ranks.
//
// A tensor produced on rank s and read by ops on ranks d1, d2, ... becomes one
// transfer per destination rank, however many ops read it there: a Send on s
// and a Recv on d. The Recv produces a tensor of the same name on d, so the
// consumers there are unchanged. Transfer ids are dense, 0.., ordered by
// (tensor id, destination rank) and so deterministic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "graph/ir.h"
#include "graph/placement.h"

namespace rdmaflow::graph {

using TransferId = uint32_t;

// Op types the partitioner adds. Their attrs carry "transfer_id" and "peer".
inline constexpr const char* kSendOpType = "Send";
inline constexpr const char* kRecvOpType = "Recv";

// "send:<tensor>:to:<rank>", "recv:<tensor>:from:<rank>".
std::string send_op_name(const std::string& tensor, int dst);
std::string recv_op_name(const std::string& tensor, int src);

struct Edge {
  TransferId id = 0;
  TensorId tensor = 0;  // in the original graph
  int src_rank = 0;
  int dst_rank = 0;
  OpId send_op = kNoOp;  // in the source rank's subgraph
  OpId recv_op = kNoOp;  // in the destination rank's subgraph
};

struct RankGraph {
  int rank = 0;
  Graph graph;                      // local ops, then Send and Recv ops
  std::vector<std::string> device;  // per local op (Send/Recv: the producer's / first reader's)
  std::vector<OpId> original_op;    // per local op; kNoOp for Send/Recv
  std::vector<TensorId> original_tensor;  // per local tensor
  std::vector<int64_t> transfer_of_op;    // per local op; -1 unless Send/Recv
};

struct PartitionedGraph {
  const Graph* original = nullptr;  // not owned; must outlive this
  int num_ranks = 0;
  // graph_fingerprint(graph, placement): what ranks compare at setup.
  uint64_t graph_hash = 0;
  std::vector<RankGraph> ranks;
  std::vector<Edge> transfers;  // indexed by TransferId
};

// A 64-bit FNV-1a fingerprint of everything planning depends on: the graph's
// name, every tensor (name, dtype, shape, size hint) and op (name, type,
// attributes, inputs, outputs) in order, and each op's rank and device.
uint64_t graph_fingerprint(const Graph& graph, const Placement& placement);

// Validates the graph and the placement, then splits. `graph` must outlive
// the result.
Result<PartitionedGraph> partition(const Graph& graph, const Placement& placement, int num_ranks);

}  // namespace rdmaflow::graph
