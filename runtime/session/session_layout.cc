#include "runtime/session/session_layout.h"

#include <algorithm>

namespace rdmaflow::session_detail {

namespace {
void add_unique(std::vector<int>& v, int x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}
}  // namespace

Result<SessionLayout> SessionLayout::build(const graph::TransferPlan& plan, int rank) {
  const char* op = "set up session";
  if (rank < 0 || rank >= plan.num_ranks ||
      plan.ranks.size() != static_cast<size_t>(plan.num_ranks)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "rank " + std::to_string(rank) + " is not in the plan of '" +
                              plan.graph_name + "' (" + std::to_string(plan.num_ranks) + " ranks)");
  }
  SessionLayout l;
  l.plan = &plan;
  l.rank = rank;
  l.me = &plan.ranks[static_cast<size_t>(rank)];
  l.copies = std::max<uint32_t>(1, l.me->copies);
  l.frame_bytes = l.me->frame_bytes;
  for (graph::TransferId t : l.me->sends) {
    if (t >= plan.transfers.size() || plan.transfers[t].src_rank != rank) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                            "the plan lists transfer " + std::to_string(t) + " as a send of rank " +
                                std::to_string(rank) + " but it is not");
    }
    l.sends.push_back(t);
    add_unique(l.receivers, plan.transfers[t].dst_rank);
  }
  for (graph::TransferId t : l.me->recvs) {
    if (t >= plan.transfers.size() || plan.transfers[t].dst_rank != rank) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                            "the plan lists transfer " + std::to_string(t) +
                                " as a receive of rank " + std::to_string(rank) + " but it is not");
    }
    l.recvs.push_back(t);
    add_unique(l.senders, plan.transfers[t].src_rank);
  }
  std::sort(l.senders.begin(), l.senders.end());
  std::sort(l.receivers.begin(), l.receivers.end());
  for (size_t i = 0; i < l.me->buffers.size(); ++i) {
    const auto& b = l.me->buffers[i];
    const uint64_t end = b.region.offset + b.region.size;
    if (end < b.region.offset || end > l.frame_bytes) {
      return RDMAFLOW_ERROR(
          Code::kInvalidArgument, op, -1,
          "buffer of '" + b.tensor + "' lies outside rank " + std::to_string(rank) + "'s frame");
    }
    if (b.kind == graph::BufferKind::kOutput) l.output_by_tensor[b.tensor] = i;
  }
  for (graph::TransferId t : l.sends) {
    const auto& s = plan.transfers[t];
    auto it = l.output_by_tensor.find(s.tensor);
    if (it == l.output_by_tensor.end() ||
        s.send_buffer.offset + s.send_buffer.size > l.frame_bytes ||
        s.send_stride != l.frame_bytes) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, s.dst_rank,
                            "transfer " + std::to_string(t) + " '" + s.tensor +
                                "' has no valid output buffer on rank " + std::to_string(rank));
    }
  }
  for (graph::TransferId t : l.recvs) {
    const auto& s = plan.transfers[t];
    if (s.recv_slot.offset + s.recv_slot.size > l.frame_bytes || s.slot_stride != l.frame_bytes ||
        s.recv_slot.size < s.meta_bytes + (s.dynamic ? 0 : s.bytes)) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, s.src_rank,
                            "transfer " + std::to_string(t) + " '" + s.tensor +
                                "' has no valid receive slot on rank " + std::to_string(rank));
    }
  }
  l.recvs_before_send.assign(plan.transfers.size(), 0);
  for (const auto& op : l.me->schedule) {
    if (op.transfer < 0 || static_cast<uint64_t>(op.transfer) >= plan.transfers.size()) continue;
    const auto t = static_cast<graph::TransferId>(op.transfer);
    if (op.kind == graph::OpKind::kRecv && plan.transfers[t].dst_rank == rank) {
      l.recv_order.push_back(t);
    } else if (op.kind == graph::OpKind::kSend && plan.transfers[t].src_rank == rank) {
      l.recvs_before_send[t] = static_cast<uint32_t>(l.recv_order.size());
    }
  }
  return l;
}

std::string SessionLayout::describe(graph::TransferId t) const {
  const auto& s = spec(t);
  return "transfer " + std::to_string(t) + " '" + s.tensor + "' (rank " +
         std::to_string(s.src_rank) + " -> " + std::to_string(s.dst_rank) + ")";
}

std::vector<uint8_t> encode_setup_record(const SetupRecord& r) {
  ByteWriter w;
  w.u32(static_cast<uint32_t>(r.slots.size()));
  for (const auto& s : r.slots) w.u32(s.transfer).u32(s.frame).bytes(s.key.serialize());
  w.u32(static_cast<uint32_t>(r.credits.size()));
  for (const auto& c : r.credits) w.u32(c.rank).bytes(c.key.serialize());
  return w.take();
}

Result<SetupRecord> decode_setup_record(std::span<const uint8_t> in, uint32_t copies) {
  auto bad = [](const std::string& why) {
    return RDMAFLOW_ERROR(Code::kProtocolError, "decode setup record", -1, why);
  };
  ByteReader r(in);
  SetupRecord rec;
  std::span<const uint8_t> kb;
  auto key = [&](RemoteKey& out, const char* what) -> Status {
    uint32_t len = 0;
    if (!r.u32(len) || !r.view(len, kb)) return bad(std::string("truncated ") + what);
    auto k = RemoteKey::deserialize(kb);
    if (!k) return bad(std::string(what) + ": " + k.status().reason());
    out = std::move(*k);
    return Status::ok();
  };
  uint32_t n = 0;
  if (!r.u32(n)) return bad("truncated");
  for (uint32_t i = 0; i < n; ++i) {
    SetupRecord::Slot s;
    if (!r.u32(s.transfer) || !r.u32(s.frame)) return bad("truncated slot key");
    if (s.frame >= copies) {
      return bad("slot key for frame " + std::to_string(s.frame) + " of " + std::to_string(copies));
    }
    RDMAFLOW_RETURN_IF_ERROR(key(s.key, "slot key"));
    rec.slots.push_back(std::move(s));
  }
  if (!r.u32(n)) return bad("truncated");
  for (uint32_t i = 0; i < n; ++i) {
    SetupRecord::Credit c;
    if (!r.u32(c.rank)) return bad("truncated credit key");
    RDMAFLOW_RETURN_IF_ERROR(key(c.key, "credit key"));
    rec.credits.push_back(std::move(c));
  }
  if (!r.done()) return bad("trailing bytes");
  return rec;
}

std::string step_text(uint64_t step) {
  return "step " + std::to_string(step);
}

}  // namespace rdmaflow::session_detail
