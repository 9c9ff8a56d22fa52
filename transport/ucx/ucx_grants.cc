// UcxCore: registered regions (shared in place for same-host peers), the grants
// exported from them, and revocation rounds that wait until every peer that may
// have cached a key confirmed dropping it.
#include "transport/ucx/ucx_core.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "common/env.h"
#include "common/log.h"
#include "transport/shm/shared_pages.h"
#include "transport/ucx/ucx_channel.h"

namespace rdmaflow::ucx {

// ---------------------------------------------------------------------------
// Memory and grants

Result<RegionId> UcxCore::register_memory(void* addr, size_t len) {
  const char* op = "register memory";
  if (addr == nullptr || len == 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "empty region");
  }
  const auto a = reinterpret_cast<uintptr_t>(addr);
  if (a + len < a) return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "region wraps around");
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (stopped()) return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "transport is shut down");
  auto next = region_by_addr_.lower_bound(a);
  if (next != region_by_addr_.end() && next->first < a + len) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "overlaps a registered region");
  }
  if (next != region_by_addr_.begin()) {
    const Region& prev = regions_.at(std::prev(next)->second);
    if (prev.addr + prev.len > a) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "overlaps a registered region");
    }
  }
  Region r;
  r.addr = a;
  r.len = len;
  if (options_.direct && shm_capable_) {
    // Same-host peers will reach it with memcpy (shm/shared_pages.h); others are unaffected.
    auto fd = shm::share_in_place(addr, len);
    if (fd.is_ok()) {
      r.shm = *fd;
    } else {
      RDMAFLOW_LOG_DEBUG("ucx: region at {} ({} bytes) stays private, no direct access: {}", addr,
                         len, fd.status().reason());
    }
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = addr;
  mp.length = len;
  ucs_status_t s = ucp_mem_map(context_, &mp, &r.memh);
  if (s != UCS_OK) {
    if (r.shm.fd >= 0) shm::unshare_in_place(r.shm);
    return RDMAFLOW_ERROR(Code::kResourceExhausted, op, -1,
                          std::string("ucp_mem_map failed: ") + ucs_status_string(s));
  }
  void* packed = nullptr;
  size_t packed_len = 0;
  s = ucp_rkey_pack(context_, r.memh, &packed, &packed_len);
  if (s != UCS_OK) {
    ucp_mem_unmap(context_, r.memh);
    if (r.shm.fd >= 0) shm::unshare_in_place(r.shm);
    return RDMAFLOW_ERROR(Code::kInternal, op, -1,
                          std::string("ucp_rkey_pack failed: ") + ucs_status_string(s));
  }
  r.rkey.assign(static_cast<uint8_t*>(packed), static_cast<uint8_t*>(packed) + packed_len);
  ucp_rkey_buffer_release(packed);
  const RegionId id = next_region_++;
  regions_.emplace(id, std::move(r));
  region_by_addr_.emplace(a, id);
  return id;
}

Status UcxCore::deregister_memory(RegionId region) {
  const char* op = "deregister memory";
  std::vector<uint64_t> keys;
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    if (stopped()) return Status::ok();  // everything was released at shutdown
    if (!regions_.count(region)) {
      return RDMAFLOW_ERROR(Code::kNotFound, op, -1,
                            "region " + std::to_string(region) + " is not registered");
    }
    for (const auto& [id, g] : grants_) {
      if (g.region == region) keys.push_back(id);
    }
  }
  // Peers stop using the region's keys before the memory goes away.
  Status st = keys.empty() ? Status::ok() : revoke_grants(std::move(keys), op);
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (stopped()) return Status::ok();
  auto it = regions_.find(region);
  if (it == regions_.end()) return st;
  ucp_mem_unmap(context_, it->second.memh);
  if (it->second.shm.fd >= 0) {
    // Every peer confirmed dropping its keys (above); take the pages back private.
    shm::unshare_in_place(it->second.shm);
  }
  region_by_addr_.erase(it->second.addr);
  regions_.erase(it);
  return st;
}

Result<RemoteKey> UcxCore::export_key(const void* addr, size_t len) {
  const char* op = "export key";
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (stopped()) return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "transport is shut down");
  auto it = region_by_addr_.upper_bound(a);
  if (it == region_by_addr_.begin()) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, -1, "address is not in a registered region");
  }
  --it;
  const RegionId rid = it->second;
  const Region& r = regions_.at(rid);
  if (a >= r.addr + r.len) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, -1, "address is not in a registered region");
  }
  if (len > r.addr + r.len - a) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, -1,
                          std::to_string(len) +
                              " bytes from that address run past the end of "
                              "its registered region");
  }
  // splitmix64: secrets only need to be unguessable by accident, not by an attacker.
  rng_state_ += 0x9e3779b97f4a7c15ull;
  uint64_t z = rng_state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  RemoteKey key;
  key.backend = "ucx";
  key.key_id = next_key_++;
  key.secret = z;
  key.addr = a;
  key.length = len;
  key.blob = r.rkey;
  grants_.emplace(key.key_id, Grant{key.secret, a, len, rid, {}});
  return key;
}

Status UcxCore::resolve_grant(uint64_t key_id, uint64_t secret, uint64_t offset, uint64_t len,
                              const char* op, int peer, uint8_t** target) {
  auto it = grants_.find(key_id);
  if (it == grants_.end()) {
    return RDMAFLOW_ERROR(
        Code::kNotFound, op, peer,
        "unknown key id " + std::to_string(key_id) + " (never exported here, or revoked)");
  }
  const Grant& g = it->second;
  if (g.secret != secret) {
    return RDMAFLOW_ERROR(
        Code::kNotFound, op, peer,
        "wrong secret for key id " + std::to_string(key_id) + " (forged or stale key)");
  }
  if (!(offset <= g.len && len <= g.len - offset)) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer,
                          "offset " + std::to_string(offset) + " + length " + std::to_string(len) +
                              " exceeds the " + std::to_string(g.len) +
                              " bytes granted by key id " + std::to_string(key_id));
  }
  *target = reinterpret_cast<uint8_t*>(g.addr + offset);
  return Status::ok();
}

Status UcxCore::query_grant(uint64_t key_id, uint64_t secret, uint32_t channel, int peer,
                            uint64_t* addr, uint64_t* len, uint64_t* rkey_sum, DirectInfo* direct) {
  uint8_t* target = nullptr;
  RDMAFLOW_RETURN_IF_ERROR(resolve_grant(key_id, secret, 0, 0, "key query", peer, &target));
  Grant& g = grants_.at(key_id);
  if (std::find(g.queried_by.begin(), g.queried_by.end(), channel) == g.queried_by.end()) {
    g.queried_by.push_back(channel);
  }
  *addr = g.addr;
  *len = g.len;
  const Region& r = regions_.at(g.region);
  *rkey_sum = rkey_checksum(r.rkey);
  if (direct != nullptr) {
    direct->fd = r.shm.fd;
    if (r.shm.fd >= 0) {
      direct->region = g.region;
      direct->base = r.shm.base;
      direct->length = r.shm.length;
    }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------
// Revocation

Status UcxCore::revoke_key(const RemoteKey& key) {
  const char* op = "revoke key";
  if (key.backend != "ucx") {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "remote key belongs to backend '" + key.backend + "', not ucx");
  }
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    if (stopped()) return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "transport is shut down");
    auto it = grants_.find(key.key_id);
    if (it == grants_.end() || it->second.secret != key.secret) {
      return RDMAFLOW_ERROR(
          Code::kNotFound, op, -1,
          "key id " + std::to_string(key.key_id) + " is not an active grant of this transport");
    }
  }
  return revoke_grants({key.key_id}, op);
}

Status UcxCore::revoke_grants(std::vector<uint64_t> key_ids, const char* op) {
  auto remaining = std::make_shared<std::atomic<int>>(0);
  uint64_t round = 0;
  std::vector<int> ranks;
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    if (stopped()) return Status::ok();
    // Notifies already published in our rings were checked by their writers against
    // the grants still valid: deliver them before the grants go.
    poll_rings_locked();
    std::map<uint32_t, std::vector<uint64_t>> per_channel;
    for (uint64_t id : key_ids) {
      auto it = grants_.find(id);
      if (it == grants_.end()) continue;
      for (uint32_t c : it->second.queried_by) per_channel[c].push_back(id);
      grants_.erase(it);  // from now on the receiver refuses it (am path, key queries)
    }
    // Peers that cached an rkey for one of the keys must drop it and confirm, after their
    // last put/get with it completed.
    round = next_round_++;
    RevokeRound rr;
    rr.remaining = remaining;
    for (auto& [cid, ids] : per_channel) {
      UcxChannel* ch = channels_[cid - 1].get();
      if (ch->failed()) continue;
      std::vector<uint8_t> data(ids.size() * 8);
      std::memcpy(data.data(), ids.data(), data.size());
      ch->send_ctrl(MsgType::kRevoke, round, std::move(data));
      rr.waiting.push_back(cid);
      ranks.push_back(ch->peer_rank());
    }
    if (rr.waiting.empty()) return Status::ok();
    remaining->store(static_cast<int>(rr.waiting.size()));
    rounds_.emplace(round, std::move(rr));
    pass_locked();
  }
  dispatch();
  const Millis timeout = default_timeout();
  wait_control([&] { return remaining->load() == 0; }, Clock::now() + timeout);
  if (remaining->load() == 0) return Status::ok();
  {
    std::lock_guard<std::mutex> lock(worker_mu_);
    rounds_.erase(round);
  }
  std::string who;
  for (int r : ranks) who += (who.empty() ? "" : ", ") + std::to_string(r);
  return RDMAFLOW_ERROR(Code::kTimeout, op, ranks.size() == 1 ? ranks[0] : -1,
                        "revoked here, but peer rank(s) " + who +
                            " did not confirm dropping the key within " +
                            std::to_string(timeout.count()) + " ms");
}

void UcxCore::on_revoke_ack(uint64_t round, uint32_t channel) {
  auto it = rounds_.find(round);
  if (it == rounds_.end()) return;
  auto& w = it->second.waiting;
  auto pos = std::find(w.begin(), w.end(), channel);
  if (pos == w.end()) return;
  w.erase(pos);
  it->second.remaining->fetch_sub(1);
  if (w.empty()) rounds_.erase(it);
  { std::lock_guard<std::mutex> lock(ctl_mu_); }
  ctl_cv_.notify_all();
}

void UcxCore::channel_failed(uint32_t channel) {
  std::vector<uint64_t> rounds;
  for (auto& [id, rr] : rounds_) {
    if (std::find(rr.waiting.begin(), rr.waiting.end(), channel) != rr.waiting.end()) {
      rounds.push_back(id);
    }
  }
  for (uint64_t r : rounds) on_revoke_ack(r, channel);
  { std::lock_guard<std::mutex> lock(ctl_mu_); }
  ctl_cv_.notify_all();
}

}  // namespace rdmaflow::ucx
