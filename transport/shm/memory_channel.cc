#include "transport/shm/memory_channel.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "common/bytes.h"
#include "common/log.h"

namespace rdmaflow::shm {
namespace {

const char* kOp = "connect memory channel";
constexpr char kOffer[8] = {'R', 'F', 'S', 'H', 'M', 'O', 'F', '2'};
constexpr char kAgree[8] = {'R', 'F', 'S', 'H', 'M', 'A', 'G', '2'};

// Fills the page tables of a shared mapping (writable) without touching the
// bytes: otherwise the first accesses pay a page fault per 4 KiB (and a cost
// model measuring them would learn the faults).
void prefault(std::byte* p, size_t len) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  if (p == nullptr || len == 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t hi = reinterpret_cast<uintptr_t>(p) + len;
  ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);  // best effort
}

Status unexpected(int peer, const std::string& what) {
  return RDMAFLOW_ERROR(Code::kProtocolError, kOp, peer,
                        "unexpected " + what +
                            " (is the peer connecting memory channels with the same rdmaflow "
                            "version, at the same point?)");
}

}  // namespace

MemoryEndpoint::~MemoryEndpoint() {
  revoke_keys();
}

void MemoryEndpoint::revoke_keys() {
  for (auto& [t, key] : exported_) {
    Status st = t->revoke_key(key);
    if (!st.is_ok()) RDMAFLOW_LOG_DEBUG("shm: {}", st.to_string());
  }
  exported_.clear();
}

Result<std::vector<MemoryChannel>> MemoryEndpoint::connect_all(const std::vector<MemoryPeer>& peers,
                                                               bool offer, Millis timeout) {
  const size_t n = peers.size();
  std::vector<MemoryChannel> out(n);

  // 1. Offer this rank's doorbell and wake socket to every peer.
  if (offer && wake_.fd() < 0) {
    auto wake = WakeSocket::open();
    if (!wake.is_ok()) return wake.status();
    wake_ = std::move(*wake);
    auto self = connect_wake(wake_.address(), -1);
    if (!self.is_ok()) return self.status().with_op("connect own wake socket");
    self_ = std::make_shared<const OwnedFd>(std::move(*self));
  }
  CompletionGroup sent;
  for (const MemoryPeer& peer : peers) {
    if (peer.channel == nullptr) continue;
    std::vector<uint8_t> bell;
    if (offer) {
      if (peer.transport == nullptr) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, kOp, peer.channel->peer_rank(),
                              "no transport to export the doorbell through");
      }
      auto key = peer.transport->export_key(bell_bytes_, Doorbell::kBytes);
      if (!key.is_ok()) return key.status().with_op("export memory channel doorbell");
      exported_.emplace_back(peer.transport, *key);
      bell = key->serialize();
    }
    const std::vector<uint8_t> no_address;
    const std::vector<uint8_t>& address = offer ? wake_.address() : no_address;
    ByteWriter msg;
    msg.raw(kOffer, sizeof(kOffer)).u64(bell.size()).raw(bell.data(), bell.size());
    msg.u64(address.size()).raw(address.data(), address.size());
    peer.channel->send_message(msg.take(), sent.add(), timeout);
  }

  // 2. Map what both sides offered, and say whether it worked.
  std::vector<bool> mapped(n, false), reached(n, false);
  for (size_t i = 0; i < n; ++i) {
    const MemoryPeer& peer = peers[i];
    if (peer.channel == nullptr) continue;
    Channel& ch = *peer.channel;
    const int rank = ch.peer_rank();
    auto msg = ch.inbox().recv_message(timeout);
    if (!msg.is_ok()) return msg.status().with_op("receive memory channel offer");
    ByteReader r(*msg);
    std::span<const uint8_t> magic, bell_bytes, address;
    uint64_t bell_len = 0, address_len = 0;
    if (!r.view(sizeof(kOffer), magic) || std::memcmp(magic.data(), kOffer, sizeof(kOffer)) != 0 ||
        !r.get(bell_len) || !r.view(bell_len, bell_bytes) || !r.get(address_len) ||
        !r.view(address_len, address) || !r.done()) {
      return unexpected(rank, "memory channel offer");
    }
    if (offer && bell_len > 0) {
      auto bell_key = RemoteKey::deserialize(bell_bytes);
      if (!bell_key.is_ok()) return bell_key.status().with_op("receive memory channel offer");
      Status why;
      auto view = ch.direct_view(peer.remote, 0, peer.remote.length, timeout);
      if (view.is_ok()) {
        auto bell = ch.direct_view(*bell_key, 0, Doorbell::kBytes, timeout);
        if (bell.is_ok()) {
          // Without a way to the peer's wake socket the pair still works: the
          // peer learns it (below) and sleeps on its futex only.
          OwnedFd wake;
          if (!address.empty()) {
            auto fd = connect_wake(std::vector<uint8_t>(address.begin(), address.end()), rank);
            if (fd.is_ok()) {
              wake = std::move(*fd);
              reached[i] = true;
            } else if (fd.status().code() != Code::kNotViable) {
              return fd.status();
            } else {
              RDMAFLOW_LOG_DEBUG("shm: {}", fd.status().to_string());
            }
          }
          out[i] = MemoryChannel(PeerMemory(view->data, view->length, view->keep, rank),
                                 PeerMemory(bell->data, bell->length, bell->keep, rank),
                                 std::move(wake));
          mapped[i] = true;
        } else {
          why = bell.status();
        }
      } else {
        why = view.status();
      }
      if (!why.is_ok()) {
        if (why.code() != Code::kNotViable) return why.with_op("map peer memory");
        RDMAFLOW_LOG_DEBUG("shm: no memory channel to rank {}: {}", rank, why.to_string());
      }
    }
    ByteWriter agree;
    agree.raw(kAgree, sizeof(kAgree)).u64(mapped[i] ? 1 : 0).u64(reached[i] ? 1 : 0);
    ch.send_message(agree.take(), sent.add(), timeout);
  }

  // 3. A pair takes its memory channel only when both sides mapped; this
  // rank sleeps on its wake socket only when every such peer can reach it.
  bool all_reached = true;
  for (size_t i = 0; i < n; ++i) {
    const MemoryPeer& peer = peers[i];
    if (peer.channel == nullptr) continue;
    Channel& ch = *peer.channel;
    auto msg = ch.inbox().recv_message(timeout);
    if (!msg.is_ok()) return msg.status().with_op("agree on memory channels");
    const auto& m = *msg;
    if (m.size() != sizeof(kAgree) + 16 || std::memcmp(m.data(), kAgree, sizeof(kAgree)) != 0) {
      return unexpected(ch.peer_rank(), "memory channel agreement");
    }
    if (mapped[i] && load_le<uint64_t>(m.data() + sizeof(kAgree)) == 1) {
      all_reached = all_reached && load_le<uint64_t>(m.data() + sizeof(kAgree) + 8) == 1;
      prefault(out[i].memory().data(), out[i].memory().length());
      prefault(peer.local.data(), peer.local.size());
    } else {
      out[i] = MemoryChannel{};
    }
  }
  RDMAFLOW_RETURN_IF_ERROR(sent.wait(timeout, "send memory channel setup"));
  wake_reached_ = offer && all_reached && wake_.fd() >= 0;
  return out;
}

}  // namespace rdmaflow::shm
