// VerbsChannel: per-grant protection with type 2 memory windows (see
// verbs_channel.h and docs/security.md). The target binds one window per grant
// and peer, on the peer's queue pair, when the peer first presents the key; a
// type 2 window is usable only through the queue pair it was bound on, so the
// rkey it yields opens exactly the grant, to exactly that peer. Revoking the
// grant deallocates the window.
#include <cstring>

#include "common/log.h"
#include "transport/verbs/verbs_channel.h"
#include "transport/verbs/verbs_channel_internal.h"

namespace rdmaflow::verbs {

Result<uint32_t> VerbsChannel::window_for_locked(const KeyClaim& claim) {
  const char* op = "bind memory window";
  if (claim.length == 0) return 0;  // nothing to open; a zero-byte access checks no rkey
  if (auto it = windows_.find(claim.key_id); it != windows_.end()) {
    if (it->second.addr == claim.addr && it->second.length == claim.length) {
      return it->second.rkey;
    }
    drop_windows_locked(claim.key_id);
  }
  ibv_mr* mr = core_->mr_for_window(claim.key_id);
  if (mr == nullptr) {
    return RDMAFLOW_ERROR(
        Code::kNotFound, op, peer_rank_,
        "the memory of key id " + std::to_string(claim.key_id) + " is no longer registered");
  }
  ibv_mw* mw = ibv_alloc_mw(core_->pd(), IBV_MW_TYPE_2);
  if (mw == nullptr) {
    return RDMAFLOW_ERROR(Code::kResourceExhausted, op, peer_rank_,
                          std::string("ibv_alloc_mw failed: ") + std::strerror(errno) +
                              " (the device's max_mw windows are in use?)");
  }
  Control bind{MsgType::kKeyVerdict, {}, mw, {}, ibv_inc_rkey(mw->rkey)};
  bind.bind_info.mr = mr;
  bind.bind_info.addr = claim.addr;
  bind.bind_info.length = claim.length;
  bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  windows_[claim.key_id] = Window{mw, bind.bind_rkey, claim.addr, claim.length};
  control_out_.push_back(std::move(bind));
  return windows_[claim.key_id].rkey;
}

void VerbsChannel::post_bind_locked(const Control& c, Tasks& out) {
  if (!window_.try_reserve(1)) return;
  ibv_send_wr wr{};
  wr.wr_id = next_wr_id_++;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = c.bind;
  wr.bind_mw.rkey = c.bind_rkey;
  wr.bind_mw.bind_info = c.bind_info;
  if (!post_locked(&wr, "bind memory window", out)) return;
  inflight_[wr.wr_id] = InFlight{nullptr, 1, -1};
}

void VerbsChannel::drop_windows_locked(std::optional<uint64_t> key_id) {
  auto drop = [&](ibv_mw* mw) {
    std::erase_if(control_out_, [&](const Control& c) { return c.bind == mw; });
    if (int rc = ibv_dealloc_mw(mw); rc != 0) {
      RDMAFLOW_LOG_WARN("verbs: ibv_dealloc_mw on the channel to rank {} failed: {}", peer_rank_,
                        std::strerror(rc));
    }
  };
  if (!key_id) {
    for (auto& [id, w] : windows_) drop(w.mw);
    windows_.clear();
    return;
  }
  auto it = windows_.find(*key_id);
  if (it == windows_.end()) return;
  drop(it->second.mw);
  windows_.erase(it);
}

uint32_t VerbsChannel::remote_rkey_locked(const WorkItem& item) const {
  if (item.key) {
    auto it = keys_.find(*item.key);
    if (it != keys_.end() && it->second.rkey != 0) return it->second.rkey;
  }
  return item.rkey;
}

}  // namespace rdmaflow::verbs
