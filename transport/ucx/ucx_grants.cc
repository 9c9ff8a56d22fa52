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
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (stopped()) return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "transport is shut down");
  RDMAFLOW_ASSIGN_OR_RETURN(const RegionId id, grants_.add_region(addr, len));
  Region r;
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
  auto undo = [&] {
    if (r.shm.fd >= 0) shm::unshare_in_place(r.shm);
    (void)grants_.remove_region(id);  // no grant exists yet
  };
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = addr;
  mp.length = len;
  ucs_status_t s = ucp_mem_map(context_, &mp, &r.memh);
  if (s != UCS_OK) {
    undo();
    return RDMAFLOW_ERROR(Code::kResourceExhausted, op, -1,
                          std::string("ucp_mem_map failed: ") + ucs_status_string(s));
  }
  void* packed = nullptr;
  size_t packed_len = 0;
  s = ucp_rkey_pack(context_, r.memh, &packed, &packed_len);
  if (s != UCS_OK) {
    ucp_mem_unmap(context_, r.memh);
    undo();
    return RDMAFLOW_ERROR(Code::kInternal, op, -1,
                          std::string("ucp_rkey_pack failed: ") + ucs_status_string(s));
  }
  r.rkey.assign(static_cast<uint8_t*>(packed), static_cast<uint8_t*>(packed) + packed_len);
  ucp_rkey_buffer_release(packed);
  regions_.emplace(id, std::move(r));
  return id;
}

Status UcxCore::deregister_memory(RegionId region) {
  const char* op = "deregister memory";
  std::unique_lock<std::mutex> lock(worker_mu_);
  if (stopped()) return Status::ok();  // everything was released at shutdown
  auto it = regions_.find(region);
  if (it == regions_.end() || it->second.closing) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, -1,
                          "region " + std::to_string(region) + " is not registered");
  }
  poll_rings_locked();  // see revoke_key()
  // The region stays in grants_ (so nothing overlapping is registered meanwhile), but
  // exports from it are refused while peers stop using its keys, before the memory goes.
  RDMAFLOW_ASSIGN_OR_RETURN(const std::vector<uint64_t> gone, grants_.revoke_region(region));
  it->second.closing = true;
  Status st = confirm_revoked(lock, gone, op);
  lock.lock();
  if (stopped()) return Status::ok();
  it = regions_.find(region);
  if (it == regions_.end()) return st;
  (void)grants_.remove_region(region);  // no grant left in it: exports were refused
  ucp_mem_unmap(context_, it->second.memh);
  if (it->second.shm.fd >= 0) {
    // Every peer confirmed dropping its keys (above); take the pages back private.
    shm::unshare_in_place(it->second.shm);
  }
  regions_.erase(it);
  return st;
}

Result<RemoteKey> UcxCore::export_key(const void* addr, size_t len) {
  const char* op = "export key";
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (stopped()) return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "transport is shut down");
  // Refuses a range not inside one region, with the reason.
  RDMAFLOW_ASSIGN_OR_RETURN(RemoteKey key, grants_.grant(addr, len));
  const std::optional<RegionId> rid = grants_.region_of(addr, len);
  auto r = rid ? regions_.find(*rid) : regions_.end();
  if (r == regions_.end() || r->second.closing) {
    (void)grants_.revoke(key);  // nobody has seen it
    return RDMAFLOW_ERROR(Code::kNotFound, op, -1,
                          "the region holding " + std::to_string(len) + " bytes at " +
                              std::to_string(key.addr) + " is being deregistered");
  }
  key.blob = r->second.rkey;
  return key;
}

Status UcxCore::query_grant(uint64_t key_id, const KeySecret& secret, uint32_t channel, int peer,
                            uint64_t* addr, uint64_t* len, uint64_t* rkey_sum, DirectInfo* direct) {
  const char* op = "key query";
  RDMAFLOW_ASSIGN_OR_RETURN(const GrantTable::GrantInfo g,
                            grants_.lookup(key_id, secret, op, peer));
  auto r = regions_.find(g.region);  // always there: a live grant's region is not closing
  if (r == regions_.end()) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, peer,
                          "key id " + std::to_string(key_id) + " lies in no registered region");
  }
  std::vector<uint32_t>& users = queried_by_[key_id];
  if (std::find(users.begin(), users.end(), channel) == users.end()) users.push_back(channel);
  *addr = g.addr;
  *len = g.len;
  *rkey_sum = rkey_checksum(r->second.rkey);
  if (direct != nullptr) {
    direct->fd = r->second.shm.fd;
    if (r->second.shm.fd >= 0) {
      direct->region = g.region;
      direct->base = r->second.shm.base;
      direct->length = r->second.shm.length;
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
  std::unique_lock<std::mutex> lock(worker_mu_);
  if (stopped()) return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "transport is shut down");
  // Notifies already published in our rings were checked by their writers against
  // the grants still valid: deliver them before the grant goes.
  poll_rings_locked();
  // From here on the receive paths refuse the key (am path, key queries, ring entries).
  RDMAFLOW_RETURN_IF_ERROR(grants_.revoke(key));
  return confirm_revoked(lock, {key.key_id}, op);
}

Status UcxCore::confirm_revoked(std::unique_lock<std::mutex>& lock,
                                const std::vector<uint64_t>& key_ids, const char* op) {
  // Peers that cached an rkey or a mapping for one of the keys must drop it and
  // confirm, after their last put/get or copy with it completed.
  std::map<uint32_t, std::vector<uint64_t>> per_channel;
  for (uint64_t id : key_ids) {
    auto it = queried_by_.find(id);
    if (it == queried_by_.end()) continue;
    for (uint32_t c : it->second) per_channel[c].push_back(id);
    queried_by_.erase(it);
  }
  auto remaining = std::make_shared<std::atomic<int>>(0);
  const uint64_t round = next_round_++;
  std::vector<int> ranks;
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
  if (rr.waiting.empty()) {
    lock.unlock();
    return Status::ok();
  }
  remaining->store(static_cast<int>(rr.waiting.size()));
  rounds_.emplace(round, std::move(rr));
  pass_locked();
  lock.unlock();
  dispatch();
  const Millis timeout = default_timeout();
  wait_control([&] { return remaining->load() == 0; }, Clock::now() + timeout);
  if (remaining->load() == 0) return Status::ok();
  {
    std::lock_guard<std::mutex> relock(worker_mu_);
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
