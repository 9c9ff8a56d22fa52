#include "runtime/session/session.h"

#include <algorithm>
#include <cstring>

#include "common/env.h"
#include "common/log.h"
#include "graph/hash.h"
#include "graph/plan_json.h"
#include "runtime/session/session_engine.h"
#include "runtime/session/session_layout.h"
#include "runtime/session/session_one_sided.h"
#include "runtime/session/session_trace.h"
#ifdef RDMAFLOW_HAVE_GRPC
#include "runtime/session/session_grpc.h"
#endif

namespace rdmaflow {

using session_detail::SessionLayout;
using session_detail::step_text;

namespace {

constexpr const char* kSetup = "set up session";

}  // namespace

Result<std::string> choose_transport(const std::string& requested, const TransportConfig& config,
                                     const AllGather& allgather) {
  const char* op = "choose transport";
  if (requested == "grpc") {
#ifdef RDMAFLOW_HAVE_GRPC
    return requested;
#else
    return RDMAFLOW_ERROR(Code::kNotViable, op, -1,
                          "RDMAFLOW_TRANSPORT=grpc, but this build has no gRPC baseline "
                          "(configured with -DRDMAFLOW_WITH_GRPC=OFF)");
#endif
  }
  const auto names = transport_backend_names();
  std::vector<std::string> candidates;
  std::string why_not;
  if (requested == "auto") {
    for (const auto& n : names) {
      auto t = make_transport(n, config);
      if (t.is_ok()) {
        candidates.push_back(n);
        (*t)->shutdown();
      } else {
        why_not += "; " + n + ": " + t.status().reason();
      }
    }
  } else {
    if (std::find(names.begin(), names.end(), requested) == names.end()) {
      std::string known;
      for (const auto& n : names) known += ", " + n;
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                            "RDMAFLOW_TRANSPORT=" + requested +
                                " names no transport of this build (auto, grpc" + known + ")");
    }
    candidates.push_back(requested);
  }
  // Every rank must pick the same one: the first (by priority) all can run.
  ByteWriter w;
  w.u32(static_cast<uint32_t>(candidates.size()));
  for (const auto& c : candidates) w.str(c);
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<Bytes> all, allgather(w.out()));
  std::vector<std::vector<std::string>> lists;
  for (size_t r = 0; r < all.size(); ++r) {
    ByteReader rd(all[r]);
    uint32_t n = 0;
    std::vector<std::string> l;
    if (!rd.u32(n)) {
      return RDMAFLOW_ERROR(Code::kProtocolError, op, static_cast<int>(r), "malformed list");
    }
    for (uint32_t i = 0; i < n; ++i) {
      std::string s;
      if (!rd.str(s)) {
        return RDMAFLOW_ERROR(Code::kProtocolError, op, static_cast<int>(r), "malformed list");
      }
      l.push_back(std::move(s));
    }
    lists.push_back(std::move(l));
  }
  for (const auto& c : candidates) {
    bool everywhere = true;
    for (const auto& l : lists) everywhere &= std::find(l.begin(), l.end(), c) != l.end();
    if (everywhere) return c;
  }
  return RDMAFLOW_ERROR(Code::kNotViable, op, -1,
                        "no transport can run on every rank (requested '" + requested +
                            "', viable here: " + std::to_string(candidates.size()) + why_not + ")");
}

Result<std::unique_ptr<Session>> Session::create(const graph::TransferPlan& plan, Bootstrap& boot,
                                                 SessionOptions options) {
  const Millis timeout = options.timeout.value_or(default_timeout());
  AllGather allgather = [&boot, timeout](std::span<const uint8_t> mine) {
    return boot.allgather(mine, timeout);
  };
  const std::string requested = requested_transport(options.transport);
  std::unique_ptr<Engine> engine;
  std::unique_ptr<TransportSelection> selection;
  if (requested == "grpc") {
    RDMAFLOW_ASSIGN_OR_RETURN(std::string name,
                              choose_transport(requested, boot.transport_config(), allgather));
    (void)name;
#ifdef RDMAFLOW_HAVE_GRPC
    engine = std::make_unique<session_detail::GrpcEngine>(boot.rank(), boot.world_size(),
                                                          boot.transport_config().reach_address);
#endif
  } else {
    // A transport per peer (runtime/selection/transport_select.h).
    RDMAFLOW_ASSIGN_OR_RETURN(SelectedMesh mesh, connect_selected_mesh(boot, requested, timeout));
    selection = std::move(mesh.selection);
    engine = std::make_unique<session_detail::OneSidedEngine>(
        selection->per_peer(), std::move(mesh.channels), boot.rank(), boot.world_size());
  }
  RDMAFLOW_LOG_INFO("session: transport {} (requested {})", engine->name(), requested);
  // The allgather the session keeps must not refer to `boot` by a dangling
  // capture when the caller destroys it first: it is only used in finish(),
  // which the caller runs while the bootstrap lives.
  auto session = setup(plan, boot.rank(), boot.world_size(), std::move(engine), allgather, timeout);
  if (!session) return session.status();
  if (selection) (*session)->peer_transports_ = selection->peers();
  (*session)->selection_ = std::move(selection);
  return session;
}

Result<std::unique_ptr<Session>> Session::create(const graph::TransferPlan& plan,
                                                 SessionPeers peers, SessionOptions options) {
  const Millis timeout = options.timeout.value_or(default_timeout());
  if (!peers.allgather) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kSetup, -1, "SessionPeers has no allgather");
  }
  std::vector<Transport*> transports = peers.transports;
  if (transports.empty()) {
    transports.assign(static_cast<size_t>(std::max(peers.world_size, 0)), peers.transport);
    if (peers.rank >= 0 && peers.rank < peers.world_size) {
      transports[static_cast<size_t>(peers.rank)] = nullptr;
    }
  }
  if (transports.size() != static_cast<size_t>(std::max(peers.world_size, 0))) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kSetup, -1,
                          "SessionPeers has " + std::to_string(transports.size()) +
                              " transports for a world of " + std::to_string(peers.world_size));
  }
  auto engine = std::make_unique<session_detail::OneSidedEngine>(
      std::move(transports), std::move(peers.channels), peers.rank, peers.world_size);
  return setup(plan, peers.rank, peers.world_size, std::move(engine), peers.allgather, timeout);
}

Result<std::unique_ptr<Session>> Session::setup(const graph::TransferPlan& plan, int rank,
                                                int world, std::unique_ptr<Engine> engine,
                                                const AllGather& allgather, Millis timeout) {
  if (plan.num_ranks != world) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kSetup, -1,
                          "the plan of '" + plan.graph_name + "' is for " +
                              std::to_string(plan.num_ranks) + " ranks, the job has " +
                              std::to_string(world));
  }
  std::unique_ptr<Session> s(new Session());
  s->plan_ = std::make_shared<const graph::TransferPlan>(plan);
  s->rank_ = rank;
  s->world_ = world;
  s->timeout_ = timeout;
  s->allgather_ = allgather;
  s->transport_name_ = engine->name();
  RDMAFLOW_ASSIGN_OR_RETURN(SessionLayout layout, SessionLayout::build(*s->plan_, rank));
  s->layout_ = std::make_unique<SessionLayout>(std::move(layout));
  s->received_step_.assign(plan.transfers.size(), 0);

  // Every rank must run the same plan, and all over the gRPC baseline or none:
  // one-sided transports may differ per peer (each pair agreed on its channel).
  const uint64_t hash = graph::plan_hash(*s->plan_);
  const auto family = [](const std::string& name) {
    return name == "grpc" ? std::string("grpc") : std::string("one-sided");
  };
  ByteWriter w;
  w.u64(hash).str(s->transport_name_);
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<Bytes> all, allgather(w.out()));
  for (size_t r = 0; r < all.size(); ++r) {
    ByteReader rd(all[r]);
    uint64_t h = 0;
    std::string name;
    if (!rd.u64(h) || !rd.str(name)) {
      return RDMAFLOW_ERROR(Code::kProtocolError, kSetup, static_cast<int>(r),
                            "malformed plan record");
    }
    if (h != hash) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, kSetup, static_cast<int>(r),
                            "rank " + std::to_string(r) + " runs plan " + graph::hash_hex(h) +
                                " but rank " + std::to_string(rank) + " runs plan " +
                                graph::hash_hex(hash) + " of '" + plan.graph_name +
                                "': every rank must run the same plan (same graph, placement "
                                "and options)");
    }
    if (family(name) != family(s->transport_name_)) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, kSetup, static_cast<int>(r),
                            "rank " + std::to_string(r) + " uses transport '" + name +
                                "' but rank " + std::to_string(rank) + " uses '" +
                                s->transport_name_ + "'");
    }
  }
  RDMAFLOW_RETURN_IF_ERROR(engine->setup(*s->layout_, allgather, timeout));
  s->engine_ = std::move(engine);
  return s;
}

Session::Session() = default;

Session::~Session() {
  engine_.reset();  // before the transports its channels belong to
  if (selection_) selection_->shutdown();
  selection_.reset();
}

int Session::rank() const {
  return rank_;
}
int Session::world_size() const {
  return world_;
}
const std::string& Session::transport_name() const {
  return transport_name_;
}
const std::vector<PeerTransport>& Session::peer_transports() const {
  return peer_transports_;
}
const graph::TransferPlan& Session::plan() const {
  return *plan_;
}
const graph::RankPlan& Session::rank_plan() const {
  return *layout_->me;
}
Millis Session::timeout() const {
  return timeout_;
}

Status Session::check_step(uint64_t step, const char* op) const {
  if (finished_) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "the session has finished");
  }
  if (!step_ || *step_ != step) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          step_text(step) + " is not the current step (" +
                              (step_ ? step_text(*step_) : std::string("none begun")) + ")");
  }
  return Status::ok();
}

Result<const graph::TransferSpec*> Session::transfer_spec(graph::TransferId t, bool outgoing,
                                                          const char* op) const {
  if (t >= plan_->transfers.size()) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, -1,
                          "transfer " + std::to_string(t) + " is not in the plan");
  }
  const auto& spec = plan_->transfers[t];
  const int mine = outgoing ? spec.src_rank : spec.dst_rank;
  if (mine != rank_) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, outgoing ? spec.dst_rank : spec.src_rank,
                          layout_->describe(t) + " is not " + (outgoing ? "sent" : "received") +
                              " by rank " + std::to_string(rank_));
  }
  return &spec;
}

Status Session::begin_step(uint64_t step) {
  if (finished_) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "begin step", -1, "the session has finished");
  }
  if (step_) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "begin step", -1,
                          step_text(*step_) + " has not ended");
  }
  if (last_step_ && step != *last_step_ + 1) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "begin step", -1,
                          step_text(step) + " does not follow " + step_text(*last_step_));
  }
  step_began_ns_ = trace::stamp();
  RDMAFLOW_RETURN_IF_ERROR(engine_->begin_step(step));
  step_ = step;
  recvs_done_ = 0;
  return Status::ok();
}

Result<std::optional<SessionBuffer>> Session::output_buffer(const std::string& tensor,
                                                            uint64_t step, size_t bytes) {
  RDMAFLOW_RETURN_IF_ERROR(check_step(step, "allocate output"));
  auto it = layout_->output_by_tensor.find(tensor);
  if (it == layout_->output_by_tensor.end()) return std::optional<SessionBuffer>();
  const auto& buffer = layout_->me->buffers[it->second];
  const uint32_t f = layout_->frame_of(step);
  uint8_t* base = engine_->frames() + buffer.region.offset + f * layout_->frame_bytes;
  if (!buffer.dynamic) {
    const auto& spec = plan_->transfers[buffer.transfers.front()];
    if (bytes > spec.bytes) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, "allocate output", -1,
                            "'" + tensor + "' of " + std::to_string(bytes) +
                                " bytes, but the plan made it a static tensor of " +
                                std::to_string(spec.bytes) + " bytes");
    }
    return std::optional<SessionBuffer>(SessionBuffer{base, spec.bytes});
  }
  const auto& spec = plan_->transfers[buffer.transfers.front()];
  const uint64_t room = buffer.region.size - spec.meta_bytes;
  if (bytes <= room) {
    return std::optional<SessionBuffer>(SessionBuffer{base + spec.meta_bytes, room});
  }
  RDMAFLOW_ASSIGN_OR_RETURN(SessionBuffer b, engine_->overflow_buffer(it->second, step, bytes));
  return std::optional<SessionBuffer>(b);
}

Status Session::send(graph::TransferId t, uint64_t step, const SendSource& source) {
  RDMAFLOW_RETURN_IF_ERROR(check_step(step, "send"));
  RDMAFLOW_ASSIGN_OR_RETURN(const graph::TransferSpec* spec, transfer_spec(t, true, "send"));
  if (recvs_done_ < layout_->recvs_before_send[t]) {
    // The planner let the receiver share this slot's bytes with a buffer it
    // frees only after that Recv's data came back here: writing now could
    // land on memory the receiver still reads.
    const graph::TransferId missing = layout_->recv_order[recvs_done_];
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "send", spec->dst_rank,
                          layout_->describe(t) + " in " + step_text(step) + " before the recv of " +
                              layout_->describe(missing) +
                              ", which comes first in this rank's schedule (the plan's receive "
                              "slots rely on that order; docs/graph-plans.md)");
  }
  std::vector<int64_t> dims = spec->shape;
  size_t bytes = spec->bytes;
  if (spec->dynamic) {
    if (source.dims.size() != spec->shape.size()) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, "send", spec->dst_rank,
                            layout_->describe(t) + " is dynamic: send() needs its dims (rank " +
                                std::to_string(spec->shape.size()) + ")");
    }
    dims = source.dims;
    uint64_t n = dtype_size(spec->dtype);
    for (size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] < 0 || (spec->shape[i] >= 0 && dims[i] != spec->shape[i])) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, "send", spec->dst_rank,
                              layout_->describe(t) + ": dims do not match the planned shape " +
                                  graph::shape_to_string(spec->shape));
      }
      n *= static_cast<uint64_t>(dims[i]);
    }
    bytes = n;
    if (source.data && source.bytes != bytes) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, "send", spec->dst_rank,
                            layout_->describe(t) + ": " + std::to_string(source.bytes) +
                                " bytes for dims of " + std::to_string(bytes));
    }
  } else if (source.data && source.bytes != spec->bytes) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "send", spec->dst_rank,
                          layout_->describe(t) + ": " + std::to_string(source.bytes) +
                              " bytes, the plan says " + std::to_string(spec->bytes));
  }
  // Where the payload must be: the planned buffer (or, for a large dynamic
  // tensor, its overflow buffer). A producer that wrote elsewhere costs a copy.
  RDMAFLOW_ASSIGN_OR_RETURN(std::optional<SessionBuffer> dst,
                            output_buffer(spec->tensor, step, bytes));
  if (!dst) {
    return RDMAFLOW_ERROR(Code::kInternal, "send", spec->dst_rank,
                          layout_->describe(t) + " has no output buffer");
  }
  const trace::Span span(trace::kSession, "send", transfer_args(*spec, step, bytes, true));
  if (source.data && source.data != dst->data) {
    std::memcpy(dst->data, source.data, bytes);
    ++staging_copies_;
  }
  return engine_->send(t, step, dst->data, bytes, dims);
}

Status Session::send(const std::string& tensor, int dst_rank, uint64_t step,
                     const SendSource& source) {
  auto t = find_transfer(tensor, rank_, dst_rank);
  if (!t) {
    return RDMAFLOW_ERROR(
        Code::kNotFound, "send", dst_rank,
        "the plan sends no '" + tensor + "' from rank " + std::to_string(rank_) + " to this rank");
  }
  return send(*t, step, source);
}

Result<RecvView> Session::recv(graph::TransferId t, uint64_t step) {
  RDMAFLOW_RETURN_IF_ERROR(check_step(step, "recv"));
  RDMAFLOW_ASSIGN_OR_RETURN(const graph::TransferSpec* spec, transfer_spec(t, false, "recv"));
  const trace::Span span(trace::kSession, "recv", transfer_args(*spec, step, spec->bytes, false));
  RDMAFLOW_ASSIGN_OR_RETURN(RecvView view, engine_->recv(t, step));
  received_step_[t] = step + 1;
  const auto& order = layout_->recv_order;
  while (recvs_done_ < order.size() && received_step_[order[recvs_done_]] == step + 1) {
    ++recvs_done_;
  }
  return view;
}

Result<RecvView> Session::recv(const std::string& tensor, int src_rank, uint64_t step) {
  auto t = find_transfer(tensor, src_rank, rank_);
  if (!t) {
    return RDMAFLOW_ERROR(
        Code::kNotFound, "recv", src_rank,
        "the plan sends no '" + tensor + "' from this rank to rank " + std::to_string(rank_));
  }
  return recv(*t, step);
}

Status Session::end_step(uint64_t step) {
  RDMAFLOW_RETURN_IF_ERROR(check_step(step, "end step"));
  Status st = engine_->end_step(step);
  trace::finish(trace::kSession, "step", step_began_ns_, {.step = static_cast<int64_t>(step)});
  last_step_ = step;
  step_.reset();
  return st;
}

Status Session::finish() {
  if (finished_) return Status::ok();
  if (step_) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "finish session", -1,
                          step_text(*step_) + " has not ended");
  }
  finished_ = true;
  return engine_->finish(allgather_);
}

SessionStats Session::stats() const {
  SessionStats s;
  engine_->add_stats(s);
  s.staging_copies = staging_copies_;
  return s;
}

std::optional<graph::TransferId> Session::find_transfer(const std::string& tensor, int src,
                                                        int dst) const {
  for (const auto& t : plan_->transfers) {
    if (t.tensor == tensor && t.src_rank == src && t.dst_rank == dst) return t.id;
  }
  return std::nullopt;
}

}  // namespace rdmaflow
