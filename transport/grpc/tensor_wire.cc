#include "transport/grpc/tensor_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <climits>
#include <cstring>

#include "transport/grpc/tensor_service.pb.h"

namespace rdmaflow::grpc_wire {
namespace {

namespace pb = ::rdmaflow::grpc_tensor;
using google::protobuf::internal::WireFormatLite;

// Tags: (field number << 3) | wire type (0 varint, 2 length-delimited).
constexpr uint32_t kResponseTensorTag = (1 << 3) | 2;  // RecvTensorResponse.tensor
constexpr uint32_t kDtypeTag = (1 << 3) | 0;           // TensorProto.dtype
constexpr uint32_t kShapeUnpackedTag = (2 << 3) | 0;   // TensorProto.shape, one element
constexpr uint32_t kShapePackedTag = (2 << 3) | 2;     // TensorProto.shape, packed
constexpr uint32_t kContentTag = (4 << 3) | 2;         // TensorProto.tensor_content

size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(static_cast<uint8_t>(v) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

Status malformed(const char* op, int peer, const std::string& what) {
  return RDMAFLOW_ERROR(Code::kProtocolError, op, peer, "malformed RecvTensorResponse: " + what);
}

}  // namespace

int dtype_to_proto(DataType dtype) {
  switch (dtype) {
    case DataType::kF32:
      return pb::DT_FLOAT;
    case DataType::kF64:
      return pb::DT_DOUBLE;
    case DataType::kF16:
      return pb::DT_HALF;
    case DataType::kBF16:
      return pb::DT_BFLOAT16;
    case DataType::kI32:
      return pb::DT_INT32;
    case DataType::kI64:
      return pb::DT_INT64;
    case DataType::kU8:
      return pb::DT_UINT8;
    case DataType::kI8:
      return pb::DT_INT8;
    case DataType::kBool:
      return pb::DT_BOOL;
  }
  return pb::DT_INVALID;
}

bool dtype_from_proto(int value, DataType* out) {
  for (DataType t : kAllDataTypes) {
    if (dtype_to_proto(t) == value) {
      *out = t;
      return true;
    }
  }
  return false;
}

Result<size_t> tensor_bytes(DataType dtype, std::span<const int64_t> shape, const char* op,
                            int peer) {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, peer,
                            "negative dimension " + std::to_string(d) + " in the shape");
    }
    if (d != 0 && n > SIZE_MAX / static_cast<uint64_t>(d)) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, peer, "the shape's size overflows");
    }
    n *= static_cast<size_t>(d);
  }
  return n;
}

std::string encode_response_prefix(DataType dtype, std::span<const int64_t> shape,
                                   size_t content_bytes) {
  // Field order and omissions follow protobuf's serializer: proto3 scalars
  // equal to their default and empty repeated/bytes fields are not written.
  const auto dtype_value = static_cast<uint64_t>(dtype_to_proto(dtype));
  size_t packed = 0;
  for (int64_t d : shape) packed += varint_size(static_cast<uint64_t>(d));
  size_t inner = 0;
  if (dtype_value != 0) inner += 1 + varint_size(dtype_value);
  if (!shape.empty()) inner += 1 + varint_size(packed) + packed;
  if (content_bytes != 0) inner += 1 + varint_size(content_bytes) + content_bytes;

  std::string out;
  out.reserve(32 + packed);
  out.push_back(static_cast<char>(kResponseTensorTag));
  put_varint(out, inner);
  if (dtype_value != 0) {
    out.push_back(static_cast<char>(kDtypeTag));
    put_varint(out, dtype_value);
  }
  if (!shape.empty()) {
    out.push_back(static_cast<char>(kShapePackedTag));
    put_varint(out, packed);
    for (int64_t d : shape) put_varint(out, static_cast<uint64_t>(d));
  }
  if (content_bytes != 0) {
    out.push_back(static_cast<char>(kContentTag));
    put_varint(out, content_bytes);
  }
  return out;
}

namespace {

using google::protobuf::io::CodedInputStream;

struct Decoded {
  int dtype = 0;
  std::vector<int64_t> shape;
  size_t bytes = 0;
};

// Reads the fields of one TensorProto up to the current limit.
Status decode_tensor(CodedInputStream& in, const ContentSink& sink, Decoded& d, const char* op,
                     int peer) {
  while (uint32_t tag = in.ReadTag()) {
    switch (tag) {
      case kDtypeTag: {
        uint32_t v = 0;
        if (!in.ReadVarint32(&v)) return malformed(op, peer, "truncated dtype");
        d.dtype = static_cast<int>(v);
        break;
      }
      case kShapeUnpackedTag: {
        uint64_t v = 0;
        if (!in.ReadVarint64(&v)) return malformed(op, peer, "truncated shape");
        d.shape.push_back(static_cast<int64_t>(v));
        break;
      }
      case kShapePackedTag: {
        uint32_t len = 0;
        if (!in.ReadVarint32(&len)) return malformed(op, peer, "truncated shape");
        CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(len));
        while (in.BytesUntilLimit() > 0) {
          uint64_t v = 0;
          if (!in.ReadVarint64(&v)) return malformed(op, peer, "truncated shape");
          d.shape.push_back(static_cast<int64_t>(v));
        }
        in.PopLimit(limit);
        break;
      }
      case kContentTag: {
        uint32_t len = 0;
        if (!in.ReadVarint32(&len) || len > static_cast<uint32_t>(INT_MAX)) {
          return malformed(op, peer, "bad tensor_content length");
        }
        if (in.BytesUntilLimit() >= 0 && static_cast<uint32_t>(in.BytesUntilLimit()) < len) {
          return malformed(op, peer, "tensor_content runs past its message");
        }
        RDMAFLOW_ASSIGN_OR_RETURN(void* dst, sink(len));
        if (len != 0 && !in.ReadRaw(dst, static_cast<int>(len))) {
          return malformed(op, peer, "truncated tensor_content");
        }
        d.bytes = len;
        break;
      }
      default:
        if (!WireFormatLite::SkipField(&in, tag)) return malformed(op, peer, "bad field");
    }
  }
  if (!in.ConsumedEntireMessage()) return malformed(op, peer, "bad tag in TensorProto");
  // The stream may end before the length the TensorProto announced.
  if (in.BytesUntilLimit() > 0) return malformed(op, peer, "truncated TensorProto");
  return Status::ok();
}

}  // namespace

Result<TensorMeta> decode_response(google::protobuf::io::ZeroCopyInputStream* stream,
                                   const ContentSink& sink, const char* op, int peer) {
  Decoded d;
  {
    CodedInputStream in(stream);
    in.SetTotalBytesLimit(INT_MAX);
    while (uint32_t tag = in.ReadTag()) {
      if (tag == kResponseTensorTag) {
        uint32_t len = 0;
        if (!in.ReadVarint32(&len) || len > static_cast<uint32_t>(INT_MAX)) {
          return malformed(op, peer, "bad tensor length");
        }
        CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(len));
        RDMAFLOW_RETURN_IF_ERROR(decode_tensor(in, sink, d, op, peer));
        in.PopLimit(limit);
      } else if (!WireFormatLite::SkipField(&in, tag)) {
        return malformed(op, peer, "bad field");
      }
    }
    if (!in.ConsumedEntireMessage()) return malformed(op, peer, "bad tag");
  }
  TensorMeta meta;
  if (!dtype_from_proto(d.dtype, &meta.dtype)) {
    return malformed(op, peer, "unknown dtype " + std::to_string(d.dtype));
  }
  meta.shape = std::move(d.shape);
  meta.bytes = d.bytes;
  auto expected = tensor_bytes(meta.dtype, meta.shape, op, peer);
  if (!expected.is_ok()) return malformed(op, peer, expected.status().reason());
  if (*expected != meta.bytes) {
    return malformed(op, peer,
                     "tensor_content has " + std::to_string(meta.bytes) +
                         " bytes, the shape says " + std::to_string(*expected));
  }
  return meta;
}

}  // namespace rdmaflow::grpc_wire
