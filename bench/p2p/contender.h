// bench/p2p's rdmaflow contenders: a backend (or a backend pinned to one
// medium) connected between the two processes, with its latency and bandwidth
// loops.
#pragma once

#include "bench/p2p/harness.h"

namespace rdmaflow::bench {

struct Contender {
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Channel> channel;
  uint8_t* local = nullptr;  // registered; the peer writes here
  uint8_t* source = nullptr;
  size_t bytes = 0;
  RemoteKey peer_key;
  std::atomic<uint64_t> completed{0};
  std::atomic<uint64_t> failed{0};
  std::string first_error;
  std::mutex error_mu;

  ~Contender() {
    channel.reset();
    if (transport) transport->shutdown();
    std::free(local);
    std::free(source);
  }

  Callback counter() {
    return [this](const Status& st) {
      if (!st.is_ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (failed++ == 0) first_error = st.to_string();
      }
      completed.fetch_add(1, std::memory_order_release);
    };
  }
  void check_errors() {
    if (failed.load() > 0) die("transport operation failed: " + first_error);
  }

  uint64_t wait_notify(const Options& o) {
    if (o.spin) {
      auto deadline = Clock::now() + std::chrono::seconds(30);
      for (;;) {
        if (auto v = channel->inbox().poll_notify()) return *v;
        if (Clock::now() > deadline) die("timed out spinning for a notify");
      }
    }
    auto v = channel->inbox().wait_notify(Millis(30000));
    check(v.status(), "wait for notify");
    return *v;
  }
};

// A row of the report: a backend as the transport registry lists it, possibly
// pinned to one medium through the environment it is created in.
using Spec = TransportVariant;

// The registry's row named `name`; any other name is passed to make_transport()
// as it is, which names the backends this build has when it does not know it.
inline std::vector<Spec> expand(const std::string& name) {
  for (const Spec& v : transport_variants()) {
    if (v.label == name) return {v};
  }
  if (name == "tcp_tls") {
    // Not a registry row: tcp with every connection through TLS (RDMAFLOW_TLS=1,
    // common/tls.h; needs a job secret), to price encryption beside plain tcp in one run.
    Spec tls;
    tls.label = name;
    tls.backend = "tcp";
    tls.env = {{"RDMAFLOW_TLS", "1"}};
    return {tls};
  }
  Spec unknown;
  unknown.label = unknown.backend = name;
  return {unknown};
}

// A row per medium of every backend built in. Across hosts, every backend as
// it is: the pinned rows are for ranks of one host (ucx_tcp stays on lo).
inline std::vector<Spec> default_specs(bool across_hosts) {
  std::vector<Spec> out;
  for (const Spec& v : transport_variants()) {
    if (v.built && (across_hosts ? !v.pinned : v.per_medium)) out.push_back(v);
  }
  return out;
}

// Why `spec` does not run between two hosts, or empty when it does.
inline std::string same_host_only(const Spec& spec) {
  if (!spec.pinned) return {};
  std::string env;
  for (const auto& [k, v] : spec.env) env += (env.empty() ? "" : " ") + k + "=" + v;
  return "pinned to a same-host medium (" + env + "); the two ranks are on different hosts";
}

inline Result<std::unique_ptr<Transport>> create_in_env(const Spec& spec,
                                                        const TransportConfig& config) {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  for (const auto& [k, v] : spec.env) {
    const char* old = std::getenv(k.c_str());
    saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
    ::setenv(k.c_str(), v.c_str(), 1);
  }
  auto t = make_transport(spec.backend, config);
  for (const auto& [k, v] : saved) {
    if (v) {
      ::setenv(k.c_str(), v->c_str(), 1);
    } else {
      ::unsetenv(k.c_str());
    }
  }
  return t;
}

// `reach_address`: where socket backends listen (TransportConfig::reach_address);
// empty on one host.
inline std::unique_ptr<Contender> setup(const Spec& spec, int rank, Oob& oob, size_t bytes,
                                        const std::string& reach_address,
                                        std::string* skip_reason) {
  auto c = std::make_unique<Contender>();
  TransportConfig config;
  config.rank = rank;
  config.world_size = 2;
  config.reach_address = reach_address;
  auto t = create_in_env(spec, config);
  // Both sides must agree on skipping.
  std::string mine = t.is_ok() ? "ok" : t.status().to_string();
  oob.send(mine);
  std::string theirs = oob.recv();
  if (mine != "ok" || theirs != "ok") {
    *skip_reason = mine != "ok" ? mine : "peer: " + theirs;
    return nullptr;
  }
  c->transport = std::move(t).value();
  auto address = c->transport->listen();
  check(address.status(), "listen");
  oob.send(*address);
  std::string peer_address = oob.recv();
  if (rank == 0) {
    auto ch = c->transport->connect(1, peer_address, Millis(30000));
    check(ch.status(), "connect");
    c->channel = *ch;
  } else {
    auto ch = c->transport->accept(0, Millis(30000));
    check(ch.status(), "accept");
    c->channel = *ch;
  }
  c->bytes = bytes;
  // Whole pages are registered, as rdmaflow's own users register them (the arena's
  // slabs are 2 MiB-aligned): a region smaller than a page cannot be shared with a
  // same-host peer, so an 8-byte registration would time a path they never take.
  const size_t region = (bytes + 4095) / 4096 * 4096;
  c->local = static_cast<uint8_t*>(std::aligned_alloc(4096, region));
  c->source = static_cast<uint8_t*>(std::aligned_alloc(4096, region));
  std::memset(c->local, 0, region);
  std::memset(c->source, 7, region);
  check(c->transport->register_memory(c->local, region).status(), "register");
  check(c->transport->register_memory(c->source, region).status(), "register");
  auto key = c->transport->export_key(c->local, bytes);
  check(key.status(), "export key");
  auto wire = key->serialize();
  oob.send(std::string(wire.begin(), wire.end()));
  std::string peer = oob.recv();
  auto pk = RemoteKey::deserialize(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(peer.data()), peer.size()));
  check(pk.status(), "peer key");
  c->peer_key = *pk;
  return c;
}

// The transport's ping-pong: round() is one round trip (a notifying write each
// way); finish() waits for every write's completion and syncs the ranks.
struct TransportPingPong {
  static constexpr Millis kTimeout{30000};
  Contender& c;
  int rank;
  size_t size;
  const Options& o;
  uint64_t issued = 0;
  uint64_t seq = 0;

  std::function<void()> round() {
    return [this] {
      if (rank == 0) {
        c.channel->write(c.source, size, c.peer_key, 0, seq++, c.counter(), kTimeout);
        ++issued;
        c.wait_notify(o);
      } else {
        c.wait_notify(o);
        c.channel->write(c.source, size, c.peer_key, 0, seq++, c.counter(), kTimeout);
        ++issued;
      }
    };
  }
  // Lets every write's completion arrive before the next size.
  void finish(Oob& oob) {
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (c.completed.load(std::memory_order_acquire) < issued && Clock::now() < deadline) {
      std::this_thread::yield();
    }
    c.check_errors();
    c.completed = 0;
    oob.send("done");
    oob.recv();
  }
};

inline Latency transport_latency(Contender& c, int rank, Oob& oob, size_t size, const Options& o) {
  TransportPingPong pp{c, rank, size, o};
  Latency l = measure_pingpong(rank, oob, o, size, pp.round());
  pp.finish(oob);
  return l;
}

// --interleave: the socket reference's round trips and the transport's in turn,
// in the same loop (harness.h measure_pingpongs); returns {reference, transport}.
inline std::pair<Latency, Latency> interleaved_latency(Reference& ref, Contender& c, int rank,
                                                       Oob& oob, size_t size, const Options& o) {
  TransportPingPong pp{c, rank, size, o};
  auto l = measure_pingpongs(rank, oob, o, size, {ref.round(rank, size), pp.round()});
  pp.finish(oob);
  return {l[0], l[1]};
}

inline double transport_bandwidth(Contender& c, int rank, Oob& oob, size_t size, const Options& o) {
  constexpr Millis kTimeout(60000);
  const size_t window = window_for(size);
  auto run = [&](uint64_t windows) {
    for (uint64_t w = 0; w < windows; ++w) {
      CompletionGroup group;
      for (size_t i = 0; i < window; ++i) {
        c.channel->write(c.source, size, c.peer_key, 0, std::nullopt, group.add(), kTimeout);
      }
      check(group.wait(kTimeout + Millis(5000), "window of writes"), "bandwidth window");
    }
  };
  uint64_t windows = 0;
  if (rank == 0) {  // the writer; the peer's transport does the receiving on its own
    run(1);
    auto t0 = Clock::now();
    run(2);
    windows = pick_iters(since(t0), 2, o.seconds, 3, 100000);
    t0 = Clock::now();
    run(windows);
    double s = since(t0);
    oob.send("done");
    return static_cast<double>(windows * window * size) / s / 1e6;
  }
  oob.recv();
  return 0;
}

// ------------------------------------------------------------------- main

}  // namespace rdmaflow::bench
