// The gRPC baseline in real processes over loopback: tensors of every size
// arrive byte for byte, many receives run at once, and every failure (a tensor
// never published, a peer killed, bad use) ends with a clear Status in time.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/support/process.h"
#include "transport/grpc/grpc_common.h"
#include "transport/grpc/grpc_tensor.h"
#include "transport/grpc/tensor_service.grpc.pb.h"

namespace rdmaflow::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr Millis kTimeout(20000);

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t seed_of(const TensorKey& key, int src) {
  return mix64(key.transfer_id * 1000003 + key.step * 7919 + static_cast<uint64_t>(src));
}

// A pattern that differs per key and per position.
std::vector<std::byte> pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = mix64(seed + i);
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return v;
}

bool matches(const void* p, size_t n, uint64_t seed) {
  const auto* b = static_cast<const std::byte*>(p);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = mix64(seed + i);
    if (std::memcmp(b + i, &x, std::min<size_t>(8, n - i)) != 0) return false;
  }
  return true;
}

std::vector<int64_t> shape_of(size_t bytes) {
  return {static_cast<int64_t>(bytes)};
}

// A rank's server and client, with every peer's address added.
struct Node {
  std::unique_ptr<GrpcTensorServer> server;
  std::unique_ptr<GrpcTensorClient> client;
  std::vector<std::string> addresses;  // of every rank's server
};

Result<Node> make_node(int rank, int world, Exchange& ex, GrpcServerOptions options = {}) {
  options.rank = rank;
  Node node;
  RDMAFLOW_ASSIGN_OR_RETURN(node.server, GrpcTensorServer::start(options));
  node.client = std::make_unique<GrpcTensorClient>(rank);
  RDMAFLOW_ASSIGN_OR_RETURN(node.addresses, ex.allgather(node.server->address()));
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    RDMAFLOW_RETURN_IF_ERROR(
        node.client->add_peer(peer, node.addresses[static_cast<size_t>(peer)]));
  }
  return node;
}

Status publish_pattern(GrpcTensorServer& server, const TensorKey& key, size_t bytes) {
  auto data = pattern(bytes, seed_of(key, server.rank()));
  return server.publish(key, DataType::kU8, shape_of(bytes), data.data(), bytes);
}

const size_t kSizes[] = {0, 1, 1 << 20, 64 << 20};
// Sizes also sent to a receiver already waiting (all but the largest, for time).
constexpr size_t kWaitedSizes = 3;

// ------------------------------------------------------------------ correctness

TEST(GrpcTensor, TwoRanksMoveEverySizeByteForByte) {
  auto r = run_ranks(2, [](int rank, int world, Exchange& ex) {
    RF_ASSIGN_OR_FAIL(Node node, make_node(rank, world, ex));
    if (rank == 1) {
      // Published before the receiver asks (step 0), and after it is waiting (step 1).
      for (uint64_t t = 0; t < std::size(kSizes); ++t) {
        RF_ASSERT_OK(publish_pattern(*node.server, {t, 0}, kSizes[t]));
      }
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(ex.barrier());  // rank 0's receives of steps 1 are in flight
      for (uint64_t t = 0; t < kWaitedSizes; ++t) {
        RF_ASSERT_OK(publish_pattern(*node.server, {t, 1}, kSizes[t]));
      }
      RF_ASSERT_OK(ex.barrier());  // all received
      RF_ASSERT(node.server->pending() == 0);
      return 0;
    }
    RF_ASSERT_OK(ex.barrier());
    for (uint64_t t = 0; t < std::size(kSizes); ++t) {
      const TensorKey key{t, 0};
      RF_ASSIGN_OR_FAIL(ReceivedTensor got, node.client->recv_tensor(1, key, kTimeout));
      RF_ASSERT(got.meta.dtype == DataType::kU8);
      RF_ASSERT(got.meta.shape == shape_of(kSizes[t]));
      RF_ASSERT(got.meta.bytes == kSizes[t]);
      RF_ASSERT(matches(got.data().data(), kSizes[t], seed_of(key, 1)));
    }
    // Receives first: each waits on rank 1's server until the tensor appears.
    struct Pending {
      std::vector<std::byte> dst;
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      std::optional<Result<TensorMeta>> result;
    };
    std::vector<std::unique_ptr<Pending>> pending;
    for (uint64_t t = 0; t < kWaitedSizes; ++t) {
      auto p = std::make_unique<Pending>();
      p->dst.resize(kSizes[t] + 16);
      Pending* raw = p.get();
      node.client->recv_tensor_into_async(1, {t, 1}, raw->dst.data(), raw->dst.size(), kTimeout,
                                          [raw](Result<TensorMeta> m) {
                                            std::lock_guard<std::mutex> lock(raw->mu);
                                            raw->result.emplace(std::move(m));
                                            raw->done = true;
                                            raw->cv.notify_all();
                                          });
      pending.push_back(std::move(p));
    }
    // Give the calls time to reach rank 1's server, so they park there.
    std::this_thread::sleep_for(Millis(100));
    RF_ASSERT_OK(ex.barrier());
    for (uint64_t t = 0; t < kWaitedSizes; ++t) {
      Pending& p = *pending[t];
      std::unique_lock<std::mutex> lock(p.mu);
      RF_ASSERT(p.cv.wait_for(lock, kTimeout + Millis(5000), [&] { return p.done; }));
      RF_ASSERT_OK(*p.result);
      RF_ASSERT((*p.result)->bytes == kSizes[t]);
      RF_ASSERT(matches(p.dst.data(), kSizes[t], seed_of({t, 1}, 1)));
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST(GrpcTensor, FourRanksExchangeAllPairsAtOnce) {
  constexpr int kWorld = 4;
  constexpr uint64_t kSteps = 3;
  auto r = run_ranks(kWorld, [](int rank, int world, Exchange& ex) {
    RF_ASSIGN_OR_FAIL(Node node, make_node(rank, world, ex));
    // Transfer src * world + dst carries (src + 1) * 64 KiB + step bytes.
    auto bytes_of = [](int src, uint64_t step) { return size_t(src + 1) * (64 << 10) + step; };
    std::atomic<int> failures{0};
    std::atomic<int> done{0};
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::thread> receivers;
    for (int src = 0; src < world; ++src) {
      if (src == rank) continue;
      receivers.emplace_back([&, src] {
        for (uint64_t s = 0; s < kSteps; ++s) {
          const TensorKey key{uint64_t(src * world + rank), s};
          auto got = node.client->recv_tensor(src, key, kTimeout);
          if (!got.is_ok() || got->meta.bytes != bytes_of(src, s) ||
              !matches(got->data().data(), got->meta.bytes, seed_of(key, src))) {
            ADD_FAILURE() << "rank " << rank << " from " << src << " " << to_string(key) << ": "
                          << (got.is_ok() ? "wrong bytes" : got.status().to_string());
            ++failures;
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        ++done;
        cv.notify_all();
      });
    }
    for (uint64_t s = 0; s < kSteps; ++s) {
      for (int dst = 0; dst < world; ++dst) {
        if (dst == rank) continue;
        RF_ASSERT_OK(
            publish_pattern(*node.server, {uint64_t(rank * world + dst), s}, bytes_of(rank, s)));
      }
    }
    for (auto& t : receivers) t.join();
    RF_ASSERT(failures == 0);
    RF_ASSERT_OK(ex.barrier());  // everyone took everything before the servers go
    RF_ASSERT(node.server->pending() == 0);
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST(GrpcTensor, ManyConcurrentReceivesEachGetTheirTensor) {
  constexpr uint64_t kCalls = 256;
  constexpr size_t kBytes = 16 << 10;
  auto r = run_ranks(2, [](int rank, int world, Exchange& ex) {
    RF_ASSIGN_OR_FAIL(Node node, make_node(rank, world, ex));
    if (rank == 1) {
      RF_ASSERT_OK(ex.barrier());
      // Published in an order unrelated to the receives'.
      for (uint64_t i = 0; i < kCalls; ++i) {
        const uint64_t t = (i * 97) % kCalls;
        RF_ASSERT_OK(publish_pattern(*node.server, {t, 5}, kBytes + t));
      }
      for (uint64_t i = 0; i < 64; ++i) {
        RF_ASSERT_OK(publish_pattern(*node.server, {1000 + i, 6}, kBytes));
      }
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    std::vector<std::vector<std::byte>> dst(kCalls);
    std::mutex mu;
    std::condition_variable cv;
    uint64_t finished = 0;
    std::vector<Status> errors;
    for (uint64_t t = 0; t < kCalls; ++t) {
      dst[t].resize(kBytes + t);
      node.client->recv_tensor_into_async(
          1, {t, 5}, dst[t].data(), dst[t].size(), kTimeout, [&, t](Result<TensorMeta> m) {
            std::lock_guard<std::mutex> lock(mu);
            if (!m.is_ok()) {
              errors.push_back(m.status());
            } else if (!matches(dst[t].data(), kBytes + t, seed_of({t, 5}, 1))) {
              errors.push_back(RDMAFLOW_ERROR(Code::kInternal, "verify", 1, "wrong bytes"));
            }
            ++finished;
            cv.notify_all();
          });
    }
    // Blocking receives from many threads at the same time as the async ones.
    std::atomic<int> sync_failures{0};
    std::vector<std::thread> threads;
    for (uint64_t th = 0; th < 8; ++th) {
      threads.emplace_back([&, th] {
        for (uint64_t i = th; i < 64; i += 8) {
          const TensorKey key{1000 + i, 6};
          auto got = node.client->recv_tensor(1, key, kTimeout);
          if (!got.is_ok() || !matches(got->data().data(), kBytes, seed_of(key, 1)))
            ++sync_failures;
        }
      });
    }
    RF_ASSERT_OK(ex.barrier());
    {
      std::unique_lock<std::mutex> lock(mu);
      RF_ASSERT(cv.wait_for(lock, kTimeout + Millis(5000), [&] { return finished == kCalls; }));
      for (const Status& s : errors) ADD_FAILURE() << s.to_string();
      RF_ASSERT(errors.empty());
    }
    for (auto& t : threads) t.join();
    RF_ASSERT(sync_failures == 0);
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// publish_no_copy sends from the caller's memory and releases it exactly once:
// after the reply went out, when refused, when empty, or when dropped.
TEST(GrpcTensor, ZeroCopyPublishReleasesExactlyOnce) {
  constexpr size_t kBytes = 1 << 20;
  auto r = run_ranks(2, [](int rank, int world, Exchange& ex) {
    RF_ASSIGN_OR_FAIL(Node node, make_node(rank, world, ex));
    const TensorKey sent{1, 0}, empty{2, 0}, dropped{3, 0};
    if (rank == 1) {
      auto data = pattern(kBytes, seed_of(sent, 1));
      std::atomic<int> released[4] = {};
      auto release = [&](int i) { return [&released, i] { ++released[i]; }; };
      const auto shape = shape_of(kBytes);
      GrpcTensorServer& server = *node.server;
      RF_ASSERT_OK(
          server.publish_no_copy(sent, DataType::kU8, shape, data.data(), kBytes, release(0)));
      // A second publish of a pending key is refused and released at once.
      Status dup =
          server.publish_no_copy(sent, DataType::kU8, shape, data.data(), kBytes, release(3));
      EXPECT_EQ(dup.code(), Code::kInvalidArgument) << dup.to_string();
      RF_ASSERT(released[3] == 1);
      // Refused for its shape: released before publish returns.
      Status bad = server.publish_no_copy({9, 9}, DataType::kF32, shape, data.data(), 3,
                                          [&] { ++released[3]; });
      EXPECT_EQ(bad.code(), Code::kInvalidArgument);
      RF_ASSERT(released[3] == 2);
      const std::vector<int64_t> zero{0};
      RF_ASSERT_OK(server.publish_no_copy(empty, DataType::kU8, zero, nullptr, 0, release(1)));
      RF_ASSERT(released[1] == 1);
      RF_ASSERT_OK(
          server.publish_no_copy(dropped, DataType::kU8, shape, data.data(), kBytes, release(2)));
      RF_ASSERT(released[0] == 0 && released[2] == 0);
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(ex.barrier());  // rank 0 received `sent` and `empty`
      auto deadline = Clock::now() + kTimeout;
      while (released[0] == 0 && Clock::now() < deadline) std::this_thread::sleep_for(Millis(1));
      RF_ASSERT(released[0] == 1);
      RF_ASSERT(released[2] == 0);
      server.shutdown();
      RF_ASSERT(released[2] == 1);
      RF_ASSERT(released[0] == 1 && released[1] == 1 && released[3] == 2);
      return 0;
    }
    RF_ASSERT_OK(ex.barrier());  // rank 1 published
    RF_ASSIGN_OR_FAIL(ReceivedTensor got, node.client->recv_tensor(1, sent, kTimeout));
    RF_ASSERT(got.meta.bytes == kBytes && matches(got.data().data(), kBytes, seed_of(sent, 1)));
    RF_ASSIGN_OR_FAIL(ReceivedTensor none, node.client->recv_tensor(1, empty, kTimeout));
    RF_ASSERT(none.meta.bytes == 0 && none.meta.shape == std::vector<int64_t>{0});
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// Any gRPC client of tensor_service.proto can call the service: the reply
// parses with protobuf's generated code into the same tensor.
TEST(GrpcTensor, GeneratedStubReadsTheSameTensor) {
  namespace pb = ::rdmaflow::grpc_tensor;
  auto r = run_ranks(2, [](int rank, int world, Exchange& ex) {
    RF_ASSIGN_OR_FAIL(Node node, make_node(rank, world, ex));
    const std::vector<int64_t> shape{3, 5};
    const TensorKey key{42, 9};
    if (rank == 1) {
      auto data = pattern(60, seed_of(key, 1));
      RF_ASSERT_OK(node.server->publish(key, DataType::kF32, shape, data.data(), data.size()));
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    RF_ASSERT_OK(ex.barrier());
    auto channel = grpc::CreateCustomChannel(node.addresses[1], grpc::InsecureChannelCredentials(),
                                             grpc_common::channel_arguments());
    auto stub = pb::TensorService::NewStub(channel);
    auto call = [&](int src_rank, pb::RecvTensorResponse* resp) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + kTimeout);
      pb::RecvTensorRequest req;
      req.set_transfer_id(key.transfer_id);
      req.set_step(key.step);
      req.set_src_rank(src_rank);
      req.set_dst_rank(0);
      return stub->RecvTensor(&ctx, req, resp);
    };
    pb::RecvTensorResponse resp;
    grpc::Status st = call(1, &resp);
    RF_ASSERT(st.ok());
    RF_ASSERT(resp.tensor().dtype() == pb::DT_FLOAT);
    RF_ASSERT(std::vector<int64_t>(resp.tensor().shape().begin(), resp.tensor().shape().end()) ==
              shape);
    RF_ASSERT(resp.tensor().tensor_content().size() == 60);
    RF_ASSERT(matches(resp.tensor().tensor_content().data(), 60, seed_of(key, 1)));

    // A request meant for another rank's server is refused, naming both ranks.
    st = call(2, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(st.error_message().find("rank 2 but this server is rank 1"), std::string::npos)
        << st.error_message();

    // Bytes that are no RecvTensorRequest.
    grpc::GenericStub generic(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kTimeout);
    grpc::Slice junk(std::string("\xff\xff\xff", 3));
    grpc::ByteBuffer request(&junk, 1), reply;
    std::mutex mu;
    std::condition_variable cv;
    std::optional<grpc::Status> outcome;
    generic.UnaryCall(&ctx, "/rdmaflow.grpc_tensor.TensorService/RecvTensor", grpc::StubOptions(),
                      &request, &reply, [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        outcome = s;
                        cv.notify_all();
                      });
    {
      std::unique_lock<std::mutex> lock(mu);
      RF_ASSERT(cv.wait_for(lock, kTimeout, [&] { return outcome.has_value(); }));
      EXPECT_EQ(outcome->error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << outcome->error_message();
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

// ------------------------------------------------------------------ failures

TEST(GrpcTensor, NeverPublishedTimesOutWithinTheDeadline) {
  auto r = run_ranks(2, [](int rank, int world, Exchange& ex) {
    GrpcServerOptions options;
    options.max_wait = Millis(400);  // the server's own cap, for rank 1's server
    RF_ASSIGN_OR_FAIL(Node node, make_node(rank, world, ex, options));
    if (rank == 1) {
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    // The client's deadline ends the call.
    const TensorKey key{7, 3};
    auto t0 = Clock::now();
    auto got = node.client->recv_tensor(1, key, Millis(300));
    auto elapsed = Clock::now() - t0;
    RF_ASSERT(!got.is_ok());
    const std::string text = got.status().to_string();
    EXPECT_EQ(got.status().code(), Code::kTimeout) << text;
    EXPECT_EQ(got.status().peer(), 1) << text;
    EXPECT_NE(text.find("transfer 7 step 3"), std::string::npos) << text;
    EXPECT_NE(text.find("300 ms"), std::string::npos) << text;
    EXPECT_GE(elapsed, Millis(290));
    EXPECT_LT(elapsed, Millis(2000)) << text;

    // The server's max_wait ends a call whose own deadline is later.
    t0 = Clock::now();
    std::vector<std::byte> dst(16);
    auto meta = node.client->recv_tensor_into(1, {7, 4}, dst.data(), dst.size(), Millis(10000));
    elapsed = Clock::now() - t0;
    RF_ASSERT(!meta.is_ok());
    const std::string text2 = meta.status().to_string();
    EXPECT_EQ(meta.status().code(), Code::kTimeout) << text2;
    EXPECT_NE(text2.find("rank 1 did not publish it within"), std::string::npos) << text2;
    EXPECT_GE(elapsed, Millis(390));
    EXPECT_LT(elapsed, Millis(3000)) << text2;

    // A late publish still works for a new call: nothing was left behind.
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST(GrpcTensor, PeerKilledFailsWaitingAndLaterCallsNamingIt) {
  RunOptions o;
  o.may_be_killed = {1};
  auto r = run_ranks(
      2,
      [](int rank, int world, Exchange& ex) {
        RF_ASSIGN_OR_FAIL(Node node, make_node(rank, world, ex));
        if (rank == 1) {
          RF_ASSERT_OK(ex.barrier());
          for (;;) ::pause();  // killed by rank 0
        }
        constexpr Millis kLong(15000);
        RF_ASSERT_OK(node.client->connect(1, kTimeout));
        std::mutex mu;
        std::condition_variable cv;
        std::optional<Result<ReceivedTensor>> waiting;
        node.client->recv_tensor_async(1, {1, 1}, kLong, [&](Result<ReceivedTensor> got) {
          std::lock_guard<std::mutex> lock(mu);
          waiting.emplace(std::move(got));
          cv.notify_all();
        });
        RF_ASSERT_OK(ex.barrier());
        std::this_thread::sleep_for(Millis(100));  // the call is parked on rank 1's server
        auto killed_at = Clock::now();
        RF_ASSERT_OK(ex.kill(1));
        {
          std::unique_lock<std::mutex> lock(mu);
          RF_ASSERT(cv.wait_for(lock, kLong + Millis(5000), [&] { return waiting.has_value(); }));
        }
        EXPECT_LT(Clock::now() - killed_at, Millis(5000)) << "the death went unnoticed";
        RF_ASSERT(!waiting->is_ok());
        const Status& s = waiting->status();
        EXPECT_EQ(s.code(), Code::kPeerFailed) << s.to_string();
        EXPECT_EQ(s.peer(), 1);
        EXPECT_NE(s.to_string().find("rank 1"), std::string::npos) << s.to_string();
        EXPECT_NE(s.to_string().find("UNAVAILABLE"), std::string::npos) << s.to_string();

        // Calls after the death fail fast too.
        auto t0 = Clock::now();
        std::vector<std::byte> dst(8);
        auto later = node.client->recv_tensor_into(1, {1, 2}, dst.data(), dst.size(), kLong);
        EXPECT_EQ(later.status().code(), Code::kPeerFailed) << later.status().to_string();
        EXPECT_LT(Clock::now() - t0, Millis(5000));
        return 0;
      },
      o);
  RF_EXPECT_RUN_OK(r);
}

TEST(GrpcTensor, RefusesBadUseWithClearErrors) {
  auto r = run_ranks(2, [](int rank, int world, Exchange& ex) {
    RF_ASSIGN_OR_FAIL(Node node, make_node(rank, world, ex));
    if (rank == 1) {
      GrpcTensorServer& server = *node.server;
      const std::vector<int64_t> shape{4};
      std::vector<std::byte> data(16);
      // Size and shape disagree; negative dimension; null data; duplicate key.
      Status s = server.publish({1, 0}, DataType::kF32, shape, data.data(), 12);
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
      EXPECT_NE(s.reason().find("12 bytes given, the shape holds 16"), std::string::npos)
          << s.to_string();
      const std::vector<int64_t> negative{-4};
      EXPECT_EQ(server.publish({1, 0}, DataType::kU8, negative, data.data(), 4).code(),
                Code::kInvalidArgument);
      EXPECT_EQ(server.publish({1, 0}, DataType::kF32, shape, nullptr, 16).code(),
                Code::kInvalidArgument);
      RF_ASSERT_OK(server.publish({1, 0}, DataType::kF32, shape, data.data(), 16));
      s = server.publish({1, 0}, DataType::kF32, shape, data.data(), 16);
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
      EXPECT_NE(s.reason().find("already published"), std::string::npos) << s.to_string();
      RF_ASSERT(server.pending() == 1);
      // A tensor larger than the receiver's buffer (rank 0 checks the error).
      const std::vector<int64_t> big{100};
      std::vector<std::byte> big_data(100);
      RF_ASSERT_OK(server.publish({2, 0}, DataType::kU8, big, big_data.data(), 100));
      RF_ASSERT_OK(ex.barrier());
      RF_ASSERT_OK(ex.barrier());  // rank 0 parked two calls for {3, 0}
      server.shutdown();
      EXPECT_EQ(server.publish({9, 0}, DataType::kF32, shape, data.data(), 16).code(),
                Code::kCancelled);
      RF_ASSERT_OK(ex.barrier());
      return 0;
    }
    GrpcTensorClient& client = *node.client;
    RF_ASSERT_OK(ex.barrier());
    // An unknown peer, and a peer re-added at another address.
    auto unknown = client.recv_tensor(5, {1, 0}, kTimeout);
    EXPECT_EQ(unknown.status().code(), Code::kNotFound) << unknown.status().to_string();
    EXPECT_EQ(unknown.status().peer(), 5);
    EXPECT_EQ(client.add_peer(1, "127.0.0.1:1").code(), Code::kInvalidArgument);
    RF_ASSERT_OK(client.add_peer(1, node.addresses[1]));  // same address: fine

    // Too small a destination: kOutOfRange, and nothing written.
    std::vector<std::byte> small(10, std::byte{0x5a});
    auto meta = client.recv_tensor_into(1, {2, 0}, small.data(), small.size(), kTimeout);
    EXPECT_EQ(meta.status().code(), Code::kOutOfRange) << meta.status().to_string();
    EXPECT_NE(meta.status().reason().find("100 bytes"), std::string::npos)
        << meta.status().to_string();
    for (std::byte b : small) RF_ASSERT(b == std::byte{0x5a});

    // The well-formed one still arrives.
    RF_ASSIGN_OR_FAIL(ReceivedTensor got, client.recv_tensor(1, {1, 0}, kTimeout));
    RF_ASSERT(got.meta.dtype == DataType::kF32 && got.meta.bytes == 16);

    // Two calls wait for one key: the second is refused at once. Then rank 1
    // shuts its server down, which fails the first.
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Status> outcomes;
    auto record = [&](Result<ReceivedTensor> res) {
      std::lock_guard<std::mutex> lock(mu);
      outcomes.push_back(res.status());
      cv.notify_all();
    };
    client.recv_tensor_async(1, {3, 0}, kTimeout, record);
    std::this_thread::sleep_for(Millis(100));  // the first call is parked
    client.recv_tensor_async(1, {3, 0}, kTimeout, record);
    {
      std::unique_lock<std::mutex> lock(mu);
      RF_ASSERT(cv.wait_for(lock, kTimeout, [&] { return outcomes.size() == 1; }));
      EXPECT_EQ(outcomes[0].code(), Code::kInvalidArgument) << outcomes[0].to_string();
      EXPECT_NE(outcomes[0].reason().find("already waiting"), std::string::npos)
          << outcomes[0].to_string();
    }
    RF_ASSERT_OK(ex.barrier());
    {
      std::unique_lock<std::mutex> lock(mu);
      RF_ASSERT(cv.wait_for(lock, kTimeout, [&] { return outcomes.size() == 2; }));
      EXPECT_EQ(outcomes[1].code(), Code::kPeerFailed) << outcomes[1].to_string();
      EXPECT_NE(outcomes[1].reason().find("shut down"), std::string::npos)
          << outcomes[1].to_string();
    }
    RF_ASSERT_OK(ex.barrier());
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow::testing
