// Creation's measurements: which ranks share a host, and alpha, beta and gamma
// per level of the layout, agreed by every rank (the cost model's inputs).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <vector>

#include "collectives/communicator_internal.h"
#include "collectives/executor.h"
#include "collectives/program.h"
#include "collectives/reduce_kernels.h"
#include "common/log.h"

namespace rdmaflow {

namespace {

// gamma out of cache, as a call reduces once its buffers outgrow the cache:
// 64 KiB pieces of a received slot (in cache: the receive just wrote it) added
// to an input into an output, walking both from start to end. The two are 4x
// the cache each, at least 4 MiB. Each piece is timed, and the figure is the
// median piece: a rank descheduled for a few pieces (a loaded host; every rank
// measures at once) inflates those pieces, not the figure, where the fastest
// of two whole passes over 8 MiB read 0.10-1.16 ns/B in one minute on the dev
// VM. About 7-10 ms at creation, most of it the first touch of the buffers.
double cold_gamma(size_t cache) {
  const size_t piece = 16 * 1024;  // floats: 64 KiB
  const size_t floats = std::max<size_t>(size_t{4} << 20, 4 * cache) / sizeof(float);
  std::vector<float> in(floats, 1.0f), out(floats, 0.0f), slot(4 * piece, 2.0f);
  std::vector<double> seconds;
  seconds.reserve(2 * (floats / piece));
  for (int r = 0; r < 2; ++r) {
    for (size_t off = 0; off + piece <= floats; off += piece) {
      const auto t0 = Clock::now();
      reduce_buffers(DataType::kF32, ReduceOp::kSum, out.data() + off, in.data() + off,
                     slot.data() + off % slot.size(), piece);
      seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  auto mid = seconds.begin() + static_cast<std::ptrdiff_t>(seconds.size() / 2);
  std::nth_element(seconds.begin(), mid, seconds.end());
  return *mid / static_cast<double>(piece * sizeof(float));
}

}  // namespace

Status Communicator::find_hosts(uint64_t key) {
  std::vector<uint64_t> keys(static_cast<size_t>(world_));
  CollArgs args;
  args.kind = CollectiveKind::kAllgather;
  args.in = reinterpret_cast<const std::byte*>(&key);
  args.out = reinterpret_cast<std::byte*>(keys.data());
  args.count = 1;
  args.type = DataType::kI64;
  args.rank = rank_;
  args.world = world_;
  Program p(world_, args.type, ReduceOp::kSum, 1);
  RDMAFLOW_RETURN_IF_ERROR(build_program(args, Algorithm::kRecursiveDoubling, p));
  p.finalize();
  RDMAFLOW_RETURN_IF_ERROR(
      execute(*fabric_, p, 0, Clock::now() + *options_.timeout, "find the host groups"));
  hosts_ = HostGroups(keys);
  return Status::ok();
}

// Ping-pongs measure alpha and beta per level: within a host between local
// ranks i and i ^ 1, between hosts between the local ranks 0 of hosts h and
// h ^ 1 (one pair per link, so that nothing else shares the link while it is
// measured). The reduction kernel is timed for gamma. Every figure is the
// maximum over the ranks that measured it.
Status Communicator::measure() {
  const auto deadline = Clock::now() + *options_.timeout;
  const HostGroups& g = hosts_;
  const int host = g.host_of(rank_), local = g.local_rank(rank_);
  const int within = (local ^ 1) < g.local_size(host) ? g.ranks(host)[local ^ 1] : -1;
  const int between = local == 0 && (host ^ 1) < g.hosts() ? g.ranks(host ^ 1)[0] : -1;
  std::vector<std::byte> a(256 * 1024), b(256 * 1024);
  const size_t large = std::min<size_t>(a.size(), fabric_->config().slot_bytes);
  auto pingpong = [&](int partner, size_t bytes, int iters, double* seconds) -> Status {
    Program p(world_, DataType::kU8, ReduceOp::kSum, bytes);
    for (int i = 0; i < iters; ++i) {
      if (rank_ < partner) {
        p.send(partner, a.data(), bytes);
        p.recv(partner, b.data(), bytes);
      } else {
        p.recv(partner, b.data(), bytes);
        p.send(partner, b.data(), bytes);
      }
    }
    p.finalize();
    const auto t0 = Clock::now();
    RDMAFLOW_RETURN_IF_ERROR(execute(*fabric_, p, 0, deadline, "measure channels"));
    *seconds = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    return Status::ok();
  };
  // Each figure is the fastest of a few rounds: a partner descheduled during
  // one round (a loaded or oversubscribed host) inflates that round only, and
  // an inflated alpha once made every size pick recursive doubling.
  constexpr int kRounds = 3;
  auto fastest = [&](int partner, size_t bytes, int iters, double* seconds) -> Status {
    *seconds = std::numeric_limits<double>::infinity();
    for (int r = 0; r < kRounds; ++r) {
      double t = 0;
      RDMAFLOW_RETURN_IF_ERROR(pingpong(partner, bytes, iters, &t));
      *seconds = std::min(*seconds, t);
    }
    return Status::ok();
  };
  // alpha, beta: [0], [1] within a host, [2], [3] between hosts; [4] gamma; [5] round; [6] cpus;
  // [7] gamma out of cache; [8] the cache's bytes.
  double params[9] = {
      0, 0, 0, 0, 0, model_.params().round, static_cast<double>(model_.params().cpus), 0, 0};
  // beta from streams: `pieces` pieces of `piece` bytes one way, 8 bytes
  // back. A ping-pong of one 256 KiB buffer read the link up to 2.5x too fast
  // between the simulated hosts (it passes within tbf's burst at the veth's
  // speed, and socket buffers hide the rest). The difference of a long and a
  // short stream is the sustained rate, without alpha.
  auto stream = [&](int partner, int pieces, size_t piece, double* seconds) -> Status {
    Program p(world_, DataType::kU8, ReduceOp::kSum, large);
    for (int i = 0; i < pieces; ++i) {
      if (rank_ < partner) {
        p.send(partner, a.data(), piece);
      } else {
        p.recv(partner, b.data(), piece);
      }
    }
    if (rank_ < partner) {
      p.recv(partner, b.data(), 8);
    } else {
      p.send(partner, b.data(), 8);
    }
    p.finalize();
    const auto t0 = Clock::now();
    RDMAFLOW_RETURN_IF_ERROR(execute(*fabric_, p, 0, deadline, "measure channels"));
    *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return Status::ok();
  };
  // alpha: half the fastest 8-byte round trip, after one to warm up.
  auto measure_alpha = [&](int partner, double* alpha) -> Status {
    double t = 0;
    RDMAFLOW_RETURN_IF_ERROR(pingpong(partner, 8, 4, &t));
    RDMAFLOW_RETURN_IF_ERROR(fastest(partner, 8, 8, &t));
    *alpha = t / 2;
    return Status::ok();
  };
  // Between hosts the streams are long enough (2 and 8 MiB of 256 KiB
  // pieces) that tbf's burst of 1 ms at the rate is a small part of them
  // (within a host: measure_within below).
  auto measure_between = [&](int partner, double* alpha, double* beta) -> Status {
    constexpr int short_stream = 8, long_stream = 4 * short_stream;
    double t = 0, shorter = 0, longer = 0;
    RDMAFLOW_RETURN_IF_ERROR(measure_alpha(partner, alpha));
    // A first long stream empties tbf's bucket, so that every timed stream
    // starts as the one before it: the fastest of each length is then
    // comparable.
    RDMAFLOW_RETURN_IF_ERROR(stream(partner, long_stream, large, &t));
    shorter = longer = std::numeric_limits<double>::infinity();
    for (int r = 0; r < kRounds; ++r) {
      RDMAFLOW_RETURN_IF_ERROR(stream(partner, short_stream, large, &t));
      shorter = std::min(shorter, t);
      RDMAFLOW_RETURN_IF_ERROR(stream(partner, long_stream, large, &t));
      longer = std::min(longer, t);
    }
    *beta = std::max(
        1e-12, (longer - shorter) / static_cast<double>((long_stream - short_stream) * large));
    return Status::ok();
  };
  // Within a host, beta from streams of as many pieces, of two sizes: a
  // receiver that must be woken for each piece (crowded or loaded cores) adds
  // the same per piece to both, where the difference of a long and a short
  // stream counted it per byte (0.27-0.30 GB/s read at load 6-13 against
  // 7.7-16.9 at load 3-4; the model then took the double tree everywhere).
  auto measure_within = [&](int partner) -> Status {
    constexpr int kPieces = 8;
    const size_t small = large / 4;
    double t = 0, shorter = std::numeric_limits<double>::infinity(), longer = shorter;
    RDMAFLOW_RETURN_IF_ERROR(measure_alpha(partner, &params[0]));
    for (int r = 0; r < kRounds; ++r) {
      RDMAFLOW_RETURN_IF_ERROR(stream(partner, kPieces, small, &t));
      shorter = std::min(shorter, t);
      RDMAFLOW_RETURN_IF_ERROR(stream(partner, kPieces, large, &t));
      longer = std::min(longer, t);
    }
    params[1] =
        std::max(1e-12, (longer - shorter) / static_cast<double>(kPieces * (large - small)));
    return Status::ok();
  };
  if (within >= 0) RDMAFLOW_RETURN_IF_ERROR(measure_within(within));
  if (between >= 0) RDMAFLOW_RETURN_IF_ERROR(measure_between(between, &params[2], &params[3]));
  // gamma in cache: the kernel on 256 KiB it has just touched.
  {
    std::vector<float> x(64 * 1024, 1.0f), y(64 * 1024, 2.0f);
    reduce_buffers(DataType::kF32, ReduceOp::kSum, x.data(), x.data(), y.data(), x.size());
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < kRounds; ++r) {
      const auto t0 = Clock::now();
      for (int i = 0; i < 4; ++i) {
        reduce_buffers(DataType::kF32, ReduceOp::kSum, x.data(), x.data(), y.data(), x.size());
      }
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / 4);
    }
    params[4] = best / static_cast<double>(x.size() * sizeof(float));
  }
  params[8] = static_cast<double>(model_.params().cache_bytes);  // RDMAFLOW_COLL_CACHE_BYTES
  params[7] = cold_gamma(static_cast<size_t>(params[8]));
  // Agree: the maximum over ranks, by recursive doubling on lane 0.
  double agreed[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  CollArgs args;
  args.kind = CollectiveKind::kAllreduce;
  args.in = reinterpret_cast<const std::byte*>(params);
  args.out = reinterpret_cast<std::byte*>(agreed);
  std::vector<double> tmp(std::size(params));
  args.tmp = reinterpret_cast<std::byte*>(tmp.data());
  args.count = std::size(params);
  args.type = DataType::kF64;
  args.op = ReduceOp::kMax;
  args.rank = rank_;
  args.world = world_;
  Program p(world_, DataType::kF64, ReduceOp::kMax, args.count);
  RDMAFLOW_RETURN_IF_ERROR(build_program(args, Algorithm::kRecursiveDoubling, p));
  p.finalize();
  RDMAFLOW_RETURN_IF_ERROR(execute(*fabric_, p, 0, deadline, "agree on channel costs"));
  auto level = [&](double alpha, double beta) {
    CostParams cp = model_.params();
    if (alpha > 0) cp.alpha = alpha;
    if (beta > 0) cp.beta = beta;
    if (agreed[4] > 0) cp.gamma = agreed[4];
    if (agreed[7] > 0) cp.gamma_cold = std::max(agreed[7], cp.gamma);
    if (agreed[8] > 0) cp.cache_bytes = static_cast<size_t>(agreed[8]);
    cp.round = agreed[5];
    cp.cpus = static_cast<int>(agreed[6]);
    return cp;
  };
  model_ = model_for(g, level(agreed[0], agreed[1]), level(agreed[2], agreed[3]));
  return Status::ok();
}

}  // namespace rdmaflow
