#include "transport/shm/shared_pages.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace rdmaflow::shm {

namespace {

const char* kOp = "share memory";

Status refuse(const std::string& why) {
  return RDMAFLOW_ERROR(Code::kNotViable, kOp, -1, why);
}

std::string errno_text(const char* call) {
  return std::string(call) + ": " + std::strerror(errno);
}

// One line of /proc/self/maps.
struct Vma {
  uintptr_t lo = 0, hi = 0;
  std::string perms;
  uint64_t offset = 0;
  uint64_t inode = 0;
  std::string path;
};

// True when the mappings overlapping [lo, hi) tile it and each satisfies `ok`
// (which sets *why when it does not).
template <typename Ok>
bool every_vma(uintptr_t lo, uintptr_t hi, Ok ok, std::string* why) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  uintptr_t covered = lo;
  while (covered < hi && std::getline(maps, line)) {
    std::istringstream in(line);
    Vma v;
    std::string range, off, dev;
    in >> range >> v.perms >> off >> dev >> v.inode;
    std::getline(in >> std::ws, v.path);
    const size_t dash = range.find('-');
    v.lo = std::stoull(range.substr(0, dash), nullptr, 16);
    v.hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    v.offset = std::stoull(off, nullptr, 16);
    if (v.hi <= covered) continue;
    if (v.lo > covered) break;
    if (!ok(v)) return false;
    covered = v.hi;
  }
  if (covered < hi) {
    *why = "part of the range is not mapped";
    return false;
  }
  return true;
}

// The pages moved here belong to the region's owner, who may have poisoned parts
// of them for ASan (the arena poisons its free blocks). Moving a page is not a
// use of its bytes, so under ASan these two read and copy uninstrumented (and
// volatile, so the loop does not become an intercepted memcpy call).
#if defined(__SANITIZE_ADDRESS__)
#define RDMAFLOW_SHM_RAW 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RDMAFLOW_SHM_RAW 1
#endif
#endif

#ifdef RDMAFLOW_SHM_RAW
__attribute__((no_sanitize("address"))) bool all_zero(const uint8_t* p, size_t n) {
  const auto* w = reinterpret_cast<const volatile uint64_t*>(p);
  for (size_t i = 0; i < n / 8; ++i) {
    if (w[i] != 0) return false;
  }
  return true;
}
// Whole pages: n is a multiple of 8.
__attribute__((no_sanitize("address"))) void copy_raw(uint8_t* dst, const uint8_t* src, size_t n) {
  auto* d = reinterpret_cast<volatile uint64_t*>(dst);
  const auto* s = reinterpret_cast<const volatile uint64_t*>(src);
  for (size_t i = 0; i < n / 8; ++i) d[i] = s[i];
  for (size_t i = n / 8 * 8; i < n; ++i) reinterpret_cast<volatile uint8_t*>(dst)[i] = src[i];
}
#else
bool all_zero(const uint8_t* p, size_t n) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  for (size_t i = 0; i < n / 8; ++i) {
    if (w[i] != 0) return false;
  }
  return true;
}
void copy_raw(uint8_t* dst, const uint8_t* src, size_t n) {
  std::memcpy(dst, src, n);
}
#endif

// Copies `len` bytes page by page, skipping all-zero source pages (the
// destination reads as zero there already), so untouched memory stays unallocated.
void copy_nonzero_pages(uint8_t* dst, const uint8_t* src, size_t len, size_t page) {
  for (size_t at = 0; at < len; at += page) {
    const size_t n = std::min(page, len - at);
    if (!all_zero(src + at, n)) copy_raw(dst + at, src + at, n);
  }
}

// Copies the pages of private anonymous [src, src + len) that were ever touched
// (present or swapped out, per /proc/self/pagemap); the others read as zero, and
// reading them would only fault in the zero page, one fault per page.
void copy_touched_pages(uint8_t* dst, const uint8_t* src, size_t len, size_t page) {
  const int pm = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pm < 0) return copy_nonzero_pages(dst, src, len, page);
  constexpr size_t kBatch = 512;
  uint64_t entries[kBatch];
  const size_t pages = len / page;
  for (size_t first = 0; first < pages; first += kBatch) {
    const size_t n = std::min(kBatch, pages - first);
    const off_t at = static_cast<off_t>((reinterpret_cast<uintptr_t>(src) / page + first) * 8);
    if (::pread(pm, entries, n * 8, at) != static_cast<ssize_t>(n * 8)) {
      copy_nonzero_pages(dst + first * page, src + first * page, len - first * page, page);
      break;
    }
    for (size_t k = 0; k < n; ++k) {
      if ((entries[k] >> 62) == 0) continue;  // neither present (bit 63) nor swapped (62)
      const size_t off = (first + k) * page;
      if (!all_zero(src + off, page)) copy_raw(dst + off, src + off, page);
    }
  }
  ::close(pm);
}

// Copies the parts of the memfd mapped at [src, src + len) that hold data (holes
// read as zero).
void copy_memfd_data(uint8_t* dst, const uint8_t* src, size_t len, int memfd, size_t page) {
  off_t at = 0;
  const auto end = static_cast<off_t>(len);
  while (at < end) {
    const off_t data = ::lseek(memfd, at, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) return;  // no data after `at`
      return copy_nonzero_pages(dst + at, src + at, len - static_cast<size_t>(at), page);
    }
    if (data >= end) return;
    off_t hole = ::lseek(memfd, data, SEEK_HOLE);
    if (hole < 0 || hole > end) hole = end;
    copy_raw(dst + data, src + data, static_cast<size_t>(hole - data));
    at = hole;
  }
}

}  // namespace

Result<SharedRange> share_in_place(void* region, size_t region_len) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(region);
  const uintptr_t lo = (start + page - 1) / page * page;
  const uintptr_t hi = (start + region_len) / page * page;
  if (hi <= lo) return refuse("the region holds no whole page");
  void* addr = reinterpret_cast<void*>(lo);
  const size_t len = hi - lo;
  std::string why;
  auto anonymous = [&](const Vma& v) {
    // Not a file, hugetlb page or stack: plain private anonymous read/write memory.
    if (v.perms.compare(0, 4, "rw-p") == 0 && v.inode == 0 &&
        (v.path.empty() || v.path == "[heap]")) {
      return true;
    }
    why = "the range is not private anonymous read/write memory (" + v.perms + " " + v.path + ")";
    return false;
  };
  if (!every_vma(lo, hi, anonymous, &why)) return refuse(why);
  const int fd = ::memfd_create("rdmaflow-ucx", MFD_CLOEXEC);
  if (fd < 0) return refuse(errno_text("memfd_create"));
  if (::ftruncate(fd, static_cast<off_t>(len)) != 0) {
    why = errno_text("ftruncate");
    ::close(fd);
    return refuse(why);
  }
  void* tmp = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (tmp == MAP_FAILED) {
    why = errno_text("mmap");
    ::close(fd);
    return refuse(why);
  }
  copy_touched_pages(static_cast<uint8_t*>(tmp), static_cast<const uint8_t*>(addr), len, page);
  ::munmap(tmp, len);
  // Replaces the private pages by the shared ones at the same address, in one step.
  // (mmap, not mremap: UCX 1.13's memory hooks drop mremap's new address.)
  if (::mmap(addr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    why = errno_text("mmap");
    ::close(fd);
    return refuse(why);
  }
  return SharedRange{fd, lo, len};
}

void unshare_in_place(const SharedRange& shared) {
  void* addr = reinterpret_cast<void*>(shared.base);
  const size_t len = shared.length;
  const int memfd = shared.fd;
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // Only where the memfd still backs the range: the owner may have unmapped it (or
  // had it replaced) without deregistering first; then there is nothing to restore.
  struct stat st {};
  const auto lo = reinterpret_cast<uintptr_t>(addr);
  std::string why;
  auto ours = [&](const Vma& v) {
    return v.perms.compare(0, 4, "rw-s") == 0 && v.inode == st.st_ino &&
           v.offset == std::max(v.lo, lo) - lo;
  };
  if (::fstat(memfd, &st) != 0 || !every_vma(lo, lo + len, ours, &why)) {
    ::close(memfd);
    return;
  }
  void* tmp = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp != MAP_FAILED) {
    copy_memfd_data(static_cast<uint8_t*>(tmp), static_cast<const uint8_t*>(addr), len, memfd,
                    page);
    if (::mmap(addr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
        MAP_FAILED) {
      copy_touched_pages(static_cast<uint8_t*>(addr), static_cast<const uint8_t*>(tmp), len, page);
    }  // else the range stays shared: still valid memory for its owner
    ::munmap(tmp, len);
  }
  ::close(memfd);
}

Result<uint8_t*> map_peer_memfd(int pidfd, int remote_fd, size_t len) {
  const char* op = "map peer memory";
  const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, remote_fd, 0));
  if (fd < 0) return RDMAFLOW_ERROR(Code::kNotViable, op, -1, errno_text("pidfd_getfd"));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < len) {
    ::close(fd);
    return RDMAFLOW_ERROR(Code::kNotViable, op, -1, "the peer's descriptor is not its segment");
  }
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    return RDMAFLOW_ERROR(Code::kNotViable, op, -1, std::string("mmap: ") + std::strerror(err));
  }
  return static_cast<uint8_t*>(p);
}

Result<int> fetch_peer_eventfd(int pidfd, int remote_fd) {
  const char* op = "fetch peer eventfd";
  const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, remote_fd, 0));
  if (fd < 0) return RDMAFLOW_ERROR(Code::kNotViable, op, -1, errno_text("pidfd_getfd"));
  char target[64] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0 || std::string_view(target, static_cast<size_t>(n)) != "anon_inode:[eventfd]") {
    ::close(fd);
    return RDMAFLOW_ERROR(Code::kProtocolError, op, -1, "the peer's descriptor is not an eventfd");
  }
  return fd;
}

}  // namespace rdmaflow::shm
