#include "runtime/session/session_dynamic.h"

#include <cstring>

#include "runtime/session/session_layout.h"

namespace rdmaflow::session_detail {

Status encode_dynamic_header(const DynamicHeader& h, std::span<uint8_t> out) {
  ByteWriter w;
  w.u32(kDynamicMagic)
      .u8(static_cast<uint8_t>(h.dtype))
      .u8(static_cast<uint8_t>(h.dims.size()))
      .u8(h.inline_payload ? 1 : 0)
      .u8(static_cast<uint8_t>(h.key ? h.more_keys.size() : 0))
      .u64(h.step)
      .u64(h.bytes);
  for (int64_t d : h.dims) w.u64(static_cast<uint64_t>(d));
  if (h.key) {
    w.bytes(h.key->serialize());
    for (const auto& k : h.more_keys) w.bytes(k.serialize());
  } else {
    w.u32(0);
  }
  if (h.more_keys.size() > kMaxDynamicExtraKeys) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "encode dynamic header", -1,
                          std::to_string(h.more_keys.size()) + " extra keys (at most " +
                              std::to_string(kMaxDynamicExtraKeys) + ")");
  }
  if (h.dims.size() > kMaxDynamicDims || w.out().size() > out.size()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "encode dynamic header", -1,
                          "header of " + std::to_string(w.out().size()) + " bytes (" +
                              std::to_string(h.dims.size()) + " dims) does not fit in " +
                              std::to_string(out.size()) + " bytes of metadata");
  }
  std::memcpy(out.data(), w.out().data(), w.out().size());
  return Status::ok();
}

Result<DynamicHeader> decode_dynamic_header(std::span<const uint8_t> in) {
  auto bad = [](const std::string& why) {
    return RDMAFLOW_ERROR(Code::kProtocolError, "decode dynamic header", -1, why);
  };
  ByteReader r(in);
  uint32_t magic = 0;
  uint8_t dtype = 0, ndims = 0, inl = 0, extra = 0;
  DynamicHeader h;
  if (!r.u32(magic) || magic != kDynamicMagic) return bad("bad magic");
  if (!r.u8(dtype) || !r.u8(ndims) || !r.u8(inl) || !r.u8(extra) || !r.u64(h.step) ||
      !r.u64(h.bytes)) {
    return bad("truncated");
  }
  bool known = false;
  for (DataType t : kAllDataTypes) known |= static_cast<uint8_t>(t) == dtype;
  if (!known) return bad("unknown dtype " + std::to_string(dtype));
  if (ndims > kMaxDynamicDims) return bad(std::to_string(ndims) + " dims");
  h.dtype = static_cast<DataType>(dtype);
  h.inline_payload = inl == 1;
  uint64_t elements = 1;
  for (uint8_t i = 0; i < ndims; ++i) {
    uint64_t d = 0;
    if (!r.u64(d)) return bad("truncated dims");
    if (static_cast<int64_t>(d) < 0 || (d != 0 && elements > (uint64_t{1} << 62) / d)) {
      return bad("dimension " + std::to_string(static_cast<int64_t>(d)) + " out of range");
    }
    elements *= d;
    h.dims.push_back(static_cast<int64_t>(d));
  }
  // Compared by division: elements * size may wrap (2^62 elements of 8 bytes).
  const uint64_t size = dtype_size(h.dtype);
  if (h.bytes % size != 0 || h.bytes / size != elements) {
    return bad("payload of " + std::to_string(h.bytes) + " bytes does not match its shape");
  }
  std::vector<uint8_t> key;
  if (!r.bytes(key)) return bad("truncated key");
  if (!h.inline_payload) {
    auto k = RemoteKey::deserialize(key);
    if (!k) return bad("bad payload key: " + k.status().reason());
    if (k->length < h.bytes) return bad("payload key grants fewer bytes than the payload");
    h.key = std::move(*k);
    if (extra > kMaxDynamicExtraKeys) return bad(std::to_string(extra) + " extra keys");
    for (uint8_t i = 0; i < extra; ++i) {
      if (!r.bytes(key)) return bad("truncated extra key");
      auto more = RemoteKey::deserialize(key);
      if (!more) return bad("bad extra payload key: " + more.status().reason());
      if (more->length < h.bytes) return bad("an extra key grants fewer bytes than the payload");
      h.more_keys.push_back(std::move(*more));
    }
  }
  return h;
}

}  // namespace rdmaflow::session_detail
