// The JSON graph format: round trips, and every validation error names the op
// or tensor and what is wrong.
#include <gtest/gtest.h>

#include <string>

#include "graph/graph_json.h"
#include "graph/placement.h"
#include "graph/validate.h"

namespace rdmaflow::graph {
namespace {

// A two-op graph with `extra_tensors` / `extra_ops` spliced in (JSON fragments).
std::string doc(const std::string& tensors, const std::string& ops) {
  return R"({"format": "rdmaflow-graph/1", "name": "t", "tensors": [)" + tensors +
         R"(], "ops": [)" + ops + "]}";
}

const std::string kTensors =
    R"({"name": "x", "dtype": "f32", "shape": [4, 8]},
       {"name": "y", "dtype": "f16", "shape": [-1, 8], "size_hint": 1024})";
const std::string kOps =
    R"({"name": "src", "type": "Input", "outputs": ["x"], "rank": 0},
       {"name": "f", "type": "Relu", "inputs": ["x"], "outputs": ["y"], "rank": 1,
        "device": "gpu:0", "attrs": {"alpha": 0.5, "n": 3, "on": true, "mode": "fast",
                                      "dims": [1, 2], "scales": [1.5, 2], "tags": ["a", "b"],
                                      "none": []}})";

// The load error for `text`, or "" when it loads.
std::string load_error(const std::string& text) {
  auto f = parse_graph_json(text);
  return f ? std::string() : f.status().to_string();
}

void expect_error(const std::string& text, const std::string& needle) {
  std::string err = load_error(text);
  EXPECT_NE(err.find(needle), std::string::npos)
      << "expected an error containing \"" << needle << "\", got \"" << err << "\"";
}

TEST(GraphFormat, LoadsOpsTensorsAttrsAndPlacement) {
  auto f = parse_graph_json(doc(kTensors, kOps));
  ASSERT_TRUE(f) << f.status().to_string();
  const Graph& g = f->graph;
  ASSERT_EQ(g.num_ops(), 2u);
  ASSERT_EQ(g.num_tensors(), 2u);
  const Tensor& y = g.tensor(*g.find_tensor("y"));
  EXPECT_EQ(y.dtype, DataType::kF16);
  EXPECT_EQ(y.shape, (Shape{kUnknownDim, 8}));
  EXPECT_EQ(y.size_hint, 1024u);
  EXPECT_EQ(y.producer, *g.find_op("f"));
  const Tensor& x = g.tensor(*g.find_tensor("x"));
  EXPECT_EQ(x.consumers, std::vector<OpId>{*g.find_op("f")});
  EXPECT_EQ(static_bytes(x.dtype, x.shape), 128u);
  EXPECT_FALSE(static_bytes(y.dtype, y.shape));
  const Op& op = g.op(*g.find_op("f"));
  EXPECT_EQ(std::get<double>(op.attrs.at("alpha")), 0.5);
  EXPECT_EQ(std::get<int64_t>(op.attrs.at("n")), 3);
  EXPECT_EQ(std::get<bool>(op.attrs.at("on")), true);
  EXPECT_EQ(std::get<std::string>(op.attrs.at("mode")), "fast");
  EXPECT_EQ(std::get<std::vector<int64_t>>(op.attrs.at("dims")), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(std::get<std::vector<double>>(op.attrs.at("scales")), (std::vector<double>{1.5, 2.0}));
  EXPECT_EQ(std::get<std::vector<std::string>>(op.attrs.at("tags")),
            (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f->placement.rank, (std::vector<int>{0, 1}));
  EXPECT_EQ(f->placement.device, (std::vector<std::string>{"cpu:0", "gpu:0"}));
  EXPECT_TRUE(validate_placement(g, f->placement, 2));
}

TEST(GraphFormat, WriterRoundTripsByteForByte) {
  auto f = parse_graph_json(doc(kTensors, kOps));
  ASSERT_TRUE(f) << f.status().to_string();
  std::string once = write_graph_json(f->graph, &f->placement);
  auto g = parse_graph_json(once);
  ASSERT_TRUE(g) << g.status().to_string() << "\n" << once;
  EXPECT_TRUE(g->graph == f->graph);
  EXPECT_TRUE(g->placement == f->placement);
  EXPECT_EQ(write_graph_json(g->graph, &g->placement), once);
  // Without a placement the writer leaves rank/device out and the loader sees none.
  auto h = parse_graph_json(write_graph_json(f->graph));
  ASSERT_TRUE(h);
  EXPECT_TRUE(h->placement.empty());
}

TEST(GraphFormat, PlacementFileRoundTrips) {
  auto f = parse_graph_json(doc(kTensors, kOps));
  ASSERT_TRUE(f);
  auto p =
      parse_placement_json(R"({"ops": {"src": 1, "f": {"rank": 0, "device": "gpu:1"}}})", f->graph);
  ASSERT_TRUE(p) << p.status().to_string();
  EXPECT_EQ(p->rank, (std::vector<int>{1, 0}));
  EXPECT_EQ(p->device, (std::vector<std::string>{"cpu:0", "gpu:1"}));
  auto q = parse_placement_json(write_placement_json(f->graph, *p), f->graph);
  ASSERT_TRUE(q) << q.status().to_string();
  EXPECT_TRUE(*q == *p);
}

TEST(GraphValidation, MalformedAndTruncatedFilesGetErrors) {
  std::string full = doc(kTensors, kOps);
  for (size_t n = 0; n < full.size(); ++n) {
    EXPECT_NE(load_error(full.substr(0, n)), "") << "prefix of " << n << " bytes loaded";
  }
  expect_error("{\"tensors\": [}", "parse error");
  expect_error("[]", "must be a JSON object");
  expect_error(R"({"tensors": [], "ops": {}})", "'ops' must be an array");
  expect_error(R"({"ops": []})", "'tensors' must be an array");
  expect_error(R"({"format": "other/2", "tensors": [], "ops": []})", "'format' must be");
  expect_error(std::string(100, '[') + std::string(100, ']'), "nested deeper");
  expect_error(doc(R"(7)", ""), "tensors[0] must be an object");
  expect_error(doc(R"({"name": 3, "dtype": "f32", "shape": []})", ""), "'name' must be a string");
  expect_error(doc(R"({"name": "a", "dtype": "f32", "shape": 5})", ""),
               "tensors[0] 'a': 'shape' must be an array");
  expect_error(doc(R"({"name": "a", "dtype": "f32", "shape": [1.5]})", ""),
               "tensors[0] 'a': dimension 1.5 is not valid");
  expect_error(doc(R"({"name": "a", "dtype": "f32", "shape": [-2]})", ""),
               "dimension -2 is not valid");
  expect_error(doc(R"({"name": "a", "dtype": "f32", "shape": [18446744073709551615]})", ""),
               "is not valid");
  expect_error(doc(R"({"name": "a", "dtype": "f32", "shape": [], "size_hint": -1})", ""),
               "'size_hint' must be a byte count");
  expect_error(doc(kTensors, R"({"name": "o", "type": "T", "inputs": "x"})"),
               "ops[0] 'o': 'inputs' must be an array of tensor names");
  expect_error(doc(kTensors, R"({"name": "o", "inputs": []})"), "'type' must be a string");
  expect_error(doc(kTensors, R"({"name": "o", "type": "T", "attrs": {"k": {"a": 1}}})"),
               "ops[0] 'o': attribute 'k' has an unsupported value");
  expect_error(doc(kTensors, R"({"name": "o", "type": "T", "attrs": {"k": [1, "a"]}})"),
               "attribute 'k' has an unsupported value");
  expect_error(doc(kTensors, R"({"name": "o", "type": "T", "rank": -1})"), "'rank' must be");
  expect_error(doc(kTensors, R"({"name": "o", "type": "T", "device": "gpu:0"})"),
               "'device' given without 'rank'");
}

TEST(GraphValidation, UnknownDtype) {
  expect_error(doc(R"({"name": "w", "dtype": "float8", "shape": [2]})", ""),
               "tensors[0] 'w': unknown dtype 'float8'");
}

TEST(GraphValidation, DuplicateNames) {
  expect_error(doc(kTensors + R"(, {"name": "x", "dtype": "f32", "shape": []})", kOps),
               "duplicate tensor name 'x'");
  expect_error(doc(kTensors, kOps + R"(, {"name": "f", "type": "Relu", "inputs": ["y"]})"),
               "ops[2] 'f': duplicate op name 'f'");
}

TEST(GraphValidation, DanglingInputs) {
  // Names no declared tensor.
  expect_error(doc(kTensors, kOps + R"(, {"name": "g", "type": "Sink", "inputs": ["zz"]})"),
               "op 'g': dangling input 'zz' (no tensor of that name is declared)");
  // Declared, but nothing produces it.
  expect_error(doc(kTensors + R"(, {"name": "orphan", "dtype": "i32", "shape": [1]})",
                   kOps + R"(, {"name": "g", "type": "Sink", "inputs": ["orphan"]})"),
               "op 'g': dangling input 'orphan' (no op produces it)");
  // An output that is not declared.
  expect_error(doc(kTensors, R"({"name": "g", "type": "T", "outputs": ["nope"]})"),
               "op 'g': output 'nope' is not a declared tensor");
}

TEST(GraphValidation, TwoProducersAndRepeatedOutputs) {
  expect_error(doc(kTensors, kOps + R"(, {"name": "g", "type": "T", "outputs": ["y"]})"),
               "tensor 'y' has two producers: op 'f' and op 'g'");
  expect_error(doc(kTensors, R"({"name": "g", "type": "T", "outputs": ["x", "x"]})"),
               "op 'g' lists output 'x' twice");
}

TEST(GraphValidation, Cycles) {
  const std::string t = R"({"name": "a", "dtype": "f32", "shape": [1]},
                           {"name": "b", "dtype": "f32", "shape": [1]},
                           {"name": "c", "dtype": "f32", "shape": [1]})";
  expect_error(doc(t, R"({"name": "A", "type": "T", "inputs": ["c"], "outputs": ["a"]},
                         {"name": "B", "type": "T", "inputs": ["a"], "outputs": ["b"]},
                         {"name": "C", "type": "T", "inputs": ["b"], "outputs": ["c"]})"),
               "cycle: 'A' -> 'B' -> 'C' -> 'A'");
  expect_error(doc(t, R"({"name": "S", "type": "T", "inputs": ["a"], "outputs": ["a"]})"),
               "cycle: 'S' -> 'S'");
}

TEST(GraphValidation, OversizedTensor) {
  expect_error(doc(R"({"name": "huge", "dtype": "f64", "shape": [4294967296, 4294967296]})", ""),
               "tensor 'huge': f64[4294967296,4294967296] is larger than 2^63 bytes");
}

TEST(GraphValidation, PlacementMissingOrOutOfRange) {
  // One op placed, the other not: the graph loads, its placement does not validate.
  std::string ops = R"({"name": "src", "type": "Input", "outputs": ["x"], "rank": 0},
                       {"name": "f", "type": "Relu", "inputs": ["x"], "outputs": ["y"]})";
  auto f = parse_graph_json(doc(kTensors, ops));
  ASSERT_TRUE(f) << f.status().to_string();
  Status st = validate_placement(f->graph, f->placement, 2);
  EXPECT_NE(st.to_string().find("op 'f' has no placement"), std::string::npos) << st.to_string();
  auto g = parse_graph_json(doc(kTensors, kOps));
  ASSERT_TRUE(g);
  st = validate_placement(g->graph, g->placement, 1);
  EXPECT_NE(st.to_string().find("op 'f' is placed on rank 1 but there are only 1 ranks"),
            std::string::npos)
      << st.to_string();
  EXPECT_FALSE(validate_placement(g->graph, g->placement, 0));
  EXPECT_FALSE(validate_placement(g->graph, Placement{}, 2));
  auto p = parse_placement_json(R"({"ops": {"nosuch": 0}})", g->graph);
  ASSERT_FALSE(p);
  EXPECT_NE(p.status().reason().find("op 'nosuch' is not in the graph"), std::string::npos);
  EXPECT_FALSE(parse_placement_json(R"({"ops": {"f": {"device": "x"}}})", g->graph));
  EXPECT_FALSE(parse_placement_json(R"({"ops": {"f": "one"}})", g->graph));
  EXPECT_FALSE(parse_placement_json(R"({"ops": [1]})", g->graph));
  EXPECT_FALSE(parse_placement_json(R"({"ops": {"f": 0)", g->graph));
}

TEST(GraphValidation, DefaultPlacementCutsTopologicalOrderIntoBlocks) {
  Graph g;
  std::string prev;
  for (int i = 0; i < 10; ++i) {
    std::string t = "t" + std::to_string(i);
    ASSERT_TRUE(g.add_tensor(t, DataType::kF32, {4}));
    std::vector<std::string> in;
    if (!prev.empty()) in.push_back(prev);
    ASSERT_TRUE(g.add_op("op" + std::to_string(i), "T", in, {t}));
    prev = t;
  }
  auto p = default_placement(g, 3);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->rank, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 2, 2, 2}));
  EXPECT_TRUE(validate_placement(g, *p, 3));
  EXPECT_FALSE(default_placement(g, 0));
}

TEST(GraphValidation, MissingFileNamesThePath) {
  auto f = load_graph_file("/nonexistent/graph.json");
  ASSERT_FALSE(f);
  EXPECT_NE(f.status().to_string().find("/nonexistent/graph.json"), std::string::npos);
}

}  // namespace
}  // namespace rdmaflow::graph
