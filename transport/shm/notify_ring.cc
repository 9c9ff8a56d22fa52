#include "transport/shm/notify_ring.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include "transport/shm/shared_pages.h"

namespace rdmaflow::shm {

NotifyRing::NotifyRing(RingHeader* header, size_t len, uint32_t slots, int fd, int wake_fd)
    : header_(header),
      slot0_(reinterpret_cast<RingSlot*>(reinterpret_cast<uint8_t*>(header) + sizeof(RingHeader))),
      len_(len),
      slots_(slots),
      fd_(fd),
      wake_fd_(wake_fd) {}

NotifyRing::~NotifyRing() {
  ::munmap(header_, len_);
  if (fd_ >= 0) ::close(fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

bool NotifyRing::wake() const {
  if (wake_fd_ < 0) return false;
  const uint64_t one = 1;
  // EAGAIN (the counter is full) still leaves the eventfd readable: the owner wakes.
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  return true;
}

Result<std::shared_ptr<NotifyRing>> NotifyRing::create(uint32_t slots) {
  const char* op = "create notify ring";
  if (slots == 0 || slots > kMaxSlots) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "ring of " + std::to_string(slots) + " slots");
  }
  const size_t len = bytes(slots);
  const int fd = ::memfd_create("rdmaflow-ucx-ring", MFD_CLOEXEC);
  if (fd < 0) {
    return RDMAFLOW_ERROR(Code::kNotViable, op, -1,
                          std::string("memfd_create: ") + std::strerror(errno));
  }
  if (::ftruncate(fd, static_cast<off_t>(len)) != 0) {
    const int err = errno;
    ::close(fd);
    return RDMAFLOW_ERROR(Code::kNotViable, op, -1,
                          std::string("ftruncate: ") + std::strerror(err));
  }
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return RDMAFLOW_ERROR(Code::kNotViable, op, -1, std::string("mmap: ") + std::strerror(err));
  }
  auto* h = new (p) RingHeader();
  h->slots = slots;
  return std::shared_ptr<NotifyRing>(new NotifyRing(h, len, slots, fd));
}

Result<std::shared_ptr<NotifyRing>> NotifyRing::map_peer(int pidfd, int remote_fd, uint32_t slots,
                                                         int remote_wake_fd) {
  const char* op = "map notify ring";
  if (slots == 0 || slots > kMaxSlots) {
    return RDMAFLOW_ERROR(Code::kProtocolError, op, -1,
                          "the peer announced a ring of " + std::to_string(slots) + " slots");
  }
  const size_t len = bytes(slots);
  RDMAFLOW_ASSIGN_OR_RETURN(uint8_t * p, map_peer_memfd(pidfd, remote_fd, len));
  auto* h = reinterpret_cast<RingHeader*>(p);
  if (h->magic != RingHeader::kMagic || h->slots != slots) {
    ::munmap(p, len);
    return RDMAFLOW_ERROR(Code::kProtocolError, op, -1,
                          "the peer's descriptor is not its notify ring");
  }
  // Without the owner's eventfd (none announced, or not an eventfd) the writer
  // wakes the owner with a message instead.
  int wake_fd = -1;
  if (remote_wake_fd >= 0) {
    auto fetched = fetch_peer_eventfd(pidfd, remote_wake_fd);
    if (fetched.is_ok()) wake_fd = *fetched;
  }
  return std::shared_ptr<NotifyRing>(new NotifyRing(h, len, slots, -1, wake_fd));
}

}  // namespace rdmaflow::shm
