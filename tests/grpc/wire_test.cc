// The hand-written RecvTensorResponse coding (transport/grpc/tensor_wire.h)
// against protobuf's own serializer and parser, and the gRPC status mapping.
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "transport/grpc/grpc_common.h"
#include "transport/grpc/tensor_service.pb.h"
#include "transport/grpc/tensor_wire.h"

namespace rdmaflow {
namespace {

namespace pb = ::rdmaflow::grpc_tensor;
using google::protobuf::io::ArrayInputStream;

std::string pattern(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed) & 0xff);
  return s;
}

struct Case {
  DataType dtype;
  std::vector<int64_t> shape;
};

// Every dtype, scalars, empty tensors, dimensions that need multi-byte varints.
std::vector<Case> cases() {
  std::vector<Case> out;
  for (DataType t : kAllDataTypes) {
    out.push_back({t, {}});
    out.push_back({t, {0}});
    out.push_back({t, {3, 5}});
  }
  out.push_back({DataType::kU8, {1}});
  out.push_back({DataType::kU8, {200, 0, 7}});
  out.push_back({DataType::kF32, {1, 130, 3}});
  out.push_back({DataType::kI8, {70000}});
  out.push_back({DataType::kU8, {1 << 21}});  // content length needs a 4-byte varint
  return out;
}

size_t bytes_of(const Case& c) {
  auto r = grpc_wire::tensor_bytes(c.dtype, c.shape, "test", -1);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : 0;
}

TEST(GrpcWire, PrefixPlusContentIsWhatProtobufSerializes) {
  for (const Case& c : cases()) {
    const size_t n = bytes_of(c);
    const std::string content = pattern(n, 7);
    pb::RecvTensorResponse msg;
    msg.mutable_tensor()->set_dtype(static_cast<pb::DType>(grpc_wire::dtype_to_proto(c.dtype)));
    for (int64_t d : c.shape) msg.mutable_tensor()->add_shape(d);
    msg.mutable_tensor()->set_tensor_content(content);
    const std::string ours = grpc_wire::encode_response_prefix(c.dtype, c.shape, n) + content;
    EXPECT_EQ(ours, msg.SerializeAsString())
        << dtype_name(c.dtype) << " with " << c.shape.size() << " dims";
  }
}

TEST(GrpcWire, DecodesWhatProtobufSerializesCopyingContentOnce) {
  for (const Case& c : cases()) {
    const size_t n = bytes_of(c);
    const std::string content = pattern(n, 3);
    pb::RecvTensorResponse msg;
    msg.mutable_tensor()->set_dtype(static_cast<pb::DType>(grpc_wire::dtype_to_proto(c.dtype)));
    for (int64_t d : c.shape) msg.mutable_tensor()->add_shape(d);
    msg.mutable_tensor()->set_tensor_content(content);
    const std::string wire = msg.SerializeAsString();
    // Small blocks: tensor_content spans many buffers, as it spans gRPC's slices.
    ArrayInputStream in(wire.data(), static_cast<int>(wire.size()), /*block_size=*/61);
    std::vector<char> dst(n + 1, 'x');
    int sink_calls = 0;
    auto meta = grpc_wire::decode_response(
        &in,
        [&](size_t len) -> Result<void*> {
          ++sink_calls;
          EXPECT_EQ(len, n);
          return static_cast<void*>(dst.data());
        },
        "test", 1);
    ASSERT_TRUE(meta.is_ok()) << meta.status().to_string();
    EXPECT_EQ(meta->dtype, c.dtype);
    EXPECT_EQ(meta->shape, c.shape);
    EXPECT_EQ(meta->bytes, n);
    EXPECT_EQ(sink_calls, n == 0 ? 0 : 1);
    EXPECT_EQ(std::memcmp(dst.data(), content.data(), n), 0);
    EXPECT_EQ(dst[n], 'x') << "wrote past tensor_content";
  }
}

// Another encoder may order fields differently, not pack the shape, or add
// fields this version does not know; all of that must still parse.
TEST(GrpcWire, AcceptsReorderedUnpackedAndUnknownFields) {
  std::string inner;
  inner += '\x22';  // tensor_content first: 4 bytes
  inner += '\x04';
  inner += "abcd";
  inner += '\x10';  // shape, unpacked: 2
  inner += '\x02';
  inner += '\x10';  // shape, unpacked: 2
  inner += '\x02';
  inner += '\x18';  // field 3 (TensorFlow's version_number), unknown here
  inner += '\x07';
  inner += '\x08';  // dtype = DT_UINT8
  inner += '\x04';
  std::string wire;
  wire += '\x10';  // unknown outer field 2 (varint) before the tensor
  wire += '\x01';
  wire += '\x0a';
  wire += static_cast<char>(inner.size());
  wire += inner;
  ArrayInputStream in(wire.data(), static_cast<int>(wire.size()));
  char dst[4] = {};
  auto meta = grpc_wire::decode_response(
      &in, [&](size_t) -> Result<void*> { return static_cast<void*>(dst); }, "test", 1);
  ASSERT_TRUE(meta.is_ok()) << meta.status().to_string();
  EXPECT_EQ(meta->dtype, DataType::kU8);
  EXPECT_EQ(meta->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(std::string(dst, 4), "abcd");
}

Result<TensorMeta> decode_string(const std::string& wire, std::vector<char>& dst) {
  ArrayInputStream in(wire.data(), static_cast<int>(wire.size()));
  return grpc_wire::decode_response(
      &in,
      [&](size_t n) -> Result<void*> {
        dst.resize(n);
        return static_cast<void*>(dst.data());
      },
      "recv_tensor", 2);
}

TEST(GrpcWire, RefusesMalformedAndInconsistentReplies) {
  const std::vector<int64_t> shape{4};
  const std::string good =
      grpc_wire::encode_response_prefix(DataType::kF32, shape, 16) + pattern(16, 1);
  std::vector<char> dst;
  ASSERT_TRUE(decode_string(good, dst).is_ok());

  for (size_t cut : {size_t{1}, size_t{5}, good.size() - 1}) {
    auto r = decode_string(good.substr(0, cut), dst);
    EXPECT_EQ(r.status().code(), Code::kProtocolError) << "cut at " << cut;
  }
  // The shape says 4 floats (16 bytes) but tensor_content has 12.
  auto r = decode_string(
      grpc_wire::encode_response_prefix(DataType::kF32, shape, 12) + pattern(12, 1), dst);
  EXPECT_EQ(r.status().code(), Code::kProtocolError);
  EXPECT_NE(r.status().to_string().find("shape"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(r.status().peer(), 2);

  pb::RecvTensorResponse unknown_dtype;
  unknown_dtype.mutable_tensor()->set_dtype(static_cast<pb::DType>(77));
  r = decode_string(unknown_dtype.SerializeAsString(), dst);
  EXPECT_EQ(r.status().code(), Code::kProtocolError);
  EXPECT_NE(r.status().reason().find("dtype 77"), std::string::npos) << r.status().to_string();

  pb::RecvTensorResponse negative;
  negative.mutable_tensor()->set_dtype(pb::DT_UINT8);
  negative.mutable_tensor()->add_shape(-3);
  r = decode_string(negative.SerializeAsString(), dst);
  EXPECT_EQ(r.status().code(), Code::kProtocolError);

  r = decode_string(std::string("\x0a\x7f\x08", 3), dst);  // length past the end
  EXPECT_EQ(r.status().code(), Code::kProtocolError);
}

TEST(GrpcWire, SinkErrorsStopDecodingBeforeAnyWrite) {
  const std::vector<int64_t> shape{8};
  const std::string wire =
      grpc_wire::encode_response_prefix(DataType::kU8, shape, 8) + pattern(8, 1);
  ArrayInputStream in(wire.data(), static_cast<int>(wire.size()));
  auto r = grpc_wire::decode_response(
      &in,
      [](size_t n) -> Result<void*> {
        return RDMAFLOW_ERROR(Code::kOutOfRange, "recv_tensor", 1,
                              std::to_string(n) + " bytes do not fit");
      },
      "recv_tensor", 1);
  EXPECT_EQ(r.status().code(), Code::kOutOfRange);
}

TEST(GrpcWire, TensorBytesChecksShapes) {
  const std::vector<int64_t> ok{2, 3, 4};
  EXPECT_EQ(*grpc_wire::tensor_bytes(DataType::kF64, ok, "publish", 0), 192u);
  const std::vector<int64_t> scalar{};
  EXPECT_EQ(*grpc_wire::tensor_bytes(DataType::kBF16, scalar, "publish", 0), 2u);
  const std::vector<int64_t> negative{2, -1};
  EXPECT_EQ(grpc_wire::tensor_bytes(DataType::kF32, negative, "publish", 0).status().code(),
            Code::kInvalidArgument);
  const std::vector<int64_t> huge{int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_EQ(grpc_wire::tensor_bytes(DataType::kF32, huge, "publish", 0).status().code(),
            Code::kInvalidArgument);
}

TEST(GrpcWire, DtypesRoundTripWithTensorFlowNumbers) {
  EXPECT_EQ(grpc_wire::dtype_to_proto(DataType::kF32), 1);
  EXPECT_EQ(grpc_wire::dtype_to_proto(DataType::kF16), 19);
  EXPECT_EQ(grpc_wire::dtype_to_proto(DataType::kBF16), 14);
  for (DataType t : kAllDataTypes) {
    DataType back{};
    ASSERT_TRUE(grpc_wire::dtype_from_proto(grpc_wire::dtype_to_proto(t), &back));
    EXPECT_EQ(back, t);
  }
  DataType unused{};
  EXPECT_FALSE(grpc_wire::dtype_from_proto(0, &unused));
}

TEST(GrpcStatus, MapsGrpcCodesNamingOpPeerAndReason) {
  Status s = grpc_common::from_grpc(grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed"),
                                    "recv_tensor", 3, "RecvTensor transfer 1 step 2");
  EXPECT_EQ(s.code(), Code::kPeerFailed);
  EXPECT_EQ(s.peer(), 3);
  EXPECT_EQ(s.op(), "recv_tensor");
  EXPECT_NE(s.reason().find("UNAVAILABLE: Socket closed"), std::string::npos) << s.to_string();
  EXPECT_NE(s.reason().find("transfer 1 step 2"), std::string::npos) << s.to_string();
  EXPECT_EQ(
      grpc_common::from_grpc(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, ""), "r", 1, "c")
          .code(),
      Code::kTimeout);
  EXPECT_EQ(
      grpc_common::from_grpc(grpc::Status(grpc::StatusCode::CANCELLED, ""), "r", 1, "c").code(),
      Code::kCancelled);
  EXPECT_TRUE(grpc_common::from_grpc(grpc::Status::OK, "r", 1, "c").is_ok());
}

}  // namespace
}  // namespace rdmaflow
