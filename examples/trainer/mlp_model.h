// The MLP the reference executor trains, as a graph, in four settings:
//
//  kSingle          one rank runs the whole training step on the full batch.
//  kParameterServer ranks 0..servers-1 hold the variables; every other rank is
//                   a worker with its own shard of the batch that pulls the
//                   parameters (transfers server -> worker) and pushes its
//                   gradients (worker -> server) each step; servers sum them
//                   (AddN, in worker order) and apply SGD scaled by 1/workers.
//                   The setting of the EuroSys'19 paper.
//  kModelParallel   the layers are cut into contiguous blocks, one per rank:
//                   activations flow down the ranks, gradients flow back.
//  kDataParallel    every rank runs the same replica graph (a 1-rank graph) on
//                   its shard; gradients go through AllReduce (average) ops
//                   before the SGD update.
//
// Every setting computes the same mathematical step, so a distributed run must
// agree with a single-process run of the same graph (tests/session).
//
// Tensors: per layer l (1..L) variables "W<l>" [in, out] and "b<l>" [out];
// inputs "x" [batch, widths[0]] f32 and "y" [batch] i32 (labels); forward
// z<l> = x W, a<l> = z + b, h<l> = relu(a) (the last a<l> are the logits);
// "loss" = softmax cross-entropy. Worker tensors in the parameter-server graph
// carry the prefix "w<k>/". Input ops have attributes "shard" and "num_shards"
// (-1: the rank's own, in the data-parallel replica).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "graph/graph_json.h"

namespace rdmaflow::exec {

enum class MlpMode { kSingle, kParameterServer, kModelParallel, kDataParallel };

// "single", "ps", "mp", "dp".
std::string mlp_mode_name(MlpMode mode);
Result<MlpMode> parse_mlp_mode(const std::string& name);

struct MlpConfig {
  std::vector<int64_t> widths = {64, 128, 128, 10};  // input, hidden..., classes
  int64_t batch = 32;                                // global batch per step
  double learning_rate = 0.1;
};

struct MlpGraph {
  graph::GraphFile file;  // graph and placement
  int num_ranks = 1;      // ranks the graph is placed on (1 for kSingle and kDataParallel)
  // The loss tensors; the step's loss is their mean.
  std::vector<std::string> losses;
  // Variable op names ("W1", "b1", ...).
  std::vector<std::string> variables;
};

// `ranks`: processes of the job (kSingle ignores it; kParameterServer needs
// more than `servers`). The batch must divide evenly among workers / replicas.
Result<MlpGraph> build_mlp(const MlpConfig& config, MlpMode mode, int ranks, int servers = 1);

}  // namespace rdmaflow::exec
