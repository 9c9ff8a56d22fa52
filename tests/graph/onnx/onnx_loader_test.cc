// The ONNX loader on models built here with ONNX's own protobuf classes:
// what becomes what, and every kind of bad input gets one error naming the
// file and the node or tensor (issue 17 point 6), never a crash.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/onnx/onnx_loader.h"

namespace rdmaflow::graph {
namespace {

namespace fs = std::filesystem;

void set_shape(onnx::ValueInfoProto* v, int32_t elem, const std::vector<std::string>& dims) {
  v->mutable_type()->mutable_tensor_type()->set_elem_type(elem);
  auto* shape = v->mutable_type()->mutable_tensor_type()->mutable_shape();
  for (const auto& d : dims) {
    auto* dim = shape->add_dim();
    if (!d.empty() && (std::isdigit(static_cast<unsigned char>(d[0])) || d[0] == '-')) {
      dim->set_dim_value(std::stoll(d));
    } else if (!d.empty()) {
      dim->set_dim_param(d);
    }
  }
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& name, const std::string& type,
                          const std::vector<std::string>& in, const std::vector<std::string>& out) {
  auto* n = g->add_node();
  n->set_name(name);
  n->set_op_type(type);
  for (const auto& i : in) n->add_input(i);
  for (const auto& o : out) n->add_output(o);
  return n;
}

// x: f32[batch, 16] -> MatMul(x, W: f32[16, 32]) -> Relu -> y
onnx::ModelProto small_model() {
  onnx::ModelProto m;
  m.set_ir_version(7);
  m.set_producer_name("test");
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(14);
  auto* g = m.mutable_graph();
  g->set_name("small");
  set_shape(g->add_input(), onnx::TensorProto::FLOAT, {"batch", "16"});
  set_shape(g->add_output(), onnx::TensorProto::FLOAT, {"batch", "32"});
  g->mutable_output(0)->set_name("y");
  g->mutable_input(0)->set_name("x");
  auto* w = g->add_initializer();
  w->set_name("W");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(16);
  w->add_dims(32);
  w->set_raw_data(std::string(16 * 32 * 4, '\0'));
  add_node(g, "fc", "MatMul", {"x", "W"}, {"h"});
  auto* relu = add_node(g, "act", "Relu", {"h"}, {"y"});
  auto* a = relu->add_attribute();
  a->set_name("note");
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s("kept");
  return m;
}

std::string bytes_of(const onnx::ModelProto& m) {
  std::string s;
  EXPECT_TRUE(m.SerializeToString(&s));
  return s;
}

Result<OnnxModel> load(const onnx::ModelProto& m, OnnxOptions o = {}) {
  return parse_onnx_model(bytes_of(m), o, "model.onnx");
}

void expect_error(const Result<OnnxModel>& r, const std::vector<std::string>& needles) {
  ASSERT_FALSE(r) << "loaded, but an error was expected";
  const std::string err = r.status().to_string();
  EXPECT_NE(err.find("model.onnx"), std::string::npos) << err;
  for (const auto& n : needles) {
    EXPECT_NE(err.find(n), std::string::npos) << "expected \"" << n << "\" in: " << err;
  }
}

TEST(OnnxLoader, ConvertsInputsInitializersNodesAndInferredShapes) {
  auto r = load(small_model());
  ASSERT_TRUE(r) << r.status().to_string();
  const Graph& g = r->file.graph;
  EXPECT_EQ(g.name, "small");
  ASSERT_EQ(g.num_ops(), 4u);  // Input x, Variable W, fc, act
  EXPECT_EQ(g.op(*g.find_op("x")).type, "Input");
  EXPECT_EQ(g.op(*g.find_op("W")).type, "Variable");
  EXPECT_EQ(std::get<std::string>(g.op(*g.find_op("act")).attrs.at("note")), "kept");
  const Tensor& w = g.tensor(*g.find_tensor("W"));
  EXPECT_EQ(w.shape, (Shape{16, 32}));
  // "h" is in no value_info: ONNX shape inference gives it [batch, 32].
  const Tensor& h = g.tensor(*g.find_tensor("h"));
  EXPECT_EQ(h.dtype, DataType::kF32);
  EXPECT_EQ(h.shape, (Shape{kUnknownDim, 32}));
  EXPECT_EQ(h.size_hint, 0u);  // batch not bound
  EXPECT_EQ(r->summary.symbolic_dims, std::vector<std::string>{"batch"});
  EXPECT_EQ(r->summary.weight_bytes, 16u * 32 * 4);
  EXPECT_EQ(r->summary.tensors_without_shape, 0u);
  EXPECT_TRUE(r->file.placement.empty());
}

TEST(OnnxLoader, DimBindingsBecomeSizeHints) {
  OnnxOptions o;
  o.dims["batch"] = 8;
  auto r = load(small_model(), o);
  ASSERT_TRUE(r) << r.status().to_string();
  const Tensor& h = r->file.graph.tensor(*r->file.graph.find_tensor("h"));
  EXPECT_EQ(h.shape, (Shape{kUnknownDim, 32}));  // still dynamic
  EXPECT_EQ(h.size_hint, 8u * 32 * 4);
  o.dims.clear();
  o.dims["bacth"] = 8;
  expect_error(load(small_model(), o), {"--dim bacth=8", "it has: batch"});
}

TEST(OnnxLoader, NamelessAndRepeatedNodeNamesBecomeUnique) {
  auto m = small_model();
  m.mutable_graph()->mutable_node(0)->set_name("");
  m.mutable_graph()->mutable_node(1)->set_name("W");  // also an initializer's name
  auto r = load(m);
  ASSERT_TRUE(r) << r.status().to_string();
  const Graph& g = r->file.graph;
  EXPECT_TRUE(g.find_op("MatMul_0"));
  EXPECT_EQ(g.op(*g.find_op("W")).type, "Relu");  // nodes keep their names
  EXPECT_EQ(g.op(*g.find_op("W:init")).type, "Variable");
}

TEST(OnnxLoader, RefusesWhatIsNotOnnx) {
  expect_error(parse_onnx_model("", {}, "model.onnx"), {"not an ONNX model", "empty"});
  expect_error(parse_onnx_model("hello world", {}, "model.onnx"),
               {"not an ONNX model", "starts with bytes 68 65 6c 6c"});
  expect_error(parse_onnx_model(R"({"tensors": []})", {}, "model.onnx"), {"not an ONNX model"});
}

TEST(OnnxLoader, EveryTruncationFailsCleanly) {
  const std::string full = bytes_of(small_model());
  for (size_t n = 0; n < full.size(); ++n) {
    auto r = parse_onnx_model(std::string_view(full).substr(0, n), {}, "model.onnx");
    ASSERT_FALSE(r) << "a prefix of " << n << " of " << full.size() << " bytes loaded";
    EXPECT_NE(r.status().to_string().find("model.onnx"), std::string::npos);
  }
}

TEST(OnnxLoader, CorruptBytesNeverCrash) {
  const std::string full = bytes_of(small_model());
  uint32_t seed = 17;
  size_t loaded = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bad = full;
    for (int k = 0; k < 1 + i % 4; ++k) {
      seed = seed * 1664525u + 1013904223u;
      bad[seed % bad.size()] = static_cast<char>(seed >> 24);
    }
    auto r = parse_onnx_model(bad, {}, "model.onnx");
    if (r) {
      ++loaded;  // a flipped byte inside raw data or a name is still a model
    } else {
      EXPECT_NE(r.status().to_string().find("model.onnx"), std::string::npos);
    }
  }
  EXPECT_LT(loaded, 2000u);
}

TEST(OnnxLoader, RefusesUnsupportedIrVersionAndOpset) {
  auto m = small_model();
  m.set_ir_version(99);
  expect_error(load(m), {"IR version 99 is not supported"});
  m = small_model();
  m.mutable_opset_import(0)->set_version(99);
  expect_error(load(m), {"opset 99", "not supported"});
  m = small_model();
  m.clear_opset_import();
  expect_error(load(m), {"imports no opset"});
}

TEST(OnnxLoader, RefusesDanglingInputNamingNodeAndTensor) {
  auto m = small_model();
  m.mutable_graph()->mutable_node(1)->set_input(0, "nope");
  expect_error(load(m), {"node 'act' (Relu)", "dangling input 'nope'"});
}

TEST(OnnxLoader, RefusesCycles) {
  auto m = small_model();
  add_node(m.mutable_graph(), "a", "Relu", {"q"}, {"p"});
  add_node(m.mutable_graph(), "b", "Relu", {"p"}, {"q"});
  expect_error(load(m), {"cycle: 'a' -> 'b' -> 'a'"});
}

TEST(OnnxLoader, RefusesTwoProducers) {
  auto m = small_model();
  add_node(m.mutable_graph(), "again", "Relu", {"x"}, {"h"});
  expect_error(load(m), {"node 'again' (Relu)", "tensor 'h' has two producers"});
}

TEST(OnnxLoader, RefusesSubgraphsNamingTheNode) {
  auto m = small_model();
  auto* n = add_node(m.mutable_graph(), "branch", "If", {"x"}, {"z"});
  auto* a = n->add_attribute();
  a->set_name("then_branch");
  a->set_type(onnx::AttributeProto::GRAPH);
  a->mutable_g()->set_name("then");
  expect_error(load(m), {"node 'branch' (If)", "'then_branch'", "subgraphs"});
}

TEST(OnnxLoader, RefusesAbsurdDimensions) {
  // The second dimension of the graph input x.
  auto x_dim = [](onnx::ModelProto& m) {
    return m.mutable_graph()
        ->mutable_input(0)
        ->mutable_type()
        ->mutable_tensor_type()
        ->mutable_shape()
        ->mutable_dim(1);
  };
  auto m = small_model();
  x_dim(m)->set_dim_value(int64_t{1} << 60);
  expect_error(load(m), {"tensor 'x'", "over 2^48"});
  m = small_model();
  x_dim(m)->set_dim_value(-3);
  expect_error(load(m), {"tensor 'x'", "dimension -3 is negative"});
  m = small_model();
  auto* w = m.mutable_graph()->mutable_initializer(0);
  w->clear_dims();
  for (int i = 0; i < 40; ++i) w->add_dims(1);
  expect_error(load(m), {"initializer 'W'", "40 dimensions"});
  m = small_model();
  w = m.mutable_graph()->mutable_initializer(0);
  w->clear_dims();
  w->add_dims(int64_t{1} << 40);
  w->add_dims(int64_t{1} << 40);
  expect_error(load(m), {"initializer 'W'", "larger than 2^63 bytes"});
}

TEST(OnnxLoader, RefusesInitializerDataThatDoesNotMatchItsDims) {
  auto m = small_model();
  m.mutable_graph()->mutable_initializer(0)->set_raw_data(std::string(100, '\0'));
  expect_error(load(m), {"initializer 'W'", "100 bytes of data for f32[16,32] (2048 bytes)"});
  m = small_model();
  m.mutable_graph()->mutable_initializer(0)->clear_raw_data();
  m.mutable_graph()->mutable_initializer(0)->add_float_data(1.0f);
  expect_error(load(m), {"initializer 'W'", "1 values of data", "512 elements"});
}

TEST(OnnxLoader, RefusesElementTypesWithoutDtype) {
  auto m = small_model();
  m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(
      onnx::TensorProto::STRING);
  expect_error(load(m), {"tensor 'x'", "STRING has no rdmaflow dtype"});
}

class OnnxExternalData : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rdmaflow-onnx-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The small model with W's bytes in `location`, written as dir/model.onnx.
  std::string write_model(const std::string& location, uint64_t offset = 0) {
    auto m = small_model();
    auto* w = m.mutable_graph()->mutable_initializer(0);
    w->clear_raw_data();
    w->set_data_location(onnx::TensorProto::EXTERNAL);
    auto* kv = w->add_external_data();
    kv->set_key("location");
    kv->set_value(location);
    kv = w->add_external_data();
    kv->set_key("offset");
    kv->set_value(std::to_string(offset));
    const std::string path = dir_ + "/model.onnx";
    std::ofstream(path, std::ios::binary) << bytes_of(m);
    return path;
  }
  void write_data(const std::string& name, size_t bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << std::string(bytes, '\1');
  }

  std::string dir_;
};

TEST_F(OnnxExternalData, ReadFromBesideTheModel) {
  write_data("weights.bin", 4096 + 2048);
  auto r = load_onnx_file(write_model("weights.bin", 4096));
  ASSERT_TRUE(r) << r.status().to_string();
  EXPECT_EQ(r->summary.external_initializers, 1u);
}

TEST_F(OnnxExternalData, MissingFileIsRefusedNamingIt) {
  auto r = load_onnx_file(write_model("weights.bin"));
  ASSERT_FALSE(r);
  const std::string err = r.status().to_string();
  EXPECT_NE(err.find("model.onnx"), std::string::npos) << err;
  EXPECT_NE(err.find("initializer 'W': external data file 'weights.bin' not found"),
            std::string::npos)
      << err;
}

TEST_F(OnnxExternalData, ShortFileIsRefused) {
  write_data("weights.bin", 100);
  auto r = load_onnx_file(write_model("weights.bin"));
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().to_string().find("has 100 bytes; the tensor needs 2048"), std::string::npos)
      << r.status().to_string();
}

TEST_F(OnnxExternalData, PathsOutsideTheModelsDirectoryAreRefused) {
  for (const char* loc : {"../weights.bin", "/etc/passwd", "a/../../b"}) {
    auto r = load_onnx_file(write_model(loc));
    ASSERT_FALSE(r) << loc;
    EXPECT_NE(r.status().to_string().find("outside the model's directory"), std::string::npos)
        << r.status().to_string();
  }
}

TEST_F(OnnxExternalData, ModelsOver2GiBAreRefusedBeforeReading) {
  const std::string path = dir_ + "/huge.onnx";
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, off_t{3} << 30), 0);  // sparse: no disk used
  ::close(fd);
  auto r = load_onnx_file(path);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().to_string().find("at most 2 GiB"), std::string::npos)
      << r.status().to_string();
}

}  // namespace
}  // namespace rdmaflow::graph
