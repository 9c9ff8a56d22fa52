#include "transport/common/grant_table.h"

#include <mutex>
#include <string>
#include <thread>

#include "common/log.h"
#include "common/tsan.h"
#include "transport/common/key_secret.h"

namespace rdmaflow {

Status forged_secret_failure(const char* backend, const Status& refusal, int peer) {
  RDMAFLOW_LOG_WARN("{}: closing the channel to rank {}: {}", backend, peer, refusal.reason());
  return RDMAFLOW_ERROR(
      Code::kUnauthenticated, "receive", peer,
      "peer rank " + std::to_string(peer) + " presented a forged key secret: " + refusal.reason());
}

GrantTable::GrantTable(std::string backend) : backend_(std::move(backend)) {
  // Key ids are not secrets, but they should not be 1, 2, 3 in every run (a stale
  // key from an earlier run would name a live grant); without randomness they are.
  auto r = key_random64();
  first_key_ = next_key_ = (r.is_ok() ? (*r & 0xffff) : 0) + 1;
}

Result<RegionId> GrantTable::add_region(void* addr, size_t len) {
  if (addr == nullptr || len == 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "register memory", -1,
                          "empty region (addr " +
                              std::to_string(reinterpret_cast<uintptr_t>(addr)) + ", " +
                              std::to_string(len) + " bytes)");
  }
  auto start = reinterpret_cast<uintptr_t>(addr);
  if (start + len < start) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "register memory", -1, "region wraps around");
  }
  std::unique_lock lock(mu_);
  auto next = regions_.lower_bound(start);
  const Region* overlap = nullptr;
  if (next != regions_.end() && next->first < start + len) overlap = &next->second;
  if (overlap == nullptr && next != regions_.begin()) {
    auto prev = std::prev(next);
    if (prev->second.addr + prev->second.len > start) overlap = &prev->second;
  }
  if (overlap != nullptr) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "register memory", -1,
                          "range overlaps region " + std::to_string(overlap->id) +
                              " already registered with the " + backend_ + " transport");
  }
  RegionId id = next_region_++;
  regions_.emplace(start, Region{id, start, len});
  region_start_.emplace(id, start);
  return id;
}

void GrantTable::take_grants_locked(RegionId id, std::vector<uint64_t>& revoked) {
  std::erase_if(grants_, [&](const auto& kv) {
    if (kv.second.region != id) return false;
    revoked.push_back(kv.first);
    return true;
  });
}

Result<std::vector<uint64_t>> GrantTable::remove_region(RegionId id) {
  std::vector<uint64_t> revoked;
  {
    std::unique_lock lock(mu_);
    auto it = region_start_.find(id);
    if (it == region_start_.end()) {
      return RDMAFLOW_ERROR(Code::kNotFound, "deregister memory", -1,
                            "region " + std::to_string(id) + " is not registered");
    }
    regions_.erase(it->second);
    region_start_.erase(it);
    take_grants_locked(id, revoked);
  }
  fence();
  return revoked;
}

Result<std::vector<uint64_t>> GrantTable::revoke_region(RegionId id) {
  std::vector<uint64_t> revoked;
  {
    std::unique_lock lock(mu_);
    if (!region_start_.count(id)) {
      return RDMAFLOW_ERROR(Code::kNotFound, "deregister memory", -1,
                            "region " + std::to_string(id) + " is not registered");
    }
    take_grants_locked(id, revoked);
  }
  fence();
  return revoked;
}

std::optional<RegionId> GrantTable::region_of(const void* addr, size_t len) const {
  const auto start = reinterpret_cast<uintptr_t>(addr);
  std::shared_lock lock(mu_);
  auto it = regions_.upper_bound(start);
  if (it == regions_.begin()) return std::nullopt;
  --it;
  const Region& r = it->second;
  const uint64_t off = start - r.addr;
  if (off > r.len || len > r.len - off) return std::nullopt;
  return r.id;
}

Result<RemoteKey> GrantTable::grant(const void* addr, size_t len, uint32_t tag) {
  auto start = reinterpret_cast<uintptr_t>(addr);
  std::unique_lock lock(mu_);
  auto it = regions_.upper_bound(start);
  if (it == regions_.begin() || addr == nullptr || start + len < start) {
    return RDMAFLOW_ERROR(Code::kNotFound, "export key", -1,
                          std::to_string(len) + " bytes at " + std::to_string(start) +
                              " are not inside a region registered with the " + backend_ +
                              " transport");
  }
  --it;
  const Region& r = it->second;
  if (start + len > r.addr + r.len) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, "export key", -1,
                          "range of " + std::to_string(len) + " bytes at offset " +
                              std::to_string(start - r.addr) + " runs past the end of region " +
                              std::to_string(r.id) + " (" + std::to_string(r.len) + " bytes)");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(const KeySecret secret, key_secret());
  RemoteKey key;
  key.backend = backend_;
  key.key_id = next_key_++;
  key.secret = secret;
  key.addr = start;
  key.length = len;
  grants_.emplace(key.key_id, Grant{key.secret, start, len, r.id, tag});
  return key;
}

Status GrantTable::revoke(const RemoteKey& key) {
  {
    std::unique_lock lock(mu_);
    auto it = grants_.find(key.key_id);
    if (key.backend != backend_ || it == grants_.end() || !it->second.secret.matches(key.secret)) {
      return RDMAFLOW_ERROR(Code::kNotFound, "revoke key", -1,
                            "key id " + std::to_string(key.key_id) + " is not an active " +
                                backend_ + " grant (never exported here, or already revoked)");
    }
    grants_.erase(it);
  }
  fence();
  return Status::ok();
}

Status GrantTable::recheck(uint64_t key_id, const KeySecret& secret, uint64_t offset, uint64_t len,
                           const uint8_t* expected, const char* op, int peer) const {
  uint8_t* p = nullptr;
  RDMAFLOW_RETURN_IF_ERROR(resolve(key_id, secret, offset, len, &p, op, peer));
  if (p != expected) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, peer,
                          "key id " + std::to_string(key_id) + " now grants other memory");
  }
  return Status::ok();
}

// Between enter() and leave() the thread acts for the peer, whose accesses
// ThreadSanitizer does not track (common/tsan.h, PeerAccess).
bool GrantTable::enter(uint64_t gen) const {
  // Pairs with fence(): either fence() sees this access counted, or this access
  // sees the new generation (both sides are sequentially consistent).
  auto& active = active_[gen & 1];
  active.fetch_add(1, std::memory_order_seq_cst);
  if (generation_.load(std::memory_order_seq_cst) == gen) {
    PeerAccess::begin();
    return true;
  }
  active.fetch_sub(1, std::memory_order_seq_cst);
  return false;
}

void GrantTable::leave(uint64_t gen) const {
  PeerAccess::end();
  active_[gen & 1].fetch_sub(1, std::memory_order_release);
}

void GrantTable::fence() {
  std::lock_guard<std::mutex> lock(fence_mu_);
  const uint64_t old = generation_.fetch_add(1, std::memory_order_seq_cst);
  // Accesses are one memcpy from the staging buffer or one socket read (bounded by
  // SO_RCVTIMEO when blocking): a short wait.
  while (active_[old & 1].load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
}

Result<const GrantTable::Grant*> GrantTable::find(uint64_t key_id, const KeySecret& secret,
                                                  const char* op, int peer) const {
  auto it = grants_.find(key_id);
  if (it == grants_.end()) {
    return RDMAFLOW_ERROR(
        Code::kNotFound, op, peer,
        "unknown key id " + std::to_string(key_id) + " (never exported here, or revoked)");
  }
  if (!it->second.secret.matches(secret)) {
    return RDMAFLOW_ERROR(
        Code::kUnauthenticated, op, peer,
        "wrong secret for key id " + std::to_string(key_id) + " (forged or stale key)");
  }
  return &it->second;
}

Status GrantTable::Reader::resolve(uint64_t key_id, const KeySecret& secret, uint64_t offset,
                                   uint64_t len, uint8_t** out, const char* op, int peer) const {
  RDMAFLOW_ASSIGN_OR_RETURN(const Grant* g, table_.find(key_id, secret, op, peer));
  if (!(offset <= g->len && len <= g->len - offset)) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer,
                          "offset " + std::to_string(offset) + " + length " + std::to_string(len) +
                              " exceeds the " + std::to_string(g->len) +
                              " bytes granted by key id " + std::to_string(key_id));
  }
  *out = reinterpret_cast<uint8_t*>(g->addr + offset);
  return Status::ok();
}

Status GrantTable::Reader::check(uint64_t key_id, const KeySecret& secret, uint32_t tag,
                                 uint64_t addr, uint64_t len, const char* op, int peer) const {
  RDMAFLOW_ASSIGN_OR_RETURN(const Grant* g, table_.find(key_id, secret, op, peer));
  if (g->tag != tag) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, peer,
                          "key id " + std::to_string(key_id) +
                              " names another memory registration (forged or stale key)");
  }
  if (!(addr >= g->addr && addr - g->addr <= g->len && len <= g->len - (addr - g->addr))) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, op, peer,
                          "key id " + std::to_string(key_id) + " claims " + std::to_string(len) +
                              " bytes at offset " + std::to_string(addr - g->addr) + " of a " +
                              std::to_string(g->len) + "-byte grant");
  }
  return Status::ok();
}

Result<GrantTable::GrantInfo> GrantTable::Reader::lookup(uint64_t key_id, const KeySecret& secret,
                                                         const char* op, int peer) const {
  RDMAFLOW_ASSIGN_OR_RETURN(const Grant* g, table_.find(key_id, secret, op, peer));
  return GrantInfo{g->addr, g->len, g->region};
}

GrantTable::KeyState GrantTable::Reader::state(uint64_t key_id) const {
  if (table_.grants_.count(key_id)) return KeyState::kLive;
  if (key_id >= table_.first_key_ && key_id < table_.next_key_) return KeyState::kRevoked;
  return KeyState::kNeverIssued;
}

}  // namespace rdmaflow
