#include "collectives/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "collectives/algorithms/registry.h"
#include "collectives/collective_trace.h"
#include "collectives/communicator_internal.h"
#include "collectives/compressed.h"
#include "collectives/executor.h"
#include "collectives/program.h"
#include "collectives/reduce_kernels.h"
#include "common/env.h"
#include "common/log.h"

namespace rdmaflow {

// ---------------- Request ----------------

bool Request::test() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

Status Request::wait(std::optional<Millis> timeout) {
  if (!state_) return RDMAFLOW_ERROR(Code::kInvalidArgument, "wait", -1, "empty request");
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!timeout) {
    // The collective ends by itself: done, or failed once it went a timeout
    // without progress (or the communicator was aborted).
    state_->cv.wait(lock, [&] { return state_->done; });
    return state_->status;
  }
  if (!state_->cv.wait_until(lock, Clock::now() + *timeout, [&] { return state_->done; })) {
    return RDMAFLOW_ERROR(Code::kTimeout, std::string(collective_name(state_->kind)), -1,
                          "still running after the wait's timeout (the collective goes on)");
  }
  return state_->status;
}

Algorithm Request::algorithm() const {
  return state_ ? state_->algorithm : Algorithm::kAuto;
}
CollectiveKind Request::kind() const {
  return state_ ? state_->kind : CollectiveKind::kAllreduce;
}

// ---------------- creation ----------------

Result<std::unique_ptr<Communicator>> Communicator::create(CommunicatorSetup setup,
                                                           CommunicatorOptions options) {
  const char* op = "create communicator";
  std::unique_ptr<Communicator> c(new Communicator());
  c->rank_ = setup.rank;
  c->world_ = setup.world;
  c->options_ = options;

  RDMAFLOW_ASSIGN_OR_RETURN(FabricKnobs knobs, fabric_config_from_env(options, setup.world));
  const FabricConfig& cfg = knobs.cfg;
  const bool crowded = knobs.crowded;
  const int collective_lanes = knobs.collective_lanes;
  c->options_.timeout = cfg.timeout;

  // Forced algorithms from the environment, checked once.
  c->env_algo_.resize(std::size(kAllCollectives));
  for (CollectiveKind k : kAllCollectives) {
    auto v = env_string(collective_algo_env(k));
    if (!v || *v == "auto") continue;
    auto a = parse_algorithm(*v);
    if (!a || !algorithm_supports(*a, k)) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                            std::string(collective_algo_env(k)) + "='" + *v +
                                "' is not an algorithm of " + std::string(collective_name(k)));
    }
    c->env_algo_[static_cast<size_t>(k)] = *a;
  }
  // The codec of every f32 sum/avg allreduce that does not choose its own.
  if (auto v = env_string("RDMAFLOW_CODEC")) {
    auto refuse = [&](const Status& st) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                            "RDMAFLOW_CODEC='" + *v + "': " + st.reason());
    };
    auto spec = parse_codec(*v);
    if (!spec.is_ok()) return refuse(spec.status());
    c->env_codec_ = *spec;
    if (spec->id != CodecId::kNone) {
      auto made = make_codec(*spec);
      if (!made.is_ok()) return refuse(made.status());
      c->env_codec_made_ = std::move(*made);
    }
  }

  std::vector<Transport*> transports = setup.transports;
  if (transports.empty()) transports.assign(setup.world, setup.transport);
  RDMAFLOW_ASSIGN_OR_RETURN(
      c->fabric_, Fabric::create(setup.rank, setup.world, setup.channels, transports, cfg));
  for (int l = 0; l < collective_lanes; ++l) {
    c->lanes_.push_back(std::make_unique<Lane>());
    c->lanes_.back()->index = l;
  }
  if (options.p2p) {
    for (int q = 0; q < 2 * setup.world; ++q) c->p2p_.push_back(std::make_unique<P2pQueue>());
  }
  if (setup.world > 1) {
    RDMAFLOW_RETURN_IF_ERROR(c->find_hosts(options.host_key.value_or(this_host_key())));
  } else {
    c->hosts_ = HostGroups::single_host(1);
  }
  CostParams params;
  params.piece_bytes = cfg.slot_bytes;
  if (options.piece_bytes > 0) {  // every call cut into the caller's pieces
    params.piece_bytes = params.min_piece_bytes = std::min(options.piece_bytes, cfg.slot_bytes);
  }
  // On an oversubscribed host every dependent round waits for the partner to
  // be scheduled: 4 ranks on 2 cores, 8 B allreduce took 13-14 us in one
  // round (direct) against 12.6-46 us in two (recursive doubling). Ranks on
  // different hosts may see different crowding: measure() agrees on the
  // maximum, and without it only an explicit setting (the same everywhere) counts.
  const bool agree = options.measure && setup.world > 1;
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t round_us,
                            env_int("RDMAFLOW_COLL_ROUND_US", crowded && agree ? 5 : 0));
  if (round_us < 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "RDMAFLOW_COLL_ROUND_US must be >= 0");
  }
  params.round = static_cast<double>(round_us) * 1e-6;
  // Crowded, every rank's sends share the CPUs (CostParams::cpus); agreed like round.
  RDMAFLOW_ASSIGN_OR_RETURN(
      int64_t cpus,
      knob("RDMAFLOW_COLL_CROWDED_CPUS", 0,
           crowded && agree ? std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN)) : 0, 0));
  params.cpus = static_cast<int>(std::min<int64_t>(cpus, 1 << 20));
  // The cache a rank's reductions run in (CostParams::gamma_at): the core's L2
  // as the C library reports it, else 1 MiB. Read here, not in measure(), so
  // a bad value is refused on every communicator, measured or not.
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t cache,
                            env_int("RDMAFLOW_COLL_CACHE_BYTES", l2 > 0 ? l2 : 1 << 20));
  if (cache < 4096 || cache > (int64_t{1} << 40)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "RDMAFLOW_COLL_CACHE_BYTES must be between 4096 and 2^40 (bytes)");
  }
  params.cache_bytes = static_cast<size_t>(cache);
  c->model_ = model_for(c->hosts_, params, params);
  if (agree) RDMAFLOW_RETURN_IF_ERROR(c->measure());
  RDMAFLOW_ASSIGN_OR_RETURN(int trials, Tuner::trials_from_env());
  RDMAFLOW_ASSIGN_OR_RETURN(size_t tune_min, Tuner::min_bytes_from_env());
  if (trials != 0 && setup.world > 1) c->tuner_ = std::make_unique<Tuner>(trials, tune_min);
  RDMAFLOW_LOG_DEBUG(
      "collectives: rank {} of {}: {} lanes x {} slots x {} B per peer, {} direct peers; {}",
      c->rank_, c->world_, cfg.lanes, cfg.slots, cfg.slot_bytes, c->fabric_->direct_peers(),
      c->model_.to_string());
  return c;
}

void Communicator::abort(const std::string& reason) {
  Status why = RDMAFLOW_ERROR(Code::kCancelled, "abort", -1,
                              "communicator aborted" + (reason.empty() ? "" : ": " + reason));
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_.is_ok()) broken_ = why;
    is_broken_.store(true, std::memory_order_release);
  }
  fabric_->abort(std::move(why));
  trace::flush_on_error();
}

FabricStats Communicator::stats() const {
  return fabric_->stats();
}

Result<std::shared_ptr<RegisteredBuffer>> Communicator::allocate_registered(size_t bytes) {
  return fabric_->user_memory()->allocate(bytes);
}

size_t Communicator::registered_buffers() const {
  return fabric_->user_memory()->live_buffers();
}

Communicator::~Communicator() {
  stop_p2p();
  for (auto& lane : lanes_) {
    {
      std::lock_guard<std::mutex> lock(lane->mu);
      lane->stop = true;
    }
    lane->cv.notify_all();
    if (lane->worker.joinable()) lane->worker.join();
  }
}

// ---------------- calls ----------------

namespace {

// The bytes of a call's largest buffer, which the model and the tuner count.
size_t call_bytes(CollectiveKind kind, size_t count, DataType type, int world) {
  size_t bytes = count * dtype_size(type);
  if (kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllgather ||
      kind == CollectiveKind::kAlltoall) {
    bytes *= static_cast<size_t>(world);
  }
  return bytes;
}

}  // namespace

Result<Algorithm> Communicator::select(CollectiveKind kind, size_t count, DataType type,
                                       const CallOptions& options) const {
  Algorithm algo = options.algorithm;
  if (algo == Algorithm::kAuto && env_algo_[static_cast<size_t>(kind)]) {
    algo = *env_algo_[static_cast<size_t>(kind)];
  }
  if (algo == Algorithm::kAuto) {
    const size_t bytes = call_bytes(kind, count, type, world_);
    // The model's last choice per kind, (bytes << 8) | (algorithm + 1).
    std::atomic<uint64_t>& memo = algo_memo_[static_cast<size_t>(kind)];
    const uint64_t m = memo.load(std::memory_order_relaxed);
    if (bytes < (uint64_t{1} << 56) && m != 0 && (m >> 8) == bytes) {
      algo = static_cast<Algorithm>((m & 0xFF) - 1);
    } else {
      algo = model_.choose(kind, bytes);
      if (bytes < (uint64_t{1} << 56)) {
        memo.store((static_cast<uint64_t>(bytes) << 8) | (static_cast<uint64_t>(algo) + 1),
                   std::memory_order_relaxed);
      }
    }
    if (tuner_) {
      if (auto w = tuner_->winner(kind, bytes); w && *w != Algorithm::kAuto) algo = *w;
    }
  }
  if (!algorithm_supports(algo, kind)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, std::string(collective_name(kind)), -1,
                          "algorithm '" + std::string(algorithm_name(algo)) +
                              "' does not implement " + std::string(collective_name(kind)));
  }
  return algo;
}

bool Communicator::tuning(CollectiveKind kind, size_t count, DataType type) const {
  return tuner_ && tuner_->tunes(call_bytes(kind, count, type, world_));
}

std::optional<Tuner::Outcome> Communicator::tuned(CollectiveKind kind, size_t count,
                                                  DataType type) const {
  if (!tuner_) return std::nullopt;
  return tuner_->outcome(kind, call_bytes(kind, count, type, world_));
}

Result<Tuner::Pick> Communicator::tune(CollectiveKind kind, size_t bytes, DataType type,
                                       ReduceOp op, const CallOptions& options) {
  // Not tuned: a forced algorithm, and compressed calls (their codec picks
  // its own schedule, compressed.cc).
  const bool codec = options.codec ? options.codec->id != CodecId::kNone
                                   : env_codec_made_ && kind == CollectiveKind::kAllreduce &&
                                         type == DataType::kF32 &&
                                         (op == ReduceOp::kSum || op == ReduceOp::kAvg);
  if (!tuner_ || options.algorithm != Algorithm::kAuto || env_algo_[static_cast<size_t>(kind)] ||
      codec) {
    return Tuner::Pick{};
  }
  const Millis timeout = options.timeout.value_or(*options_.timeout);
  // The agreement: a fixed algorithm (one round), never the tuner.
  auto agree = [&](std::vector<int64_t>& nanos) {
    CallOptions o;
    o.algorithm = Algorithm::kDirect;
    o.timeout = timeout;
    return run(CollectiveKind::kAllreduce, nanos.data(), nanos.data(), nanos.size(), DataType::kI64,
               ReduceOp::kMax, 0, o);
  };
  return tuner_->pick(kind, bytes, model_, Clock::now() + timeout, agree);
}

namespace {

// "allreduce[ring]" for every pair, built once: a call's label costs no allocation.
const std::string& call_label(CollectiveKind kind, Algorithm algo) {
  constexpr size_t kKinds = std::size(kAllCollectives), kAlgos = 16;
  static const auto* labels = [] {
    auto* t = new std::array<std::array<std::string, kAlgos>, kKinds>();
    for (CollectiveKind k : kAllCollectives) {
      for (size_t a = 0; a < kAlgos; ++a) {
        (*t)[static_cast<size_t>(k)][a] = std::string(collective_name(k)) + "[" +
                                          std::string(algorithm_name(static_cast<Algorithm>(a))) +
                                          "]";
      }
    }
    return t;
  }();
  return (*labels)[static_cast<size_t>(kind)][static_cast<size_t>(algo) % kAlgos];
}

}  // namespace

Status Communicator::prepare(Call& call, CollectiveKind kind, const void* in, void* out,
                             size_t count, DataType type, ReduceOp op, int root,
                             const CallOptions& options) {
  const std::string_view name = collective_name(kind);
  const bool reduces = kind == CollectiveKind::kAllreduce ||
                       kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kReduce;
  const bool rooted = kind == CollectiveKind::kBroadcast || kind == CollectiveKind::kReduce;
  if (kind == CollectiveKind::kBarrier) {
    count = 1;
    type = DataType::kU8;
    in = nullptr;
    out = nullptr;
  }
  if (reduces && !reducible_dtype(type)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, std::string(name), -1,
                          "cannot reduce elements of type " + std::string(dtype_name(type)));
  }
  if (rooted && (root < 0 || root >= world_)) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, std::string(name), -1,
        "root " + std::to_string(root) + " outside world of " + std::to_string(world_));
  }
  const size_t es = dtype_size(type);
  if (count > (SIZE_MAX / es) / static_cast<size_t>(world_)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, std::string(name), -1, "count too large");
  }
  if (kind != CollectiveKind::kBarrier && count > 0) {
    const bool root_only_out = kind == CollectiveKind::kReduce && rank_ != root;
    const bool root_only_in = kind == CollectiveKind::kBroadcast && rank_ != root;
    if ((in == nullptr && !root_only_in) || (out == nullptr && !root_only_out)) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, std::string(name), -1, "null buffer");
    }
  }
  RDMAFLOW_ASSIGN_OR_RETURN(Algorithm algo, select(kind, count, type, options));
  const size_t total = call_bytes(kind, count, type, world_);
  RDMAFLOW_ASSIGN_OR_RETURN(Tuner::Pick pick, tune(kind, total, type, op, options));
  if (pick.algo != Algorithm::kAuto) algo = pick.algo;
  call.tune = pick;
  CollArgs& a = call.args;
  a.kind = kind;
  a.in = static_cast<const std::byte*>(in);
  a.out = static_cast<std::byte*>(out);
  a.count = count;
  a.type = type;
  a.op = op;
  a.root = root;
  a.rank = rank_;
  a.world = world_;
  a.hosts = &hosts_;
  a.model = &model_;
  if (kind == CollectiveKind::kBroadcast && a.in == nullptr) a.in = a.out;
  call.algo = algo;
  const uint64_t seq = calls_.fetch_add(1);
  call.lane = static_cast<int>(options.tag.value_or(seq) % lanes_.size());
  call.timeout = options.timeout.value_or(*options_.timeout);
  call.what = &call_label(kind, algo);
  RDMAFLOW_RETURN_IF_ERROR(prepare_codec(call, options, seq));

  // Piece size: call_piece_bytes (cost_model.h) between the bounds the model
  // counts with (a caller's piece size, capped at a slot, is both bounds).
  const CostParams& bounds = model_.params();
  const size_t piece = call_piece_bytes(total, world_, bounds.min_piece_bytes, bounds.piece_bytes);
  call.piece_elems = std::max<size_t>(1, piece / es);
  RDMAFLOW_LOG_DEBUG(
      "collectives: {} of {} x {} on lane {}: {}", *call.what, count, dtype_name(type), call.lane,
      options.algorithm != Algorithm::kAuto  ? "forced by the caller"
      : env_algo_[static_cast<size_t>(kind)] ? std::string("forced by ") + collective_algo_env(kind)
      : pick.entry != nullptr                ? "a trial of the tuner"
                                             : "chosen by the cost model");
  return Status::ok();
}

// The call's codec: the caller's, else RDMAFLOW_CODEC for f32 sum/avg
// allreduce. Explicit codecs the call cannot use are refused; the knob only
// skips calls it does not apply to (integer allreduce, other collectives).
Status Communicator::prepare_codec(Call& call, const CallOptions& options, uint64_t seq) {
  const CollArgs& a = call.args;
  CodecCall cc;
  if (options.codec) {
    if (options.codec->id == CodecId::kNone) return Status::ok();
    cc.spec = *options.codec;
    auto made = make_codec(cc.spec);
    if (!made.is_ok()) return made.status().with_op(std::string(collective_name(a.kind)));
    cc.codec = std::move(*made);
  } else {
    const bool applies = env_codec_made_ && a.kind == CollectiveKind::kAllreduce &&
                         a.type == DataType::kF32 &&
                         (a.op == ReduceOp::kSum || a.op == ReduceOp::kAvg);
    if (!applies) return Status::ok();
    cc.spec = env_codec_;
    cc.codec = env_codec_made_;
  }
  cc.state = options.codec_state;
  cc.seed = (seq + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(rank_) << 32);
  RDMAFLOW_RETURN_IF_ERROR(check_codec_call(a.kind, a.count, a.type, a.op, cc));
  call.codec_label = std::string(collective_name(a.kind)) + "[" + codec_text(cc.spec) + "]";
  call.what = &call.codec_label;
  call.codec = std::move(cc);
  return Status::ok();
}

Status Communicator::execute_call(Call& call, Lane& lane) {
  const trace::Span span(trace::kCollective, collective_name(call.args.kind),
                         call_args(call.args, call.algo, world_));
  if (is_broken_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(broken_mu_);
    return RDMAFLOW_ERROR(Code::kCancelled, *call.what, broken_.peer(),
                          "communicator is broken by an earlier failure: " + broken_.to_string());
  }
  if (call.body) return call.body(lane);
  CollArgs& a = call.args;
  if (call.codec) {
    Status st = run_compressed(*fabric_, a, *call.codec, lane.index, Clock::now() + call.timeout,
                               *call.what);
    if (!st.is_ok()) {
      std::lock_guard<std::mutex> lock(broken_mu_);
      if (broken_.is_ok()) broken_ = st;
      is_broken_.store(true, std::memory_order_release);
    }
    return st;
  }
  const size_t es = dtype_size(a.type);
  const size_t need = temp_elems(a, call.algo) * es + 64;
  if (need > lane.tmp_bytes) {
    std::free(lane.tmp);
    const size_t bytes = (need + 4095) / 4096 * 4096;
    lane.tmp = static_cast<std::byte*>(std::aligned_alloc(4096, bytes));
    if (lane.tmp == nullptr) {
      lane.tmp_bytes = 0;
      return RDMAFLOW_ERROR(Code::kResourceExhausted, *call.what, -1,
                            "cannot allocate " + std::to_string(bytes) + " temporary bytes");
    }
    std::memset(lane.tmp, 0, bytes);
    lane.tmp_bytes = bytes;
  }
  a.tmp = lane.tmp;
  const CollArgs& b = lane.program_args;
  const bool same = lane.program && lane.program_algo == call.algo &&
                    lane.program_piece == call.piece_elems && b.kind == a.kind && b.in == a.in &&
                    b.out == a.out && b.tmp == a.tmp && b.count == a.count && b.type == a.type &&
                    b.op == a.op && b.root == a.root;
  if (!same) {
    lane.program.reset();
    auto program = std::make_unique<Program>(world_, a.type, a.op, call.piece_elems);
    RDMAFLOW_RETURN_IF_ERROR(build_program(a, call.algo, *program));
    program->finalize();
    lane.program = std::move(program);
    lane.program_args = a;
    lane.program_algo = call.algo;
    lane.program_piece = call.piece_elems;
  }
  return execute_program(*lane.program, lane.index, *call.what, Clock::now() + call.timeout);
}

Status Communicator::execute_timed(Call& call, Lane& lane) {
  if (call.tune.entry == nullptr) return execute_call(call, lane);
  const Clock::time_point t0 = Clock::now();
  Status st = execute_call(call, lane);
  tuner_->record(call.tune, std::chrono::duration<double>(Clock::now() - t0).count());
  return st;
}

Status Communicator::execute_program(const Program& program, int lane, const std::string& what,
                                     Clock::time_point deadline) {
  Status st = execute(*fabric_, program, lane, deadline, what);
  if (!st.is_ok()) {
    trace::flush_on_error();
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_.is_ok()) broken_ = st;
    is_broken_.store(true, std::memory_order_release);
  }
  return st;
}

Status Communicator::run(CollectiveKind kind, const void* in, void* out, size_t count,
                         DataType type, ReduceOp op, int root, const CallOptions& options) {
  if (count == 0 && kind != CollectiveKind::kBarrier) {
    calls_.fetch_add(1);
    return Status::ok();
  }
  Call call;
  RDMAFLOW_RETURN_IF_ERROR(prepare(call, kind, in, out, count, type, op, root, options));
  return run_prepared(call);
}

Status Communicator::run_prepared(Call& call) {
  Lane& lane = *lanes_[call.lane];
  // Wait for our turn on the lane (calls on a lane run in call order), then run
  // on this thread: no hand-off to a worker for blocking calls.
  {
    std::unique_lock<std::mutex> lock(lane.mu);
    call.ticket = lane.next_ticket++;
    lane.cv.wait(lock, [&] { return lane.turn == call.ticket; });
  }
  Status st = execute_timed(call, lane);
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    ++lane.turn;
  }
  lane.cv.notify_all();
  return st;
}

Request Communicator::start(CollectiveKind kind, const void* in, void* out, size_t count,
                            DataType type, ReduceOp op, int root, const CallOptions& options) {
  auto failed = [&](Status st) { return finished(kind, std::move(st)); };
  if (count == 0 && kind != CollectiveKind::kBarrier) {
    calls_.fetch_add(1);
    return failed(Status::ok());
  }
  auto call = std::make_shared<Call>();
  if (Status st = prepare(*call, kind, in, out, count, type, op, root, options); !st.is_ok()) {
    return failed(std::move(st));
  }
  return enqueue(std::move(call));
}

Request Communicator::enqueue(std::shared_ptr<Call> call) {
  call->state = std::make_shared<detail::OpState>();
  call->state->algorithm = call->algo;
  call->state->kind = call->args.kind;
  Lane& lane = *lanes_[call->lane];
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    call->ticket = lane.next_ticket++;
    lane.queue.push_back(call);
    if (!lane.worker.joinable()) lane.worker = std::thread([this, l = &lane] { worker_loop(l); });
  }
  lane.cv.notify_all();
  return Request(call->state);
}

void Communicator::worker_loop(Lane* lane) {
  std::unique_lock<std::mutex> lock(lane->mu);
  for (;;) {
    lane->cv.wait(lock, [&] {
      return lane->stop || (!lane->queue.empty() && lane->turn == lane->queue.front()->ticket);
    });
    if (lane->queue.empty() || lane->turn != lane->queue.front()->ticket) {
      // Stopping: fail whatever never got its turn.
      for (auto& c : lane->queue) {
        c->state->complete(RDMAFLOW_ERROR(Code::kCancelled, *c->what, -1,
                                          "communicator destroyed before the call ran"));
      }
      lane->queue.clear();
      return;
    }
    auto call = lane->queue.front();
    lane->queue.pop_front();
    lock.unlock();
    Status st = execute_timed(*call, *lane);
    lock.lock();
    ++lane->turn;
    lane->cv.notify_all();
    call->state->complete(std::move(st));
  }
}

// ---------------- per-kind shorthands ----------------

Status Communicator::allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                               const CallOptions& o) {
  return run(CollectiveKind::kAllreduce, in, out, count, type, op, 0, o);
}
Status Communicator::reduce_scatter(const void* in, void* out, size_t recv_count, DataType type,
                                    ReduceOp op, const CallOptions& o) {
  return run(CollectiveKind::kReduceScatter, in, out, recv_count, type, op, 0, o);
}
Status Communicator::allgather(const void* in, void* out, size_t send_count, DataType type,
                               const CallOptions& o) {
  return run(CollectiveKind::kAllgather, in, out, send_count, type, ReduceOp::kSum, 0, o);
}
Status Communicator::broadcast(const void* in, void* out, size_t count, DataType type, int root,
                               const CallOptions& o) {
  return run(CollectiveKind::kBroadcast, in, out, count, type, ReduceOp::kSum, root, o);
}
Status Communicator::reduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                            int root, const CallOptions& o) {
  return run(CollectiveKind::kReduce, in, out, count, type, op, root, o);
}
Status Communicator::barrier(const CallOptions& o) {
  return run(CollectiveKind::kBarrier, nullptr, nullptr, 1, DataType::kU8, ReduceOp::kMax, 0, o);
}
Status Communicator::alltoall(const void* in, void* out, size_t count, DataType type,
                              const CallOptions& o) {
  return run(CollectiveKind::kAlltoall, in, out, count, type, ReduceOp::kSum, 0, o);
}

Request Communicator::start_allreduce(const void* in, void* out, size_t count, DataType type,
                                      ReduceOp op, const CallOptions& o) {
  return start(CollectiveKind::kAllreduce, in, out, count, type, op, 0, o);
}
Request Communicator::start_reduce_scatter(const void* in, void* out, size_t recv_count,
                                           DataType type, ReduceOp op, const CallOptions& o) {
  return start(CollectiveKind::kReduceScatter, in, out, recv_count, type, op, 0, o);
}
Request Communicator::start_allgather(const void* in, void* out, size_t send_count, DataType type,
                                      const CallOptions& o) {
  return start(CollectiveKind::kAllgather, in, out, send_count, type, ReduceOp::kSum, 0, o);
}
Request Communicator::start_broadcast(const void* in, void* out, size_t count, DataType type,
                                      int root, const CallOptions& o) {
  return start(CollectiveKind::kBroadcast, in, out, count, type, ReduceOp::kSum, root, o);
}
Request Communicator::start_reduce(const void* in, void* out, size_t count, DataType type,
                                   ReduceOp op, int root, const CallOptions& o) {
  return start(CollectiveKind::kReduce, in, out, count, type, op, root, o);
}
Request Communicator::start_barrier(const CallOptions& o) {
  return start(CollectiveKind::kBarrier, nullptr, nullptr, 1, DataType::kU8, ReduceOp::kMax, 0, o);
}
Request Communicator::start_alltoall(const void* in, void* out, size_t count, DataType type,
                                     const CallOptions& o) {
  return start(CollectiveKind::kAlltoall, in, out, count, type, ReduceOp::kSum, 0, o);
}

}  // namespace rdmaflow
