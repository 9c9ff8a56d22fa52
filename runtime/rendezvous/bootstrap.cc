#include "runtime/rendezvous/bootstrap.h"

#include <algorithm>
#include <map>
#include <thread>

#include "common/counters.h"
#include "common/env.h"
#include "common/log.h"
#include "common/trace.h"
#include "runtime/rendezvous/launcher_rendezvous.h"
#include "runtime/rendezvous/tcp_store.h"
#include "runtime/rendezvous/tcp_store_protocol.h"
#include "runtime/rendezvous/trace_clock.h"

namespace rdmaflow {

namespace {

using Clock = std::chrono::steady_clock;
namespace wire = store_wire;

Millis remaining(Clock::time_point deadline) {
  return std::max(std::chrono::duration_cast<Millis>(deadline - Clock::now()), Millis(0));
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// What each rank publishes before the mesh is built: its listeners and, per peer,
// which of them it chose (so a disagreement is found without waiting).
struct MeshRecord {
  Status failure;  // set when this rank could not even start listening
  std::string failure_text;
  std::vector<std::pair<std::string, std::string>> listeners;  // name, address
  std::vector<uint8_t> choice;  // per peer: index into listeners, kNoChoice for self

  static constexpr uint8_t kNoChoice = 255;

  Bytes encode() const {
    ByteWriter w;
    if (!failure.is_ok()) {
      w.u8(0).str(failure.to_string());
      return w.body();
    }
    w.u8(1).u32(static_cast<uint32_t>(listeners.size()));
    for (const auto& [name, address] : listeners) w.str(name).str(address);
    w.u32(static_cast<uint32_t>(choice.size()));
    w.raw(choice.data(), choice.size());
    return w.body();
  }

  static std::optional<MeshRecord> decode(std::span<const uint8_t> bytes, int world) {
    ByteReader r(bytes);
    MeshRecord rec;
    auto ok = r.u8();
    if (!ok) return std::nullopt;
    if (*ok == 0) {
      auto text = r.str(wire::kMaxFrameBytes);
      if (!text) return std::nullopt;
      rec.failure_text = *text;
      return rec;
    }
    auto n = r.u32();
    if (!n || *n > 255) return std::nullopt;
    for (uint32_t i = 0; i < *n; ++i) {
      auto name = r.str(wire::kMaxKeyBytes);
      auto address = name ? r.str(wire::kMaxFrameBytes) : std::nullopt;
      if (!address) return std::nullopt;
      rec.listeners.emplace_back(*name, *address);
    }
    auto count = r.u32();
    if (!count || static_cast<int64_t>(*count) != world || r.left() != *count) return std::nullopt;
    auto rest = r.rest();
    rec.choice.assign(rest.begin(), rest.end());
    return rec;
  }

  bool failed() const { return !failure.is_ok() || !failure_text.empty(); }

  // The transport name this rank chose for `peer`, or empty.
  std::string choice_for(int peer) const {
    if (peer < 0 || static_cast<size_t>(peer) >= choice.size()) return {};
    uint8_t idx = choice[peer];
    if (idx >= listeners.size()) return {};
    return listeners[idx].first;
  }
  std::string address_of(const std::string& name) const {
    for (const auto& [n, a] : listeners) {
      if (n == name) return a;
    }
    return {};
  }
};

Bytes encode_status(const Status& st) {
  ByteWriter w;
  w.u8(st.is_ok() ? 1 : 0).str(st.is_ok() ? "" : st.to_string());
  return w.body();
}

}  // namespace

Result<std::unique_ptr<Bootstrap>> Bootstrap::create(BootstrapOptions options) {
  const auto start = Clock::now();
  std::unique_ptr<Bootstrap> b(new Bootstrap());
  if (options.rank_info) {
    b->info_ = *options.rank_info;
  } else {
    RDMAFLOW_ASSIGN_OR_RETURN(b->info_, detect_rank_info());
  }
  b->timeout_ = options.timeout.value_or(default_timeout());
  const int world = b->info_.world_size;
  const int rank = b->info_.rank;
  if (world < 1 || rank < 0 || rank >= world) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, "bootstrap", -1,
        "rank " + std::to_string(rank) + " is not inside a world of " + std::to_string(world));
  }
  set_log_rank(rank);

  if (options.store) {
    b->root_store_ = options.store;
    b->rendezvous_ = options.store->describe();
    if (world > 1 && b->info_.single_host != true && options.reach_toward) {
      auto toward = local_address_toward(*options.reach_toward);
      if (toward) {
        b->reach_address_ = *toward;
      } else {
        RDMAFLOW_LOG_WARN("bootstrap: {}; socket transports listen on loopback",
                          toward.status().to_string());
      }
    }
  } else if (world == 1) {
    b->root_store_ = std::make_shared<MemoryStore>(b->timeout_);
  } else {
    std::string what = "RDMAFLOW_RENDEZVOUS";
    std::optional<std::string> text = options.rendezvous;
    if (text) {
      what = "the rendezvous option";
    } else {
      text = env_string("RDMAFLOW_RENDEZVOUS");
    }
    auto start_server = [&b, world](const HostPort& at) -> Result<HostPort> {
      RDMAFLOW_ASSIGN_OR_RETURN(b->server_, TcpStoreServer::start(at, world));
      return b->server_->address();
    };
    HostPort hp;
    if (!text && b->info_.single_host == true) {
      text = kDefaultLocalRendezvous;
      RDMAFLOW_LOG_INFO("RDMAFLOW_RENDEZVOUS is not set; all {} ranks are on this host, using {}",
                        world, *text);
    }
    if (text) {
      RDMAFLOW_ASSIGN_OR_RETURN(hp, parse_host_port(*text, what));
      if (hp.port == 0) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, "bootstrap", -1,
                              what + "='" + *text + "' has port 0; every rank must know the port");
      }
      if (rank == 0) RDMAFLOW_RETURN_IF_ERROR(start_server(hp).status());
    } else {
      // Ranks on several hosts (or a layout the source cannot tell): ask the launcher.
      std::string why_not;
      RDMAFLOW_ASSIGN_OR_RETURN(
          std::optional<LauncherRendezvous> found,
          find_launcher_rendezvous(b->info_, process_env(), start_server, b->timeout_, &why_not));
      if (!found) {
        return RDMAFLOW_ERROR(
            Code::kInvalidArgument, "bootstrap", -1,
            "RDMAFLOW_RENDEZVOUS is not set and the " + std::to_string(world) +
                " ranks are not known to share one host (" + b->info_.source + "); " + why_not +
                "; set RDMAFLOW_RENDEZVOUS=host:port to an address of rank 0's host");
      }
      hp = found->address;
      RDMAFLOW_LOG_INFO("RDMAFLOW_RENDEZVOUS is not set; rendezvous {} from {}", hp.to_string(),
                        found->source);
    }
    b->rendezvous_ = hp.to_string();
    // Across hosts, socket transports listen where this host reaches rank 0's.
    if (b->info_.single_host != true) {
      auto toward = local_address_toward(hp.host);
      if (toward) {
        b->reach_address_ = *toward;
      } else {
        RDMAFLOW_LOG_WARN("bootstrap: {}; socket transports listen on loopback",
                          toward.status().to_string());
      }
    }
    RDMAFLOW_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> client,
                              TcpStore::connect(hp, b->timeout_, b->timeout_));
    b->tcp_store_ = std::move(client);
    b->root_store_ = b->tcp_store_;
  }
  b->internal_ = std::make_shared<PrefixStore>(b->root_store_, "rdmaflow");
  b->user_store_ = std::make_shared<PrefixStore>(b->root_store_, "user");
  // Until it has joined, this process is not part of the job: if anything above or
  // in join() fails, there is no goodbye to say and no server to keep alive.
  RDMAFLOW_RETURN_IF_ERROR(b->join(b->timeout_));
  b->finalized_ = false;
  if (trace::enabled()) align_trace_clock(*b->internal_, rank, world);
  RDMAFLOW_LOG_INFO("bootstrap ready: rank {} of {}{} in {:.1f} ms", rank, world,
                    world > 1 ? " via rendezvous " + b->rendezvous_ : std::string(),
                    ms_since(start));
  return b;
}

// Every rank checks it agrees with rank 0 on the world size and that nobody else
// claimed its rank, then waits for all ranks.
Status Bootstrap::join(Millis timeout) {
  if (world_size() == 1) return Status::ok();
  const auto deadline = Clock::now() + timeout;
  const std::string world_text = std::to_string(world_size());
  if (rank() == 0) RDMAFLOW_RETURN_IF_ERROR(internal_->set("join/world", to_bytes(world_text)));
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t claims,
                            internal_->add("join/rank/" + std::to_string(rank()), 1, timeout));
  if (claims > 1) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "bootstrap", -1,
                          "another process already joined the " + rendezvous_ + " as rank " +
                              std::to_string(rank()) + " (" + info_.source +
                              "); is a second job using the same RDMAFLOW_RENDEZVOUS?");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(Bytes rank0_world, internal_->get("join/world", remaining(deadline)));
  if (as_string(rank0_world) != world_text) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "bootstrap", 0,
                          "this rank has world size " + world_text + " (" + info_.source +
                              ") but rank 0 has " + as_string(rank0_world));
  }
  return barrier(remaining(deadline)).with_op("bootstrap: wait for every rank to join");
}

Bootstrap::~Bootstrap() {
  Status st = finalize();
  if (!st.is_ok()) RDMAFLOW_LOG_WARN("{}", st.to_string());
}

Status Bootstrap::finalize(std::optional<Millis> timeout) {
  if (finalized_) return Status::ok();
  finalized_ = true;
  const auto deadline = Clock::now() + timeout.value_or(timeout_);
  Status st;
  if (tcp_store_) st = tcp_store_->goodbye(rank(), remaining(deadline));
  if (server_) {
    Status s = server_->wait_for_goodbyes(remaining(deadline));
    if (st.is_ok()) st = s;
    server_->stop();
    RDMAFLOW_LOG_DEBUG("rendezvous server at {} stopped", rendezvous_);
  }
  return st;
}

Status Bootstrap::barrier(std::optional<Millis> timeout) {
  const Millis t = timeout.value_or(timeout_);
  const auto deadline = Clock::now() + t;
  const uint64_t n = barriers_++;
  const std::string key = "barrier/" + std::to_string(n);
  const std::string op = "barrier #" + std::to_string(n);
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t arrived, internal_->add(key, 1, t));
  if (arrived == world_size()) {
    RDMAFLOW_RETURN_IF_ERROR(internal_->set(key + "/done", to_bytes("1")));
  }
  Status st = internal_->wait({key + "/done"}, remaining(deadline));
  if (st.code() == Code::kTimeout) {
    const std::string world = std::to_string(world_size());
    const std::string within =
        " within " + std::to_string(t.count()) + " ms (" + internal_->describe() + ")";
    auto arrived_now = internal_->add(key, 0, std::min(t, Millis(1000)));
    if (!arrived_now.is_ok()) {
      return RDMAFLOW_ERROR(Code::kTimeout, op, -1,
                            "not all " + world + " ranks arrived" + within +
                                "; counting them failed too: " + arrived_now.status().reason());
    }
    return RDMAFLOW_ERROR(
        Code::kTimeout, op, -1,
        "only " + std::to_string(*arrived_now) + " of " + world + " ranks arrived" + within);
  }
  return st.is_ok() ? st : st.with_op(op);
}

Result<std::vector<Bytes>> Bootstrap::allgather(std::span<const uint8_t> mine,
                                                std::optional<Millis> timeout) {
  const Millis t = timeout.value_or(timeout_);
  const auto deadline = Clock::now() + t;
  const std::string prefix = "allgather/" + std::to_string(allgathers_++) + "/";
  RDMAFLOW_RETURN_IF_ERROR(internal_->set(prefix + std::to_string(rank()), mine, t));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size(); ++r) keys.push_back(prefix + std::to_string(r));
  RDMAFLOW_RETURN_IF_ERROR(internal_->wait(keys, remaining(deadline)).with_op("allgather"));
  std::vector<Bytes> all(world_size());
  for (int r = 0; r < world_size(); ++r) {
    if (r == rank()) {
      all[r].assign(mine.begin(), mine.end());
      continue;
    }
    // Present already (waited above); a short deadline still bounds a broken store.
    RDMAFLOW_ASSIGN_OR_RETURN(all[r],
                              internal_->get(keys[r], std::max(remaining(deadline), Millis(1000))));
  }
  return all;
}

TransportConfig Bootstrap::transport_config() const {
  TransportConfig config;
  config.rank = rank();
  config.world_size = world_size();
  config.ifname = env_string("RDMAFLOW_SOCKET_IFNAME").value_or("");
  config.reach_address = reach_address_;
  config.connect_timeout = timeout_;
  return config;
}

Result<ChannelMesh> Bootstrap::connect_mesh(Transport& transport, std::optional<Millis> timeout) {
  return connect_mesh([&transport](int) { return &transport; }, timeout);
}

Result<ChannelMesh> Bootstrap::connect_mesh(const TransportSelector& select,
                                            std::optional<Millis> timeout) {
  const Millis t = timeout.value_or(timeout_);
  const auto start = Clock::now();
  const auto deadline = start + t;
  const int world = world_size();
  const int me = rank();
  const int mesh_index = meshes_++;
  const std::string op = "connect_mesh #" + std::to_string(mesh_index);
  // A rank whose connect fails counts itself here at once, so that ranks still
  // waiting in accept stop within a slice instead of at the deadline (a wrong
  // job secret is known the moment it is refused, and torch's default timeout
  // is 30 minutes).
  const std::string failed_key = "mesh/" + std::to_string(mesh_index) + "/failed";
  ChannelMesh mesh(world);

  // 1. Choose a transport per peer and start listening on each.
  MeshRecord mine;
  mine.choice.assign(world, MeshRecord::kNoChoice);
  std::vector<Transport*> chosen(world, nullptr);
  std::map<std::string, Transport*> by_name;
  for (int p = 0; p < world && mine.failure.is_ok(); ++p) {
    if (p == me) continue;
    Transport* tr = select(p);
    if (tr == nullptr) {
      mine.failure =
          RDMAFLOW_ERROR(Code::kInvalidArgument, op, p, "no transport chosen for this peer");
      break;
    }
    auto [it, inserted] = by_name.emplace(tr->name(), tr);
    if (!inserted && it->second != tr) {
      mine.failure = RDMAFLOW_ERROR(Code::kInvalidArgument, op, p,
                                    "two different transports are named '" + tr->name() + "'");
      break;
    }
    chosen[p] = tr;
  }
  if (mine.failure.is_ok() && by_name.size() > 254) {
    mine.failure = RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1, "too many transports");
  }
  for (auto& [name, tr] : by_name) {
    if (!mine.failure.is_ok()) break;
    auto address = tr->listen();
    if (!address.is_ok()) {
      mine.failure = address.status().with_op(op + ": listen on " + name);
      break;
    }
    mine.listeners.emplace_back(name, *address);
  }
  if (mine.failure.is_ok()) {
    for (int p = 0; p < world; ++p) {
      if (p == me) continue;
      for (size_t i = 0; i < mine.listeners.size(); ++i) {
        if (mine.listeners[i].first == chosen[p]->name()) mine.choice[p] = static_cast<uint8_t>(i);
      }
    }
  }

  // 2. Publish the listeners and learn everyone's.
  RDMAFLOW_ASSIGN_OR_RETURN(std::vector<Bytes> records,
                            allgather(mine.encode(), remaining(deadline)));
  const double publish_ms = ms_since(start);

  // 3. Every rank holds the same records, so every rank reaches the same verdict on
  // them: if any rank failed to listen or any pair disagrees on its transport, all
  // ranks return the same error now, and nobody waits on a connection that will
  // never come.
  if (!mine.failure.is_ok()) return mine.failure;
  std::vector<MeshRecord> recs(world);
  for (int p = 0; p < world; ++p) {
    auto rec = MeshRecord::decode(records[p], world);
    if (!rec) {
      return RDMAFLOW_ERROR(Code::kProtocolError, op, p, "malformed mesh record from this rank");
    }
    if (rec->failed()) {
      return RDMAFLOW_ERROR(
          Code::kPeerFailed, op, p,
          "rank " + std::to_string(p) + " could not set up: " + rec->failure_text);
    }
    recs[p] = std::move(*rec);
  }
  for (int i = 0; i < world; ++i) {
    for (int j = i + 1; j < world; ++j) {
      const std::string ci = recs[i].choice_for(j), cj = recs[j].choice_for(i);
      if (ci != cj || ci.empty()) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, op, i == me ? j : i,
                              "rank " + std::to_string(i) + " chose transport '" + ci +
                                  "' for rank " + std::to_string(j) + " but rank " +
                                  std::to_string(j) + " chose '" + cj + "' for rank " +
                                  std::to_string(i));
      }
    }
  }
  std::vector<std::string> peer_address(world);
  for (int p = 0; p < me; ++p) peer_address[p] = recs[p].address_of(chosen[p]->name());
  Status local;

  // 4. The higher rank connects, the lower accepts. Accepts run on their own thread
  // so that no rank waits on a peer that is itself waiting.
  Status accept_error, connect_error;
  double accept_ms = 0, connect_ms = 0;
  int accepted = 0, connected = 0;
  // Accepts in slices; between them, asks whether any rank has failed to connect.
  auto accept_from = [&](int p) -> Result<std::shared_ptr<Channel>> {
    constexpr Millis kSlice(250);
    for (;;) {
      const Millis left = remaining(deadline);
      auto ch = chosen[p]->accept(p, std::min(left, kSlice));
      if (ch.is_ok() || ch.status().code() != Code::kTimeout) return ch;
      if (left <= kSlice) {
        return RDMAFLOW_ERROR(Code::kTimeout, "accept", p,
                              "rank " + std::to_string(p) + " did not connect within " +
                                  std::to_string(t.count()) + " ms (" + ch.status().reason() + ")");
      }
      auto failures = internal_->add(failed_key, 0, kSlice);
      if (failures.is_ok() && *failures > 0) {
        return RDMAFLOW_ERROR(Code::kCancelled, "accept", p,
                              "stopped waiting: a rank failed to connect (its error follows)");
      }
    }
  };
  {
    std::thread acceptor([&] {
      const auto t0 = Clock::now();
      for (int p = me + 1; p < world; ++p) {
        auto ch = accept_from(p);
        if (ch.is_ok()) {
          mesh[p] = std::move(*ch);
          ++accepted;
        } else {
          stats::counters(chosen[p]->name(), p).add_error();
          if (accept_error.is_ok()) {
            accept_error = ch.status().with_op(op + ": accept from rank " + std::to_string(p) +
                                               " over " + chosen[p]->name());
          }
          if (ch.status().code() == Code::kCancelled) break;  // the mesh fails anyway
        }
      }
      accept_ms = ms_since(t0);
    });
    const auto t0 = Clock::now();
    for (int p = 0; p < me; ++p) {
      auto ch = chosen[p]->connect(p, peer_address[p], remaining(deadline));
      if (ch.is_ok()) {
        mesh[p] = std::move(*ch);
        ++connected;
      } else {
        stats::counters(chosen[p]->name(), p).add_error();
        if (connect_error.is_ok()) {
          connect_error =
              ch.status().with_op(op + ": connect to rank " + std::to_string(p) + " at " +
                                  peer_address[p] + " over " + chosen[p]->name());
          (void)internal_->add(failed_key, 1, remaining(deadline));  // best effort
        }
      }
    }
    connect_ms = ms_since(t0);
    acceptor.join();
    local = !connect_error.is_ok() ? connect_error : accept_error;
  }

  // 5. Agree on the outcome, so a failure on one rank fails the mesh on all of them.
  const auto t_confirm = Clock::now();
  const Millis grace = std::min(t, Millis(5000));
  auto outcomes = allgather(encode_status(local), std::max(remaining(deadline), grace));
  Status result = local;
  if (result.is_ok() && !outcomes.is_ok()) result = outcomes.status().with_op(op + ": confirm");
  if (result.is_ok()) {
    for (int p = 0; p < world; ++p) {
      ByteReader r((*outcomes)[p]);
      auto ok = r.u8();
      auto text = r.str(wire::kMaxFrameBytes);
      if (!ok || !text) {
        result = RDMAFLOW_ERROR(Code::kProtocolError, op, p, "malformed mesh outcome");
        break;
      }
      if (*ok == 0) {
        result = RDMAFLOW_ERROR(Code::kPeerFailed, op, p,
                                "rank " + std::to_string(p) + " failed: " + *text);
        break;
      }
    }
  }
  if (!result.is_ok()) {
    for (auto& ch : mesh) {
      if (ch) ch->close();
    }
    RDMAFLOW_LOG_WARN("{}", result.to_string());
    return result;
  }

  std::string names;
  for (const auto& [name, tr] : by_name) names += (names.empty() ? "" : ", ") + name;
  RDMAFLOW_LOG_INFO(
      "{}: {} channels over {} in {:.1f} ms (publish {:.1f} ms, connect to {} lower ranks "
      "{:.1f} ms, accept from {} higher ranks {:.1f} ms, confirm {:.1f} ms)",
      op, world - 1, names.empty() ? "nothing" : names, ms_since(start), publish_ms, connected,
      connect_ms, accepted, accept_ms, ms_since(t_confirm));
  return mesh;
}

}  // namespace rdmaflow
