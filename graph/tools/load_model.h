// What rdmaflow's graph tools (rdmaflow-plan, plan_bench) share to read a
// model: the format is chosen by the file's bytes (graph/model_format.h), not
// its name. ONNX needs the loader in graph/onnx, built when libonnx-dev is
// found; without it an ONNX file is answered with how to get it.
#pragma once

#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "common/status.h"
#include "graph/graph_json.h"
#include "graph/model_format.h"
#ifdef RDMAFLOW_HAVE_ONNX
#include "graph/onnx/onnx_loader.h"
#endif

namespace rdmaflow::graph {

struct LoadedModel {
  GraphFile file;
  ModelFormat format = ModelFormat::kJson;
  std::string description;  // "ONNX (IR 7, opset 14, pytorch 1.13.1): 26 initializers, ..."
};

inline Result<LoadedModel> load_model(const std::string& path,
                                      const std::map<std::string, int64_t>& dims) {
  char head[4] = {};
  std::ifstream in(path, std::ios::binary);
  if (!in) return RDMAFLOW_ERROR(Code::kNotFound, "load graph " + path, -1, "cannot open the file");
  in.read(head, sizeof head);
  LoadedModel m;
  m.format = detect_model_format(std::string_view(head, static_cast<size_t>(in.gcount())));
  if (m.format == ModelFormat::kUnknown) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, "load graph " + path, -1,
        "neither an rdmaflow JSON graph (starts with '{') nor an ONNX model (a "
        "protobuf ModelProto); the file " +
            (in.gcount() == 0 ? std::string("is empty")
                              : describe_start(std::string_view(head, in.gcount()))));
  }
  if (m.format != ModelFormat::kOnnx) {
    if (!dims.empty()) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, "load graph " + path, -1,
                            "--dim applies to ONNX models; give a JSON graph's tensors a "
                            "size_hint instead");
    }
    RDMAFLOW_ASSIGN_OR_RETURN(m.file, load_graph_file(path));
    m.format = ModelFormat::kJson;
    m.description = "JSON";
    return m;
  }
#ifdef RDMAFLOW_HAVE_ONNX
  OnnxOptions options;
  options.dims = dims;
  RDMAFLOW_ASSIGN_OR_RETURN(OnnxModel onnx, load_onnx_file(path, options));
  const OnnxSummary& s = onnx.summary;
  m.file = std::move(onnx.file);
  m.description = "ONNX (IR " + std::to_string(s.ir_version) + ", opset " +
                  std::to_string(s.opset) + (s.producer.empty() ? "" : ", " + s.producer) +
                  "): " + std::to_string(s.inputs) + " inputs, " + std::to_string(s.initializers) +
                  " initializers (" + std::to_string(s.weight_bytes) + " bytes";
  if (s.external_initializers) {
    m.description += ", " + std::to_string(s.external_initializers) + " external";
  }
  m.description += ")";
  if (!s.symbolic_dims.empty()) {
    // Bound ones first; ONNX's inference names many more ("unk__3"): counted only.
    m.description += ", symbolic dims:";
    size_t shown = 0;
    for (const auto& [name, value] : dims) {
      m.description += " " + name + "=" + std::to_string(value);
      ++shown;
    }
    for (const auto& d : s.symbolic_dims) {
      if (dims.count(d) || shown >= 6) continue;
      m.description += " " + d;
      ++shown;
    }
    if (s.symbolic_dims.size() > shown) {
      m.description += " (+" + std::to_string(s.symbolic_dims.size() - shown) + " more)";
    }
  }
  if (s.tensors_without_shape) {
    m.description += ", " + std::to_string(s.tensors_without_shape) + " tensors of unknown shape";
  }
  return m;
#else
  return RDMAFLOW_ERROR(Code::kNotViable, "load graph " + path, -1,
                        "this is an ONNX model, but this build has no ONNX loader (it needs "
                        "libonnx-dev, see scripts/install-deps.sh, and RDMAFLOW_WITH_ONNX=ON)");
#endif
}

}  // namespace rdmaflow::graph
