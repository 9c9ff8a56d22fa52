// --codec: a column per gradient codec (docs/compression.md) beside the
// uncompressed rdmaflow column, in the same run on the same ranks. Each column
// runs the collective with the codec on its own inputs (uniform in [-1, 1):
// the bench's small integers would make fp16 exact and top-k all ties), keeps
// one CodecState across iterations as a training loop does, and reports the
// bytes one rank sends per call and the relative L2 error of its last result
// against the uncompressed collective of the same inputs.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/compressed.h"

namespace rdmaflow::bench {

// "all": every codec of the table; else a comma-separated list of codec texts.
inline Result<std::vector<CodecSpec>> parse_codec_list(const std::string& text) {
  std::vector<CodecSpec> out;
  if (text.empty()) return out;
  if (text == "all") {
    for (const CodecInfo& row : codec_table()) out.push_back({row.id, std::nullopt});
    return out;
  }
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    RDMAFLOW_ASSIGN_OR_RETURN(CodecSpec spec, parse_codec(text.substr(start, comma - start)));
    RDMAFLOW_RETURN_IF_ERROR(make_codec(spec).status());
    out.push_back(spec);
    start = comma + 1;
  }
  return out;
}

// Bytes one rank sends per uncompressed call on a bandwidth-optimal schedule
// (ring, Rabenseifner): 2 (n-1)/n of the buffer for allreduce, (n-1)/n for
// reduce_scatter and allgather.
inline size_t uncompressed_sent_bytes(CollectiveKind kind, size_t bytes, int world) {
  const double f = (kind == CollectiveKind::kAllreduce ? 2.0 : 1.0) * (world - 1) / world;
  return static_cast<size_t>(f * static_cast<double>(bytes));
}

class CodecColumn {
 public:
  CodecColumn(Communicator& comm, CodecSpec spec)
      : comm_(comm), spec_(spec), codec_(make_codec(spec).value()) {}

  std::string name() const { return "codec:" + codec_text(spec_); }
  bool supports(CollectiveKind kind) const {
    if (kind == CollectiveKind::kAllreduce) return true;
    const bool dense = codec_->schedule() == CodecSchedule::kReduceScatterAllgather;
    return dense && (kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllgather);
  }
  // `count`: elements of the largest buffer, as the bench's rows.
  Status run(CollectiveKind kind, size_t count, ReduceOp op) {
    prepare(kind, count, op);
    CallOptions o;
    o.codec = spec_;
    o.codec_state = &state_;
    return comm_.run(kind, in_.data(), out_.data(), per_call(kind, count), DataType::kF32, op, 0,
                     o);
  }
  size_t sent_bytes(CollectiveKind kind, size_t count) const {
    return compressed_sent_bytes(kind, per_call(kind, count), comm_.world_size(), *codec_);
  }
  // ||last result - uncompressed|| / ||uncompressed|| on this rank.
  Result<double> relative_error(CollectiveKind kind, size_t count, ReduceOp op) {
    std::vector<float> exact(out_.size());
    CallOptions none;
    none.codec = CodecSpec{};
    RDMAFLOW_RETURN_IF_ERROR(comm_.run(kind, in_.data(), exact.data(), per_call(kind, count),
                                       DataType::kF32, op, 0, none));
    double diff = 0, norm = 0;
    for (size_t i = 0; i < exact.size(); ++i) {
      diff += (double(out_[i]) - exact[i]) * (double(out_[i]) - exact[i]);
      norm += double(exact[i]) * exact[i];
    }
    return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  }

  // The codec's CPU work on this rank, one pass each over the last call's input:
  // encode (with error feedback when the codec has it) and decode_add, in ms,
  // best of 3. Where the time of a codec column goes when it is not the wire:
  // an allgather-route call encodes once and decodes n messages, a dense one
  // encodes once, decodes n blocks of n-th size, re-encodes its block and
  // decodes the gathered whole.
  struct CpuCost {
    double encode_ms = 0;
    double decode_ms = 0;
  };
  CpuCost cpu_cost() {
    const size_t n = in_.size();
    std::vector<std::byte> enc(codec_->encoded_bytes(n));
    std::vector<float> residual(codec_->error_feedback() ? n : 0), acc(n, 0.0f);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    CpuCost best{1e300, 1e300};
    using Clock = std::chrono::steady_clock;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = Clock::now();
      codec_->encode(in_.data(), n, enc.data(), residual.empty() ? nullptr : residual.data(), rng);
      const auto t1 = Clock::now();
      codec_->decode_add(enc.data(), n, acc.data());
      const auto t2 = Clock::now();
      best.encode_ms =
          std::min(best.encode_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
      best.decode_ms =
          std::min(best.decode_ms, std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    return best;
  }

 private:
  size_t per_call(CollectiveKind kind, size_t count) const {
    return kind == CollectiveKind::kAllreduce ? count : count / comm_.world_size();
  }
  void prepare(CollectiveKind kind, size_t count, ReduceOp) {
    const size_t in = kind == CollectiveKind::kAllgather ? count / comm_.world_size() : count;
    const size_t out = kind == CollectiveKind::kReduceScatter ? count / comm_.world_size() : count;
    if (in_.size() == in && out_.size() == out) return;
    in_.resize(in);
    out_.resize(out);
    uint64_t s = 0x2545F4914F6CDD1Dull ^ static_cast<uint64_t>(comm_.rank() + 1);
    for (auto& v : in_) v = static_cast<float>(codec_random(s) >> 40) / 8388608.0f - 1.0f;
    state_ = CodecState();
  }

  Communicator& comm_;
  CodecSpec spec_;
  std::unique_ptr<Codec> codec_;
  CodecState state_;
  std::vector<float> in_, out_;
};

}  // namespace rdmaflow::bench
