#include <charconv>
#include <cmath>
#include <string>

#include "collectives/codecs/codec.h"

namespace rdmaflow {

// What each codec's file (this folder) defines for its row of the table.
Result<std::unique_ptr<Codec>> make_fp16(double param);     // fp16.cc
Result<std::unique_ptr<Codec>> make_bf16(double param);     // bf16.cc
Result<std::unique_ptr<Codec>> make_topk(double ratio);     // topk.cc
Result<std::unique_ptr<Codec>> make_onebit(double bucket);  // onebit.cc
Result<std::unique_ptr<Codec>> make_qsgd(double levels);    // qsgd.cc

namespace {

// clang-format off
constexpr CodecInfo kTable[] = {
    {CodecId::kFp16, "fp16", "half", "", 0,
     "IEEE half precision on the wire, f32 accumulation (2x fewer bytes)", make_fp16},
    {CodecId::kBf16, "bf16", "bfloat16", "", 0,
     "bfloat16 on the wire, f32 accumulation (2x fewer bytes, f32's range)", make_bf16},
    {CodecId::kTopK, "topk", "dgc", "ratio", 0.01,
     "the largest |x| (a ratio of the elements) as index/value pairs, with error feedback (DGC)",
     make_topk},
    {CodecId::kOneBit, "onebit", "1bit", "bucket", 512,
     "one sign bit per element, a mean per sign per bucket, with error feedback (1-bit SGD)",
     make_onebit},
    {CodecId::kQsgd, "qsgd", "", "levels", 127,
     "unbiased stochastic quantization to `levels` levels of the bucket's norm (QSGD)",
     make_qsgd},
};
// clang-format on

}  // namespace

std::span<const CodecInfo> codec_table() {
  return kTable;
}

const CodecInfo* find_codec(CodecId id) {
  for (const auto& row : kTable) {
    if (row.id == id) return &row;
  }
  return nullptr;
}

Result<CodecSpec> parse_codec(std::string_view text) {
  const char* op = "parse codec";
  const size_t colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  CodecSpec spec;
  if (name == "none" || name == "off" || name.empty()) {
    if (colon != std::string_view::npos) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                            "codec 'none' takes no parameter (got '" + std::string(text) + "')");
    }
    return spec;
  }
  const CodecInfo* row = nullptr;
  for (const auto& r : kTable) {
    if (name == r.name || (!r.alias.empty() && name == r.alias)) row = &r;
  }
  if (row == nullptr) {
    std::string known = "none";
    for (const auto& r : kTable) known += ", " + std::string(r.name);
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "unknown codec '" + std::string(name) + "' (known: " + known + ")");
  }
  spec.id = row->id;
  if (colon == std::string_view::npos) return spec;
  const std::string_view value = text.substr(colon + 1);
  if (row->param.empty()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "codec '" + std::string(row->name) + "' takes no parameter (got '" +
                              std::string(text) + "')");
  }
  double v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(v)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "codec '" + std::string(row->name) + "': " + std::string(row->param) +
                              " '" + std::string(value) + "' is not a number");
  }
  spec.param = v;
  return spec;
}

std::string codec_text(const CodecSpec& spec) {
  const CodecInfo* row = find_codec(spec.id);
  if (row == nullptr) return "none";
  std::string s(row->name);
  if (spec.param && *spec.param != row->default_param) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, *spec.param);
    s += ":" + std::string(buf, r.ptr);
  }
  return s;
}

Result<std::unique_ptr<Codec>> make_codec(const CodecSpec& spec) {
  const CodecInfo* row = find_codec(spec.id);
  if (row == nullptr) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "make codec", -1, "no codec to make ('none')");
  }
  return row->make(spec.param.value_or(row->default_param));
}

}  // namespace rdmaflow
