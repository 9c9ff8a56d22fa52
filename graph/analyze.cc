#include "graph/analyze.h"

#include <string>
#include <utility>

#include "graph/graph_json.h"
#include "graph/hash.h"
#include "graph/liveness.h"
#include "graph/memory_planner.h"
#include "graph/schedule.h"

namespace rdmaflow::graph {

namespace {

constexpr const char* kAnalyze = "analyze graph";
// Largest buffer the planner places (so sums of many cannot overflow).
constexpr uint64_t kMaxBufferBytes = uint64_t{1} << 48;

Status bad_option(const std::string& reason) {
  return RDMAFLOW_ERROR(Code::kInvalidArgument, kAnalyze, -1, reason);
}

bool is_pow2(uint64_t v) {
  return v && !(v & (v - 1));
}

// Payload bytes of a cross-rank tensor: exact when static, the hint otherwise.
uint64_t payload_bytes(const Tensor& t, const PlanOptions& o) {
  if (auto b = static_bytes(t.dtype, t.shape)) return *b;
  return t.size_hint ? t.size_hint : o.dynamic_size_hint;
}

}  // namespace

Status validate_options(const PlanOptions& o) {
  if (o.pipeline_depth < 1 || o.pipeline_depth > 64) {
    return bad_option("pipeline depth must be in 1..64, got " + std::to_string(o.pipeline_depth));
  }
  if (!is_pow2(o.alignment) || o.alignment > (1u << 20)) {
    return bad_option("alignment must be a power of two up to 2^20, got " +
                      std::to_string(o.alignment));
  }
  if (o.meta_bytes < 64 || o.meta_bytes > (1u << 20) || o.meta_bytes % 8) {
    return bad_option("metadata header bytes must be a multiple of 8 in 64..2^20, got " +
                      std::to_string(o.meta_bytes));
  }
  if (o.dynamic_size_hint > kMaxBufferBytes) {
    return bad_option("dynamic size hint is larger than 2^48 bytes");
  }
  return Status::ok();
}

Result<TransferPlan> analyze(const PartitionedGraph& pg, const PlanOptions& o) {
  RDMAFLOW_RETURN_IF_ERROR(validate_options(o));
  if (!pg.original || pg.ranks.size() != static_cast<size_t>(pg.num_ranks)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kAnalyze, -1,
                          "not a partitioned graph (use partition())");
  }
  const Graph& g = *pg.original;
  RDMAFLOW_ASSIGN_OR_RETURN(Schedule schedule, make_schedule(pg));
  std::vector<RankLiveness> lives = cross_rank_liveness(pg, schedule);

  TransferPlan plan;
  plan.graph_name = g.name;
  plan.graph_hash = pg.graph_hash;
  plan.num_ranks = pg.num_ranks;
  plan.options = o;
  plan.transfers.resize(pg.transfers.size());
  plan.ranks.resize(pg.ranks.size());

  // Transfer descriptions (regions filled in below).
  for (const Edge& e : pg.transfers) {
    const Tensor& t = g.tensor(e.tensor);
    TransferSpec& ts = plan.transfers[e.id];
    ts.id = e.id;
    ts.tensor = t.name;
    ts.dtype = t.dtype;
    ts.shape = t.shape;
    ts.src_rank = e.src_rank;
    ts.dst_rank = e.dst_rank;
    ts.producer = g.op(t.producer).name;
    ts.send_op = pg.ranks[static_cast<size_t>(e.src_rank)].graph.op(e.send_op).name;
    ts.recv_op = pg.ranks[static_cast<size_t>(e.dst_rank)].graph.op(e.recv_op).name;
    ts.dynamic = !is_static(t.shape);
    ts.bytes = payload_bytes(t, o);
    ts.slots = o.pipeline_depth;
    ts.meta_bytes = ts.dynamic ? o.meta_bytes : 0;
    if (ts.bytes > kMaxBufferBytes) {
      return RDMAFLOW_ERROR(Code::kResourceExhausted, kAnalyze, -1,
                            "tensor '" + t.name + "' (" + std::to_string(ts.bytes) +
                                " bytes) is larger than 2^48 bytes and cannot be placed");
    }
  }

  for (size_t r = 0; r < pg.ranks.size(); ++r) {
    const RankGraph& rg = pg.ranks[r];
    const RankLiveness& live = lives[r];
    RankPlan& rp = plan.ranks[r];
    rp.rank = static_cast<int>(r);
    rp.copies = o.pipeline_depth;

    rp.schedule.reserve(schedule.order[r].size());
    for (OpId op : schedule.order[r]) {
      const Op& lop = rg.graph.op(op);
      ScheduledOp so;
      so.name = lop.name;
      so.type = lop.type;
      so.transfer = rg.transfer_of_op[static_cast<size_t>(op)];
      if (so.transfer >= 0) {
        const Edge& e = pg.transfers[static_cast<size_t>(so.transfer)];
        so.kind = (e.src_rank == rp.rank && e.send_op == op) ? OpKind::kSend : OpKind::kRecv;
      }
      rp.schedule.push_back(std::move(so));
    }

    std::vector<MemoryRequest> requests;
    requests.reserve(live.buffers.size());
    uint64_t total = 0;
    for (const BufferLife& b : live.buffers) {
      const TransferSpec& ts = plan.transfers[b.transfer];
      MemoryRequest req;
      req.size = ts.meta_bytes + ts.bytes;
      req.begin = o.reuse ? b.begin : 0;
      req.end = o.reuse ? b.end : 1;
      if (__builtin_add_overflow(total, align_up(req.size, o.alignment), &total) ||
          total > (uint64_t{1} << 62)) {
        return RDMAFLOW_ERROR(Code::kResourceExhausted, kAnalyze, rp.rank,
                              "cross-rank tensors of this rank need more than 2^62 bytes");
      }
      requests.push_back(req);
    }
    MemoryLayout layout = plan_memory(requests, o.alignment);
    rp.frame_bytes = layout.arena_bytes;
    rp.frame_bytes_without_reuse = layout.bytes_without_reuse;
    if (__builtin_mul_overflow(rp.frame_bytes_without_reuse, uint64_t{o.pipeline_depth},
                               &rp.registered_bytes_without_reuse)) {
      return RDMAFLOW_ERROR(Code::kResourceExhausted, kAnalyze, rp.rank,
                            "registered memory size overflows");
    }
    rp.registered_bytes = rp.frame_bytes * o.pipeline_depth;

    rp.buffers.reserve(live.buffers.size());
    for (size_t i = 0; i < live.buffers.size(); ++i) {
      const BufferLife& b = live.buffers[i];
      const TransferSpec& first = plan.transfers[b.transfer];
      PlannedBuffer pb;
      pb.kind = b.kind;
      pb.tensor = first.tensor;
      pb.dynamic = first.dynamic;
      pb.region = Region{layout.offset[i], layout.reserved[i], o.alignment};
      pb.live_begin = b.begin;
      pb.live_end = b.end;
      if (b.kind == BufferKind::kOutput) {
        pb.op = first.producer;
        for (TransferId t = b.transfer;
             t < plan.transfers.size() && pg.transfers[t].tensor == b.tensor; ++t) {
          pb.transfers.push_back(t);
          plan.transfers[t].send_buffer = pb.region;
          plan.transfers[t].send_stride = rp.frame_bytes;
        }
      } else {
        pb.op = first.recv_op;
        pb.transfers.push_back(b.transfer);
        plan.transfers[b.transfer].recv_slot = pb.region;
        plan.transfers[b.transfer].slot_stride = rp.frame_bytes;
      }
      rp.buffers.push_back(std::move(pb));
    }
  }

  for (const TransferSpec& ts : plan.transfers) {
    RankPlan& src = plan.ranks[static_cast<size_t>(ts.src_rank)];
    RankPlan& dst = plan.ranks[static_cast<size_t>(ts.dst_rank)];
    src.sends.push_back(ts.id);
    dst.recvs.push_back(ts.id);
    src.bytes_out_per_step += ts.bytes;
    dst.bytes_in_per_step += ts.bytes;
    (ts.dynamic ? src.dynamic_out : src.static_out)++;
    (ts.dynamic ? dst.dynamic_in : dst.static_in)++;
  }
  return plan;
}

Result<TransferPlan> plan_transfers(const Graph& graph, const Placement& placement, int num_ranks,
                                    const PlanOptions& options) {
  RDMAFLOW_RETURN_IF_ERROR(validate_options(options));
  RDMAFLOW_ASSIGN_OR_RETURN(PartitionedGraph pg, partition(graph, placement, num_ranks));
  return analyze(pg, options);
}

}  // namespace rdmaflow::graph
