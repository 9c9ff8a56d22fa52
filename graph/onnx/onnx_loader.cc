#include "graph/onnx/onnx_loader.h"

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <sys/stat.h>

#include <charconv>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "graph/model_format.h"
#include "graph/onnx/onnx_types.h"
#include "graph/validate.h"

namespace rdmaflow::graph {

namespace {

using onnx_detail::convert_attributes;
using onnx_detail::convert_initializer;
using onnx_detail::convert_value_type;
using onnx_detail::DimContext;
using onnx_detail::TensorType;

constexpr int64_t kMinIrVersion = 3;  // the first with opset_import

std::string q(const std::string& s) {
  return "'" + s + "'";
}

Status bad(const std::string& reason) {
  return RDMAFLOW_ERROR(Code::kInvalidArgument, "load ONNX", -1, reason);
}

std::string node_label(const onnx::NodeProto& n, int index) {
  std::string s = "node " + (n.name().empty() ? "#" + std::to_string(index) : q(n.name()));
  return s + " (" + n.op_type() + ")";
}

Result<uint64_t> parse_u64(const std::string& text, const std::string& what) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return bad(what + ": " + q(text) + " is not a byte count");
  }
  return v;
}

// External data (onnx.proto: location, offset, length) must be a file inside
// the model's directory holding at least the tensor's bytes at that offset.
// Planning needs only the shapes, so the bytes are checked, not loaded.
Status check_external(const onnx::TensorProto& t, const TensorType& type,
                      const std::string& base_dir, const std::string& what) {
  std::string location;
  uint64_t offset = 0, length = 0;
  bool has_length = false;
  for (const auto& kv : t.external_data()) {
    if (kv.key() == "location") {
      location = kv.value();
    } else if (kv.key() == "offset") {
      RDMAFLOW_ASSIGN_OR_RETURN(offset, parse_u64(kv.value(), what + " external offset"));
    } else if (kv.key() == "length") {
      RDMAFLOW_ASSIGN_OR_RETURN(length, parse_u64(kv.value(), what + " external length"));
      has_length = true;
    }
  }
  if (location.empty()) return bad(what + ": external data without a 'location'");
  if (location.front() == '/' || location == ".." || location.rfind("../", 0) == 0 ||
      location.find("/../") != std::string::npos ||
      (location.size() >= 3 && location.compare(location.size() - 3, 3, "/..") == 0)) {
    return bad(what + ": external data file " + q(location) +
               " is outside the model's directory (refused)");
  }
  if (base_dir.empty()) {
    return bad(what + ": external data file " + q(location) +
               " cannot be read: the model was given without its directory");
  }
  const std::string path = base_dir + "/" + location;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return bad(what + ": external data file " + q(location) + " not found beside the model (" +
               path + ")");
  }
  const uint64_t need = *static_bytes(type.dtype, type.shape);
  if (has_length && length != need) {
    return bad(what + ": external length " + std::to_string(length) + " bytes, but " +
               std::string(dtype_name(type.dtype)) + shape_to_string(type.shape) + " is " +
               std::to_string(need) + " bytes");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (offset > size || size - offset < need) {
    return bad(what + ": external data file " + q(location) + " has " + std::to_string(size) +
               " bytes; the tensor needs " + std::to_string(need) + " at offset " +
               std::to_string(offset));
  }
  return Status::ok();
}

Result<int64_t> default_opset(const onnx::ModelProto& m) {
  int64_t opset = -1;
  for (const auto& o : m.opset_import()) {
    if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
  }
  const auto& ranges = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  auto it = ranges.find(onnx::ONNX_DOMAIN);
  const int lo = it == ranges.end() ? 1 : it->second.first;
  const int hi = it == ranges.end() ? 1 : it->second.second;
  if (opset < 0) return bad("the model imports no opset of the default ONNX domain");
  if (opset < lo || opset > hi) {
    return bad("opset " + std::to_string(opset) + " of the default domain is not supported (this " +
               "ONNX library knows " + std::to_string(lo) + ".." + std::to_string(hi) + ")");
  }
  return opset;
}

// Unique op names: a node's own name when it has a fresh one, else
// "<op_type>_<index>" (the index makes it fresh).
std::vector<std::string> node_names(const onnx::GraphProto& g) {
  std::vector<std::string> names;
  names.reserve(static_cast<size_t>(g.node_size()));
  std::unordered_set<std::string> used;
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    std::string name = n.name();
    if (name.empty() || used.count(name)) {
      name = (n.op_type().empty() ? "node" : n.op_type()) + "_" + std::to_string(i);
      while (used.count(name)) name += "_";
    }
    used.insert(name);
    names.push_back(std::move(name));
  }
  return names;
}

class Converter {
 public:
  Converter(onnx::ModelProto& m, const OnnxOptions& o) : m_(m), g_(*m.mutable_graph()), o_(o) {
    dims_.bindings = &o.dims;
  }

  Result<OnnxModel> run() {
    RDMAFLOW_RETURN_IF_ERROR(check_model());
    RDMAFLOW_RETURN_IF_ERROR(check_values());     // before ONNX's inference reads them
    RDMAFLOW_RETURN_IF_ERROR(check_producers());  // likewise
    if (o_.infer_shapes) RDMAFLOW_RETURN_IF_ERROR(infer());
    RDMAFLOW_RETURN_IF_ERROR(build());
    for (const auto& [name, value] : o_.dims) {
      if (!dims_.seen.count(name)) {
        std::string known;
        for (const auto& s : dims_.seen) known += (known.empty() ? "" : ", ") + s;
        return bad("--dim " + name + "=" + std::to_string(value) +
                   " names no symbolic dimension of the model (it has: " +
                   (known.empty() ? "none" : known) + ")");
      }
    }
    out_.summary.symbolic_dims.assign(dims_.seen.begin(), dims_.seen.end());
    Status st = validate(out_.file.graph);
    if (!st) return bad(st.reason());
    out_.file.placement = Placement::unplaced(out_.file.graph);
    return std::move(out_);
  }

 private:
  Status check_model() {
    const int64_t ir = m_.ir_version();
    if (ir < kMinIrVersion || ir > onnx::IR_VERSION) {
      return bad("IR version " + std::to_string(ir) + " is not supported (this ONNX library " +
                 "reads " + std::to_string(kMinIrVersion) + ".." +
                 std::to_string(onnx::IR_VERSION) + ")" +
                 (ir == 0 ? "; a model without an IR version is truncated or not ONNX" : ""));
    }
    RDMAFLOW_ASSIGN_OR_RETURN(out_.summary.opset, default_opset(m_));
    if (!m_.has_graph()) return bad("the model has no graph");
    out_.summary.ir_version = ir;
    out_.summary.producer = m_.producer_name();
    if (!m_.producer_version().empty()) out_.summary.producer += " " + m_.producer_version();
    for (int i = 0; i < g_.node_size(); ++i) {
      RDMAFLOW_ASSIGN_OR_RETURN(Attributes a, convert_attributes(g_.node(i), label(i)));
      (void)a;  // refuses subgraphs before shape inference would descend into them
    }
    return Status::ok();
  }

  Status check_values() {
    for (const auto& list : {&g_.input(), &g_.output(), &g_.value_info()}) {
      for (const auto& v : *list) {
        DimContext scratch;
        auto t = convert_value_type(&v.type(), "tensor " + q(v.name()), scratch);
        if (!t) return t.status();
      }
    }
    for (const auto& t : g_.initializer()) {
      auto c = convert_initializer(t, "initializer " + q(t.name()));
      if (!c) return c.status();
    }
    return Status::ok();
  }

  // Every value has at most one producer (an input, an initializer or a node
  // output) and every node input has one. ONNX's inference would otherwise
  // answer with a shape conflict far from the cause.
  Status check_producers() {
    std::unordered_map<std::string, std::string> producer;
    for (const auto& v : g_.input()) producer.emplace(v.name(), "graph input");
    for (const auto& t : g_.initializer()) producer[t.name()] = "initializer";
    for (int i = 0; i < g_.node_size(); ++i) {
      for (const auto& o : g_.node(i).output()) {
        if (o.empty()) continue;
        auto [it, fresh] = producer.emplace(o, label(i));
        if (!fresh) {
          return bad(label(i) + ": tensor " + q(o) + " has two producers: " + it->second + " and " +
                     label(i));
        }
      }
    }
    for (int i = 0; i < g_.node_size(); ++i) {
      for (const auto& in : g_.node(i).input()) {
        if (!in.empty() && !producer.count(in)) {
          return bad(label(i) + ": dangling input " + q(in) + " (no input, initializer or node " +
                     "output has that name)");
        }
      }
    }
    return Status::ok();
  }

  Status infer() {
    try {
      // error_mode 0: a node inference cannot handle leaves its outputs unknown.
      onnx::ShapeInferenceOptions options(/*check_type=*/false, /*error_mode=*/0,
                                          /*data_prop=*/true);
      onnx::shape_inference::InferShapes(m_, onnx::OpSchemaRegistry::Instance(), options);
    } catch (const std::exception& e) {
      return bad(std::string("ONNX shape inference failed: ") + e.what());
    }
    return Status::ok();
  }

  std::string label(int i) const { return node_label(g_.node(i), i); }

  Status declare(const std::string& name, const TensorType& t) {
    Graph& g = out_.file.graph;
    if (g.find_tensor(name)) return Status::ok();
    auto id = g.add_tensor(name, t.dtype, t.shape, t.size_hint);
    if (!id) return bad(id.status().reason());
    if (!t.known) ++out_.summary.tensors_without_shape;
    return Status::ok();
  }

  // An op name for a source op (Input, Variable) named after its tensor,
  // kept apart from the node names.
  std::string source_op_name(const std::string& tensor, const char* suffix) {
    std::string name = tensor.empty() ? std::string(suffix) : tensor;
    while (reserved_.count(name) || out_.file.graph.find_op(name)) name += suffix;
    return name;
  }

  Status add_source(const std::string& tensor, const char* type, const char* suffix) {
    auto op = out_.file.graph.add_op(source_op_name(tensor, suffix), type, {}, {tensor});
    if (!op) return bad(op.status().reason());
    return Status::ok();
  }

  Status build() {
    Graph& g = out_.file.graph;
    g.name = g_.name().empty() ? "onnx_model" : g_.name();
    g.reserve(static_cast<size_t>(g_.node_size() + g_.initializer_size() + g_.input_size()),
              static_cast<size_t>(g_.node_size() * 2 + g_.initializer_size()));
    std::unordered_map<std::string, const onnx::TypeProto*> types;
    for (const auto& list : {&g_.input(), &g_.output(), &g_.value_info()}) {
      for (const auto& v : *list) types.emplace(v.name(), &v.type());
    }
    auto type_of = [&](const std::string& name) -> Result<TensorType> {
      auto it = types.find(name);
      return convert_value_type(it == types.end() ? nullptr : it->second, "tensor " + q(name),
                                dims_);
    };
    const std::vector<std::string> names = node_names(g_);
    reserved_.insert(names.begin(), names.end());

    std::unordered_set<std::string> initializers;
    for (const auto& t : g_.initializer()) initializers.insert(t.name());
    // Graph inputs first (older exporters list initializers among them too).
    for (const auto& v : g_.input()) {
      if (initializers.count(v.name())) continue;
      RDMAFLOW_ASSIGN_OR_RETURN(TensorType t, type_of(v.name()));
      RDMAFLOW_RETURN_IF_ERROR(declare(v.name(), t));
      RDMAFLOW_RETURN_IF_ERROR(add_source(v.name(), "Input", ":input"));
      ++out_.summary.inputs;
    }
    for (const auto& init : g_.initializer()) {
      const std::string what = "initializer " + q(init.name());
      RDMAFLOW_ASSIGN_OR_RETURN(TensorType t, convert_initializer(init, what));
      if (init.data_location() == onnx::TensorProto::EXTERNAL) {
        RDMAFLOW_RETURN_IF_ERROR(check_external(init, t, o_.base_dir, what));
        ++out_.summary.external_initializers;
      }
      if (g.find_tensor(init.name())) return bad(what + ": a second initializer of that name");
      RDMAFLOW_RETURN_IF_ERROR(declare(init.name(), t));
      RDMAFLOW_RETURN_IF_ERROR(add_source(init.name(), "Variable", ":init"));
      ++out_.summary.initializers;
      out_.summary.weight_bytes += *static_bytes(t.dtype, t.shape);
    }
    for (int i = 0; i < g_.node_size(); ++i) {
      for (const auto& o : g_.node(i).output()) {
        if (o.empty()) continue;  // an optional output left out
        RDMAFLOW_ASSIGN_OR_RETURN(TensorType t, type_of(o));
        RDMAFLOW_RETURN_IF_ERROR(declare(o, t));
      }
    }
    std::vector<std::string> inputs, outputs;
    for (int i = 0; i < g_.node_size(); ++i) {
      const onnx::NodeProto& n = g_.node(i);
      inputs.clear();
      outputs.clear();
      for (const auto& in : n.input()) {
        if (!in.empty()) inputs.push_back(in);  // "" is an optional input left out
      }
      for (const auto& o : n.output()) {
        if (!o.empty()) outputs.push_back(o);
      }
      RDMAFLOW_ASSIGN_OR_RETURN(Attributes attrs, convert_attributes(n, label(i)));
      std::string type = n.op_type().empty() ? std::string("?") : n.op_type();
      if (!n.domain().empty() && n.domain() != "ai.onnx") type = n.domain() + ":" + type;
      auto op = g.add_op(names[static_cast<size_t>(i)], std::move(type), inputs, outputs,
                         std::move(attrs));
      if (!op) return bad(label(i) + ": " + op.status().reason());
    }
    out_.summary.outputs = static_cast<size_t>(g_.output_size());
    return Status::ok();
  }

  onnx::ModelProto& m_;
  onnx::GraphProto& g_;
  const OnnxOptions& o_;
  DimContext dims_;
  std::unordered_set<std::string> reserved_;
  OnnxModel out_;
};

Status with_file(const Status& st, const std::string& where) {
  return RDMAFLOW_ERROR(st.code(), "load graph " + where, -1, st.reason());
}

}  // namespace

Result<OnnxModel> parse_onnx_model(std::string_view bytes, const OnnxOptions& options,
                                   const std::string& where) {
  if (bytes.size() > kMaxOnnxBytes) {
    return with_file(bad("the model is " + std::to_string(bytes.size()) +
                         " bytes; protobuf reads at most 2 GiB (store the weights as external "
                         "data beside it)"),
                     where);
  }
  if (detect_model_format(bytes) != ModelFormat::kOnnx) {
    return with_file(bad("not an ONNX model (" + describe_start(bytes) +
                         "; an ONNX model is a protobuf ModelProto)"),
                     where);
  }
  onnx::ModelProto m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return with_file(bad("not a valid ONNX model: the protobuf does not parse (truncated or "
                         "corrupt file)"),
                     where);
  }
  try {
    auto r = Converter(m, options).run();
    if (!r) return with_file(r.status(), where);
    return r;
  } catch (const std::exception& e) {  // protobuf or ONNX internals (e.g. bad_alloc)
    return with_file(bad(e.what()), where);
  }
}

Result<OnnxModel> load_onnx_file(const std::string& path, OnnxOptions options) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return RDMAFLOW_ERROR(Code::kNotFound, "load graph " + path, -1, "cannot open the file");
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxOnnxBytes) {
    return with_file(bad(std::to_string(st.st_size) +
                         " bytes; protobuf reads at most 2 GiB (store the weights as external "
                         "data beside it)"),
                     path);
  }
  RDMAFLOW_ASSIGN_OR_RETURN(std::string bytes, read_text_file(path));
  if (options.base_dir.empty()) {
    auto slash = path.find_last_of('/');
    options.base_dir = slash == std::string::npos ? "." : path.substr(0, slash ? slash : 1);
  }
  return parse_onnx_model(bytes, options, path);
}

}  // namespace rdmaflow::graph
