// The ONNX loader: an ONNX model (a protobuf ModelProto, parsed and
// shape-inferred by ONNX's own C++ library) into rdmaflow's graph IR
// (docs/graph-format.md, "ONNX models").
//
// What becomes what:
//  - each initializer: a tensor (its dtype and dims) produced by an op of type
//    "Variable" named after it; each graph input that is not an initializer: a
//    tensor produced by an op of type "Input";
//  - each node: an op of its op_type (nodes of another domain: "domain:type")
//    with its scalar and list attributes; a nameless or repeated node name
//    becomes "<op_type>_<index>";
//  - every other value: a tensor whose dtype and shape come from the graph's
//    inputs, outputs and value_info after ONNX shape inference. A symbolic
//    ("batch") or unknown dimension becomes kUnknownDim; when every unknown
//    dimension of a tensor is symbolic and bound by OnnxOptions::dims, the
//    tensor's size_hint is its size with those values. A value shape inference
//    knows nothing about becomes f32[?] (counted in OnnxSummary).
//
// Refused, with one error naming the file and the node or tensor: bytes that
// are not an ONNX model, truncated or corrupt protobuf, a model over 2 GiB
// (protobuf's limit: keep weights as external data), an IR version or default
// opset this ONNX library does not know, a node with a subgraph (If, Loop,
// Scan), a node input nothing declares, cycles, element types rdmaflow has no
// dtype for, more than 32 dimensions, a dimension over 2^48, an initializer
// whose data does not match its dims, and external data that is missing,
// outside the model's directory or shorter than the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "graph/graph_json.h"
#include "graph/model_format.h"

namespace rdmaflow::graph {

// Largest model file read (protobuf refuses messages of 2 GiB and more).
inline constexpr uint64_t kMaxOnnxBytes = (uint64_t{1} << 31) - 1;
// Largest single dimension accepted; a larger one is taken as a damaged file.
inline constexpr int64_t kMaxOnnxDim = kMaxDimBinding;

struct OnnxOptions {
  // Values for symbolic dimensions ("batch" -> 8): size hints, not shapes.
  std::map<std::string, int64_t> dims;
  // Where external-data files are looked up (the model's directory); empty:
  // a model with external data is refused.
  std::string base_dir;
  // Run onnx::shape_inference (with data propagation) before converting.
  bool infer_shapes = true;
};

struct OnnxSummary {
  int64_t ir_version = 0;
  int64_t opset = 0;  // of the default domain
  std::string producer;
  size_t initializers = 0;
  uint64_t weight_bytes = 0;  // of all initializers
  size_t external_initializers = 0;
  size_t inputs = 0;  // graph inputs that are not initializers
  size_t outputs = 0;
  std::vector<std::string> symbolic_dims;  // sorted, distinct
  size_t tensors_without_shape = 0;        // became f32[?]
};

struct OnnxModel {
  GraphFile file;  // placement: unplaced (ONNX has none)
  OnnxSummary summary;
};

// `where` names the model in errors (a path, or "<memory>").
Result<OnnxModel> parse_onnx_model(std::string_view bytes, const OnnxOptions& options,
                                   const std::string& where = "<memory>");

// Reads `path` (refusing files over kMaxOnnxBytes before reading them) and
// parses it; external data is looked up beside it unless options.base_dir is set.
Result<OnnxModel> load_onnx_file(const std::string& path, OnnxOptions options = {});

}  // namespace rdmaflow::graph
