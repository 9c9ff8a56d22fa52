// PeerMemory: a same-host peer's memory mapped into this process, and the one
// bounds-checked copy every same-host data path uses to reach it.
//
// A mapping comes from the peer's memfd (shared_pages.h: map_peer_memfd), or
// from Channel::direct_view, which hands out part of such a mapping. Both
// users of the same-host path copy through PeerMemory: UCX's direct channel,
// which carries Channel::write / read to a same-host peer (and so the
// Session's transfers), and MemoryChannel (memory_channel.h), which the
// collectives drive with put and signal. An access outside the mapping is a
// caller's bug: it is refused with kOutOfRange and touches nothing, so no path
// ever writes past what the peer granted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "common/status.h"

namespace rdmaflow::shm {

class PeerMemory {
 public:
  PeerMemory() = default;  // maps nothing; every access is refused
  // [data, data + length) of the memory of peer `peer_rank`, mapped while `keep` lives.
  PeerMemory(std::byte* data, size_t length, std::shared_ptr<void> keep, int peer_rank)
      : data_(data), length_(length), keep_(std::move(keep)), peer_(peer_rank) {}

  bool mapped() const { return data_ != nullptr; }
  std::byte* data() const { return data_; }
  size_t length() const { return length_; }
  int peer_rank() const { return peer_; }
  // Whoever holds this keeps the mapping alive, even after the channel it came from failed.
  const std::shared_ptr<void>& keep() const { return keep_; }

  // [offset, offset + len) lies inside the mapping.
  bool covers(uint64_t offset, uint64_t len) const {
    return offset <= length_ && len <= length_ - offset;
  }

  // Copies [src, src + len) to `offset` of the peer's memory.
  Status put(uint64_t offset, const void* src, size_t len) const {
    if (!covers(offset, len) || data_ == nullptr) [[unlikely]] {
      return refuse("put", offset, len);
    }
    std::memcpy(data_ + offset, src, len);
    return Status::ok();
  }
  // Copies `len` bytes at `offset` of the peer's memory to `dst`.
  Status get(uint64_t offset, void* dst, size_t len) const {
    if (!covers(offset, len) || data_ == nullptr) [[unlikely]] {
      return refuse("get", offset, len);
    }
    std::memcpy(dst, data_ + offset, len);
    return Status::ok();
  }
  // Release store of the 8-byte aligned word at `offset`: whoever reads the
  // value with acquire order also sees every store this thread made before.
  Status store_release(uint64_t offset, uint64_t value) const {
    if (!covers(offset, 8) || (reinterpret_cast<uintptr_t>(data_) + offset) % 8 != 0) [[unlikely]] {
      return refuse("signal", offset, 8);
    }
    std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(data_ + offset))
        .store(value, std::memory_order_release);
    return Status::ok();
  }

 private:
  [[gnu::cold]] Status refuse(const char* op, uint64_t offset, uint64_t len) const;

  std::byte* data_ = nullptr;
  size_t length_ = 0;
  std::shared_ptr<void> keep_;
  int peer_ = -1;
};

}  // namespace rdmaflow::shm
