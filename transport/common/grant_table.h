// Registered regions and the grants (RemoteKeys) exported from them, for
// every backend: the overlap checks of registration, the key id and random
// secret of each grant, and the checks an access or a claim must pass.
//
// A peer names a grant by key id and proves it with the grant's secret. Where
// the backend places the bytes itself (tcp; ucx's active messages and notify
// ring entries) the table resolves (key, secret, offset, length) to local
// memory; where the NIC does (verbs) it checks a peer's claim on an absolute
// address range and the NIC tag (rkey) the grant was made with; where a peer
// asks before it caches a key (ucx's rma and direct paths) it looks the grant
// up. Either way an unknown key is refused with kNotFound, a wrong secret for a
// live key with kUnauthenticated (a forgery: the backend fails the channel that
// presented it instead of answering, so a peer cannot guess secrets one refusal at
// a time) and a range outside the grant with kOutOfRange, naming the operation and
// the peer. Thread safe: user threads register and export, progress threads
// resolve. The table never calls out while holding its lock, so a backend may
// call it under a lock of its own (ucx does, under its worker lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "allocator/registrar.h"
#include "common/status.h"
#include "transport/remote_key.h"

namespace rdmaflow {

// The channel failure for a wrong secret (`refusal`, kUnauthenticated) presented
// by `peer`, logged. Answering would let a peer test secrets one refusal at a
// time, so the backend fails the channel with this instead.
Status forged_secret_failure(const char* backend, const Status& refusal, int peer);

class GrantTable {
 public:
  // What a grant covers: its range and the region it lies in.
  struct GrantInfo {
    uint64_t addr = 0;
    uint64_t len = 0;
    RegionId region = 0;
  };
  // What became of a key id, whatever secret comes with it.
  enum class KeyState : uint8_t { kLive, kRevoked, kNeverIssued };

  // `backend` names the keys (RemoteKey::backend) and the errors.
  explicit GrantTable(std::string backend);

  // Refuses empty, wrapping and overlapping ranges.
  Result<RegionId> add_region(void* addr, size_t len);
  // Also revokes every grant inside the region; returns their key ids (the
  // backend may tell its peers).
  Result<std::vector<uint64_t>> remove_region(RegionId id);
  // Revokes every grant inside the region but keeps it registered, for a backend
  // that must hear from its peers before the memory goes (then remove_region()).
  Result<std::vector<uint64_t>> revoke_region(RegionId id);
  // The region holding all of [addr, addr + len), if one does.
  std::optional<RegionId> region_of(const void* addr, size_t len) const;

  // A grant of [addr, addr + len), which must lie inside one region. `tag` is
  // what the backend's NIC checks as well (the verbs rkey); 0 where none. The
  // secret comes from key_secret() (key_secret.h).
  Result<RemoteKey> grant(const void* addr, size_t len, uint32_t tag = 0);
  // kNotFound unless `key` is a live grant of this table (right backend and secret).
  Status revoke(const RemoteKey& key);

  // The checks below, one acquisition of the table's lock for many of them (a
  // receive path checking a batch of entries). Hold it only across checks: grant()
  // and revoke() wait for it, so never call them, or anything that may, meanwhile.
  class Reader {
   public:
    explicit Reader(const GrantTable& table) : table_(table), lock_(table.mu_) {}
    Status resolve(uint64_t key_id, const KeySecret& secret, uint64_t offset, uint64_t len,
                   uint8_t** out, const char* op, int peer) const;
    Status check(uint64_t key_id, const KeySecret& secret, uint32_t tag, uint64_t addr,
                 uint64_t len, const char* op, int peer) const;
    Result<GrantInfo> lookup(uint64_t key_id, const KeySecret& secret, const char* op,
                             int peer) const;
    KeyState state(uint64_t key_id) const;

   private:
    const GrantTable& table_;
    std::shared_lock<std::shared_mutex> lock_;
  };

  // Resolves [offset, offset + len) of grant `key_id` to local memory. Refuses
  // unknown keys with kNotFound, wrong secrets with kUnauthenticated, ranges outside the grant with
  // kOutOfRange; `op` and `peer` name the access in the returned error.
  Status resolve(uint64_t key_id, const KeySecret& secret, uint64_t offset, uint64_t len,
                 uint8_t** out, const char* op, int peer) const {
    return Reader(*this).resolve(key_id, secret, offset, len, out, op, peer);
  }
  // A peer's claim that grant `key_id` (with `secret` and NIC `tag`) covers the
  // absolute range [addr, addr + len): OK, or kNotFound / kOutOfRange.
  Status check(uint64_t key_id, const KeySecret& secret, uint32_t tag, uint64_t addr, uint64_t len,
               const char* op, int peer) const {
    return Reader(*this).check(key_id, secret, tag, addr, len, op, peer);
  }
  // The range and region of grant `key_id`, proven by `secret` (a peer confirming a
  // key before it caches it); kNotFound as resolve().
  Result<GrantInfo> lookup(uint64_t key_id, const KeySecret& secret, const char* op,
                           int peer) const {
    return Reader(*this).lookup(key_id, secret, op, peer);
  }
  // Live, revoked, or never handed out here: tells an access a peer checked before
  // the key was revoked from one naming a key this table never made.
  KeyState state(uint64_t key_id) const { return Reader(*this).state(key_id); }

  // The access fence. A receive path resolves a grant once per chunk but places
  // the chunk's bytes over several reads of the socket; revoke() and
  // remove_region() must not return while such a placement is still writing.
  // So every access to resolved memory runs between enter(gen) and leave(gen),
  // where gen is generation() read before the resolve. Revoking bumps the
  // generation and waits until no access that entered under the old one is left
  // (one bounded memcpy or socket read). enter() refuses a stale generation: the
  // caller resolves again (the grant may be gone) and retries with the new one.
  uint64_t generation() const { return generation_.load(std::memory_order_seq_cst); }
  // After enter() refused: is [offset, offset + len) of the grant still granted, at
  // the address resolved before? OK, or why not (kNotFound when it moved).
  Status recheck(uint64_t key_id, const KeySecret& secret, uint64_t offset, uint64_t len,
                 const uint8_t* expected, const char* op, int peer) const;
  bool enter(uint64_t gen) const;
  void leave(uint64_t gen) const;

 private:
  struct Region {
    RegionId id;
    uintptr_t addr;
    size_t len;
  };
  struct Grant {
    KeySecret secret;
    uintptr_t addr;
    uint64_t len;
    RegionId region;
    uint32_t tag;
  };
  // The grant `key_id` proven by `secret`, or why not (mu_ held).
  Result<const Grant*> find(uint64_t key_id, const KeySecret& secret, const char* op,
                            int peer) const;
  // Takes the grants inside region `id` out of the table (mu_ held).
  void take_grants_locked(RegionId id, std::vector<uint64_t>& revoked);

  // Bumps the generation and waits out the accesses that entered under the old one.
  void fence();

  mutable std::shared_mutex mu_;
  std::mutex fence_mu_;  // one fence at a time, so each waits on its own parity
  std::atomic<uint64_t> generation_{0};
  mutable std::atomic<int64_t> active_[2] = {0, 0};  // accesses in progress, by generation parity
  std::map<uintptr_t, Region> regions_;              // by start address
  std::unordered_map<RegionId, uintptr_t> region_start_;
  std::unordered_map<uint64_t, Grant> grants_;
  RegionId next_region_ = 1;
  uint64_t first_key_ = 1;  // key ids handed out: [first_key_, next_key_)
  uint64_t next_key_ = 1;
  const std::string backend_;
};

}  // namespace rdmaflow
