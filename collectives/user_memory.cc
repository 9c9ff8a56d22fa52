#include "collectives/user_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/log.h"

namespace rdmaflow {

RegisteredBuffer::~RegisteredBuffer() {
  if (auto registry = registry_.lock()) registry->release(data_);
  if (data_ != nullptr) munmap(data_, mapped_);
}

Result<std::shared_ptr<RegisteredBuffer>> UserMemory::allocate(size_t bytes) {
  const char* op = "allocate registered memory";
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Whole pages: verbs pins pages, and a buffer never shares one with another.
  const size_t mapped = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  if (mapped < bytes) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          std::to_string(bytes) + " bytes is too large");
  }
  void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    return RDMAFLOW_ERROR(
        Code::kResourceExhausted, op, -1,
        "cannot map " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  }
  std::shared_ptr<RegisteredBuffer> buf(new RegisteredBuffer());
  buf->data_ = data;
  buf->size_ = bytes;
  buf->mapped_ = mapped;
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) {
    return RDMAFLOW_ERROR(Code::kCancelled, op, -1, "the communicator is closed");
  }
  Entry e{mapped, {}};
  for (Transport* t : transports_) {
    auto region = t->register_memory(data, mapped);
    if (!region.is_ok()) {
      deregister(e);
      return region.status().with_op(op);  // buf unmaps (not yet in the registry)
    }
    e.regions.emplace_back(t, *region);
  }
  live_.emplace(static_cast<const std::byte*>(data), std::move(e));
  buf->registry_ = weak_from_this();
  return buf;
}

bool UserMemory::contains(const void* p, size_t len) const {
  const auto* b = static_cast<const std::byte*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(b);
  if (it == live_.begin()) return false;
  --it;
  return b + len <= it->first + it->second.len;
}

void UserMemory::deregister(Entry& e) {
  for (auto& [t, region] : e.regions) {
    Status st = t->deregister_memory(region);
    if (!st.is_ok()) RDMAFLOW_LOG_DEBUG("collectives: {}", st.to_string());
  }
  e.regions.clear();
}

void UserMemory::release(void* data) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(static_cast<const std::byte*>(data));
  if (it == live_.end()) return;  // closed already
  deregister(it->second);
  live_.erase(it);
}

void UserMemory::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  for (auto& [start, e] : live_) deregister(e);
  live_.clear();
}

size_t UserMemory::live_buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}

}  // namespace rdmaflow
