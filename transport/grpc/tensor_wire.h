// The RecvTensorResponse wire format, written and read by hand so that a
// tensor's bytes are copied once on each side, as TensorFlow's gRPC path does
// (grpc_tensor_coding.cc on the sender, TensorResponse on the receiver):
//  - the sender encodes the message prefix (dtype, shape, tags and lengths) and
//    copies the elements behind it, once, into the buffer gRPC sends from;
//  - the receiver walks the reply's slices and copies tensor_content straight
//    into its destination.
// The bytes are exactly what protobuf's own serializer writes for
// tensor_service.proto (tests/grpc/wire_test.cc checks it), so any gRPC client
// can call the service. Internal to transport/grpc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "common/status.h"
#include "transport/grpc/grpc_tensor.h"

namespace google::protobuf::io {
class ZeroCopyInputStream;
}

namespace rdmaflow::grpc_wire {

// The RecvTensor method as gRPC names it on the wire.
inline constexpr const char* kRecvTensorMethod = "/rdmaflow.grpc_tensor.TensorService/RecvTensor";

// product(shape) * dtype_size(dtype); kInvalidArgument for a negative
// dimension or an overflow. `op`/`peer` name the failing operation.
Result<size_t> tensor_bytes(DataType dtype, std::span<const int64_t> shape, const char* op,
                            int peer);

// The serialized RecvTensorResponse{tensor: {dtype, shape, tensor_content}} up
// to (not including) the `content_bytes` bytes of tensor_content.
std::string encode_response_prefix(DataType dtype, std::span<const int64_t> shape,
                                   size_t content_bytes);

// Where tensor_content goes: given its size, a destination of at least that
// many bytes (or an error, which ends the decoding with it).
using ContentSink = std::function<Result<void*>(size_t content_bytes)>;

// Parses a serialized RecvTensorResponse from `in`, copying tensor_content to
// sink(size) (called only when the message carries tensor_content). Errors are
// kProtocolError (malformed or inconsistent), or whatever the sink returned.
Result<TensorMeta> decode_response(google::protobuf::io::ZeroCopyInputStream* in,
                                   const ContentSink& sink, const char* op, int peer);

// TensorFlow's DataType numbers (tensor_service.proto's DType).
int dtype_to_proto(DataType dtype);
bool dtype_from_proto(int value, DataType* out);

}  // namespace rdmaflow::grpc_wire
