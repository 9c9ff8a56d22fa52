#include "collectives/compressed.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
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
  std::vector<std::byte> send, recv, send2, recv2, tmp;
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
      : fabric_(fabric), a_(args), lane_(lane), patience_(deadline - Clock::now()), what_(what) {}

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
    // Each phase may go as long without progress as the call (the timeout is
    // about progress, not total time: executor.h).
    return execute(fabric_, p, lane_, Clock::now() + patience_, what_);
  }

 private:
  Fabric& fabric_;
  const CollArgs& a_;
  const int lane_;
  const Clock::duration patience_;
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
  c.decode_sum(in, bytes, n_msgs, n, out);
}

// Segments of a dense allreduce: while one segment's bytes travel, the next
// is encoded and the previous decoded (on a helper thread), so the codec's
// CPU work hides behind the transfers. At least 1 M elements each, at most 8.
size_t dense_segments(size_t count) {
  return std::clamp<size_t>(count >> 20, 1, 8);
}

// The dense route of allreduce: per segment, each rank encodes its n blocks,
// an alltoall gives block j of every rank to rank j, which sums them decoded
// in f32 and encodes the sum once, and an allgather hands every encoded sum to
// everyone, which decodes them (its own too: all ranks hold the same bits).
// With several segments the transfers run on this thread in the order
// A0 A1 G0 A2 G1 ... and a helper thread does the CPU stages in between.
Status dense_allreduce(Phases& phases, const Codec& c, const CollArgs& a, uint64_t& rng) {
  const int n = a.world, r = a.rank;
  const size_t count = a.count, segments = dense_segments(count);
  const auto* in = reinterpret_cast<const float*>(a.in);
  auto* out = reinterpret_cast<float*>(a.out);
  const bool avg = a.op == ReduceOp::kAvg;
  const size_t largest = (count + segments - 1) / segments;
  const size_t e = c.encoded_bytes((largest + n - 1) / n);  // one block of one segment
  const size_t seg_bytes = e * static_cast<size_t>(n);
  Buffers& buf = buffers();
  buf.send.resize(seg_bytes * segments);
  buf.recv.resize(seg_bytes * segments);
  buf.send2.resize(e * segments);
  buf.recv2.resize(seg_bytes * segments);
  buf.acc.resize((largest + n - 1) / n);
  auto block = [&](size_t s, int j) {
    const BlockRange seg = block_range(count, segments, s);
    BlockRange b = block_range(seg.size, static_cast<size_t>(n), static_cast<size_t>(j));
    b.begin += seg.begin;
    return b;
  };
  // The CPU stages of segment s.
  auto encode_blocks = [&](size_t s) {
    for (int j = 0; j < n; ++j) {
      const BlockRange b = block(s, j);
      c.encode(in + b.begin, b.size, buf.send.data() + s * seg_bytes + static_cast<size_t>(j) * e,
               nullptr, rng);
    }
  };
  auto reduce_own = [&](size_t s) {
    const size_t mine = block(s, r).size;
    sum_decoded(c, buf.recv.data() + s * seg_bytes, e, n, mine, buf.acc.data());
    if (avg) scale(buf.acc.data(), mine, n);
    c.encode(buf.acc.data(), mine, buf.send2.data() + s * e, nullptr, rng);
  };
  auto decode_all = [&](size_t s) {
    for (int j = 0; j < n; ++j) {
      const BlockRange b = block(s, j);
      sum_decoded(c, buf.recv2.data() + s * seg_bytes + static_cast<size_t>(j) * e, e, 1, b.size,
                  out + b.begin);
    }
  };
  // Its transfers.
  auto alltoall = [&](size_t s) {
    return phases.exchange(CollectiveKind::kAlltoall, buf.send.data() + s * seg_bytes,
                           buf.recv.data() + s * seg_bytes, e);
  };
  auto allgather = [&](size_t s) {
    return phases.exchange(CollectiveKind::kAllgather, buf.send2.data() + s * e,
                           buf.recv2.data() + s * seg_bytes, e);
  };

  if (segments == 1) {
    encode_blocks(0);
    RDMAFLOW_RETURN_IF_ERROR(alltoall(0));
    reduce_own(0);
    RDMAFLOW_RETURN_IF_ERROR(allgather(0));
    decode_all(0);
    return Status::ok();
  }

  // Stages done so far, and whether this thread gave up.
  struct Progress {
    std::mutex mu;
    std::condition_variable cv;
    size_t encoded = 0, exchanged = 0, reduced = 0, gathered = 0;
    bool abort = false;
    // Waits until `counter` reaches `v`; false when aborted.
    bool wait(const size_t& counter, size_t v) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return abort || counter >= v; });
      return !abort;
    }
    void set(size_t& counter, size_t v) {
      {
        std::lock_guard<std::mutex> lock(mu);
        counter = v;
      }
      cv.notify_all();
    }
  } p;
  auto helper = [&] {
    encode_blocks(0);
    p.set(p.encoded, 1);
    encode_blocks(1);
    p.set(p.encoded, 2);
    for (size_t s = 0; s < segments; ++s) {
      if (!p.wait(p.exchanged, s + 1)) return;
      reduce_own(s);
      p.set(p.reduced, s + 1);
      if (s + 2 < segments) {
        encode_blocks(s + 2);
        p.set(p.encoded, s + 3);
      }
      if (s >= 1) {
        if (!p.wait(p.gathered, s)) return;
        decode_all(s - 1);
      }
    }
    if (p.wait(p.gathered, segments)) decode_all(segments - 1);
  };
  std::thread worker(helper);
  auto transfers = [&]() -> Status {
    for (size_t s = 0; s < segments; ++s) {
      p.wait(p.encoded, s + 1);
      RDMAFLOW_RETURN_IF_ERROR(alltoall(s));
      p.set(p.exchanged, s + 1);
      if (s >= 1) {
        p.wait(p.reduced, s);
        RDMAFLOW_RETURN_IF_ERROR(allgather(s - 1));
        p.set(p.gathered, s);
      }
    }
    p.wait(p.reduced, segments);
    RDMAFLOW_RETURN_IF_ERROR(allgather(segments - 1));
    p.set(p.gathered, segments);
    return Status::ok();
  };
  Status st = transfers();
  if (!st.is_ok()) {
    std::lock_guard<std::mutex> lock(p.mu);
    p.abort = true;
  }
  p.cv.notify_all();
  worker.join();
  return st;
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

  if (a.kind == CollectiveKind::kAllreduce) return dense_allreduce(phases, c, a, rng);

  // reduce_scatter with a dense codec: block j of the input to rank j
  // (alltoall), summed there in f32.
  const size_t e = c.encoded_bytes(count);
  buf.send.resize(e * static_cast<size_t>(n));
  buf.recv.resize(e * static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    c.encode(in + static_cast<size_t>(j) * count, count,
             buf.send.data() + static_cast<size_t>(j) * e, nullptr, rng);
  }
  RDMAFLOW_RETURN_IF_ERROR(
      phases.exchange(CollectiveKind::kAlltoall, buf.send.data(), buf.recv.data(), e));
  sum_decoded(c, buf.recv.data(), e, n, count, out);
  if (avg) scale(out, count, n);
  (void)r;
  return Status::ok();
}

size_t compressed_sent_bytes(CollectiveKind kind, size_t count, int world, const Codec& codec) {
  const auto others = static_cast<size_t>(world - 1);
  if (kind == CollectiveKind::kAllreduce) {
    if (!dense(codec)) return others * codec.encoded_bytes(count);
    const size_t segments = dense_segments(count);
    const size_t largest = (count + segments - 1) / segments;
    return segments * 2 * others * codec.encoded_bytes((largest + world - 1) / world);
  }
  return others * codec.encoded_bytes(count);
}

}  // namespace rdmaflow
