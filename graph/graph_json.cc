#include "graph/graph_json.h"

#include <cstdint>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "graph/json_util.h"
#include "graph/validate.h"

namespace rdmaflow::graph {

namespace {

using nlohmann::json;

constexpr const char* kLoadGraph = "load graph";
constexpr const char* kLoadPlacement = "load placement";
constexpr std::string_view kGraphFormat = "rdmaflow-graph/1";
constexpr std::string_view kPlacementFormat = "rdmaflow-placement/1";

Status bad(const char* op, const std::string& reason) {
  return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, reason);
}

// "ops[3] 'fc2'" (or "ops[3]" when the element has no usable name).
std::string element(const char* list, size_t i, const json& obj) {
  std::string s = std::string(list) + "[" + std::to_string(i) + "]";
  if (obj.is_object()) {
    auto it = obj.find("name");
    if (it != obj.end() && it->is_string()) s += " '" + it->get<std::string>() + "'";
  }
  return s;
}

Status check_format(const json& doc, std::string_view expected, const char* op) {
  auto it = doc.find("format");
  if (it == doc.end()) return Status::ok();
  if (!it->is_string() || it->get<std::string>() != expected) {
    return bad(op, "'format' must be \"" + std::string(expected) + "\"");
  }
  return Status::ok();
}

Result<std::vector<std::string>> string_list(const json& obj, const char* key,
                                             const std::string& where) {
  std::vector<std::string> out;
  auto it = obj.find(key);
  if (it == obj.end()) return out;
  if (!it->is_array()) {
    return bad(kLoadGraph, where + ": '" + key + "' must be an array of tensor names");
  }
  out.reserve(it->size());
  for (const json& v : *it) {
    if (!v.is_string()) {
      return bad(kLoadGraph, where + ": '" + key + "' must be an array of tensor names");
    }
    out.push_back(v.get<std::string>());
  }
  return out;
}

Result<AttrValue> parse_attr(const json& v, const std::string& where, const std::string& key) {
  auto unsupported = [&] {
    return bad(kLoadGraph, where + ": attribute '" + key +
                               "' has an unsupported value (use a bool, a number, a string or a "
                               "flat list of numbers or of strings)");
  };
  if (v.is_boolean()) return AttrValue(v.get<bool>());
  if (v.is_number_integer()) {
    auto i = json_int(v);
    if (!i) return unsupported();
    return AttrValue(*i);
  }
  if (v.is_number_float()) return AttrValue(v.get<double>());
  if (v.is_string()) return AttrValue(v.get<std::string>());
  if (!v.is_array()) return unsupported();
  bool all_int = true, all_num = true, all_str = true;
  for (const json& e : v) {
    all_int = all_int && e.is_number_integer() && json_int(e).has_value();
    all_num = all_num && e.is_number();
    all_str = all_str && e.is_string();
  }
  if (all_int) {  // also the empty list
    std::vector<int64_t> out;
    for (const json& e : v) out.push_back(*json_int(e));
    return AttrValue(std::move(out));
  }
  if (all_num) {
    std::vector<double> out;
    for (const json& e : v) out.push_back(e.get<double>());
    return AttrValue(std::move(out));
  }
  if (all_str) {
    std::vector<std::string> out;
    for (const json& e : v) out.push_back(e.get<std::string>());
    return AttrValue(std::move(out));
  }
  return unsupported();
}

json attr_to_json(const AttrValue& v) {
  return std::visit([](const auto& x) { return json(x); }, v);
}

Status parse_tensor(Graph& g, const json& t, size_t i) {
  const std::string where = element("tensors", i, t);
  if (!t.is_object()) return bad(kLoadGraph, where + " must be an object");
  auto name = t.find("name");
  if (name == t.end() || !name->is_string()) {
    return bad(kLoadGraph, where + ": 'name' must be a string");
  }
  auto dt = t.find("dtype");
  if (dt == t.end() || !dt->is_string()) {
    return bad(kLoadGraph, where + ": 'dtype' must be a string such as \"f32\"");
  }
  auto dtype = parse_dtype(dt->get<std::string>());
  if (!dtype) {
    return bad(kLoadGraph, where + ": unknown dtype '" + dt->get<std::string>() +
                               "' (known: f32, f64, f16, bf16, i32, i64, u8, i8, bool)");
  }
  auto sh = t.find("shape");
  if (sh == t.end() || !sh->is_array()) {
    return bad(kLoadGraph, where + ": 'shape' must be an array of dimensions ([] for a scalar)");
  }
  if (sh->size() > kMaxDims) {
    return bad(kLoadGraph, where + ": " + std::to_string(sh->size()) + " dimensions; at most " +
                               std::to_string(kMaxDims) + " are supported");
  }
  Shape shape;
  for (const json& d : *sh) {
    if (d.is_null()) {
      shape.push_back(kUnknownDim);
      continue;
    }
    auto v = json_int(d);
    if (!v || *v < kUnknownDim) {
      return bad(kLoadGraph, where + ": dimension " + d.dump() +
                                 " is not valid (a size >= 0, or -1 / null when unknown)");
    }
    shape.push_back(*v);
  }
  uint64_t hint = 0;
  auto h = t.find("size_hint");
  if (h != t.end()) {
    auto v = json_int(*h);
    if (!v || *v < 0) {
      return bad(kLoadGraph, where + ": 'size_hint' must be a byte count >= 0");
    }
    hint = static_cast<uint64_t>(*v);
  }
  auto added = g.add_tensor(name->get<std::string>(), *dtype, std::move(shape), hint);
  if (!added) return bad(kLoadGraph, where + ": " + added.status().reason());
  return Status::ok();
}

Status parse_op(GraphFile& f, const json& o, size_t i, bool& any_placed) {
  const std::string where = element("ops", i, o);
  if (!o.is_object()) return bad(kLoadGraph, where + " must be an object");
  auto name = o.find("name");
  if (name == o.end() || !name->is_string()) {
    return bad(kLoadGraph, where + ": 'name' must be a string");
  }
  auto type = o.find("type");
  if (type == o.end() || !type->is_string()) {
    return bad(kLoadGraph, where + ": 'type' must be a string");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<std::string> inputs, string_list(o, "inputs", where));
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<std::string> outputs, string_list(o, "outputs", where));
  Attributes attrs;
  auto a = o.find("attrs");
  if (a != o.end()) {
    if (!a->is_object()) return bad(kLoadGraph, where + ": 'attrs' must be an object");
    for (auto it = a->begin(); it != a->end(); ++it) {
      RDMAFLOW_ASSIGN_OR_RETURN(AttrValue v, parse_attr(it.value(), where, it.key()));
      attrs.emplace(it.key(), std::move(v));
    }
  }
  int rank = kUnplaced;
  std::string device;
  auto r = o.find("rank");
  auto d = o.find("device");
  if (r != o.end()) {
    auto v = json_int(*r);
    if (!v || *v < 0 || *v >= kMaxRanks) {
      return bad(kLoadGraph,
                 where + ": 'rank' must be an integer in [0, " + std::to_string(kMaxRanks) + ")");
    }
    rank = static_cast<int>(*v);
    device = kDefaultDevice;
  }
  if (d != o.end()) {
    if (r == o.end()) return bad(kLoadGraph, where + ": 'device' given without 'rank'");
    if (!d->is_string() || d->get<std::string>().empty()) {
      return bad(kLoadGraph, where + ": 'device' must be a non-empty string");
    }
    device = d->get<std::string>();
  }
  auto added = f.graph.add_op(name->get<std::string>(), type->get<std::string>(), inputs, outputs,
                              std::move(attrs));
  if (!added) return bad(kLoadGraph, where + ": " + added.status().reason());
  f.placement.rank.push_back(rank);
  f.placement.device.push_back(std::move(device));
  any_placed = any_placed || rank != kUnplaced;
  return Status::ok();
}

Result<GraphFile> parse_graph_doc(const json& doc) {
  if (!doc.is_object()) return bad(kLoadGraph, "the document must be a JSON object");
  RDMAFLOW_RETURN_IF_ERROR(check_format(doc, kGraphFormat, kLoadGraph));
  GraphFile f;
  auto name = doc.find("name");
  if (name != doc.end()) {
    if (!name->is_string()) return bad(kLoadGraph, "'name' must be a string");
    f.graph.name = name->get<std::string>();
  }
  auto tensors = doc.find("tensors");
  if (tensors == doc.end() || !tensors->is_array()) {
    return bad(kLoadGraph, "'tensors' must be an array of tensor objects");
  }
  auto ops = doc.find("ops");
  if (ops == doc.end() || !ops->is_array()) {
    return bad(kLoadGraph, "'ops' must be an array of op objects");
  }
  f.graph.reserve(ops->size(), tensors->size());
  f.placement.rank.reserve(ops->size());
  f.placement.device.reserve(ops->size());
  for (size_t i = 0; i < tensors->size(); ++i) {
    RDMAFLOW_RETURN_IF_ERROR(parse_tensor(f.graph, (*tensors)[i], i));
  }
  bool any_placed = false;
  for (size_t i = 0; i < ops->size(); ++i) {
    RDMAFLOW_RETURN_IF_ERROR(parse_op(f, (*ops)[i], i, any_placed));
  }
  if (!any_placed) f.placement = Placement::unplaced(f.graph);
  Status st = validate(f.graph);
  if (!st) return st.with_op(kLoadGraph);
  return f;
}

}  // namespace

Result<GraphFile> parse_graph_json(std::string_view text) {
  RDMAFLOW_ASSIGN_OR_RETURN(json doc, parse_json_text(text, kLoadGraph));
  try {
    return parse_graph_doc(doc);
  } catch (const std::exception& e) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kLoadGraph, -1, e.what());
  }
}

Result<GraphFile> load_graph_file(const std::string& path) {
  RDMAFLOW_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  auto f = parse_graph_json(text);
  if (!f) {
    return RDMAFLOW_ERROR(f.status().code(), "load graph " + path, -1, f.status().reason());
  }
  return f;
}

std::string write_graph_json(const Graph& g, const Placement* placement) {
  std::string out = "{\n";
  out += "  \"format\": " + json_dump(json(kGraphFormat)) + ",\n";
  out += "  \"name\": " + json_dump(json(g.name)) + ",\n";
  out += "  \"tensors\": [";
  for (size_t i = 0; i < g.num_tensors(); ++i) {
    const Tensor& t = g.tensors()[i];
    nlohmann::ordered_json j;
    j["name"] = t.name;
    j["dtype"] = std::string(dtype_name(t.dtype));
    j["shape"] = t.shape;
    if (t.size_hint) j["size_hint"] = t.size_hint;
    out += (i ? ",\n    " : "\n    ") + json_dump(j);
  }
  out += g.num_tensors() ? "\n  ],\n" : "],\n";
  out += "  \"ops\": [";
  const bool placed =
      placement && placement->rank.size() == g.num_ops() && placement->device.size() == g.num_ops();
  for (size_t i = 0; i < g.num_ops(); ++i) {
    const Op& op = g.ops()[i];
    nlohmann::ordered_json j;
    j["name"] = op.name;
    j["type"] = op.type;
    j["inputs"] = json::array();
    for (TensorId t : op.inputs) j["inputs"].push_back(g.tensor(t).name);
    j["outputs"] = json::array();
    for (TensorId t : op.outputs) j["outputs"].push_back(g.tensor(t).name);
    if (!op.attrs.empty()) {
      nlohmann::ordered_json a = nlohmann::ordered_json::object();
      for (const auto& [k, v] : op.attrs) a[k] = attr_to_json(v);
      j["attrs"] = std::move(a);
    }
    if (placed && placement->rank[i] != kUnplaced) {
      j["rank"] = placement->rank[i];
      j["device"] = placement->device[i];
    }
    out += (i ? ",\n    " : "\n    ") + json_dump(j);
  }
  out += g.num_ops() ? "\n  ]\n}\n" : "]\n}\n";
  return out;
}

Result<Placement> parse_placement_json(std::string_view text, const Graph& g) {
  RDMAFLOW_ASSIGN_OR_RETURN(json doc, parse_json_text(text, kLoadPlacement));
  try {
    if (!doc.is_object()) return bad(kLoadPlacement, "the document must be a JSON object");
    RDMAFLOW_RETURN_IF_ERROR(check_format(doc, kPlacementFormat, kLoadPlacement));
    auto ops = doc.find("ops");
    if (ops == doc.end() || !ops->is_object()) {
      return bad(kLoadPlacement, "'ops' must be an object mapping op names to ranks");
    }
    Placement p = Placement::unplaced(g);
    for (auto it = ops->begin(); it != ops->end(); ++it) {
      const std::string where = "op '" + it.key() + "'";
      auto id = g.find_op(it.key());
      if (!id) return bad(kLoadPlacement, where + " is not in the graph");
      const json& v = it.value();
      const json* rank = &v;
      std::string device = kDefaultDevice;
      if (v.is_object()) {
        auto r = v.find("rank");
        if (r == v.end()) return bad(kLoadPlacement, where + ": 'rank' is missing");
        rank = &*r;
        auto d = v.find("device");
        if (d != v.end()) {
          if (!d->is_string() || d->get<std::string>().empty()) {
            return bad(kLoadPlacement, where + ": 'device' must be a non-empty string");
          }
          device = d->get<std::string>();
        }
      }
      auto r = json_int(*rank);
      if (!r || *r < 0 || *r >= kMaxRanks) {
        return bad(kLoadPlacement, where + ": the rank must be an integer in [0, " +
                                       std::to_string(kMaxRanks) + ")");
      }
      p.set(*id, static_cast<int>(*r), std::move(device));
    }
    return p;
  } catch (const std::exception& e) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kLoadPlacement, -1, e.what());
  }
}

Result<Placement> load_placement_file(const std::string& path, const Graph& g) {
  RDMAFLOW_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  auto p = parse_placement_json(text, g);
  if (!p) {
    return RDMAFLOW_ERROR(p.status().code(), "load placement " + path, -1, p.status().reason());
  }
  return p;
}

std::string write_placement_json(const Graph& g, const Placement& p) {
  std::string out = "{\n  \"format\": " + json_dump(json(kPlacementFormat)) + ",\n  \"ops\": {";
  bool first = true;
  for (size_t i = 0; i < g.num_ops() && i < p.rank.size() && i < p.device.size(); ++i) {
    if (p.rank[i] == kUnplaced) continue;
    nlohmann::ordered_json j;
    j["rank"] = p.rank[i];
    j["device"] = p.device[i];
    out += (first ? "\n    " : ",\n    ") + json_dump(json(g.ops()[i].name)) + ": " + json_dump(j);
    first = false;
  }
  out += first ? "}\n}\n" : "\n  }\n}\n";
  return out;
}

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return RDMAFLOW_ERROR(Code::kNotFound, "read " + path, -1, "cannot open the file");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "read " + path, -1, "read error");
  }
  return ss.str();
}

}  // namespace rdmaflow::graph
