// Gradient codecs: how f32 data is compressed on the wire by a collective
// (docs/compression.md). Every codec is one file in this folder and one row of
// the table in registry.cc (its name, parameter, default and range, factory),
// as the algorithms are; parse_codec(), the communicator's checks, the tests
// and the bench read that table, so nothing else lists codecs.
//
//   CodecState state;                                   // one per tensor, the caller's
//   CallOptions o;
//   o.codec = *parse_codec("topk:0.01");                // or RDMAFLOW_CODEC=topk:0.01
//   o.codec_state = &state;
//   comm->allreduce(grad, grad, n, DataType::kF32, ReduceOp::kAvg, o);
//
// A codec encodes `count` floats into a fixed number of bytes (encoded_bytes
// depends on the count only), so every rank's message has the same size and
// the collectives move them with the plain byte allgather and alltoall.
// Decoding always accumulates in f32.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace rdmaflow {

enum class CodecId : uint8_t { kNone, kFp16, kBf16, kTopK, kOneBit, kQsgd };

// How a codec's messages travel in an allreduce.
enum class CodecSchedule : uint8_t {
  // Dense codecs (fp16, bf16, qsgd): an alltoall of encoded blocks, the owner
  // of each block decodes and sums the contributions in f32, re-encodes the
  // sum, and an allgather of the encoded sums finishes it. Bytes per rank:
  // 2 (n-1)/n of the encoded tensor, as a ring allreduce's, one rounding per
  // contribution and one of the sum.
  kReduceScatterAllgather,
  // Codecs whose sum does not re-encode well (top-k's supports differ per
  // rank; a sum of signs is no sign): an allgather of every rank's encoded
  // tensor; every rank decodes and sums all n in rank order, so all ranks
  // hold the same result. Bytes per rank: (n-1) encoded tensors.
  kAllgather,
};

// What a caller asks for, e.g. parse_codec("topk:0.01").
struct CodecSpec {
  CodecId id = CodecId::kNone;
  std::optional<double> param;  // the row's parameter; nullopt: its default
};

// Error-feedback memory and random state of one tensor, owned by the caller
// (as DGC and 1-bit SGD keep the residual beside the gradient): pass the same
// state with every call on the same tensor (same count), never the same state
// to two calls in flight. It must outlive an asynchronous call. Codecs with
// error feedback (topk, onebit) add the residual to the next input; without a
// state they run without error feedback. Stochastic codecs (qsgd) draw from
// `rng`; without a state a seed from the rank and call sequence is used.
struct CodecState {
  explicit CodecState(uint64_t seed = 0x9E3779B97F4A7C15ull) : rng(seed) {}
  std::vector<float> residual;  // sized to the tensor at its first call
  uint64_t rng;
  uint64_t calls = 0;  // calls that used this state
  // Resets the error feedback (e.g. when the tensor is re-initialized).
  void reset() {
    residual.clear();
    calls = 0;
  }
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual CodecId id() const = 0;
  virtual CodecSchedule schedule() const = 0;
  // Whether encode() uses a residual (error feedback).
  virtual bool error_feedback() const { return false; }
  // The largest count it encodes (top-k's indices are 32-bit).
  virtual size_t max_count() const { return SIZE_MAX; }
  // Bytes of the encoding of `count` floats: the same on every rank.
  virtual size_t encoded_bytes(size_t count) const = 0;
  // Encodes x[0..count) into out[0..encoded_bytes(count)). With `residual`
  // (error feedback, count floats) it encodes x + residual and leaves in
  // `residual` what the encoding lost: (x + residual) - decode(encoding).
  // `rng` is the state of a stochastic codec (xorshift64, never 0).
  virtual void encode(const float* x, size_t count, std::byte* out, float* residual,
                      uint64_t& rng) const = 0;
  // acc[i] += decode(in)[i] for i < count.
  virtual void decode_add(const std::byte* in, size_t count, float* acc) const = 0;
  // out[i] = decode(in)[i]: one pass fewer than zeroing and adding.
  virtual void decode(const std::byte* in, size_t count, float* out) const {
    std::fill(out, out + count, 0.0f);
    decode_add(in, count, out);
  }
  // out = the sum of the decodings of the `msgs` messages at in + j * bytes,
  // added in message order (so every rank that sums the same messages gets
  // the same bits).
  virtual void decode_sum(const std::byte* in, size_t bytes, int msgs, size_t count,
                          float* out) const {
    decode(in, count, out);
    for (int j = 1; j < msgs; ++j) decode_add(in + static_cast<size_t>(j) * bytes, count, out);
  }
};

// One row per codec (kNone has none).
struct CodecInfo {
  CodecId id;
  std::string_view name;  // what parse_codec() and RDMAFLOW_CODEC take
  std::string_view alias;
  std::string_view param;  // its parameter's name ("ratio", ...); empty: none
  double default_param;
  std::string_view summary;
  // Checks `param` (a clear error naming the codec and the accepted range)
  // and makes the codec.
  Result<std::unique_ptr<Codec>> (*make)(double param);
};

std::span<const CodecInfo> codec_table();
const CodecInfo* find_codec(CodecId id);  // null for kNone

// "none", "fp16", "bf16", "topk[:ratio]", "onebit[:bucket]", "qsgd[:levels]"
// (names and aliases of the table). Unknown names and unparsable parameters
// are refused naming the text; the parameter's range is checked by make_codec.
Result<CodecSpec> parse_codec(std::string_view text);
// "topk:0.01", or the name alone when the parameter is the default.
std::string codec_text(const CodecSpec& spec);
// The codec of `spec` with its parameter checked; kInvalidArgument names it.
Result<std::unique_ptr<Codec>> make_codec(const CodecSpec& spec);

// The xorshift64 step the stochastic codecs use.
inline uint64_t codec_random(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

}  // namespace rdmaflow
