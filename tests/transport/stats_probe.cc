// One rank of the counters test (tests/transport/stats_test.py): bootstraps
// from RDMAFLOW_RANK / RDMAFLOW_WORLD_SIZE / RDMAFLOW_RENDEZVOUS, builds the
// mesh over one backend and moves a known number of bytes to every peer, so
// that the table RDMAFLOW_STATS prints at exit and the Prometheus file it
// writes can be checked against what moved.
//
//   stats_probe BACKEND move   every rank, to every peer p: writes of
//                              1000 * (me + 1) + p bytes (3 of them), one read
//                              of 4096 + p bytes, one message of 100 + me bytes;
//                              prints "expect peer=P bytes_sent=... ..." per peer
//   stats_probe BACKEND kill   2 ranks: rank 1 is SIGKILLed by itself once the
//                              mesh is up; rank 0 then writes to it until a
//                              write fails, and exits 0 (its table must show
//                              the errors)
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/counters.h"
#include "runtime/rendezvous/bootstrap.h"
#include "transport/transport.h"

namespace {

using namespace std::chrono_literals;
using namespace rdmaflow;

constexpr size_t kBuffer = 1 << 20;
constexpr int kWrites = 3;

int fail(const std::string& what) {
  std::fprintf(stderr, "stats_probe: %s\n", what.c_str());
  return 1;
}

size_t write_bytes(int me, int peer) {
  return 1000 * static_cast<size_t>(me + 1) + peer;
}
size_t read_bytes(int peer) {
  return 4096 + static_cast<size_t>(peer);
}
size_t message_bytes(int from) {
  return 100 + static_cast<size_t>(from);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: stats_probe BACKEND move|kill");
  const std::string backend = argv[1], mode = argv[2];
  auto boot_r = Bootstrap::create();
  if (!boot_r.is_ok()) return fail(boot_r.status().to_string());
  Bootstrap& boot = **boot_r;
  const int me = boot.rank(), world = boot.world_size();
  auto tr = make_transport(backend, boot.transport_config());
  if (!tr.is_ok()) return fail(tr.status().to_string());
  Transport& t = **tr;
  auto mesh_r = boot.connect_mesh(t);
  if (!mesh_r.is_ok()) return fail(mesh_r.status().to_string());
  auto& mesh = *mesh_r;

  std::vector<std::byte> buffer(kBuffer);
  auto region = t.register_memory(buffer.data(), buffer.size());
  if (!region.is_ok()) return fail(region.status().to_string());
  auto key = t.export_key(buffer.data(), buffer.size());
  if (!key.is_ok()) return fail(key.status().to_string());
  auto keys_r = boot.allgather(key->serialize());
  if (!keys_r.is_ok()) return fail(keys_r.status().to_string());
  std::vector<RemoteKey> keys;
  for (const auto& k : *keys_r) {
    auto d = RemoteKey::deserialize(k);
    if (!d.is_ok()) return fail(d.status().to_string());
    keys.push_back(*d);
  }

  if (mode == "kill") {
    if (world != 2) return fail("kill needs 2 ranks");
    if (Status st = boot.barrier(); !st.is_ok()) return fail(st.to_string());
    if (me == 1) ::kill(::getpid(), SIGKILL);
    // Writes until one fails: the peer is gone, the channel notices.
    for (int i = 0; i < 2000; ++i) {
      Completion c;
      mesh[1]->write(buffer.data(), 4096, keys[1], 0, std::nullopt, c.callback(), 2000ms);
      if (!c.wait(5000ms).is_ok()) {
        std::printf("stats_probe: write %d to the killed rank failed, as it should\n", i);
        std::printf("expect-errors peer=1 transport=%s\n", backend.c_str());
        return 0;  // the exit report runs
      }
      std::this_thread::sleep_for(5ms);
    }
    return fail("writes to a killed rank kept succeeding");
  }

  CompletionGroup ops;
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    Channel& ch = *mesh[p];
    for (int i = 0; i < kWrites; ++i) {
      ch.write(buffer.data(), write_bytes(me, p), keys[p], 0, std::nullopt, ops.add(), 10000ms);
    }
    // Each peer's read into its own range: the responses of different peers
    // may land at once, on different threads (a joined wait drives some).
    ch.read(buffer.data() + kBuffer / 2 + static_cast<size_t>(p) * 8192, read_bytes(p), keys[p], 0,
            ops.add(), 10000ms);
    ch.send_message(std::vector<uint8_t>(message_bytes(me), 7), ops.add(), 10000ms);
  }
  if (Status st = ops.wait(20000ms); !st.is_ok()) return fail(st.to_string());
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    auto m = mesh[p]->inbox().recv_message(20000ms);
    if (!m.is_ok()) return fail(m.status().to_string());
    if (m->size() != message_bytes(p)) return fail("a message of the wrong size");
  }
  // What the counters must say, by the definitions of common/counters.h.
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    const uint64_t sent = kWrites * write_bytes(me, p) + message_bytes(me);
    const uint64_t received = read_bytes(p) + message_bytes(p);
    std::printf(
        "expect transport=%s peer=%d bytes_sent=%llu bytes_received=%llu writes=%d reads=1 "
        "messages_sent=1 messages_received=1 errors=0\n",
        backend.c_str(), p, static_cast<unsigned long long>(sent),
        static_cast<unsigned long long>(received), kWrites);
    // The API gives the same figures as the exit report.
    const stats::PeerCounters& c = mesh[p]->counters();
    if (c.bytes_sent.load() != sent || c.bytes_received.load() != received) {
      return fail("counters() of peer " + std::to_string(p) + ": sent " +
                  std::to_string(c.bytes_sent.load()) + " received " +
                  std::to_string(c.bytes_received.load()) + ", expected " + std::to_string(sent) +
                  " and " + std::to_string(received));
    }
  }
  std::fflush(stdout);
  if (Status st = boot.barrier(); !st.is_ok()) return fail(st.to_string());
  t.shutdown();
  if (Status st = boot.finalize(); !st.is_ok()) return fail(st.to_string());
  return 0;
}
