// share_in_place / unshare_in_place / map_peer_memfd (transport/shm/shared_pages.h): the
// pieces of the direct same-host path that do not need a peer. The path itself runs
// in the conformance suite's ucx_shm row.
#include "transport/shm/shared_pages.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace rdmaflow::shm {
namespace {

const size_t kPage = static_cast<size_t>(::sysconf(_SC_PAGESIZE));

uint8_t* map_anonymous(size_t len) {
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

int self_pidfd() {
  return static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
}

TEST(ShmSharedPages, SharesInPlaceKeepingContentsAndAddress) {
  const size_t len = 64 * kPage;
  uint8_t* p = map_anonymous(len);
  ASSERT_NE(p, nullptr);
  for (size_t i = 0; i < len; i += 97) p[i] = static_cast<uint8_t>(i * 7 + 1);
  auto shared = share_in_place(p, len);
  ASSERT_TRUE(shared.is_ok()) << shared.status().to_string();
  EXPECT_EQ(shared->base, reinterpret_cast<uintptr_t>(p));
  EXPECT_EQ(shared->length, len);
  for (size_t i = 0; i < len; i += 97) ASSERT_EQ(p[i], static_cast<uint8_t>(i * 7 + 1)) << i;

  // A second mapping (what a peer gets) sees the same bytes, both ways.
  const int pidfd = self_pidfd();
  ASSERT_GE(pidfd, 0);
  auto peer = map_peer_memfd(pidfd, shared->fd, len);
  ASSERT_TRUE(peer.is_ok()) << peer.status().to_string();
  EXPECT_EQ((*peer)[97], p[97]);
  (*peer)[5] = 0xAB;
  EXPECT_EQ(p[5], 0xAB);
  p[len - 1] = 0xCD;
  EXPECT_EQ((*peer)[len - 1], 0xCD);

  // Undone: same contents, private again (the peer's mapping no longer reaches it).
  unshare_in_place(*shared);
  EXPECT_EQ(p[5], 0xAB);
  EXPECT_EQ(p[len - 1], 0xCD);
  for (size_t i = 97; i < len; i += 97) {
    if (i != 5 && i != len - 1) {
      ASSERT_EQ(p[i], static_cast<uint8_t>(i * 7 + 1)) << i;
    }
  }
  (*peer)[5] = 0x11;
  EXPECT_EQ(p[5], 0xAB);
  ::munmap(*peer, len);
  ::close(pidfd);
  ::munmap(p, len);
}

TEST(ShmSharedPages, RaggedRegionSharesOnlyItsWholePages) {
  const size_t len = 8 * kPage;
  uint8_t* p = map_anonymous(len);
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x5A, len);
  auto shared = share_in_place(p + 100, 6 * kPage);  // pages 1..5 are whole
  ASSERT_TRUE(shared.is_ok()) << shared.status().to_string();
  EXPECT_EQ(shared->base, reinterpret_cast<uintptr_t>(p + kPage));
  EXPECT_EQ(shared->length, 5 * kPage);
  for (size_t i = 0; i < len; ++i) ASSERT_EQ(p[i], 0x5A) << i;
  unshare_in_place(*shared);
  ::munmap(p, len);

  uint8_t* q = map_anonymous(kPage);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(share_in_place(q + 1, kPage - 1).status().code(), Code::kNotViable);
  ::munmap(q, kPage);
}

TEST(ShmSharedPages, RefusesMemoryThatIsNotPrivateAnonymous) {
  void* ro = ::mmap(nullptr, kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  EXPECT_EQ(share_in_place(ro, kPage).status().code(), Code::kNotViable);
  ::munmap(ro, kPage);
  void* sh = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(sh, MAP_FAILED);
  EXPECT_EQ(share_in_place(sh, kPage).status().code(), Code::kNotViable);
  ::munmap(sh, kPage);
}

TEST(ShmSharedPages, UnshareLeavesMemoryTheOwnerAlreadyUnmappedAlone) {
  const size_t len = 4 * kPage;
  uint8_t* p = map_anonymous(len);
  ASSERT_NE(p, nullptr);
  auto shared = share_in_place(p, len);
  ASSERT_TRUE(shared.is_ok()) << shared.status().to_string();
  ::munmap(p, len);                     // freed before deregistering
  uint8_t* other = map_anonymous(len);  // may land at the same address
  ASSERT_NE(other, nullptr);
  other[0] = 9;
  unshare_in_place(*shared);  // must neither crash nor touch `other`
  EXPECT_EQ(other[0], 9);
  ::munmap(other, len);
}

}  // namespace
}  // namespace rdmaflow::shm
