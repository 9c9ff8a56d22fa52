// Two real processes over a real RDMA device (rxe or hardware). Where there is
// no device every rank skips with the backend's own not-viable reason, which
// gtest prints as the SKIPPED message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "tests/support/process.h"
#include "transport/transport.h"

namespace rdmaflow {
namespace {

using testing::Exchange;
using testing::run_ranks;
using testing::RunOptions;

constexpr Millis kWait{10000};

struct Mem {
  explicit Mem(size_t n) : size(n), data(static_cast<uint8_t*>(std::aligned_alloc(4096, n))) {
    std::memset(data, 0, n);
  }
  ~Mem() { std::free(data); }
  size_t size;
  uint8_t* data;
};

// The verbs transport of this rank, or a skip when the machine cannot run it.
std::unique_ptr<Transport> open_verbs(Exchange& ex) {
  TransportConfig c;
  c.rank = ex.rank();
  c.world_size = ex.world();
  auto t = make_transport("verbs", c);
  if (!t.is_ok()) {
    if (t.status().code() == Code::kNotViable) ex.skip(t.status().reason());
    ADD_FAILURE() << t.status().to_string();
    return nullptr;
  }
  return std::move(t).value();
}

// Rank 0 connects to rank 1.
Result<std::shared_ptr<Channel>> link(Transport& t, Exchange& ex) {
  std::string mine;
  if (ex.rank() == 1) {
    RDMAFLOW_ASSIGN_OR_RETURN(mine, t.listen());
  }
  RDMAFLOW_ASSIGN_OR_RETURN(auto addrs, ex.allgather(mine));
  if (ex.rank() == 0) return t.connect(1, addrs[1], kWait);
  return t.accept(0, kWait);
}

Status wait_op(const std::function<void(Callback)>& issue) {
  Completion c;
  issue(c.callback());
  return c.wait(kWait);
}

TEST(VerbsLoopback, WriteReadNotifyAndMessages) {
  auto r = run_ranks(2, [](int rank, int, Exchange& ex) {
    auto t = open_verbs(ex);
    RF_ASSERT(t != nullptr);
    RF_ASSIGN_OR_FAIL(auto ch, link(*t, ex));
    RF_ASSERT(ch->peer_rank() == 1 - rank);
    RF_ASSERT(ch->backend() == "verbs");
    Mem mem(1 << 20);
    RF_ASSIGN_OR_FAIL(RegionId region, t->register_memory(mem.data, mem.size));

    if (rank == 1) {
      RF_ASSIGN_OR_FAIL(RemoteKey key, t->export_key(mem.data, mem.size));
      RF_ASSERT(key.backend == "verbs");
      RF_ASSERT_OK(wait_op([&](Callback cb) { ch->send_message(key.serialize(), cb, kWait); }));
      // Small notify inline in the immediate, large ones through the ring.
      RF_ASSERT_OK(ch->inbox().wait_notify_value(7, kWait));
      for (size_t i = 0; i < 65536; ++i) RF_ASSERT(mem.data[4096 + i] == static_cast<uint8_t>(i));
      RF_ASSERT_OK(ch->inbox().wait_notify_value((uint64_t{1} << 40) + 5, kWait));
      RF_ASSERT(mem.data[0] == 0xab);
      RF_ASSERT_OK(ch->inbox().wait_notify_value(std::numeric_limits<uint64_t>::max(), kWait));
      // Many notifies in a row: far beyond the credit window, in order.
      for (uint64_t i = 0; i < 2000; ++i) {
        RF_ASSIGN_OR_FAIL(uint64_t v, ch->inbox().wait_notify(kWait));
        RF_ASSERT(v == (i % 2 ? (uint64_t{1} << 50) + i : i));
      }
      // Messages: ordered, empty, and larger than a receive buffer (fragmented).
      for (int i = 0; i < 100; ++i) {
        RF_ASSIGN_OR_FAIL(auto m, ch->inbox().recv_message(kWait));
        size_t want = i == 0 ? 0 : (i % 10 == 0 ? 100000 : static_cast<size_t>(i));
        RF_ASSERT(m.size() == want);
        for (size_t k = 0; k < m.size(); ++k) RF_ASSERT(m[k] == static_cast<uint8_t>(k + i));
      }
      RF_ASSERT_OK(wait_op([&](Callback cb) { ch->send_message({'o', 'k'}, cb, kWait); }));
    } else {
      RF_ASSIGN_OR_FAIL(auto key_bytes, ch->inbox().recv_message(kWait));
      RF_ASSIGN_OR_FAIL(RemoteKey key, RemoteKey::deserialize(key_bytes));
      for (size_t i = 0; i < 65536; ++i) mem.data[i] = static_cast<uint8_t>(i);
      RF_ASSERT_OK(
          wait_op([&](Callback cb) { ch->write(mem.data, 65536, key, 4096, 7, cb, kWait); }));
      mem.data[70000] = 0xab;
      RF_ASSERT_OK(wait_op([&](Callback cb) {
        ch->write(mem.data + 70000, 1, key, 0, (uint64_t{1} << 40) + 5, cb, kWait);
      }));
      RF_ASSERT_OK(wait_op([&](Callback cb) {
        ch->write(nullptr, 0, key, 0, std::numeric_limits<uint64_t>::max(), cb, kWait);
      }));
      CompletionGroup g;
      for (uint64_t i = 0; i < 2000; ++i) {
        uint64_t v = i % 2 ? (uint64_t{1} << 50) + i : i;
        ch->write(mem.data + 8, 8, key, 8, v, g.add(), kWait);
      }
      RF_ASSERT_OK(g.wait(kWait));
      for (int i = 0; i < 100; ++i) {
        size_t n = i == 0 ? 0 : (i % 10 == 0 ? 100000 : static_cast<size_t>(i));
        std::vector<uint8_t> m(n);
        for (size_t k = 0; k < n; ++k) m[k] = static_cast<uint8_t>(k + i);
        ch->send_message(std::move(m), g.add(), kWait);
      }
      RF_ASSERT_OK(g.wait(kWait));
      // Read back what was written.
      uint8_t* back = mem.data + (512 << 10);
      RF_ASSERT_OK(wait_op([&](Callback cb) { ch->read(back, 65536, key, 4096, cb, kWait); }));
      RF_ASSERT(std::memcmp(back, mem.data, 65536) == 0);
      // Refusals, without posting anything.
      Status s = wait_op(
          [&](Callback cb) { ch->write(mem.data, 11, key, key.length - 10, {}, cb, kWait); });
      RF_ASSERT(s.code() == Code::kOutOfRange);
      s = wait_op([&](Callback cb) { ch->read(mem.data, 2, key, key.length, cb, kWait); });
      RF_ASSERT(s.code() == Code::kOutOfRange);
      uint8_t stack[16] = {};
      s = wait_op([&](Callback cb) { ch->write(stack, sizeof(stack), key, 0, {}, cb, kWait); });
      RF_ASSERT(s.code() == Code::kInvalidArgument);
      RemoteKey foreign = key;
      foreign.backend = "tcp";
      s = wait_op([&](Callback cb) { ch->write(mem.data, 1, foreign, 0, {}, cb, kWait); });
      RF_ASSERT(s.code() == Code::kInvalidArgument);
      RF_ASSERT_OK(ch->error());  // refusals do not break the channel
      RF_ASSIGN_OR_FAIL(auto ok, ch->inbox().recv_message(kWait));
      RF_ASSERT(ok.size() == 2);
    }
    RF_ASSERT_OK(ex.barrier());
    ch->close();
    RF_ASSERT_OK(t->deregister_memory(region));
    t->shutdown();
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST(VerbsLoopback, TheTargetRefusesForgedRevokedAndInflatedKeys) {
  auto r = run_ranks(2, [](int rank, int, Exchange& ex) {
    auto t = open_verbs(ex);
    RF_ASSERT(t != nullptr);
    RF_ASSIGN_OR_FAIL(auto ch, link(*t, ex));
    Mem mem(1 << 16);
    RF_ASSIGN_OR_FAIL(RegionId region, t->register_memory(mem.data, mem.size));
    (void)region;
    if (rank == 1) {
      std::memset(mem.data, 0x5c, mem.size);
      RF_ASSIGN_OR_FAIL(RemoteKey half, t->export_key(mem.data, mem.size / 2));
      RF_ASSIGN_OR_FAIL(RemoteKey gone, t->export_key(mem.data, 64));
      RF_ASSERT_OK(t->revoke_key(gone));
      RF_ASSERT(t->revoke_key(gone).code() == Code::kNotFound);
      RF_ASSERT_OK(ex.allgather(std::string(reinterpret_cast<const char*>(half.serialize().data()),
                                            half.serialize().size())));
      RF_ASSERT_OK(ex.allgather(std::string(reinterpret_cast<const char*>(gone.serialize().data()),
                                            gone.serialize().size())));
      RF_ASSERT_OK(ex.barrier());  // rank 0 is done with the bad keys
      for (size_t i = 0; i < mem.size; ++i) RF_ASSERT(mem.data[i] == 0x5c);
      RF_ASSERT_OK(ex.barrier());  // rank 0 has read with the genuine key
      // Revoking a key rank 0 already used: its verdict is dropped, the next use is refused.
      RF_ASSERT_OK(t->revoke_key(half));
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    auto parse = [](const std::string& s) {
      return RemoteKey::deserialize(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
    };
    RF_ASSIGN_OR_FAIL(auto a, ex.allgather(""));
    RF_ASSIGN_OR_FAIL(RemoteKey half, parse(a[1]));
    RF_ASSIGN_OR_FAIL(auto b, ex.allgather(""));
    RF_ASSIGN_OR_FAIL(RemoteKey gone, parse(b[1]));
    auto write = [&](const RemoteKey& k, uint64_t off, size_t len) {
      return wait_op([&](Callback cb) { ch->write(mem.data, len, k, off, 1, cb, kWait); });
    };
    // (A forged secret fails the channel: conformance_auth_test.cc's verbs row.)
    RF_ASSERT(write(gone, 0, 8).code() == Code::kNotFound);
    RemoteKey inflated = half;
    inflated.length = mem.size;
    Status s = write(inflated, mem.size / 2, 8);
    RF_ASSERT(s.code() == Code::kOutOfRange);
    RF_ASSERT(s.peer() == 1);
    RF_ASSERT(s.to_string().find("refused the remote key") != std::string::npos);
    RF_ASSERT_OK(ch->error());
    RF_ASSERT_OK(ex.barrier());
    // The genuine key works (and is now verified)...
    RF_ASSERT_OK(wait_op([&](Callback cb) { ch->read(mem.data, 8, half, 0, cb, kWait); }));
    RF_ASSERT_OK(ex.barrier());  // ...until rank 1 revokes it
    Status after = Status::ok();
    for (int i = 0; i < 100 && after.is_ok(); ++i) {  // the notice travels on its own
      after = wait_op([&](Callback cb) { ch->read(mem.data, 8, half, 0, cb, kWait); });
    }
    // Refused by the key check once the notice is in (kNotFound), or, with grant
    // windows (the default where the device has type 2 windows), by the NIC
    // before that: the window is gone, the read fails with 'remote access error'
    // and breaks the channel (kPeerFailed), as in the conformance revoke rows.
    RF_ASSERT(after.code() == Code::kNotFound ||
              (after.code() == Code::kPeerFailed &&
               after.to_string().find("remote access error") != std::string::npos));
    RF_ASSERT_OK(ex.barrier());
    t->shutdown();
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST(VerbsLoopback, PeerDeathFailsThePendingAndLaterOperations) {
  RunOptions o;
  o.may_be_killed = {1};
  auto r = run_ranks(
      2,
      [](int rank, int, Exchange& ex) {
        auto t = open_verbs(ex);
        RF_ASSERT(t != nullptr);
        RF_ASSIGN_OR_FAIL(auto ch, link(*t, ex));
        if (rank == 1) {
          ::pause();  // killed by rank 0
          return 1;
        }
        RF_ASSERT_OK(ex.kill(1));
        // The kernel tears the dead process's connection down: a DISCONNECTED
        // event or a retry-exceeded completion. Either way: peer failed, named.
        auto got = ch->inbox().recv_message(Millis(20000));
        RF_ASSERT(!got.is_ok());
        RF_ASSERT(got.status().code() == Code::kPeerFailed);
        RF_ASSERT(got.status().peer() == 1);
        Status s = wait_op([&](Callback cb) { ch->send_message({1}, cb, kWait); });
        RF_ASSERT(s.code() == Code::kPeerFailed);
        RF_ASSERT(s.op() == "send message");
        t->shutdown();
        return 0;
      },
      o);
  RF_EXPECT_RUN_OK(r);
}

TEST(VerbsLoopback, CloseCancelsLocallyAndFailsThePeer) {
  auto r = run_ranks(2, [](int rank, int, Exchange& ex) {
    auto t = open_verbs(ex);
    RF_ASSERT(t != nullptr);
    RF_ASSIGN_OR_FAIL(auto ch, link(*t, ex));
    if (rank == 0) {
      ch->close();
      Status s = wait_op([&](Callback cb) { ch->send_message({1}, cb, kWait); });
      RF_ASSERT(s.code() == Code::kCancelled);
    } else {
      auto got = ch->inbox().recv_message(kWait);
      RF_ASSERT(!got.is_ok());
      RF_ASSERT(got.status().code() == Code::kPeerFailed);
    }
    RF_ASSERT_OK(ex.barrier());
    t->shutdown();
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST(VerbsLoopback, ConnectToNobodyFailsWithinTheTimeout) {
  auto r = run_ranks(1, [](int, int, Exchange& ex) {
    auto t = open_verbs(ex);
    RF_ASSERT(t != nullptr);
    RF_ASSIGN_OR_FAIL(std::string addr, t->listen());
    // Same IP, a port nobody listens on.
    std::string other = addr.substr(0, addr.rfind(':')) + ":1";
    auto start = std::chrono::steady_clock::now();
    auto ch = t->connect(3, other, Millis(3000));
    RF_ASSERT(!ch.is_ok());
    RF_ASSERT(ch.status().code() == Code::kConnectionFailed ||
              ch.status().code() == Code::kTimeout);
    RF_ASSERT(ch.status().peer() == 3);
    RF_ASSERT(std::chrono::steady_clock::now() - start < std::chrono::seconds(6));
    auto bad = t->connect(3, "tcp://127.0.0.1:5", Millis(1000));
    RF_ASSERT(!bad.is_ok() && bad.status().code() == Code::kInvalidArgument);
    t->shutdown();
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow
