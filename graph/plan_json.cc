#include "graph/plan_json.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "graph/graph_json.h"
#include "graph/hash.h"
#include "graph/json_util.h"

namespace rdmaflow::graph {

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr const char* kLoadPlan = "load plan";
constexpr const char* kCheckPlan = "check plan";
constexpr std::string_view kPlanFormat = "rdmaflow-plan/1";

const char* kind_name(OpKind k) {
  switch (k) {
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kCompute:
      break;
  }
  return "compute";
}

ojson region_json(const Region& r) {
  ojson j;
  j["offset"] = r.offset;
  j["size"] = r.size;
  j["alignment"] = r.alignment;
  return j;
}

ojson transfer_json(const TransferSpec& t) {
  ojson j;
  j["id"] = t.id;
  j["tensor"] = t.tensor;
  j["dtype"] = std::string(dtype_name(t.dtype));
  j["shape"] = t.shape;
  j["src"] = t.src_rank;
  j["dst"] = t.dst_rank;
  j["producer"] = t.producer;
  j["send_op"] = t.send_op;
  j["recv_op"] = t.recv_op;
  j["dynamic"] = t.dynamic;
  j["bytes"] = t.bytes;
  j["meta_bytes"] = t.meta_bytes;
  j["slots"] = t.slots;
  j["recv_slot"] = region_json(t.recv_slot);
  j["slot_stride"] = t.slot_stride;
  j["send_buffer"] = region_json(t.send_buffer);
  j["send_stride"] = t.send_stride;
  return j;
}

ojson op_json(const ScheduledOp& op) {
  ojson j;
  j["op"] = op.name;
  j["type"] = op.type;
  if (op.kind != OpKind::kCompute) {
    j["kind"] = kind_name(op.kind);
    j["transfer"] = op.transfer;
  }
  return j;
}

ojson buffer_json(const PlannedBuffer& b) {
  ojson j;
  j["kind"] = b.kind == BufferKind::kOutput ? "output" : "slot";
  j["tensor"] = b.tensor;
  j["op"] = b.op;
  j["transfers"] = b.transfers;
  j["dynamic"] = b.dynamic;
  j["region"] = region_json(b.region);
  j["live"] = {b.live_begin, b.live_end};
  return j;
}

ojson rank_header_json(const RankPlan& r) {
  ojson j;
  j["rank"] = r.rank;
  j["copies"] = r.copies;
  j["frame_bytes"] = r.frame_bytes;
  j["frame_bytes_without_reuse"] = r.frame_bytes_without_reuse;
  j["registered_bytes"] = r.registered_bytes;
  j["registered_bytes_without_reuse"] = r.registered_bytes_without_reuse;
  j["bytes_out_per_step"] = r.bytes_out_per_step;
  j["bytes_in_per_step"] = r.bytes_in_per_step;
  j["static_out"] = r.static_out;
  j["dynamic_out"] = r.dynamic_out;
  j["static_in"] = r.static_in;
  j["dynamic_in"] = r.dynamic_in;
  j["sends"] = r.sends;
  j["recvs"] = r.recvs;
  return j;
}

// Appends `items` as a JSON array, one element per line.
template <typename T, typename F>
void append_lines(std::string& out, const std::vector<T>& items, F to_json,
                  const std::string& indent) {
  if (items.empty()) {
    out += "[]";
    return;
  }
  out += "[";
  for (size_t i = 0; i < items.size(); ++i) {
    out += (i ? ",\n" : "\n") + indent + "  " + json_dump(to_json(items[i]));
  }
  out += "\n" + indent + "]";
}

// ---- reading: a parse error unwinds to parse_plan_json as an exception and
// ---- becomes a Status there; nothing escapes.
struct PlanError {
  std::string message;
};

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw PlanError{where + ": " + what};
}

const json& field(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) fail(where, "must be an object");
  auto it = obj.find(key);
  if (it == obj.end()) fail(where, std::string("'") + key + "' is missing");
  return *it;
}

int64_t get_int(const json& obj, const char* key, const std::string& where, int64_t lo,
                int64_t hi) {
  auto v = json_int(field(obj, key, where));
  if (!v || *v < lo || *v > hi) {
    fail(where, std::string("'") + key + "' must be an integer in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
  }
  return *v;
}

uint64_t get_u64(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    fail(where, std::string("'") + key + "' must be a non-negative integer");
  }
  return v.get<uint64_t>();
}

std::string get_str(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (!v.is_string()) fail(where, std::string("'") + key + "' must be a string");
  return v.get<std::string>();
}

bool get_bool(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (!v.is_boolean()) fail(where, std::string("'") + key + "' must be true or false");
  return v.get<bool>();
}

const json& get_array(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (!v.is_array()) fail(where, std::string("'") + key + "' must be an array");
  return v;
}

constexpr int64_t kI32Max = 0x7fffffff;

std::vector<TransferId> get_ids(const json& obj, const char* key, const std::string& where) {
  std::vector<TransferId> out;
  for (const json& v : get_array(obj, key, where)) {
    auto i = json_int(v);
    if (!i || *i < 0 || *i > kI32Max) fail(where, std::string("'") + key + "' has a bad id");
    out.push_back(static_cast<TransferId>(*i));
  }
  return out;
}

Region get_region(const json& obj, const char* key, const std::string& where) {
  const json& r = field(obj, key, where);
  const std::string w = where + "." + key;
  return Region{get_u64(r, "offset", w), get_u64(r, "size", w), get_u64(r, "alignment", w)};
}

TransferSpec parse_transfer(const json& j, const std::string& where) {
  TransferSpec t;
  t.id = static_cast<TransferId>(get_int(j, "id", where, 0, kI32Max));
  t.tensor = get_str(j, "tensor", where);
  auto dt = parse_dtype(get_str(j, "dtype", where));
  if (!dt) fail(where, "unknown dtype");
  t.dtype = *dt;
  for (const json& d : get_array(j, "shape", where)) {
    auto v = json_int(d);
    if (!v || *v < kUnknownDim) fail(where, "bad dimension in 'shape'");
    t.shape.push_back(*v);
  }
  if (t.shape.size() > kMaxDims) fail(where, "too many dimensions");
  t.src_rank = static_cast<int>(get_int(j, "src", where, 0, kMaxRanks - 1));
  t.dst_rank = static_cast<int>(get_int(j, "dst", where, 0, kMaxRanks - 1));
  t.producer = get_str(j, "producer", where);
  t.send_op = get_str(j, "send_op", where);
  t.recv_op = get_str(j, "recv_op", where);
  t.dynamic = get_bool(j, "dynamic", where);
  t.bytes = get_u64(j, "bytes", where);
  t.meta_bytes = get_u64(j, "meta_bytes", where);
  t.slots = static_cast<uint32_t>(get_int(j, "slots", where, 1, 64));
  t.recv_slot = get_region(j, "recv_slot", where);
  t.slot_stride = get_u64(j, "slot_stride", where);
  t.send_buffer = get_region(j, "send_buffer", where);
  t.send_stride = get_u64(j, "send_stride", where);
  return t;
}

ScheduledOp parse_op(const json& j, const std::string& where) {
  ScheduledOp op;
  op.name = get_str(j, "op", where);
  op.type = get_str(j, "type", where);
  if (j.contains("kind")) {
    std::string k = get_str(j, "kind", where);
    if (k == "send") {
      op.kind = OpKind::kSend;
    } else if (k == "recv") {
      op.kind = OpKind::kRecv;
    } else {
      fail(where, "'kind' must be \"send\" or \"recv\"");
    }
    op.transfer = get_int(j, "transfer", where, 0, kI32Max);
  }
  return op;
}

PlannedBuffer parse_buffer(const json& j, const std::string& where) {
  PlannedBuffer b;
  std::string kind = get_str(j, "kind", where);
  if (kind == "output") {
    b.kind = BufferKind::kOutput;
  } else if (kind == "slot") {
    b.kind = BufferKind::kSlot;
  } else {
    fail(where, "'kind' must be \"output\" or \"slot\"");
  }
  b.tensor = get_str(j, "tensor", where);
  b.op = get_str(j, "op", where);
  b.transfers = get_ids(j, "transfers", where);
  b.dynamic = get_bool(j, "dynamic", where);
  b.region = get_region(j, "region", where);
  const json& live = get_array(j, "live", where);
  if (live.size() != 2) fail(where, "'live' must be [begin, end]");
  auto lb = json_int(live[0]), le = json_int(live[1]);
  if (!lb || !le || *lb < -1 || *lb > kI32Max || *le < 0 || *le > kI32Max) {
    fail(where, "'live' must be [begin, end] schedule positions");
  }
  b.live_begin = static_cast<int32_t>(*lb);
  b.live_end = static_cast<int32_t>(*le);
  return b;
}

RankPlan parse_rank(const json& j, const std::string& where) {
  RankPlan r;
  r.rank = static_cast<int>(get_int(j, "rank", where, 0, kMaxRanks - 1));
  r.copies = static_cast<uint32_t>(get_int(j, "copies", where, 1, 64));
  r.frame_bytes = get_u64(j, "frame_bytes", where);
  r.frame_bytes_without_reuse = get_u64(j, "frame_bytes_without_reuse", where);
  r.registered_bytes = get_u64(j, "registered_bytes", where);
  r.registered_bytes_without_reuse = get_u64(j, "registered_bytes_without_reuse", where);
  r.bytes_out_per_step = get_u64(j, "bytes_out_per_step", where);
  r.bytes_in_per_step = get_u64(j, "bytes_in_per_step", where);
  r.static_out = static_cast<uint32_t>(get_int(j, "static_out", where, 0, kI32Max));
  r.dynamic_out = static_cast<uint32_t>(get_int(j, "dynamic_out", where, 0, kI32Max));
  r.static_in = static_cast<uint32_t>(get_int(j, "static_in", where, 0, kI32Max));
  r.dynamic_in = static_cast<uint32_t>(get_int(j, "dynamic_in", where, 0, kI32Max));
  r.sends = get_ids(j, "sends", where);
  r.recvs = get_ids(j, "recvs", where);
  const json& sched = get_array(j, "schedule", where);
  for (size_t i = 0; i < sched.size(); ++i) {
    r.schedule.push_back(parse_op(sched[i], where + ".schedule[" + std::to_string(i) + "]"));
  }
  const json& bufs = get_array(j, "buffers", where);
  for (size_t i = 0; i < bufs.size(); ++i) {
    r.buffers.push_back(parse_buffer(bufs[i], where + ".buffers[" + std::to_string(i) + "]"));
  }
  return r;
}

TransferPlan parse_plan_doc(const json& doc) {
  TransferPlan p;
  if (!doc.is_object()) fail("plan", "the document must be a JSON object");
  if (get_str(doc, "format", "plan") != kPlanFormat) {
    fail("plan", "'format' must be \"" + std::string(kPlanFormat) + "\"");
  }
  p.graph_name = get_str(doc, "graph", "plan");
  std::string h = get_str(doc, "graph_hash", "plan");
  if (h.size() != 18 || h.compare(0, 2, "0x") != 0 ||
      h.find_first_not_of("0123456789abcdef", 2) != std::string::npos) {
    fail("plan", "'graph_hash' must be 0x and 16 hex digits");
  }
  p.graph_hash = std::stoull(h.substr(2), nullptr, 16);
  p.num_ranks = static_cast<int>(get_int(doc, "num_ranks", "plan", 1, kMaxRanks));
  const json& o = field(doc, "options", "plan");
  p.options.pipeline_depth = static_cast<uint32_t>(get_int(o, "pipeline_depth", "options", 1, 64));
  p.options.alignment = get_u64(o, "alignment", "options");
  p.options.dynamic_size_hint = get_u64(o, "dynamic_size_hint", "options");
  p.options.meta_bytes = get_u64(o, "meta_bytes", "options");
  p.options.reuse = get_bool(o, "reuse", "options");
  const json& ts = get_array(doc, "transfers", "plan");
  for (size_t i = 0; i < ts.size(); ++i) {
    p.transfers.push_back(parse_transfer(ts[i], "transfers[" + std::to_string(i) + "]"));
  }
  const json& rs = get_array(doc, "ranks", "plan");
  for (size_t i = 0; i < rs.size(); ++i) {
    p.ranks.push_back(parse_rank(rs[i], "ranks[" + std::to_string(i) + "]"));
  }
  return p;
}

Status plan_error(const std::string& reason) {
  return RDMAFLOW_ERROR(Code::kInvalidArgument, kCheckPlan, -1, reason);
}

bool region_ok(const Region& r, uint64_t need, uint64_t frame, uint64_t alignment) {
  return r.alignment == alignment && alignment && r.offset % alignment == 0 && r.size >= need &&
         r.offset <= frame && r.size <= frame - r.offset;
}

}  // namespace

std::string write_plan_json(const TransferPlan& p) {
  std::string out = "{\n";
  out += "  \"format\": " + json_dump(json(kPlanFormat)) + ",\n";
  out += "  \"graph\": " + json_dump(json(p.graph_name)) + ",\n";
  out += "  \"graph_hash\": \"" + hash_hex(p.graph_hash) + "\",\n";
  out += "  \"num_ranks\": " + std::to_string(p.num_ranks) + ",\n";
  ojson o;
  o["pipeline_depth"] = p.options.pipeline_depth;
  o["alignment"] = p.options.alignment;
  o["dynamic_size_hint"] = p.options.dynamic_size_hint;
  o["meta_bytes"] = p.options.meta_bytes;
  o["reuse"] = p.options.reuse;
  out += "  \"options\": " + json_dump(o) + ",\n";
  out += "  \"transfers\": ";
  append_lines(out, p.transfers, transfer_json, "  ");
  out += ",\n  \"ranks\": [";
  for (size_t i = 0; i < p.ranks.size(); ++i) {
    const RankPlan& r = p.ranks[i];
    std::string header = json_dump(rank_header_json(r));
    header.pop_back();  // reopen the object to add the long lists
    out += (i ? ",\n    " : "\n    ") + header + ",\n      \"schedule\": ";
    append_lines(out, r.schedule, op_json, "      ");
    out += ",\n      \"buffers\": ";
    append_lines(out, r.buffers, buffer_json, "      ");
    out += "}";
  }
  out += p.ranks.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

Result<TransferPlan> parse_plan_json(std::string_view text) {
  RDMAFLOW_ASSIGN_OR_RETURN(json doc, parse_json_text(text, kLoadPlan));
  TransferPlan plan;
  try {
    plan = parse_plan_doc(doc);
  } catch (const PlanError& e) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kLoadPlan, -1, e.message);
  } catch (const std::exception& e) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kLoadPlan, -1, e.what());
  }
  Status st = check_plan(plan);
  if (!st) return st.with_op(kLoadPlan);
  return plan;
}

uint64_t plan_hash(const TransferPlan& plan) {
  return fnv1a64(write_plan_json(plan));
}

Status check_plan(const TransferPlan& p) {
  const PlanOptions& o = p.options;
  if (p.num_ranks < 1 || p.ranks.size() != static_cast<size_t>(p.num_ranks)) {
    return plan_error("the plan has " + std::to_string(p.ranks.size()) + " rank entries for " +
                      std::to_string(p.num_ranks) + " ranks");
  }
  if (!o.alignment || (o.alignment & (o.alignment - 1))) {
    return plan_error("alignment is not a power of two");
  }
  for (size_t i = 0; i < p.ranks.size(); ++i) {
    const RankPlan& r = p.ranks[i];
    const std::string where = "rank " + std::to_string(i);
    uint64_t total = 0;
    if (r.rank != static_cast<int>(i))
      return plan_error(where + ": entry says rank " + std::to_string(r.rank));
    if (r.copies != o.pipeline_depth ||
        __builtin_mul_overflow(r.frame_bytes, uint64_t{r.copies}, &total) ||
        total != r.registered_bytes) {
      return plan_error(where + ": registered bytes are not frame bytes times copies");
    }
    if (r.frame_bytes % o.alignment) return plan_error(where + ": frame size is not aligned");
  }
  // Transfers: ids, ranks, regions.
  for (size_t i = 0; i < p.transfers.size(); ++i) {
    const TransferSpec& t = p.transfers[i];
    const std::string where = "transfer " + std::to_string(i) + " ('" + t.tensor + "')";
    if (t.id != i) return plan_error(where + ": id " + std::to_string(t.id));
    if (t.src_rank < 0 || t.src_rank >= p.num_ranks || t.dst_rank < 0 ||
        t.dst_rank >= p.num_ranks || t.src_rank == t.dst_rank) {
      return plan_error(where + ": bad source or destination rank");
    }
    const RankPlan& src = p.ranks[static_cast<size_t>(t.src_rank)];
    const RankPlan& dst = p.ranks[static_cast<size_t>(t.dst_rank)];
    uint64_t need = 0;
    if (__builtin_add_overflow(t.bytes, t.meta_bytes, &need)) {
      return plan_error(where + ": size overflows");
    }
    if (t.slots != o.pipeline_depth) return plan_error(where + ": slot count differs from depth");
    if (t.dynamic != (t.meta_bytes != 0)) {
      return plan_error(where + ": dynamic transfers (only) have a metadata header");
    }
    if (!region_ok(t.recv_slot, need, dst.frame_bytes, o.alignment) ||
        t.slot_stride != dst.frame_bytes) {
      return plan_error(where + ": receive slot does not fit, is misaligned or outside the frame");
    }
    if (!region_ok(t.send_buffer, need, src.frame_bytes, o.alignment) ||
        t.send_stride != src.frame_bytes) {
      return plan_error(where + ": send buffer does not fit, is misaligned or outside the frame");
    }
  }
  // Schedules: every transfer has one Send on its source and one Recv on its destination.
  std::vector<uint8_t> sends(p.transfers.size(), 0), recvs(p.transfers.size(), 0);
  for (const RankPlan& r : p.ranks) {
    for (const ScheduledOp& op : r.schedule) {
      if (op.kind == OpKind::kCompute) continue;
      if (op.transfer < 0 || static_cast<size_t>(op.transfer) >= p.transfers.size()) {
        return plan_error("rank " + std::to_string(r.rank) + ": op '" + op.name +
                          "' names no transfer");
      }
      const TransferSpec& t = p.transfers[static_cast<size_t>(op.transfer)];
      const bool send = op.kind == OpKind::kSend;
      if ((send ? t.src_rank : t.dst_rank) != r.rank || (send ? t.send_op : t.recv_op) != op.name ||
          ++(send ? sends : recvs)[static_cast<size_t>(op.transfer)] != 1) {
        return plan_error("rank " + std::to_string(r.rank) + ": op '" + op.name +
                          "' does not match transfer " + std::to_string(op.transfer));
      }
    }
  }
  for (size_t i = 0; i < p.transfers.size(); ++i) {
    if (sends[i] != 1 || recvs[i] != 1) {
      return plan_error("transfer " + std::to_string(i) + " lacks its Send or its Recv");
    }
  }
  // Buffers: inside the frame, aligned, and no two live at once share a byte.
  for (const RankPlan& r : p.ranks) {
    const std::string where = "rank " + std::to_string(r.rank);
    struct Event {
      int32_t time;
      int kind;  // 0 = end, 1 = begin (ends first at equal times)
      size_t buffer;
      bool operator<(const Event& e) const {
        return std::tie(time, kind, buffer) < std::tie(e.time, e.kind, e.buffer);
      }
    };
    std::vector<Event> events;
    events.reserve(r.buffers.size() * 2);
    for (size_t i = 0; i < r.buffers.size(); ++i) {
      const PlannedBuffer& b = r.buffers[i];
      if (!region_ok(b.region, 1, r.frame_bytes, o.alignment) || b.live_end <= b.live_begin) {
        return plan_error(where + ": buffer of '" + b.tensor +
                          "' is misaligned, outside the frame or never live");
      }
      events.push_back({b.live_begin, 1, i});
      events.push_back({b.live_end, 0, i});
    }
    std::sort(events.begin(), events.end());
    std::map<uint64_t, size_t> live;  // offset -> buffer, disjoint ranges
    for (const Event& e : events) {
      const PlannedBuffer& b = r.buffers[e.buffer];
      if (e.kind == 0) {
        live.erase(b.region.offset);
        continue;
      }
      auto next = live.lower_bound(b.region.offset);
      bool clash = next != live.end() && next->first < b.region.offset + b.region.size;
      if (!clash && next != live.begin()) {
        const PlannedBuffer& prev = r.buffers[std::prev(next)->second];
        clash = prev.region.offset + prev.region.size > b.region.offset;
      }
      if (clash) {
        return plan_error(where + ": buffers of '" + b.tensor +
                          "' and another tensor are live at the same time and overlap");
      }
      live.emplace(b.region.offset, e.buffer);
    }
  }
  return Status::ok();
}

}  // namespace rdmaflow::graph
