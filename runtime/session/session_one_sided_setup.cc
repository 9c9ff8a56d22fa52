// OneSidedEngine's life: construction, setup (the arena, its keys and their
// exchange with every peer) and teardown. The data path is session_one_sided.cc.
#include <algorithm>

#include "common/log.h"
#include "runtime/session/session_dynamic.h"
#include "runtime/session/session_one_sided.h"

namespace rdmaflow::session_detail {

OneSidedEngine::OneSidedEngine(std::vector<Transport*> transports, ChannelMesh channels, int rank,
                               int world)
    : transports_(std::move(transports)), rank_(rank), world_(world) {
  transports_.resize(static_cast<size_t>(world), nullptr);
  for (Transport* t : transports_) {
    if (t && std::find(distinct_.begin(), distinct_.end(), t) == distinct_.end()) {
      distinct_.push_back(t);
    }
  }
  core_->peers.resize(static_cast<size_t>(world));
  for (int p = 0; p < world && p < static_cast<int>(channels.size()); ++p) {
    core_->peers[static_cast<size_t>(p)].channel = channels[static_cast<size_t>(p)];
  }
}

OneSidedEngine::~OneSidedEngine() {
  {
    Lock lock(core_->mu);
    core_->stop = true;
    core_->bump();
  }
  if (progress_.joinable()) progress_.join();
  for (auto& peer : core_->peers) {
    if (peer.channel) peer.channel->inbox().set_notify_listener(nullptr);
  }
  // Operations still in flight read or write the arena: wait for them briefly,
  // then cancel them by closing their channels, before the memory goes away.
  bool idle = false;
  {
    Lock lock(core_->mu);
    auto busy = [&] {
      if (core_->credits_in_flight) return true;
      for (const auto& p : core_->pending)
        if (!p.empty()) return true;
      return false;
    };
    idle = core_->cv.wait_for(lock, std::min(timeout_, Millis(2000)), [&] { return !busy(); });
  }
  if (!idle) {
    RDMAFLOW_LOG_WARN("session: closing channels with operations still in flight");
    for (auto& peer : core_->peers) {
      if (peer.channel) peer.channel->close();
    }
  }
  if (arena_) {
    // Peers still hold keys to the frames, the control words and the overflow
    // buffers, and a peer that is idle itself may still be writing (a credit, say).
    // Detaching revokes every grant in the arena's regions and waits out accesses
    // already in flight; only then is the memory freed.
    for (Transport* t : attached_) (void)arena_->detach(t);
    for (auto& [t, in] : core_->in)
      for (auto& slot : in.slots)
        if (slot.overflow) (void)arena_->free(*slot.overflow);
    for (auto& [k, o] : out_overflow_) {
      o.keys.clear();  // revoked with their regions
      if (o.alloc) (void)arena_->free(*o.alloc);
    }
    if (frame_alloc_.ptr) (void)arena_->free(frame_alloc_);
    if (ctrl_alloc_.ptr) (void)arena_->free(ctrl_alloc_);
  }
}

std::string OneSidedEngine::name() const {
  if (distinct_.empty()) return "local";
  // Best first, as the registry orders the backends ("ucx+tcp").
  std::string out;
  for (const auto& n : transport_backend_names()) {
    for (Transport* t : distinct_) {
      if (t->name() == n) out += (out.empty() ? "" : "+") + n;
    }
  }
  for (Transport* t : distinct_) {  // a backend the registry does not know
    if (out.find(t->name()) == std::string::npos) out += (out.empty() ? "" : "+") + t->name();
  }
  return out;
}

Status OneSidedEngine::setup(const SessionLayout& layout, const AllGather& allgather,
                             Millis timeout) {
  const char* op = "set up session";
  layout_ = &layout;
  timeout_ = timeout;
  const uint32_t copies = layout.copies;
  core_->pending.resize(copies);
  header_step_.assign(layout.me->buffers.size() * copies, -1);

  // Every rank this one receives from or sends to needs a channel and a transport.
  auto check_peers = [&](const std::vector<int>& peers, const std::string& relation) -> Status {
    for (int p : peers) {
      if (!core_->peers[static_cast<size_t>(p)].channel) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, op, p,
                              "no channel to a rank this one " + relation);
      }
      if (!transport_for(p)) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, op, p,
                              "rank " + std::to_string(rank_) + " " + relation +
                                  " this rank but has no transport for it");
      }
    }
    return Status::ok();
  };
  RDMAFLOW_RETURN_IF_ERROR(check_peers(layout.senders, "receives from"));
  RDMAFLOW_RETURN_IF_ERROR(check_peers(layout.receivers, "sends to"));

  // Frames and the control words, in one registered arena.
  ArenaOptions ao;
  ao.name = "session rank " + std::to_string(rank_);
  RDMAFLOW_ASSIGN_OR_RETURN(arena_, RegisteredArena::create(ao));
  for (Transport* t : distinct_) {  // every slab is registered with each of them
    RDMAFLOW_RETURN_IF_ERROR(arena_->attach(t).with_op(op));
    attached_.push_back(t);
  }
  const size_t align =
      std::clamp<size_t>(layout.plan->options.alignment, RegisteredArena::kMinAlignment,
                         RegisteredArena::kMaxAlignment);
  RDMAFLOW_ASSIGN_OR_RETURN(frame_alloc_, arena_->allocate(layout.total_bytes(), align));
  frames_ = static_cast<uint8_t*>(frame_alloc_.ptr);
  std::memset(frames_, 0, layout.total_bytes());
  RDMAFLOW_ASSIGN_OR_RETURN(ctrl_alloc_,
                            arena_->allocate(2 * kCtrlStride * static_cast<size_t>(world_)));
  std::memset(ctrl_alloc_.ptr, 0, ctrl_alloc_.size);
  auto* ctrl = static_cast<uint8_t*>(ctrl_alloc_.ptr);

  // Listen for notifies before any peer can hold a key to write with.
  for (int p = 0; p < world_; ++p) {
    auto& peer = core_->peers[static_cast<size_t>(p)];
    if (!peer.channel) continue;
    std::weak_ptr<Core> weak = core_;
    peer.channel->inbox().set_notify_listener([weak] {
      if (auto core = weak.lock()) {
        std::lock_guard<std::mutex> lock(core->mu);
        ++core->arrivals;
        core->bump();
      }
    });
  }
  for (graph::TransferId t : layout.recvs) {
    InTransfer in;
    in.id = t;
    in.peer = layout.spec(t).src_rank;
    in.slots.resize(copies);
    core_->in.emplace(t, std::move(in));
  }

  // What this rank grants: every slot of every transfer it receives (one key
  // per frame) and, to each rank it sends to, the word that rank's credits
  // land in.
  SetupRecord mine;
  for (graph::TransferId t : layout.recvs) {
    const auto& s = layout.spec(t);
    for (uint32_t f = 0; f < copies; ++f) {
      RDMAFLOW_ASSIGN_OR_RETURN(
          RemoteKey key, transport_for(s.src_rank)->export_key(slot_ptr(t, f), s.recv_slot.size));
      mine.slots.push_back({static_cast<uint32_t>(t), f, std::move(key)});
    }
  }
  for (int p : layout.receivers) {
    RDMAFLOW_ASSIGN_OR_RETURN(RemoteKey key, transport_for(p)->export_key(
                                                 ctrl + static_cast<size_t>(p) * kCtrlStride, 8));
    mine.credits.push_back({static_cast<uint32_t>(p), std::move(key)});
  }
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<Bytes> all, allgather(encode_setup_record(mine)));
  if (all.size() != static_cast<size_t>(world_)) {
    return RDMAFLOW_ERROR(Code::kProtocolError, op, -1, "key exchange returned the wrong count");
  }

  // Keep the slot keys of the transfers this rank sends, and the credit words
  // its senders granted it.
  for (graph::TransferId t : layout.sends) {
    OutTransfer o;
    o.id = t;
    o.peer = layout.spec(t).dst_rank;
    o.output_index = layout.output_by_tensor.at(layout.spec(t).tensor);
    o.slot_keys.resize(copies);
    out_.emplace(t, std::move(o));
  }
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    auto record = decode_setup_record(all[static_cast<size_t>(p)], copies);
    if (!record) {
      return RDMAFLOW_ERROR(Code::kProtocolError, op, p,
                            "malformed setup record from rank " + std::to_string(p) + ": " +
                                record.status().reason());
    }
    for (auto& s : record->slots) {
      auto it = out_.find(s.transfer);
      if (it == out_.end() || layout.spec(s.transfer).dst_rank != p) continue;  // not ours
      it->second.slot_keys[s.frame] = std::move(s.key);
    }
    for (auto& c : record->credits) {
      if (static_cast<int>(c.rank) == rank_) {
        core_->peers[static_cast<size_t>(p)].credit_key = std::move(c.key);
      }
    }
  }
  for (const auto& [t, o] : out_) {
    for (uint32_t f = 0; f < copies; ++f) {
      if (o.slot_keys[f].length == 0) {
        return RDMAFLOW_ERROR(
            Code::kProtocolError, op, o.peer,
            layout.describe(t) + ": the receiver sent no key for slot " + std::to_string(f));
      }
    }
  }
  for (int p : layout.senders) {
    if (!core_->peers[static_cast<size_t>(p)].credit_key) {
      return RDMAFLOW_ERROR(Code::kProtocolError, op, p,
                            "the sender granted no word for this rank's credits");
    }
  }
  progress_ = std::thread([this] { progress_loop(); });
  return Status::ok();
}

}  // namespace rdmaflow::session_detail
