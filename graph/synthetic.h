// Graph generators: the shipped examples (graph/examples/*.json are their
// output), random DAGs for property tests, and large layered graphs for the
// planning benchmark.
#pragma once

#include <cstdint>

#include "graph/graph_json.h"

namespace rdmaflow::graph::synthetic {

// Model-parallel MLP, one training step: `layers` fully connected layers cut
// into `ranks` contiguous blocks (forward activations flow down the ranks,
// gradients flow back), SGD updates next to the weights.
GraphFile mlp_model_parallel(int layers = 8, int ranks = 4, int64_t batch = 64,
                             int64_t hidden = 4096);

// Parameter server, one step: `layers` weight tensors spread over `servers`;
// each of `workers` reads every weight, runs forward and backward and sends
// every gradient back; servers aggregate (AddN) and apply. Ranks 0..servers-1
// are servers, the rest workers.
GraphFile parameter_server(int workers = 6, int servers = 2, int layers = 16, int64_t batch = 32,
                           int64_t hidden = 1024);

// Sequence-to-sequence inference with a recurrent decoder unrolled over
// `steps`: rank 0 encodes a source sentence of run-time length (a dynamic
// tensor sent to rank 1 for attention) and runs the first decoder layer;
// rank 1 runs the second layer, attention, the projection and the argmax whose
// token feeds rank 0's next step.
GraphFile unrolled_rnn(int steps = 64, int64_t batch = 32, int64_t hidden = 512,
                       int64_t vocab = 8000);

// A random DAG: `ops` ops with 0..3 inputs each (from earlier ops), 1..2
// outputs, random dtypes and shapes (some dimensions unknown), added in a
// shuffled file order, and a random placement on `ranks` ranks.
GraphFile random_dag(uint64_t seed, int ops, int ranks);

// A layered DAG of about `ops` ops, `width` ops per layer, each reading 1..3
// outputs of the previous two layers; static f32 tensors with a few dynamic
// ones. No placement (use default_placement).
Graph layered(int ops, int width = 64, uint64_t seed = 1);

}  // namespace rdmaflow::graph::synthetic
