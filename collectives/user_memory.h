// UserMemory: buffers a caller allocated through the communicator
// (Communicator::allocate_registered, rdmaflow.torch.empty), registered with
// every transport the communicator's peers use, so that a send from them to a
// peer whose backend needs a registered source (verbs) is posted straight
// from the buffer instead of being copied into the send staging first.
//
// Lifetime. A buffer is owned by its RegisteredBuffer (a tensor's deleter
// holds it); the registry only looks ranges up. Either may go first:
// - the buffer freed while the communicator lives: it is deregistered from
//   every transport, then its memory is unmapped;
// - the communicator destroyed while buffers live: close() deregisters them
//   all before the transports go (the fabric calls it in its destructor); the
//   memory stays mapped and usable as plain memory until its owner frees it.
// The mutex serializes both, so a transport never sees a region deregistered
// twice or after close().
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace rdmaflow {

class UserMemory;

// One allocation; frees itself (deregistering first if still registered).
class RegisteredBuffer {
 public:
  ~RegisteredBuffer();
  RegisteredBuffer(const RegisteredBuffer&) = delete;
  RegisteredBuffer& operator=(const RegisteredBuffer&) = delete;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  friend class UserMemory;
  RegisteredBuffer() = default;
  void* data_ = nullptr;
  size_t size_ = 0;    // what the caller asked for
  size_t mapped_ = 0;  // rounded up to whole pages
  std::weak_ptr<UserMemory> registry_;
};

class UserMemory : public std::enable_shared_from_this<UserMemory> {
 public:
  explicit UserMemory(std::vector<Transport*> transports) : transports_(std::move(transports)) {}

  // Maps `bytes` (at least one page, zero-filled) and registers it with every
  // transport. Fails with kResourceExhausted or the transport's error, naming it.
  Result<std::shared_ptr<RegisteredBuffer>> allocate(size_t bytes);
  // True when [p, p + len) lies inside one live registered buffer. Cheap: a
  // map lookup under a mutex; the executor asks once per large piece.
  bool contains(const void* p, size_t len) const;
  // Deregisters every live buffer (the communicator is going away).
  void close();
  size_t live_buffers() const;

 private:
  friend class RegisteredBuffer;
  struct Entry {
    size_t len;
    std::vector<std::pair<Transport*, RegionId>> regions;
  };
  void release(void* data);  // a buffer is being freed
  void deregister(Entry& e);

  std::vector<Transport*> transports_;  // distinct
  mutable std::mutex mu_;
  bool closed_ = false;
  std::map<const std::byte*, Entry> live_;  // by start address
};

}  // namespace rdmaflow
