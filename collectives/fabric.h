// Fabric: the communicator's registered scratch memory and the slot/credit
// protocol over the peers' channels.
//
// Memory. At creation each rank allocates one registered block holding, for
// every peer p, a region that only p writes into:
//
//   region[p] = lanes x slots x slot_bytes   data slots (p's pieces land here)
//             | 64 B control                 credit landing word, credit source word
//             | lanes x slots x kSmallBytes  small-send staging (below)
//             | lanes x slots x slot_bytes   send staging (only for backends that
//                                            need a registered source, i.e. verbs)
//
// The block is registered once per transport (never per call); a RemoteKey for
// region[p] (data + control) is sent to p once over the channel's ordered
// messages, together with the configuration, which every rank must share.
//
// Protocol. Lane l carries one collective at a time; between two ranks each
// direction of a lane numbers its pieces 0, 1, 2, ... (seq). Piece `seq` goes to
// slot seq % slots with notify DATA(l, seq). The receiver reduces or copies the
// slot and returns the slot with a credit: an 8-byte write with notify
// CREDIT(l, seq). The sender may use slot s for piece seq only once
// CREDIT(l, seq - slots) arrived. Notify values carry a magic byte so values of
// other users of the channel are put back into the inbox untouched.
//
// Small sends (<= kSmallBytes) are copied into this rank's staging cell for
// (peer, lane, slot) and posted from there; the executor does not wait for
// their completion (on UCX that is the receiver's acknowledgement, a round
// trip). The cell is reused by piece seq + slots, which is only sent after
// CREDIT(l, seq), i.e. after the receiver consumed the piece, so the bytes have
// left it. Their failures are recorded here (sticky: later calls fail with
// them), and the fabric waits for them before it frees its memory.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "allocator/status.h"
#include "collectives/signal.h"
#include "transport/channel.h"
#include "transport/transport.h"

namespace rdmaflow {

struct FabricConfig {
  size_t slot_bytes = 512 * 1024;
  int slots = 4;  // per peer per lane
  int lanes = 2;  // collectives in flight at once
  Millis timeout{30000};
  std::chrono::microseconds spin{10000};  // drive progress this long before sleeping
  int yield_polls = 0;                    // sched_yield() every N polls while driving; 0: never
};

namespace notify_code {
inline constexpr uint64_t kMagic = 0xC5ull << 56;
inline constexpr uint64_t kMagicMask = 0xFFull << 56;
inline constexpr uint64_t kSeqMask = (1ull << 48) - 1;
enum Kind : uint64_t { kData = 0, kCredit = 1 };
inline uint64_t encode(Kind kind, int lane, uint64_t seq) {
  return kMagic | (static_cast<uint64_t>(kind) << 54) | (static_cast<uint64_t>(lane) << 48) |
         (seq & kSeqMask);
}
}  // namespace notify_code

class Fabric {
 public:
  // Arrival records, shared with the notify listeners (which may outlive the
  // fabric by a moment on a progress thread).
  struct PeerSlots {
    // [lane * slots + slot] = seq + 1 of the last piece / credit seen there.
    std::unique_ptr<std::atomic<uint64_t>[]> data;
    std::unique_ptr<std::atomic<uint64_t>[]> credit;
  };
  struct Shared {
    Signal signal;
    std::vector<PeerSlots> peers;
    int lanes = 0;
    int slots = 0;
    // Small sends whose completion nobody waits for (see above).
    std::atomic<int64_t> detached{0};
    std::atomic<bool> detached_failed{false};
    std::mutex error_mu;
    Status detached_error;  // first failure of a detached send (error_mu)
  };

  struct Peer {
    std::shared_ptr<Channel> channel;  // null for self
    bool staged = false;               // backend needs a registered source
    RemoteKey remote;                  // the peer's region for this rank
    std::byte* local = nullptr;        // this rank's region for the peer
    std::vector<uint64_t> send_seq;    // next seq per lane, this rank -> peer
    std::vector<uint64_t> recv_seq;    // next seq per lane, peer -> this rank
  };

  static Result<std::unique_ptr<Fabric>> create(int rank, int world,
                                                std::vector<std::shared_ptr<Channel>> channels,
                                                std::vector<Transport*> transports,
                                                FabricConfig config);
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  const FabricConfig& config() const { return config_; }
  int yield_polls() const { return config_.yield_polls; }
  // The wait driver every peer's channel shares (one UCX worker), else null.
  WaitDriver* common_driver() const { return common_driver_.get(); }
  Peer& peer(int p) { return peers_[p]; }
  Shared& shared() { return *shared_; }
  Signal& signal() { return shared_->signal; }

  size_t slot_offset(int lane, uint64_t seq) const {
    return (static_cast<size_t>(lane) * config_.slots + seq % config_.slots) * config_.slot_bytes;
  }
  size_t control_offset() const { return data_bytes_; }
  // Staging cell of a small send (in this rank's region for the peer).
  size_t small_offset(int lane, uint64_t seq) const {
    return data_bytes_ + kControlBytes +
           (static_cast<size_t>(lane) * config_.slots + seq % config_.slots) * kSmallBytes;
  }
  size_t stage_offset() const { return data_bytes_ + kControlBytes + small_bytes_; }

  bool data_arrived(int p, int lane, uint64_t seq) const {
    return shared_->peers[p].data[lane * config_.slots + seq % config_.slots].load(
               std::memory_order_acquire) == seq + 1;
  }
  bool credit_arrived(int p, int lane, uint64_t seq) const {
    return shared_->peers[p].credit[lane * config_.slots + seq % config_.slots].load(
               std::memory_order_acquire) >= seq + 1;
  }

  // First channel error among `peers` (OK when all are healthy).
  Status peer_error(int p) const;
  // The first failure of a detached small send (OK when none failed).
  Status detached_error();
  // Posts a small send of `bytes` (<= kSmallBytes) from `src` as piece `seq` of
  // `lane` to `p` without waiting for its completion.
  void send_small(int p, int lane, uint64_t seq, const void* src, size_t bytes);

  static constexpr size_t kControlBytes = 64;
  static constexpr size_t kSmallBytes = 4096;

 private:
  Fabric() = default;
  Status setup(std::vector<Transport*> transports);
  void install_listeners();
  void find_common_driver();

  int rank_ = 0;
  int world_ = 1;
  FabricConfig config_;
  std::vector<Peer> peers_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<WaitDriver> common_driver_;
  size_t data_bytes_ = 0;
  size_t small_bytes_ = 0;
  size_t region_bytes_ = 0;
  std::byte* block_ = nullptr;
  size_t block_bytes_ = 0;
  struct Registration {
    Transport* transport;
    RegionId region;
  };
  std::vector<Registration> registrations_;
  std::vector<std::pair<Transport*, RemoteKey>> exported_;
};

}  // namespace rdmaflow
