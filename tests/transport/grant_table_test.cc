// GrantTable (transport/common/grant_table.h) and key_secret() (key_secret.h): what
// every backend's grants rest on, checked on the table itself. Each backend's use of
// it (refusals on the wire, revocation with peers) runs in the conformance suite.
#include "transport/common/grant_table.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <vector>

#include "transport/common/key_secret.h"

namespace rdmaflow {
namespace {

TEST(KeySecret, ValuesDoNotRepeatAndAForkedChildDrawsItsOwn) {
  std::set<KeySecret> secrets;
  std::set<uint64_t> seen;  // every 64-bit half drawn
  for (int i = 0; i < 1000; ++i) {
    auto v = key_secret();
    ASSERT_TRUE(v.is_ok()) << v.status().to_string();
    EXPECT_TRUE(secrets.insert(*v).second) << "repeated secret";
    EXPECT_NE(v->lo, v->hi);
    seen.insert(v->lo);
    seen.insert(v->hi);
  }
  // The parent's pool is part-used now; the child must not hand out what is left of it.
  constexpr int kDraws = 40;  // more than one pool
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    uint64_t mine[kDraws];
    for (auto& v : mine) {
      auto r = key_random64();
      v = r.is_ok() ? *r : 0;
    }
    const bool sent = ::write(fds[1], mine, sizeof(mine)) == static_cast<ssize_t>(sizeof(mine));
    ::_exit(sent ? 0 : 1);
  }
  ::close(fds[1]);
  std::vector<uint64_t> parent;
  for (int i = 0; i < kDraws; ++i) {
    auto r = key_random64();
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    parent.push_back(*r);
  }
  uint64_t theirs[kDraws];
  size_t got = 0;
  while (got < sizeof(theirs)) {
    const ssize_t n = ::read(fds[0], reinterpret_cast<char*>(theirs) + got, sizeof(theirs) - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(got, sizeof(theirs));
  for (uint64_t v : theirs) {
    EXPECT_NE(v, 0u);
    EXPECT_FALSE(seen.count(v)) << "the child repeated a secret the parent handed out";
    for (uint64_t p : parent) EXPECT_NE(v, p) << "parent and child drew the same secret";
  }
}

class GrantTableTest : public ::testing::Test {
 protected:
  GrantTable table{"test"};
  std::vector<uint8_t> mem = std::vector<uint8_t>(1 << 16);
  uint8_t* base = mem.data();
};

TEST_F(GrantTableTest, GrantsResolveAndRefuseNamingTheAccess) {
  auto id = table.add_region(base, mem.size());
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  auto key = table.grant(base + 100, 1000);
  ASSERT_TRUE(key.is_ok()) << key.status().to_string();
  EXPECT_EQ(key->backend, "test");
  EXPECT_EQ(key->addr, reinterpret_cast<uintptr_t>(base + 100));

  uint8_t* p = nullptr;
  ASSERT_TRUE(table.resolve(key->key_id, key->secret, 10, 990, &p, "write", 3).is_ok());
  EXPECT_EQ(p, base + 110);
  Status wide = table.resolve(key->key_id, key->secret, 10, 991, &p, "write", 3);
  EXPECT_EQ(wide.code(), Code::kOutOfRange);
  EXPECT_EQ(wide.peer(), 3);
  EXPECT_NE(wide.to_string().find("exceeds the 1000 bytes"), std::string::npos) << wide.to_string();
  KeySecret wrong = key->secret;
  wrong.hi ^= 1;  // one bit of 128
  Status forged = table.resolve(key->key_id, wrong, 0, 1, &p, "read", 2);
  EXPECT_EQ(forged.code(), Code::kUnauthenticated);
  EXPECT_NE(forged.to_string().find("wrong secret"), std::string::npos) << forged.to_string();

  auto info = table.lookup(key->key_id, key->secret, "key query", 1);
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  EXPECT_EQ(info->addr, key->addr);
  EXPECT_EQ(info->len, 1000u);
  EXPECT_EQ(info->region, *id);
  EXPECT_EQ(table.lookup(key->key_id, KeySecret{}, "key query", 1).status().code(),
            Code::kUnauthenticated);

  // Many checks under one hold of the lock.
  GrantTable::Reader reader(table);
  EXPECT_TRUE(reader.resolve(key->key_id, key->secret, 0, 1000, &p, "write", 0).is_ok());
  EXPECT_TRUE(reader.lookup(key->key_id, key->secret, "key query", 0).is_ok());
  EXPECT_EQ(reader.state(key->key_id), GrantTable::KeyState::kLive);
}

TEST_F(GrantTableTest, KeyStatesTellRevokedFromNeverIssued) {
  ASSERT_TRUE(table.add_region(base, mem.size()).is_ok());
  auto a = table.grant(base, 64);
  auto b = table.grant(base + 64, 64);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_NE(a->key_id, b->key_id);
  EXPECT_NE(a->secret, b->secret);
  ASSERT_TRUE(table.revoke(*a).is_ok());
  EXPECT_EQ(table.revoke(*a).code(), Code::kNotFound);
  EXPECT_EQ(table.state(a->key_id), GrantTable::KeyState::kRevoked);
  EXPECT_EQ(table.state(b->key_id), GrantTable::KeyState::kLive);
  EXPECT_EQ(table.state(b->key_id + 1), GrantTable::KeyState::kNeverIssued);
  EXPECT_EQ(table.state(0), GrantTable::KeyState::kNeverIssued);
  uint8_t* p = nullptr;
  EXPECT_EQ(table.resolve(a->key_id, a->secret, 0, 1, &p, "write", 0).code(), Code::kNotFound);
}

TEST_F(GrantTableTest, RevokeRegionKeepsTheRegionRegistered) {
  auto id = table.add_region(base, mem.size());
  ASSERT_TRUE(id.is_ok());
  auto a = table.grant(base, 64);
  auto b = table.grant(base + 4096, 64);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto gone = table.revoke_region(*id);
  ASSERT_TRUE(gone.is_ok()) << gone.status().to_string();
  EXPECT_EQ(std::set<uint64_t>(gone->begin(), gone->end()),
            (std::set<uint64_t>{a->key_id, b->key_id}));
  EXPECT_EQ(table.state(a->key_id), GrantTable::KeyState::kRevoked);
  // Still registered: nothing may overlap it, and it is still found.
  EXPECT_EQ(table.add_region(base + 8, 8).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(table.region_of(base, 16), *id);
  // Removing it afterwards revokes nothing more.
  auto rest = table.remove_region(*id);
  ASSERT_TRUE(rest.is_ok());
  EXPECT_TRUE(rest->empty());
  EXPECT_EQ(table.revoke_region(*id).status().code(), Code::kNotFound);
  EXPECT_FALSE(table.region_of(base, 16).has_value());
  EXPECT_TRUE(table.add_region(base + 8, 8).is_ok());
}

}  // namespace
}  // namespace rdmaflow
