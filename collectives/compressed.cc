#include "collectives/compressed.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/executor.h"
#include "collectives/program.h"

namespace rdmaflow {
namespace {

using Clock = std::chrono::steady_clock;

bool dense(const Codec& c) {
  return c.schedule() == CodecSchedule::kReduceScatterAllgather;
}

// The encoded messages and the f32 sums of the running call. Per thread: a
// lane's calls run one at a time on the thread that runs the lane, and the
// buffers keep the size of the largest call (as the lanes' tmp memory does).
struct Buffers {
  std::vector<std::byte> send, recv, tmp;
  std::vector<float> acc;
};

Buffers& buffers() {
  thread_local Buffers b;
  return b;
}

class Phases {
 public:
  Phases(Fabric& fabric, const CollArgs& args, int lane, Clock::time_point deadline,
         const std::string& what)
      : fabric_(fabric), a_(args), lane_(lane), deadline_(deadline), what_(what) {}

  // Every rank's `bytes` at `in` land at out + rank * bytes (allgather), or
  // block j of `in` goes to rank j's out + rank * bytes (alltoall).
  Status exchange(CollectiveKind kind, const std::byte* in, std::byte* out, size_t bytes) {
    CollArgs b;
    b.kind = kind;
    b.in = in;
    b.out = out;
    b.count = bytes;
    b.type = DataType::kU8;
    b.rank = a_.rank;
    b.world = a_.world;
    b.hosts = a_.hosts;
    b.model = a_.model;
    const size_t total = bytes * static_cast<size_t>(a_.world);
    Algorithm algo = Algorithm::kPairwise;
    if (kind == CollectiveKind::kAllgather) {
      algo = a_.model != nullptr ? a_.model->choose(kind, total) : Algorithm::kRing;
    }
    std::vector<std::byte>& tmp = buffers().tmp;
    tmp.resize(temp_elems(b, algo) + 64);
    b.tmp = tmp.data();
    // As the communicator pieces a call: a quarter of a rank's share, between
    // 32 KiB and a slot.
    const size_t slot = fabric_.config().slot_bytes;
    const size_t piece = std::clamp<size_t>(total / (static_cast<size_t>(a_.world) * 4),
                                            std::min<size_t>(32 * 1024, slot), slot);
    Program p(a_.world, DataType::kU8, ReduceOp::kSum, piece);
    RDMAFLOW_RETURN_IF_ERROR(build_program(b, algo, p));
    p.finalize();
    return execute(fabric_, p, lane_, deadline_, what_);
  }

 private:
  Fabric& fabric_;
  const CollArgs& a_;
  const int lane_;
  const Clock::time_point deadline_;
  const std::string& what_;
};

void scale(float* x, size_t n, int world) {
  const float f = 1.0f / static_cast<float>(world);
  for (size_t i = 0; i < n; ++i) x[i] *= f;
}

// out[0..n) = the sum of the n_msgs decoded messages of `bytes` each at `in`,
// in rank order (so every rank that sums the same messages gets the same bits).
void sum_decoded(const Codec& c, const std::byte* in, size_t bytes, int n_msgs, size_t n,
                 float* out) {
  std::fill(out, out + n, 0.0f);
  for (int j = 0; j < n_msgs; ++j) c.decode_add(in + static_cast<size_t>(j) * bytes, n, out);
}

}  // namespace

Status check_codec_call(CollectiveKind kind, size_t count, DataType type, ReduceOp op,
                        const CodecCall& call) {
  const std::string name(collective_name(kind));
  const std::string codec = codec_text(call.spec);
  auto refuse = [&](const std::string& why) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, name, -1, "codec '" + codec + "': " + why);
  };
  const Codec& c = *call.codec;
  if (kind != CollectiveKind::kAllreduce && kind != CollectiveKind::kReduceScatter &&
      kind != CollectiveKind::kAllgather) {
    return refuse("codecs apply to allreduce, reduce_scatter and allgather only");
  }
  if (!dense(c) && kind != CollectiveKind::kAllreduce) {
    return refuse("a sparse or sign codec applies to allreduce only (its sums do not re-encode)");
  }
  if (type != DataType::kF32) {
    return refuse("codecs encode f32 data, not " + std::string(dtype_name(type)));
  }
  if (kind != CollectiveKind::kAllgather && op != ReduceOp::kSum && op != ReduceOp::kAvg) {
    return refuse("codecs reduce with sum or avg, not " + std::string(reduce_op_name(op)));
  }
  if (count > c.max_count()) {
    return refuse(std::to_string(count) + " elements exceed its limit of " +
                  std::to_string(c.max_count()));
  }
  if (call.state != nullptr && c.error_feedback() && !call.state->residual.empty() &&
      call.state->residual.size() != count) {
    return refuse("its CodecState holds the residual of a tensor of " +
                  std::to_string(call.state->residual.size()) + " elements, this call has " +
                  std::to_string(count) + " (one state per tensor)");
  }
  return Status::ok();
}

Status run_compressed(Fabric& fabric, const CollArgs& a, const CodecCall& call, int lane,
                      Clock::time_point deadline, const std::string& what) {
  const Codec& c = *call.codec;
  const int n = a.world, r = a.rank;
  const size_t count = a.count;
  Buffers& buf = buffers();
  Phases phases(fabric, a, lane, deadline, what);
  uint64_t seed = call.seed | 1;
  uint64_t& rng = call.state != nullptr ? call.state->rng : seed;
  const auto* in = reinterpret_cast<const float*>(a.in);
  auto* out = reinterpret_cast<float*>(a.out);
  const bool avg = a.op == ReduceOp::kAvg && a.kind != CollectiveKind::kAllgather;
  if (call.state != nullptr) ++call.state->calls;

  if (a.kind == CollectiveKind::kAllreduce && !dense(c)) {
    // Every rank's encoded tensor to every rank; each sums all n decoded.
    const size_t e = c.encoded_bytes(count);
    buf.send.resize(e);
    buf.recv.resize(e * static_cast<size_t>(n));
    float* residual = nullptr;
    if (call.state != nullptr && c.error_feedback()) {
      if (call.state->residual.size() != count) call.state->residual.assign(count, 0.0f);
      residual = call.state->residual.data();
    }
    c.encode(in, count, buf.send.data(), residual, rng);
    RDMAFLOW_RETURN_IF_ERROR(
        phases.exchange(CollectiveKind::kAllgather, buf.send.data(), buf.recv.data(), e));
    sum_decoded(c, buf.recv.data(), e, n, count, out);
    if (avg) scale(out, count, n);
    return Status::ok();
  }

  if (a.kind == CollectiveKind::kAllgather) {
    const size_t e = c.encoded_bytes(count);
    buf.send.resize(e);
    buf.recv.resize(e * static_cast<size_t>(n));
    c.encode(in, count, buf.send.data(), nullptr, rng);
    RDMAFLOW_RETURN_IF_ERROR(
        phases.exchange(CollectiveKind::kAllgather, buf.send.data(), buf.recv.data(), e));
    for (int j = 0; j < n; ++j) {
      sum_decoded(c, buf.recv.data() + static_cast<size_t>(j) * e, e, 1, count,
                  out + static_cast<size_t>(j) * count);
    }
    return Status::ok();
  }

  // Dense codecs: block j of the input to rank j (alltoall), summed there in
  // f32; for allreduce the encoded sums then go to everyone (allgather).
  const bool rs = a.kind == CollectiveKind::kReduceScatter;
  auto block = [&](int j) {
    return rs ? BlockRange{static_cast<size_t>(j) * count, count} : block_range(count, n, j);
  };
  const size_t largest = rs ? count : (count + n - 1) / n;
  const size_t e = c.encoded_bytes(largest);
  buf.send.resize(e * static_cast<size_t>(n));
  buf.recv.resize(e * static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    const BlockRange b = block(j);
    c.encode(in + b.begin, b.size, buf.send.data() + static_cast<size_t>(j) * e, nullptr, rng);
  }
  RDMAFLOW_RETURN_IF_ERROR(
      phases.exchange(CollectiveKind::kAlltoall, buf.send.data(), buf.recv.data(), e));
  const size_t mine = block(r).size;
  if (rs) {
    sum_decoded(c, buf.recv.data(), e, n, mine, out);
    if (avg) scale(out, mine, n);
    return Status::ok();
  }
  buf.acc.resize(mine);
  sum_decoded(c, buf.recv.data(), e, n, mine, buf.acc.data());
  if (avg) scale(buf.acc.data(), mine, n);
  c.encode(buf.acc.data(), mine, buf.send.data(), nullptr, rng);
  RDMAFLOW_RETURN_IF_ERROR(
      phases.exchange(CollectiveKind::kAllgather, buf.send.data(), buf.recv.data(), e));
  // Every block from its encoding, this rank's too: all ranks hold the same bits.
  for (int j = 0; j < n; ++j) {
    const BlockRange b = block(j);
    sum_decoded(c, buf.recv.data() + static_cast<size_t>(j) * e, e, 1, b.size, out + b.begin);
  }
  return Status::ok();
}

size_t compressed_sent_bytes(CollectiveKind kind, size_t count, int world, const Codec& codec) {
  const auto others = static_cast<size_t>(world - 1);
  if (kind == CollectiveKind::kAllreduce) {
    if (!dense(codec)) return others * codec.encoded_bytes(count);
    return 2 * others * codec.encoded_bytes((count + world - 1) / world);
  }
  return others * codec.encoded_bytes(count);
}

}  // namespace rdmaflow
