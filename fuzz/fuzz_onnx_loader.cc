// libFuzzer target: the ONNX loader must return an error for anything
// malformed, never crash, hang or allocate without bound; whatever loads must
// partition into pipeline stages, with and without the backward pass, and
// plan to a plan that passes check_plan.
// Built and run by scripts/fuzz.sh (clang, -DRDMAFLOW_FUZZ=ON), beside
// fuzz_graph_loader.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "graph/analyze.h"
#include "graph/onnx/onnx_loader.h"
#include "graph/pipeline.h"
#include "graph/plan_json.h"
#include "graph/training.h"

namespace rg = rdmaflow::graph;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  rg::OnnxOptions options;
  options.dims["batch"] = 1 + static_cast<int64_t>(size % 16);  // refused when unused: fine
  auto model = rg::parse_onnx_model(bytes, options, "fuzz.onnx");
  if (!model) {
    options.dims.clear();
    model = rg::parse_onnx_model(bytes, options, "fuzz.onnx");
    if (!model) return 0;
  }
  const rg::Graph& g = model->file.graph;
  if (g.num_ops() > 2000) return 0;
  const int stages = 1 + static_cast<int>(size % 4);
  auto p = rg::pipeline_partition(g, stages);
  FUZZ_CHECK(p);  // a loaded model partitions into pipeline stages
  auto plan = rg::plan_transfers(g, p->placement, stages);
  FUZZ_CHECK(!plan || rg::check_plan(*plan));
  auto train = rg::add_backward(g, p->placement, rg::PlanOptions{}.dynamic_size_hint);
  if (!train) return 0;  // e.g. a gradient name taken by a tensor of the model
  auto train_plan = rg::plan_transfers(train->graph, train->placement, stages);
  FUZZ_CHECK(!train_plan || rg::check_plan(*train_plan));
  return 0;
}
