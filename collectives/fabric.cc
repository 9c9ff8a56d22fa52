#include "collectives/fabric.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/bytes.h"
#include "common/env.h"
#include "common/log.h"

namespace rdmaflow {
namespace {

constexpr char kHello[8] = {'R', 'F', 'C', 'O', 'L', 'L', '0', '3'};

// The payload of every credit write on backends that take any source (see
// Peer::credit_source): static, so it outlives a held credit.
constexpr uint64_t kCreditPayload = 0;

// Takes every notify out of `inbox`, records ours, puts the others back.
void drain(Fabric::Shared& s, Inbox& inbox, int peer) {
  thread_local int depth = 0;
  if (depth > 0) return;  // our own push_notify() of foreign values
  ++depth;
  std::vector<uint64_t> foreign;
  Fabric::PeerSlots& ps = s.peers[peer];
  while (auto v = inbox.poll_notify()) {
    if ((*v & notify_code::kMagicMask) != notify_code::kMagic) {
      foreign.push_back(*v);
      continue;
    }
    const uint64_t kind = (*v >> 54) & 3;
    const int lane = static_cast<int>((*v >> 48) & 63);
    const uint64_t seq = *v & notify_code::kSeqMask;
    if (lane >= s.lanes) continue;
    const size_t idx = static_cast<size_t>(lane) * s.slots + seq % s.slots;
    auto& cell = kind == notify_code::kData ? ps.data[idx] : ps.credit[idx];
    cell.store(seq + 1, std::memory_order_release);
  }
  for (uint64_t v : foreign) inbox.push_notify(v);
  --depth;
  s.signal.notify();
}

}  // namespace

Result<std::unique_ptr<Fabric>> Fabric::create(int rank, int world,
                                               std::vector<std::shared_ptr<Channel>> channels,
                                               std::vector<Transport*> transports,
                                               FabricConfig config) {
  const char* op = "create communicator";
  if (world < 1 || rank < 0 || rank >= world) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, op, -1,
        "rank " + std::to_string(rank) + " outside world " + std::to_string(world));
  }
  if (static_cast<int>(channels.size()) != world) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "expected " + std::to_string(world) + " channel entries, got " +
                              std::to_string(channels.size()));
  }
  if (static_cast<int>(transports.size()) != world) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "expected " + std::to_string(world) + " transport entries, got " +
                              std::to_string(transports.size()));
  }
  if (config.lanes < 1 || config.lanes > 63 || config.slots < 1 || config.slot_bytes < 64) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "need 1..63 lanes, >= 1 slot and slots of >= 64 bytes");
  }
  config.slot_bytes = (config.slot_bytes + 63) / 64 * 64;
  if (config.credit_hold < 0) {
    auto hold = env_int("RDMAFLOW_COLL_CREDIT_HOLD", std::max(0, config.slots / 2 - 1));
    if (!hold.is_ok() || *hold < 0) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                            "RDMAFLOW_COLL_CREDIT_HOLD must be a count >= 0");
    }
    config.credit_hold = static_cast<int>(std::min<int64_t>(*hold, config.slots - 1));
  }
  config.credit_hold = std::clamp(config.credit_hold, 0, config.slots - 1);
  std::unique_ptr<Fabric> f(new Fabric());
  f->rank_ = rank;
  f->world_ = world;
  f->config_ = config;
  f->peers_.resize(world);
  f->shared_ = std::make_shared<Shared>();
  f->shared_->lanes = config.lanes;
  f->shared_->slots = config.slots;
  f->shared_->peers.resize(world);
  const size_t cells = static_cast<size_t>(config.lanes) * config.slots;
  for (int p = 0; p < world; ++p) {
    if (p == rank) continue;
    if (!channels[p]) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, p, "no channel to this peer");
    }
    if (transports[p] == nullptr) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, op, p, "no transport for this peer");
    }
    Peer& peer = f->peers_[p];
    peer.channel = channels[p];
    peer.staged = config.stage_all || !peer.channel->capabilities().any_source_memory;
    peer.send_seq.assign(config.lanes, 0);
    peer.recv_seq.assign(config.lanes, 0);
    PeerSlots& ps = f->shared_->peers[p];
    ps.data = std::make_unique<std::atomic<uint64_t>[]>(cells);
    ps.credit = std::make_unique<std::atomic<uint64_t>[]>(cells);
    for (size_t i = 0; i < cells; ++i) {
      ps.data[i].store(0);
      ps.credit[i].store(0);
    }
  }
  RDMAFLOW_RETURN_IF_ERROR(f->setup(std::move(transports)));
  return f;
}

Status Fabric::setup(std::vector<Transport*> transports) {
  const char* op = "create communicator";
  cells_ = static_cast<size_t>(config_.lanes) * config_.slots;
  data_bytes_ = cells_ * config_.slot_bytes;
  control_bytes_ = (kReservedControlBytes + 2 * cells_ * 8 + 63) / 64 * 64;
  small_bytes_ = cells_ * kSmallBytes;
  bool any_staged = false;
  for (const Peer& p : peers_) any_staged |= p.staged;
  region_bytes_ = data_bytes_ + control_bytes_ + small_bytes_ + (any_staged ? data_bytes_ : 0);
  bell_offset_ = region_bytes_ * world_;
  std::vector<Transport*> distinct;
  for (int p = 0; p < world_; ++p) {
    if (p != rank_ &&
        std::find(distinct.begin(), distinct.end(), transports[p]) == distinct.end()) {
      distinct.push_back(transports[p]);
    }
  }
  user_memory_ = std::make_shared<UserMemory>(std::move(distinct));
  block_bytes_ = (bell_offset_ + 64 + 4095) / 4096 * 4096;
  if (world_ == 1) return Status::ok();
  block_ = static_cast<std::byte*>(std::aligned_alloc(4096, block_bytes_));
  if (block_ == nullptr) {
    return RDMAFLOW_ERROR(Code::kResourceExhausted, op, -1,
                          "cannot allocate " + std::to_string(block_bytes_) + " scratch bytes");
  }
  shared_->block = std::shared_ptr<std::byte>(block_, [](std::byte* b) { std::free(b); });
  std::memset(block_, 0, block_bytes_);

  // Register once with each distinct transport.
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    Transport* t = transports[p];
    bool seen = false;
    for (const auto& r : registrations_) seen |= r.transport == t;
    if (seen) continue;
    auto region = t->register_memory(block_, block_bytes_);
    if (!region.is_ok()) return region.status().with_op("register collective scratch");
    registrations_.push_back({t, *region});
  }

  // Send every peer the key of its region and our configuration.
  CompletionGroup sent;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    Peer& peer = peers_[p];
    peer.local = block_ + static_cast<size_t>(p) * region_bytes_;
    peer.credit_source = peer.channel->capabilities().any_source_memory
                             ? static_cast<const void*>(&kCreditPayload)
                             : static_cast<const void*>(peer.local + control_offset() + 8);
    auto key = transports[p]->export_key(peer.local, data_bytes_ + control_bytes_);
    if (!key.is_ok()) return key.status().with_op("export collective scratch key");
    exported_.emplace_back(transports[p], *key);
    auto kb = key->serialize();
    ByteWriter msg;
    msg.raw(kHello, sizeof(kHello)).u64(static_cast<uint64_t>(world_));
    msg.u64(static_cast<uint64_t>(rank_)).u64(config_.slot_bytes);
    msg.u64(static_cast<uint64_t>(config_.slots)).u64(static_cast<uint64_t>(config_.lanes));
    msg.u64(kb.size()).raw(kb.data(), kb.size());
    peer.channel->send_message(msg.take(), sent.add(), config_.timeout);
  }
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    Peer& peer = peers_[p];
    auto msg = peer.channel->inbox().recv_message(config_.timeout);
    if (!msg.is_ok()) return msg.status().with_op("receive collective scratch key");
    ByteReader r(*msg);
    std::span<const uint8_t> magic;
    uint64_t world = 0, prank = 0, slot_bytes = 0, slots = 0, lanes = 0, key_len = 0;
    if (!r.view(sizeof(kHello), magic) || std::memcmp(magic.data(), kHello, sizeof(kHello)) != 0 ||
        !r.get(world) || !r.get(prank) || !r.get(slot_bytes) || !r.get(slots) || !r.get(lanes) ||
        !r.get(key_len)) {
      return RDMAFLOW_ERROR(Code::kProtocolError, op, p,
                            "unexpected setup message (is the peer creating a communicator of "
                            "the same rdmaflow version?)");
    }
    if (world != static_cast<uint64_t>(world_) || prank != static_cast<uint64_t>(p)) {
      return RDMAFLOW_ERROR(Code::kProtocolError, op, p,
                            "peer says it is rank " + std::to_string(prank) + " of " +
                                std::to_string(world) + ", expected rank " + std::to_string(p) +
                                " of " + std::to_string(world_));
    }
    if (slot_bytes != config_.slot_bytes || slots != static_cast<uint64_t>(config_.slots) ||
        lanes != static_cast<uint64_t>(config_.lanes)) {
      return RDMAFLOW_ERROR(
          Code::kInvalidArgument, op, p,
          "configuration differs: peer has slot_bytes=" + std::to_string(slot_bytes) +
              " slots=" + std::to_string(slots) + " lanes=" + std::to_string(lanes) +
              ", this rank slot_bytes=" + std::to_string(config_.slot_bytes) + " slots=" +
              std::to_string(config_.slots) + " lanes=" + std::to_string(config_.lanes) +
              " (RDMAFLOW_COLL_SLOT_BYTES / _SLOTS / _LANES must match on every rank)");
    }
    std::span<const uint8_t> key_bytes;
    if (!r.view(key_len, key_bytes)) {
      return RDMAFLOW_ERROR(Code::kProtocolError, op, p, "truncated setup message");
    }
    auto key = RemoteKey::deserialize(key_bytes);
    if (!key.is_ok()) {
      // The decoder knows no peer (e.g. a key over RDMAFLOW_MAX_KEY_BYTES): name it.
      return RDMAFLOW_ERROR(
          Code::kProtocolError, op, p,
          "scratch key from rank " + std::to_string(p) + ": " + key.status().reason());
    }
    if (key->length < data_bytes_ + control_bytes_) {
      return RDMAFLOW_ERROR(Code::kProtocolError, op, p, "scratch key too short");
    }
    peer.remote = *key;
  }
  RDMAFLOW_RETURN_IF_ERROR(sent.wait(config_.timeout, "send collective scratch keys"));
  RDMAFLOW_RETURN_IF_ERROR(setup_direct(transports));
  install_listeners();
  find_common_driver();
  find_mixed_driver();
  return Status::ok();
}

Status Fabric::setup_direct(const std::vector<Transport*>& transports) {
  // Every rank takes part (a rank with the direct path off says so), so the
  // ordered message streams stay in step.
  endpoint_ = std::make_unique<shm::MemoryEndpoint>(block_ + bell_offset_);
  std::vector<shm::MemoryPeer> peers(world_);
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    Peer& peer = peers_[p];
    peers[p] = {peer.channel.get(), transports[p], peer.remote,
                std::span<std::byte>(peer.local, data_bytes_ + control_bytes_)};
  }
  auto memory = endpoint_->connect_all(peers, config_.direct, config_.timeout);
  if (!memory.is_ok()) return memory.status().with_op("create communicator");
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || !(*memory)[p].connected()) continue;
    peers_[p].memory = std::move((*memory)[p]);
    peers_[p].direct = true;
    ++direct_peers_;
  }
  if (direct_peers_ > 0) {
    // Local events wake a doorbell sleeper too, futex or fd.
    shared_->signal.set_doorbell(endpoint_->local_ringer(shared_->ringer));
  }
  return Status::ok();
}

void Fabric::find_common_driver() {
  // One driver for every peer (a UCX worker), or one the backend joins from
  // the peers' drivers (tcp: one poll over every peer's socket), so a wait
  // is woken by the answer on whichever channel it comes.
  std::vector<std::shared_ptr<WaitDriver>> drivers;
  bool same = true;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    auto d = peers_[p].channel->inbox().wait_driver();
    if (!d) return;
    same = same && (drivers.empty() || d == drivers.front());
    drivers.push_back(std::move(d));
  }
  if (drivers.empty()) return;
  // A single tcp peer joins too: its inbox's own driver blocks in recvmsg,
  // which the completion of a piece sent by the progress thread cannot wake.
  auto joined = drivers.front()->join(drivers);
  common_driver_ = joined ? joined : same ? drivers.front() : nullptr;
}

void Fabric::find_mixed_driver() {
  // The notify-path peers' drivers joined (tcp: one ppoll over their sockets):
  // the one ppoll of both kinds with mixed_wait, when it can watch the wake
  // socket every direct peer can reach; else, on a crowded rank, polled
  // beside the direct words.
  const bool poll = config_.mixed_poll && config_.yield_polls > 0;
  if ((!config_.mixed_wait && !poll) || direct_peers_ == 0 || direct_peers_ == world_ - 1) return;
  std::vector<std::shared_ptr<WaitDriver>> drivers;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || peers_[p].direct) continue;
    auto d = peers_[p].channel->inbox().wait_driver();
    if (!d) return;
    drivers.push_back(std::move(d));
  }
  auto joined = drivers.front()->join(drivers);
  if (!joined) return;
  if (config_.mixed_wait && joined->watches_fds() && endpoint_->wake_fd() >= 0) {
    mixed_driver_ = std::move(joined);
  } else if (poll) {
    mixed_poll_driver_ = std::move(joined);
  }
}

void Fabric::install_listeners() {
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    Inbox* inbox = &peers_[p].channel->inbox();
    std::weak_ptr<Shared> weak = shared_;
    inbox->set_notify_listener([weak, inbox, p] {
      if (auto s = weak.lock()) drain(*s, *inbox, p);
    });
    drain(*shared_, *inbox, p);  // whatever arrived before the listener
  }
}

Status Fabric::peer_error(int p) const {
  if (p < 0 || p == rank_ || !peers_[p].channel) return Status::ok();
  return peers_[p].channel->error();
}

Status Fabric::detached_error() {
  if (!shared_->detached_failed.load(std::memory_order_acquire)) return Status::ok();
  std::lock_guard<std::mutex> lock(shared_->error_mu);
  return shared_->detached_error;
}

void Fabric::abort(Status why) {
  {
    std::lock_guard<std::mutex> lock(shared_->error_mu);
    if (shared_->aborted.load(std::memory_order_relaxed)) return;
    shared_->abort_error = std::move(why);
    shared_->aborted.store(true, std::memory_order_release);
  }
  shared_->signal.notify();
}

Status Fabric::aborted() {
  if (!shared_->aborted.load(std::memory_order_acquire)) return Status::ok();
  std::lock_guard<std::mutex> lock(shared_->error_mu);
  return shared_->abort_error;
}

Status Fabric::send_direct(int p, int lane, uint64_t seq, const void* src, size_t bytes) {
  const shm::MemoryChannel& memory = peers_[p].memory;
  RDMAFLOW_RETURN_IF_ERROR(memory.put(slot_offset(lane, seq), src, bytes));
  RDMAFLOW_RETURN_IF_ERROR(memory.signal(data_word_offset(lane, seq), seq + 1));
  direct_pieces_.fetch_add(1, std::memory_order_relaxed);
  return Status::ok();
}

Status Fabric::return_credit(int p, int lane, uint64_t seq) {
  Peer& peer = peers_[p];
  if (peer.direct) return peer.memory.signal(credit_word_offset(lane, seq), seq + 1);
  // Nobody waits for a credit's completion: a posted write (no acknowledgement
  // frame on tcp; a refusal fails the channel, which the next call sees),
  // deferred to ride with the next frame to the peer (header comment).
  peer.channel->post_write_deferred(
      peer.credit_source, 8, peer.remote, control_offset(),
      notify_code::encode(notify_code::kCredit, lane, seq), [](const Status&) {}, config_.timeout,
      config_.credit_hold);
  return Status::ok();
}

FabricStats Fabric::stats() const {
  FabricStats s;
  s.direct_peers = direct_peers_;
  s.direct_pieces = direct_pieces_.load(std::memory_order_relaxed);
  s.notify_pieces = notify_pieces_.load(std::memory_order_relaxed);
  s.doorbell_sleeps = endpoint_ ? endpoint_->sleeps() : 0;
  s.mixed_wait = mixed_driver_ != nullptr;
  s.mixed_poll = mixed_poll_driver_ != nullptr;
  s.staged_pieces = staged_pieces_.load(std::memory_order_relaxed);
  s.registered_source_pieces = registered_source_pieces_.load(std::memory_order_relaxed);
  s.credit_hold = config_.credit_hold;
  s.landed_pieces = landed_pieces_.load(std::memory_order_relaxed);
  s.landing_copied_bytes = landing_copied_bytes_.load(std::memory_order_relaxed);
  return s;
}

void Fabric::send_small(int p, int lane, uint64_t seq, const void* src, size_t bytes) {
  notify_pieces_.fetch_add(1, std::memory_order_relaxed);
  Peer& peer = peers_[p];
  std::byte* cell = peer.local + small_offset(lane, seq);
  std::memcpy(cell, src, bytes);
  shared_->detached.fetch_add(1, std::memory_order_acq_rel);
  std::shared_ptr<Shared> s = shared_;
  peer.channel->post_write(
      cell, bytes, peer.remote, slot_offset(lane, seq),
      notify_code::encode(notify_code::kData, lane, seq),
      [s](const Status& st) {
        if (!st.is_ok()) {
          std::lock_guard<std::mutex> lock(s->error_mu);
          if (s->detached_error.is_ok()) s->detached_error = st;
          s->detached_failed.store(true, std::memory_order_release);
        }
        s->detached.fetch_sub(1, std::memory_order_acq_rel);
        s->signal.notify();
      },
      config_.timeout);
}

bool Fabric::credits_in() const {
  for (int p = 0; p < world_; ++p) {
    const Peer& peer = peers_[p];
    if (p == rank_ || !peer.channel || peer.direct || !peer.channel->error().is_ok()) continue;
    for (int lane = 0; lane < config_.lanes; ++lane) {
      const uint64_t next = peer.send_seq[lane];
      const uint64_t owed = std::min<uint64_t>(next, static_cast<uint64_t>(config_.slots));
      for (uint64_t seq = next - owed; seq < next; ++seq) {
        if (!credit_arrived(p, lane, seq)) return false;
      }
    }
  }
  return true;
}

void Fabric::await_credits() {
  // A peer may still hold the credits for our last pieces (tcp defers them
  // up to its flush tick, header comment). One that reaches our scratch key
  // after we revoked it is refused, and the refusal fails the peer's channel,
  // which the next communicator on it would inherit. So the keys stay until
  // every piece we sent is credited: at once when the peer sent them, a tick
  // later when it held them. Bounded: an aborted call's pieces, or a peer
  // that died or left before consuming them, never answer. A credit later
  // still (a peer descheduled past kCreditDrain) must not fail the channel
  // either: tcp drops a posted write to a revoked key (tcp_recv.cc); ucx
  // confirms a revoke with the peers first, so only their write fails.
  if (world_ == 1 || shared_->aborted.load(std::memory_order_acquire)) return;
  const auto until = std::chrono::steady_clock::now() + std::min(config_.timeout, kCreditDrain);
  while (!credits_in() && std::chrono::steady_clock::now() < until) {
    const uint64_t epoch = shared_->signal.epoch();
    if (credits_in()) break;
    shared_->signal.wait(epoch, std::chrono::steady_clock::now() + Millis(2),
                         std::chrono::microseconds(0));
  }
}

Fabric::~Fabric() {
  // Detached sends still read the staging cells: let them finish (they all
  // complete, at the latest at their timeout or when the channel fails).
  const auto until = std::chrono::steady_clock::now() + config_.timeout + Millis(1000);
  while (shared_ && shared_->detached.load(std::memory_order_acquire) > 0 &&
         std::chrono::steady_clock::now() < until) {
    const uint64_t epoch = shared_->signal.epoch();
    if (shared_->detached.load(std::memory_order_acquire) == 0) break;
    shared_->signal.wait(epoch, std::chrono::steady_clock::now() + Millis(10),
                         std::chrono::microseconds(0));
  }
  await_credits();
  for (Peer& p : peers_) {
    if (p.channel) p.channel->inbox().set_notify_listener(nullptr);
  }
  if (endpoint_) endpoint_->revoke_keys();
  for (auto& [t, key] : exported_) {
    Status st = t->revoke_key(key);
    if (!st.is_ok()) RDMAFLOW_LOG_DEBUG("collectives: {}", st.to_string());
  }
  // Buffers the caller still holds stay mapped but leave the transports now.
  if (user_memory_) user_memory_->close();
  for (const auto& r : registrations_) {
    Status st = r.transport->deregister_memory(r.region);
    if (!st.is_ok()) RDMAFLOW_LOG_DEBUG("collectives: {}", st.to_string());
  }
  // block_ goes with shared_ (a late callback may still ring the doorbell in it).
}

}  // namespace rdmaflow
