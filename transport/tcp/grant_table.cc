#include "transport/tcp/grant_table.h"

#include <mutex>
#include <string>
#include <thread>

namespace rdmaflow::tcp {

GrantTable::GrantTable() {
  std::random_device rd;
  std::seed_seq seed{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
  rng_.seed(seed);
  next_key_ = (rng_() & 0xffff) + 1;  // key ids are not secrets, but avoid 1, 2, 3 across runs
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
  auto it = regions_.find(start);
  if (it != regions_.end()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "register memory", -1,
                          "a region starting at this address is already registered (region " +
                              std::to_string(it->second.id) + ")");
  }
  RegionId id = next_region_++;
  regions_.emplace(start, Region{id, start, len});
  region_start_.emplace(id, start);
  return id;
}

Status GrantTable::remove_region(RegionId id) {
  {
    std::unique_lock lock(mu_);
    auto it = region_start_.find(id);
    if (it == region_start_.end()) {
      return RDMAFLOW_ERROR(Code::kNotFound, "deregister memory", -1,
                            "region " + std::to_string(id) + " is not registered");
    }
    regions_.erase(it->second);
    region_start_.erase(it);
    std::erase_if(grants_, [&](const auto& kv) { return kv.second.region == id; });
  }
  fence();
  return Status::ok();
}

Result<RemoteKey> GrantTable::grant(const void* addr, size_t len) {
  auto start = reinterpret_cast<uintptr_t>(addr);
  std::unique_lock lock(mu_);
  auto it = regions_.upper_bound(start);
  if (it == regions_.begin() || addr == nullptr || start + len < start) {
    return RDMAFLOW_ERROR(Code::kNotFound, "export key", -1,
                          std::to_string(len) + " bytes at 0x" + std::to_string(start) +
                              " are not inside a registered region");
  }
  --it;
  const Region& r = it->second;
  if (start + len > r.addr + r.len) {
    return RDMAFLOW_ERROR(Code::kOutOfRange, "export key", -1,
                          "range of " + std::to_string(len) + " bytes at offset " +
                              std::to_string(start - r.addr) + " runs past the end of region " +
                              std::to_string(r.id) + " (" + std::to_string(r.len) + " bytes)");
  }
  RemoteKey key;
  key.backend = "tcp";
  key.key_id = next_key_++;
  key.secret = rng_();
  key.addr = start;
  key.length = len;
  grants_.emplace(key.key_id, Grant{key.secret, start, len, r.id});
  return key;
}

Status GrantTable::revoke(const RemoteKey& key) {
  {
    std::unique_lock lock(mu_);
    auto it = grants_.find(key.key_id);
    if (key.backend != "tcp" || it == grants_.end() || it->second.secret != key.secret) {
      return RDMAFLOW_ERROR(Code::kNotFound, "revoke key", -1,
                            "key id " + std::to_string(key.key_id) + " is not an active tcp grant");
    }
    grants_.erase(it);
  }
  fence();
  return Status::ok();
}

Status GrantTable::recheck(uint64_t key_id, uint64_t secret, uint64_t offset, uint64_t len,
                           const uint8_t* expected, const char* op, int peer) const {
  uint8_t* p = nullptr;
  RDMAFLOW_RETURN_IF_ERROR(resolve(key_id, secret, offset, len, &p, op, peer));
  if (p != expected) {
    return RDMAFLOW_ERROR(Code::kNotFound, op, peer,
                          "key id " + std::to_string(key_id) + " now grants other memory");
  }
  return Status::ok();
}

bool GrantTable::enter(uint64_t gen) const {
  // Pairs with fence(): either fence() sees this access counted, or this access
  // sees the new generation (both sides are sequentially consistent).
  auto& active = active_[gen & 1];
  active.fetch_add(1, std::memory_order_seq_cst);
  if (generation_.load(std::memory_order_seq_cst) == gen) return true;
  active.fetch_sub(1, std::memory_order_seq_cst);
  return false;
}

void GrantTable::leave(uint64_t gen) const {
  active_[gen & 1].fetch_sub(1, std::memory_order_release);
}

void GrantTable::fence() {
  std::lock_guard<std::mutex> lock(fence_mu_);
  const uint64_t old = generation_.fetch_add(1, std::memory_order_seq_cst);
  // Accesses are one memcpy from the staging buffer or one socket read (bounded by
  // SO_RCVTIMEO when blocking): a short wait.
  while (active_[old & 1].load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
}

Status GrantTable::resolve(uint64_t key_id, uint64_t secret, uint64_t offset, uint64_t len,
                           uint8_t** out, const char* op, int peer) const {
  std::shared_lock lock(mu_);
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
  *out = reinterpret_cast<uint8_t*>(g.addr + offset);
  return Status::ok();
}

}  // namespace rdmaflow::tcp
