// The channel contract (transport/channel.h, docs/architecture.md), checked for
// every backend in real processes over real connections: data, notifies,
// messages, direct views, bad keys and announced capabilities here; revoke
// fences, peer death, timeouts and close in conformance_failure_test.cc; the job
// secret and forged key secrets in conformance_auth_test.cc. A row per medium of
// every backend (tests/support/backends.h, from the transport registry); when
// make_transport() reports kNotViable on this machine its rows are skipped with
// the reason.
#include <signal.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "tests/transport/conformance_util.h"

namespace rdmaflow::testing {
namespace {

// -------------------------------------------------------------------- sizes

TEST_P(Conformance, WriteAndReadEverySizeByteForByte) {
  const std::vector<size_t> sizes = {0, 1, 7, 61, 4097, 65536, 65537, 1000003ull, 256ull << 20};
  const size_t max = sizes.back();
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    if (rank == 1) {  // target of writes, source of reads
      Buffer region(max + 8192);
      RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
      RF_ASSERT_OK(ex.allgather(key_bytes(key)));
      for (size_t i = 0; i < sizes.size(); ++i) {
        const size_t size = sizes[i];
        const size_t offset = 1 + (i * 4099) % 4096;
        region.p[offset - 1] = 0xEE;
        region.p[offset + size] = 0xEE;
        RF_ASSERT_OK(send_text(ch, "ready"));
        RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
        RF_ASSERT(v == i);
        int64_t bad = check_pattern(region.p + offset, size, 1000 * i + 1);
        EXPECT_EQ(bad, -1) << "size " << size << ": first wrong byte at " << bad;
        EXPECT_EQ(region.p[offset - 1], 0xEE) << "byte before the write changed, size " << size;
        EXPECT_EQ(region.p[offset + size], 0xEE) << "byte after the write changed, size " << size;
        RF_ASSERT_OK(send_text(ch, "verified"));
        RF_ASSERT_OK(expect_text(ch, "read back"));  // before the next guards go in
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    Buffer src(max + 64), back(max + 64);
    RF_ASSERT_OK(node.local(src));
    RF_ASSERT_OK(node.local(back));
    RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(""));
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(keys[1]));
    for (size_t i = 0; i < sizes.size(); ++i) {
      const size_t size = sizes[i];
      const size_t offset = 1 + (i * 4099) % 4096;
      uint8_t* s = src.p + (i % 7);
      fill_pattern(s, size, 1000 * i + 1);
      RF_ASSERT_OK(expect_text(ch, "ready"));
      RF_ASSERT_OK(write_sync(ch, s, size, key, offset, i));
      RF_ASSERT_OK(expect_text(ch, "verified"));
      uint8_t* d = back.p + (i % 5);
      std::memset(d, 0x11, std::min<size_t>(size, 4096));
      RF_ASSERT_OK(read_sync(ch, d, size, key, offset));
      int64_t bad = check_pattern(d, size, 1000 * i + 1);
      EXPECT_EQ(bad, -1) << "read of " << size << " bytes: first wrong byte at " << bad;
      RF_ASSERT_OK(send_text(ch, "read back"));
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// ------------------------------------------------------ notify after the data

TEST_P(Conformance, NotifyIsObservedOnlyAfterTheDataIsThere) {
  constexpr int kSlots = 16;
  constexpr size_t kSlotBytes = 2 << 20;
  constexpr int kIterations = 640;
  auto size_of = [](int i) -> size_t {
    uint64_t h = mix64(static_cast<uint64_t>(i) * 7919);
    if (i % 10 == 9) return 1 + h % kSlotBytes;  // some large, multi-chunk writes
    return 1 + h % (64 << 10);
  };
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    if (rank == 1) {
      Buffer region(kSlots * kSlotBytes);
      std::memset(region.p, 0, region.size);
      RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
      RF_ASSERT_OK(ex.allgather(key_bytes(key)));
      for (int batch = 0; batch < kIterations / kSlots; ++batch) {
        for (int k = 0; k < kSlots; ++k) {
          RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
          int i = static_cast<int>(v);
          RF_ASSERT(i / kSlots == batch);
          // Checked the moment the notify is seen: every byte must be there.
          int64_t bad = check_pattern(region.p + (i % kSlots) * kSlotBytes, size_of(i),
                                      static_cast<uint64_t>(i) * 31 + 5);
          RF_ASSERT(bad == -1);
        }
        RF_ASSERT_OK(send_text(ch, "credit"));
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    Buffer src(kSlots * kSlotBytes);
    RF_ASSERT_OK(node.local(src));
    RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(""));
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(keys[1]));
    for (int batch = 0; batch < kIterations / kSlots; ++batch) {
      CompletionGroup group;
      for (int k = 0; k < kSlots; ++k) {
        int i = batch * kSlots + k;
        uint8_t* s = src.p + k * kSlotBytes;
        fill_pattern(s, size_of(i), static_cast<uint64_t>(i) * 31 + 5);
        ch.write(s, size_of(i), key, k * kSlotBytes, static_cast<uint64_t>(i), group.add(),
                 kOpTimeout);
      }
      RF_ASSERT_OK(group.wait(kOpTimeout + Millis(5000), "batch of writes"));
      RF_ASSERT_OK(expect_text(ch, "credit"));
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// ------------------------------------------------------------- concurrency

TEST_P(Conformance, ThousandsOfConcurrentOperationsBothWays) {
  constexpr int kThreads = 2;
  constexpr int kWritesPerThread = 2000;
  constexpr int kReadsPerThread = 500;
  constexpr size_t kSlot = 2112;
  constexpr int kWrites = kThreads * kWritesPerThread;
  auto size_of = [](int i) { return static_cast<size_t>(1 + (i * 37) % 2048); };
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    const int peer = 1 - rank;
    Buffer incoming(kWrites * kSlot);
    Buffer readable(1 << 20);
    fill_pattern(readable.p, readable.size, 77 + static_cast<uint64_t>(rank));
    RF_ASSIGN_OR_FAIL(auto in_key, node.expose(incoming.p, incoming.size));
    RF_ASSIGN_OR_FAIL(auto rd_key, node.expose(readable.p, readable.size));
    RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(join2(key_bytes(in_key), key_bytes(rd_key))));
    auto [in_bytes, rd_bytes] = split2(keys[static_cast<size_t>(peer)]);
    RF_ASSIGN_OR_FAIL(RemoteKey peer_in, parse_key(in_bytes));
    RF_ASSIGN_OR_FAIL(RemoteKey peer_rd, parse_key(rd_bytes));

    Buffer src(kWrites * kSlot);
    Buffer reads(kThreads * kReadsPerThread * 4096);
    RF_ASSERT_OK(node.local(src));
    RF_ASSERT_OK(node.local(reads));
    for (int i = 0; i < kWrites; ++i) {
      fill_pattern(src.p + i * kSlot, size_of(i), static_cast<uint64_t>(rank) * 100000 + i);
    }
    CompletionGroup group;
    OnceChecker once;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int k = 0; k < kWritesPerThread; ++k) {
          int i = t * kWritesPerThread + k;
          ch.write(src.p + i * kSlot, size_of(i), peer_in, i * kSlot, static_cast<uint64_t>(i),
                   once.wrap(group.add()), kOpTimeout);
          if (k % 4 == 0) {
            int j = t * kReadsPerThread + k / 4;
            ch.read(reads.p + j * 4096, 4096, peer_rd, (j * 512) % (readable.size - 4096),
                    once.wrap(group.add()), kOpTimeout);
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    RF_ASSERT_OK(group.wait(kOpTimeout + Millis(5000)));
    EXPECT_EQ(once.twice.load(), 0) << "a callback fired twice";
    // Every notify from the peer arrives, each exactly once.
    std::vector<int> seen(kWrites, 0);
    for (int k = 0; k < kWrites; ++k) {
      RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
      RF_ASSERT(v < static_cast<uint64_t>(kWrites));
      ++seen[v];
    }
    RF_ASSERT(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    for (int i = 0; i < kWrites; ++i) {
      int64_t bad = check_pattern(incoming.p + i * kSlot, size_of(i),
                                  static_cast<uint64_t>(peer) * 100000 + i);
      RF_ASSERT(bad == -1);
    }
    Buffer expect(readable.size);
    fill_pattern(expect.p, expect.size, 77 + static_cast<uint64_t>(peer));
    for (int j = 0; j < kThreads * kReadsPerThread; ++j) {
      size_t off = (j * 512) % (readable.size - 4096);
      RF_ASSERT(std::memcmp(reads.p + j * 4096, expect.p + off, 4096) == 0);
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST_P(Conformance, FourProcessesAllToAllAtOnce) {
  constexpr int kWorld = 4;
  constexpr size_t kBytes = (1 << 20) + 13;
  auto r = run_ranks(kWorld, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Buffer incoming(world * kBytes), source(kBytes), reads(world * kBytes);
    RF_ASSERT_OK(node.local(reads));
    fill_pattern(source.p, kBytes, 500 + static_cast<uint64_t>(rank));
    RF_ASSIGN_OR_FAIL(auto in_key, node.expose(incoming.p, incoming.size));
    RF_ASSIGN_OR_FAIL(auto src_key, node.expose(source.p, source.size));
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(join2(key_bytes(in_key), key_bytes(src_key))));
    CompletionGroup group;
    for (int p = 0; p < world; ++p) {
      if (p == rank) continue;
      auto [in_bytes, src_bytes] = split2(all[static_cast<size_t>(p)]);
      RF_ASSIGN_OR_FAIL(RemoteKey pin, parse_key(in_bytes));
      RF_ASSIGN_OR_FAIL(RemoteKey psrc, parse_key(src_bytes));
      Channel& ch = *node.peers[static_cast<size_t>(p)];
      ch.write(source.p, kBytes, pin, rank * kBytes, static_cast<uint64_t>(rank), group.add(),
               kOpTimeout);
      ch.read(reads.p + p * kBytes, kBytes, psrc, 0, group.add(), kOpTimeout);
    }
    RF_ASSERT_OK(group.wait(kOpTimeout + Millis(5000)));
    for (int p = 0; p < world; ++p) {
      if (p == rank) continue;
      RF_ASSIGN_OR_FAIL(uint64_t v,
                        node.peers[static_cast<size_t>(p)]->inbox().wait_notify(kOpTimeout));
      RF_ASSERT(v == static_cast<uint64_t>(p));
      RF_ASSERT(check_pattern(incoming.p + p * kBytes, kBytes, 500 + static_cast<uint64_t>(p)) ==
                -1);
      RF_ASSERT(check_pattern(reads.p + p * kBytes, kBytes, 500 + static_cast<uint64_t>(p)) == -1);
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST_P(Conformance, MessagesArriveInOrder) {
  constexpr int kCount = 400;
  auto size_of = [](int i) -> size_t { return i % 50 == 49 ? (1 << 20) : static_cast<size_t>(i); };
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    if (rank == 0) {
      CompletionGroup group;
      for (int i = 0; i < kCount; ++i) {
        std::vector<uint8_t> m(size_of(i));
        fill_pattern(m.data(), m.size(), static_cast<uint64_t>(i));
        ch.send_message(std::move(m), group.add(), kOpTimeout);
      }
      RF_ASSERT_OK(group.wait(kOpTimeout + Millis(5000)));
    } else {
      for (int i = 0; i < kCount; ++i) {
        RF_ASSIGN_OR_FAIL(auto m, ch.inbox().recv_message(kOpTimeout));
        RF_ASSERT(m.size() == size_of(i));
        RF_ASSERT(check_pattern(m.data(), m.size(), static_cast<uint64_t>(i)) == -1);
      }
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// direct_view: only the UCX backend over shared memory maps a peer's memory;
// a view never reaches outside the grant, and stores through it are the
// owner's bytes. Everyone else says kNotViable (and still refuses ranges
// outside the grant).
TEST_P(Conformance, DirectViewStaysInsideTheGrant) {
  const bool maps = std::string(backend().label) == "ucx_shm";
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    Buffer region(4 * 4096);
    std::memset(region.p, 0, region.size);
    std::string mine;
    if (rank == 0) {
      RF_ASSERT_OK(node.transport->register_memory(region.p, region.size));
      RF_ASSIGN_OR_FAIL(RemoteKey key, node.transport->export_key(region.p + 4096, 8192));
      mine = key_bytes(key);
    }
    RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(mine));
    if (rank == 1) {
      RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(keys[0]));
      EXPECT_EQ(ch.direct_view(key, 1, 8192, kOpTimeout).status().code(), Code::kOutOfRange);
      EXPECT_EQ(ch.direct_view(key, 8192, 1, kOpTimeout).status().code(), Code::kOutOfRange);
      RemoteKey wider = key;  // a key claiming more than the owner granted
      wider.length = 3 * 4096;
      auto view = ch.direct_view(wider, 8192, 4096, kOpTimeout);
      EXPECT_FALSE(view.is_ok());
      auto ok = ch.direct_view(key, 100, 8000, kOpTimeout);
      if (maps) {
        RF_ASSERT_OK(ok);
        EXPECT_EQ(ok->length, 8000u);
        fill_pattern(reinterpret_cast<uint8_t*>(ok->data), 8000, 7);
      } else {
        EXPECT_EQ(ok.status().code(), Code::kNotViable) << ok.status().to_string();
      }
    }
    RF_ASSERT_OK(ex.barrier());
    if (rank == 0) {
      if (maps) {
        EXPECT_EQ(check_pattern(region.p + 4096 + 100, 8000, 7), -1);
        for (size_t i = 0; i < 4096 + 100; ++i) RF_ASSERT(region.p[i] == 0);
        for (size_t i = 4096 + 8100; i < region.size; ++i) RF_ASSERT(region.p[i] == 0);
      }
      RF_ASSERT_OK(node.transport->revoke_key(*parse_key(mine)));
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// -------------------------------------------------------------- refusals

TEST_P(Conformance, BadKeysAreRefusedAndMemoryIsUntouched) {
  constexpr size_t kBytes = 64 << 10;
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    if (rank == 1) {
      Buffer region(2 * kBytes);
      fill_pattern(region.p, region.size, 4242);
      const uint64_t before = checksum(region.p, region.size);
      // Grant only the first half; the second half is registered but not granted.
      RF_ASSIGN_OR_FAIL(RegionId id, node.transport->register_memory(region.p, region.size));
      (void)id;
      RF_ASSIGN_OR_FAIL(RemoteKey key, node.transport->export_key(region.p, kBytes));
      RF_ASSIGN_OR_FAIL(RemoteKey revoked, node.transport->export_key(region.p, 128));
      RF_ASSERT_OK(node.transport->revoke_key(revoked));
      RF_ASSERT_OK(ex.allgather(join2(key_bytes(key), key_bytes(revoked))));
      RF_ASSERT_OK(ex.barrier());  // rank 0 done attacking
      EXPECT_EQ(checksum(region.p, region.size), before) << "refused accesses changed memory";
      RF_ASSERT_OK(ex.barrier());  // checked: rank 0 may write
      // The valid write at the end landed.
      RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
      EXPECT_EQ(v, 99u);
      EXPECT_EQ(check_pattern(region.p + 100, 1000, 7), -1);
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(""));
    auto [key_text, revoked_text] = split2(all[1]);
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(key_text));
    RF_ASSIGN_OR_FAIL(RemoteKey revoked, parse_key(revoked_text));
    Buffer src(2 * kBytes), dst(2 * kBytes);
    RF_ASSERT_OK(node.local(src));
    RF_ASSERT_OK(node.local(dst));
    fill_pattern(src.p, src.size, 1);

    auto expect_refused = [&](const char* what, Status st, std::set<Code> codes) {
      EXPECT_FALSE(st.is_ok()) << what << " was accepted";
      EXPECT_TRUE(codes.count(st.code())) << what << ": " << st.to_string();
      EXPECT_EQ(st.peer(), 1) << what << ": " << st.to_string();
      EXPECT_NE(st.to_string().find("peer rank 1"), std::string::npos) << st.to_string();
    };
    // (A forged secret fails the channel instead: conformance_auth_test.cc.)
    RemoteKey unknown = key;
    unknown.key_id += 1000;
    expect_refused("write with unknown key", write_sync(ch, src.p, 100, unknown, 0, 2),
                   {Code::kNotFound});
    expect_refused("write with revoked key", write_sync(ch, src.p, 100, revoked, 0, 3),
                   {Code::kNotFound});
    // Out of range with the genuine key: refused by the initiator.
    expect_refused("write past the grant", write_sync(ch, src.p, 20, key, kBytes - 10, 4),
                   {Code::kOutOfRange});
    expect_refused("read past the grant", read_sync(ch, dst.p, 20, key, kBytes - 10),
                   {Code::kOutOfRange});
    // Out of range with a key whose length was inflated: refused by the target.
    RemoteKey inflated = key;
    inflated.length = 2 * kBytes;
    expect_refused("write with inflated key", write_sync(ch, src.p, 2 * kBytes, inflated, 0, 5),
                   {Code::kOutOfRange});
    expect_refused("write with inflated key (tail)",
                   write_sync(ch, src.p, 4096, inflated, kBytes + 8, 6), {Code::kOutOfRange});
    expect_refused("read with inflated key", read_sync(ch, dst.p, 4096, inflated, kBytes),
                   {Code::kOutOfRange});
    // The channel survived every refusal.
    EXPECT_TRUE(ch.error().is_ok()) << ch.error().to_string();
    RF_ASSERT_OK(ex.barrier());
    RF_ASSERT_OK(ex.barrier());
    fill_pattern(src.p, 1000, 7);
    RF_ASSERT_OK(write_sync(ch, src.p, 1000, key, 100, 99));
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// ---------------------------------------------------------- posted writes

// Channel::post_write (the collectives' small pieces and credits): the data
// and notify rules of write() hold, every callback runs once, and a refused
// posted write is reported with its reason, naming the peer: by its callback
// (the default: a plain write) or, where the backend completes it when sent
// (tcp: no acknowledgement frame), by the channel failing stickily. Either
// way it writes nothing.
TEST_P(Conformance, PostedWritesLandInOrderAndARefusalIsReported) {
  constexpr int kWrites = 500;
  constexpr size_t kCell = 64;
  // Then two large ones (the collectives' pieces), several chunks each: on tcp
  // they outgrow the socket, so the progress thread finishes sending them.
  constexpr int kLarge = 2;
  constexpr size_t kLargeBytes = 3 * 1024 * 1024 + 123;
  constexpr size_t kSmallArea = kWrites * kCell;
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    if (rank == 1) {
      Buffer region(kSmallArea + kLarge * kLargeBytes + 4096);
      std::memset(region.p, 0, region.size);
      RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, kSmallArea + kLarge * kLargeBytes));
      RF_ASSERT_OK(ex.allgather(key_bytes(key)));
      for (int i = 0; i < kWrites + kLarge; ++i) {
        RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
        RF_ASSERT(v == static_cast<uint64_t>(i));  // in issue order, after the data
        if (i < kWrites) {
          RF_ASSERT(check_pattern(region.p + i * kCell, kCell, 900 + i) == -1);
        } else {
          RF_ASSERT(check_pattern(region.p + kSmallArea + (i - kWrites) * kLargeBytes, kLargeBytes,
                                  900 + i) == -1);
        }
      }
      const uint64_t before = checksum(region.p, region.size);
      RF_ASSERT_OK(ex.barrier());  // rank 0 posts a refused write
      RF_ASSERT_OK(ex.barrier());
      EXPECT_EQ(checksum(region.p, region.size), before) << "a refused posted write wrote";
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(""));
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(keys[1]));
    Buffer src(kSmallArea + kLarge * kLargeBytes);
    RF_ASSERT_OK(node.local(src));
    CompletionGroup group;
    for (int i = 0; i < kWrites; ++i) {
      fill_pattern(src.p + i * kCell, kCell, 900 + i);
      ch.post_write(src.p + i * kCell, kCell, key, i * kCell, static_cast<uint64_t>(i), group.add(),
                    kOpTimeout);
    }
    for (int k = 0; k < kLarge; ++k) {
      const size_t at = kSmallArea + k * kLargeBytes;
      fill_pattern(src.p + at, kLargeBytes, 900 + kWrites + k);
      ch.post_write(src.p + at, kLargeBytes, key, at, static_cast<uint64_t>(kWrites + k),
                    group.add(), kOpTimeout);
    }
    // Completes (each once its bytes left, on tcp) without any reply from the peer.
    RF_ASSERT_OK(group.wait(kOpTimeout + Millis(5000), "posted writes"));
    RF_ASSERT_OK(ex.barrier());
    RemoteKey unknown = key;
    unknown.key_id += 1000;
    Completion c;
    ch.post_write(src.p, kCell, unknown, 0, 1, c.callback(), kOpTimeout);
    Status st = c.wait(kOpTimeout + Millis(5000), "refused posted write");
    if (st.is_ok()) {  // completed when sent: the refusal fails the channel
      const auto until = std::chrono::steady_clock::now() + kOpTimeout;
      while (ch.error().is_ok() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(Millis(1));
      }
      st = ch.error();
      EXPECT_FALSE(write_sync(ch, src.p, 1, key, 0, 2).is_ok()) << "the failure is not sticky";
    }
    EXPECT_EQ(st.code(), Code::kNotFound) << st.to_string();
    EXPECT_EQ(st.peer(), 1) << st.to_string();
    EXPECT_NE(st.to_string().find("peer rank 1"), std::string::npos) << st.to_string();
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// Channel::post_write_deferred (the collectives' credits): a write the
// backend may hold back for a frame to ride with still arrives, in issue
// order among the channel's other operations, when the sender issues
// nothing more and only sleeps (the peer blocked on it must not depend on
// this process doing anything), and the one over `hold` takes the held ones
// along at once.
TEST_P(Conformance, DeferredWritesArriveWithoutTheSenderDoingMore) {
  constexpr size_t kCell = 8;
  constexpr int kRounds = 20;
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    if (rank == 1) {
      Buffer region(4096);
      std::memset(region.p, 0, region.size);
      RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
      RF_ASSERT_OK(ex.allgather(key_bytes(key)));
      uint64_t expect = 0;
      for (int round = 0; round < kRounds; ++round) {
        // One held write, then the sender sleeps: it must come anyway, and
        // long before the operation timeout (the bound is a few ms; 2 s
        // leaves room for a crowded machine).
        RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(Millis(2000)));
        RF_ASSERT(v == expect++);
        RF_ASSERT(check_pattern(region.p + (v % 64) * kCell, kCell, 700 + static_cast<int>(v)) ==
                  -1);
        RF_ASSERT_OK(ex.barrier());
      }
      // Three held (hold 3), then a plain posted write: all four in order.
      for (int k = 0; k < 4; ++k) {
        RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(Millis(2000)));
        RF_ASSERT(v == expect++);
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(""));
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(keys[1]));
    Buffer src(64 * kCell);
    RF_ASSERT_OK(node.local(src));
    CompletionGroup group;
    uint64_t v = 0;
    auto post = [&](bool deferred, int hold) {
      const size_t at = (v % 64) * kCell;
      fill_pattern(src.p + at, kCell, 700 + static_cast<int>(v));
      if (deferred) {
        ch.post_write_deferred(src.p + at, kCell, key, at, v, group.add(), kOpTimeout, hold);
      } else {
        ch.post_write(src.p + at, kCell, key, at, v, group.add(), kOpTimeout);
      }
      ++v;
    };
    for (int round = 0; round < kRounds; ++round) {
      post(/*deferred=*/true, /*hold=*/1 + round % 3);
      RF_ASSERT_OK(ex.barrier());  // sleeps until the peer saw it
    }
    for (int k = 0; k < 3; ++k) post(true, 3);
    post(false, 0);
    RF_ASSERT_OK(group.wait(kOpTimeout + Millis(5000), "deferred writes"));
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// ------------------------------------------------------------ capabilities

// What a channel announces holds: with any_source_memory a write takes its
// source from plain heap memory the transport never registered (the
// collectives rely on it to skip staging), byte for byte.
TEST_P(Conformance, AnnouncedCapabilitiesHold) {
  constexpr size_t kBytes = 300001;
  auto r = run_ranks(2, [&](int rank, int world, Exchange& ex) {
    Node node;
    RF_ASSERT_OK(node.connect_all(backend(), rank, world, ex));
    Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
    const bool any_source = ch.capabilities().any_source_memory;
    if (rank == 1) {
      Buffer region(kBytes);
      RF_ASSIGN_OR_FAIL(auto key, node.expose(region.p, region.size));
      RF_ASSERT_OK(ex.allgather(key_bytes(key)));
      if (any_source) {
        RF_ASSIGN_OR_FAIL(uint64_t v, ch.inbox().wait_notify(kOpTimeout));
        RF_ASSERT(v == 7);
        EXPECT_EQ(check_pattern(region.p, kBytes, 77), -1) << "write from unregistered memory";
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSIGN_OR_FAIL(auto keys, ex.allgather(""));
    RF_ASSIGN_OR_FAIL(RemoteKey key, parse_key(keys[1]));
    if (any_source) {
      std::vector<uint8_t> heap(kBytes + 3);  // never registered
      fill_pattern(heap.data() + 3, kBytes, 77);
      RF_ASSERT_OK(write_sync(ch, heap.data() + 3, kBytes, key, 0, 7));
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(medium_rows()),
                         [](const auto& info) { return info.param.label; });

}  // namespace
}  // namespace rdmaflow::testing
