#include "bench/p2p/grpc_reference.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <vector>

#include "transport/grpc/grpc_tensor.h"

namespace rdmaflow::bench {

namespace {

constexpr Millis kTimeout(60000);
// Transfer ids of the tensors, so that keys never repeat within a run.
enum : uint64_t { kPing = 1, kPong = 2, kStream = 3, kAck = 4 };

}  // namespace

struct GrpcReference::Impl {
  int peer = 0;
  std::unique_ptr<GrpcTensorServer> server;
  std::unique_ptr<GrpcTensorClient> client;
  std::vector<uint8_t> source;
  std::vector<uint8_t> sink;
  uint64_t next_step = 0;        // ping-pong rounds and stream tensors so far
  std::atomic<int64_t> held{0};  // publish_no_copy tensors not released yet

  // Starts the pull of `key`; the future holds its outcome.
  std::future<Result<TensorMeta>> pull(const TensorKey& key, void* dst, size_t capacity) {
    auto done = std::make_shared<std::promise<Result<TensorMeta>>>();
    auto f = done->get_future();
    client->recv_tensor_into_async(peer, key, dst, capacity, kTimeout,
                                   [done](Result<TensorMeta> r) { done->set_value(std::move(r)); });
    return f;
  }
  static void wait(std::future<Result<TensorMeta>>& f, const char* what) {
    auto r = f.get();
    check(r.status(), what);
  }
  void publish(const TensorKey& key, size_t size) {
    const int64_t shape[] = {static_cast<int64_t>(size)};
    check(server->publish(key, DataType::kU8, shape, source.data(), size), "gRPC publish");
  }
};

GrpcReference::GrpcReference(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GrpcReference::~GrpcReference() {
  // Tensors published without a copy point into source: wait for their release.
  for (int i = 0; i < 5000 && impl_->held.load() > 0; ++i) ::usleep(1000);
  impl_->client.reset();
  impl_->server.reset();
}

std::unique_ptr<GrpcReference> GrpcReference::connect(int rank, Oob& oob, const std::string& host,
                                                      size_t max_bytes) {
  auto impl = std::make_unique<Impl>();
  impl->peer = 1 - rank;
  GrpcServerOptions so;
  so.rank = rank;
  so.ifname = host;
  auto server = GrpcTensorServer::start(so);
  check(server.status(), "gRPC reference: start the server");
  impl->server = std::move(server).value();
  oob.send(impl->server->address());
  const std::string peer_address = oob.recv();
  impl->client = std::make_unique<GrpcTensorClient>(rank);
  check(impl->client->add_peer(impl->peer, peer_address), "gRPC reference: add peer");
  check(impl->client->connect(impl->peer, kTimeout), "gRPC reference: connect");
  impl->source.assign(max_bytes, 7);
  impl->sink.assign(max_bytes, 0);
  return std::unique_ptr<GrpcReference>(new GrpcReference(std::move(impl)));
}

Latency GrpcReference::latency(int rank, Oob& oob, size_t size, const Options& o) {
  Impl& m = *impl_;
  // Rank 1 keeps its pull of rank 0's next ping waiting on rank 0's server.
  std::future<Result<TensorMeta>> pending;
  if (rank == 1) pending = m.pull({kPing, m.next_step}, m.sink.data(), m.sink.size());
  Latency l = measure_pingpong(rank, oob, o, size, [&] {
    const uint64_t step = m.next_step++;
    if (rank == 0) {
      auto pong = m.pull({kPong, step}, m.sink.data(), m.sink.size());
      m.publish({kPing, step}, size);
      Impl::wait(pong, "gRPC pong");
    } else {
      Impl::wait(pending, "gRPC ping");
      pending = m.pull({kPing, step + 1}, m.sink.data(), m.sink.size());
      m.publish({kPong, step}, size);
    }
  });
  // The pull rank 1 left waiting: answered, so both ranks leave in step.
  if (rank == 0) {
    m.publish({kPing, m.next_step}, size);
  } else {
    Impl::wait(pending, "gRPC ping");
  }
  ++m.next_step;
  return l;
}

double GrpcReference::bandwidth(int rank, Oob& oob, size_t size, const Options& o) {
  Impl& m = *impl_;
  const size_t window = window_for(size);
  if (rank == 1 && m.sink.size() < window * size) m.sink.assign(window * size, 0);
  auto run = [&](uint64_t windows) {
    for (uint64_t w = 0; w < windows; ++w) {
      const uint64_t base = m.next_step;
      m.next_step += window;
      if (rank == 0) {
        uint8_t ack = 0;
        auto acked = m.pull({kAck, base}, &ack, 1);
        const int64_t shape[] = {static_cast<int64_t>(size)};
        for (size_t i = 0; i < window; ++i) {
          m.held.fetch_add(1);
          check(m.server->publish_no_copy({kStream, base + i}, DataType::kU8, shape,
                                          m.source.data(), size, [&m] { m.held.fetch_sub(1); }),
                "gRPC publish_no_copy");
        }
        Impl::wait(acked, "gRPC window acknowledgement");
      } else {
        std::vector<std::future<Result<TensorMeta>>> pulls;
        pulls.reserve(window);
        for (size_t i = 0; i < window; ++i) {
          pulls.push_back(m.pull({kStream, base + i}, m.sink.data() + i * size, size));
        }
        for (auto& f : pulls) Impl::wait(f, "gRPC stream tensor");
        m.publish({kAck, base}, 1);
      }
    }
  };
  return measure_windows(rank, oob, o, window * size, run);
}

void ensure_malloc_tunables(char** argv) {
  if (std::getenv("GLIBC_TUNABLES") != nullptr) return;
  ::setenv("GLIBC_TUNABLES", kMallocTunables, 1);
  ::execv("/proc/self/exe", argv);
  // Not re-executed: run on with glibc's defaults; the report says which.
}

}  // namespace rdmaflow::bench
