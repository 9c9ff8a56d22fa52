// Fabric: the communicator's registered scratch memory and the slot/credit
// protocol over the peers' channels, or over their memory channels where a
// same-host pair has them (the direct path, below).
//
// Memory. At creation each rank allocates one registered block holding, for
// every peer p, a region that only p writes into:
//
//   region[p] = lanes x slots x slot_bytes   data slots (p's pieces land here)
//             | control                      credit landing word, credit source word,
//                                            direct-path sequence words (below)
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
// CREDIT(l, seq). Pieces are posted writes too: nobody waits for the peer's
// word about them (its credit answers), so on tcp a piece completes once
// sent, not an ACK's round trip later. The sender may use slot s for piece seq only once
// CREDIT(l, seq - slots) arrived. Notify values carry a magic byte so values of
// other users of the channel are put back into the inbox untouched.
//
// Direct path. A pair of same-host ranks whose channel maps the peer's
// region (Channel::direct_view, UCX over shared memory) reaches it through a
// shm::MemoryChannel (transport/shm/memory_channel.h), which connects, maps,
// agrees (both sides or neither) and prefaults; the fabric only says which
// words mean what. A piece is put(slot) + signal(the slot's data word,
// seq + 1) into the peer's region; a credit is signal(the sender's credit
// word, seq + 1). Signals ring the peer's doorbell; receivers poll their own
// words with acquire loads and, when idle, sleep on this rank's doorbell
// (shm::MemoryEndpoint::poll). No active message, no acknowledgement, no
// progress thread. Pairs without a mapping (TCP, verbs, UCX to another host)
// keep the notify path; both can be mixed in one communicator. A rank with
// both kinds of peer waits for both in one ppoll where the backend allows
// (mixed_driver(): tcp's sockets plus the wake socket same-host peers ring,
// common/doorbell.h "Fd sleepers"). The control
// area of a region is
//
//   64 B reserved | lanes x slots u64 data words | lanes x slots u64 credit words
//
// and the block ends with this rank's doorbell (the memory endpoint's, granted
// to every peer on its own key).
//
// Credits ride with other frames. A credit is the most frequent frame and
// the least urgent: the peer needs credit(seq) only to send piece seq + slots.
// So on the notify path it is a deferred post (Channel::post_write_deferred):
// tcp queues it without a system call of its own, and it leaves in the
// sendmsg of the next frame to that peer (the next piece, in recursive
// doubling, trees and at the next call), or at once when it would make more
// than `credit_hold` wait on the channel (default slots / 2 - 1: at 4 slots
// every second credit goes and takes the first with it, so a sender with a
// full window gets its oldest slot back after the receiver consumed half of
// them), or at the transport's tick 1-2 ms after the oldest was held.
// Deadlock freedom: a peer blocked on a held credit gets it without this
// rank doing anything more, by that tick, which tcp's progress thread runs
// while anything is held (TcpChannel::flush_held): a blocked sender waits at
// most ~2 ms for it. That happens only when the receiver, after consuming
// the piece, consumes no more than `credit_hold` others from that peer and
// sends it nothing before the sender needs the slot (back-to-back
// broadcasts with every credit held did, collectives_test
// HeldCreditsNeverStallTheSender; at the default hold they did not). UCX
// and verbs post it at once (their default), the direct path signals at
// once. Fewer pieces leave fewer credits: Rabenseifner sends a step's
// message to another host as one piece when it fits a slot
// (collectives/algorithms/rabenseifner.cc), so its one credit per peer and
// step rides with the next step's piece to that peer.
//
// Landings. A receive that only copies its piece out of the slot (allgather
// steps, broadcast, the second half of ring and Rabenseifner allreduce) has
// the peer's backend put the piece where it goes instead, when the backend
// can (Channel::post_landing: tcp reads the frames from the socket straight
// into the destination; the NIC and UCX cannot be told). The executor posts
// the landing for piece seq when its receive is ready and the slot is free,
// before the credit of piece seq - slots leaves, so the peer cannot have
// sent a byte of it yet; the first `slots` pieces of a call may race their
// landing, and the frames that came first are copied out of the slot as
// before (FabricConfig::land_min, FabricStats::landed_pieces).
//
// Small sends (<= kSmallBytes) are copied into this rank's staging cell for
// (peer, lane, slot) and posted from there (Channel::post_write, as credits
// are: on tcp a frame with no acknowledgement); the executor does not wait for
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

#include "collectives/user_memory.h"
#include "common/signal.h"
#include "common/status.h"
#include "transport/channel.h"
#include "transport/shm/memory_channel.h"
#include "transport/transport.h"

namespace rdmaflow {

struct FabricConfig {
  size_t slot_bytes = 512 * 1024;
  int slots = 4;  // per peer per lane
  int lanes = 2;  // collectives in flight at once
  Millis timeout{30000};
  std::chrono::microseconds spin{10000};         // drive progress this long before sleeping
  std::chrono::microseconds direct_spin{10000};  // the same with direct peers (polling)
  // Of `spin`, how long after the last progress a rank with a core of its own
  // polls its sockets without blocking (WaitDriver::poll) before its drive may
  // sleep in ppoll (RDMAFLOW_COLL_POLL_US; crowded ranks always poll).
  std::chrono::microseconds poll{0};
  int yield_polls = 0;  // sched_yield() every N polls while driving; 0: never
  bool direct = true;   // same-host peers: the direct path when it is viable
  // Direct and tcp peers both: wait for both in one ppoll (mixed_driver())
  // rather than polling the words while tcp's progress thread reads the
  // sockets (RDMAFLOW_COLL_MIXED_WAIT; off: it lost at 8 B-1 MiB on the
  // crowded 2 x 2 cluster, docs/benchmarks.md "One wait for mixed peers").
  bool mixed_wait = false;
  // Direct and tcp peers both, on a rank that yields its core while it waits
  // (yield_polls > 0, crowded): read the tcp sockets on the waiting thread
  // between looks at the direct words (mixed_poll_driver()), as Open MPI's
  // progress loop polls every BTL, rather than leave them to tcp's progress
  // thread, which then reads them only while the waiter sleeps
  // (RDMAFLOW_COLL_MIXED_POLL; mixed_wait wins).
  bool mixed_poll = true;
  // Stage every large send as if each peer's backend needed a registered
  // source (RDMAFLOW_COLL_STAGE=1): how verbs behaves, on any backend, to
  // measure staging and test the registered-buffer path without an RDMA NIC.
  bool stage_all = false;
  // Receives of at least this many bytes that copy a piece out of its slot
  // (no reduction) have the backend put the piece where it goes instead
  // (Channel::post_landing; tcp), posted before its slot's credit leaves:
  // the socket's copy is the only one (RDMAFLOW_COLL_LAND_MIN; 0: never).
  size_t land_min = 32 * 1024;
  // Credits on the notify path that may wait per channel for a frame to ride
  // with (Channel::post_write_deferred; "Credits ride with other frames"
  // above). -1: from RDMAFLOW_COLL_CREDIT_HOLD, else slots / 2 - 1; 0: every
  // credit goes at once. At most slots - 1.
  int credit_hold = -1;
};

// What the fabric did, for tests and tuning.
struct FabricStats {
  int direct_peers = 0;          // peers reached by the direct path
  uint64_t direct_pieces = 0;    // pieces sent by put + signal of a sequence word
  uint64_t notify_pieces = 0;    // pieces sent as channel writes with notify
  uint64_t doorbell_sleeps = 0;  // times a waiter slept on the doorbell
  bool mixed_wait = false;       // direct and other peers waited for in one ppoll
  bool mixed_poll = false;       // other peers' sockets polled beside the direct words
  // Large sends to peers that need a registered source: copied into the send
  // staging first, or posted straight from a buffer of user_memory().
  uint64_t staged_pieces = 0;
  uint64_t registered_source_pieces = 0;
  int credit_hold = 0;  // credits that may wait per channel (FabricConfig)
  // Copy receives whose piece the backend put in place (land_min): wholly,
  // and bytes copied out of the slot anyway (frames that came first).
  uint64_t landed_pieces = 0;
  uint64_t landing_copied_bytes = 0;
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
    std::atomic<bool> aborted{false};
    Status abort_error;  // why abort() was called (error_mu)
    // The scratch block; freed with the last holder (a late callback may still
    // ring the doorbell in it), and the socket the signal's ring wakes this
    // rank's fd sleepers through.
    std::shared_ptr<std::byte> block;
    std::shared_ptr<const void> ringer;
  };

  struct Peer {
    std::shared_ptr<Channel> channel;  // null for self
    bool staged = false;               // backend needs a registered source
    // What a credit write sends (8 bytes nobody reads): a constant outside
    // the scratch block where the backend takes any source, since a held
    // credit may leave after the fabric freed the block; else the block's
    // credit source word (registered).
    const void* credit_source = nullptr;
    RemoteKey remote;                // the peer's region for this rank
    std::byte* local = nullptr;      // this rank's region for the peer
    std::vector<uint64_t> send_seq;  // next seq per lane, this rank -> peer
    std::vector<uint64_t> recv_seq;  // next seq per lane, peer -> this rank
    bool direct = false;             // the direct path (above)
    shm::MemoryChannel memory;       // the peer's region for this rank, when direct
  };

  static Result<std::unique_ptr<Fabric>> create(int rank, int world,
                                                std::vector<std::shared_ptr<Channel>> channels,
                                                std::vector<Transport*> transports,
                                                FabricConfig config);
  ~Fabric();

  // How long ~Fabric waits at most for the credits of its last pieces
  // (await_credits()).
  static constexpr Millis kCreditDrain{200};
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  const FabricConfig& config() const { return config_; }
  int yield_polls() const { return config_.yield_polls; }
  // The wait driver every peer's channel shares (one UCX worker), else null.
  WaitDriver* common_driver() const { return common_driver_.get(); }
  // With direct peers and peers on the notify path: one driver over the
  // latter's channels that can also watch this rank's wake socket
  // (WaitDriver::drive_watching), else null. The executor then waits for
  // both kinds of peer in one ppoll (executor_wait.cc, run_mixed).
  WaitDriver* mixed_driver() const { return mixed_driver_.get(); }
  // With direct peers and peers on the notify path, on a crowded rank (see
  // FabricConfig::mixed_poll): the latter's channels joined in one driver
  // whose poll() the direct path's waiter calls between its looks at the
  // words, else null.
  WaitDriver* mixed_poll_driver() const { return mixed_poll_driver_.get(); }
  Peer& peer(int p) { return peers_[p]; }
  Shared& shared() { return *shared_; }
  Signal& signal() { return shared_->signal; }

  size_t slot_offset(int lane, uint64_t seq) const {
    return (static_cast<size_t>(lane) * config_.slots + seq % config_.slots) * config_.slot_bytes;
  }
  size_t control_offset() const { return data_bytes_; }
  // Staging cell of a small send (in this rank's region for the peer).
  size_t small_offset(int lane, uint64_t seq) const {
    return data_bytes_ + control_bytes_ +
           (static_cast<size_t>(lane) * config_.slots + seq % config_.slots) * kSmallBytes;
  }
  size_t stage_offset() const { return data_bytes_ + control_bytes_ + small_bytes_; }
  // Direct path: the sequence words of (lane, seq's slot) in a region.
  size_t data_word_offset(int lane, uint64_t seq) const {
    return data_bytes_ + kReservedControlBytes + cell(lane, seq) * 8;
  }
  size_t credit_word_offset(int lane, uint64_t seq) const {
    return data_word_offset(lane, seq) + cells_ * 8;
  }

  bool data_arrived(int p, int lane, uint64_t seq) const {
    if (peers_[p].direct) {
      return shm::load_word(peers_[p].local + data_word_offset(lane, seq)) == seq + 1;
    }
    return shared_->peers[p].data[cell(lane, seq)].load(std::memory_order_acquire) == seq + 1;
  }
  bool credit_arrived(int p, int lane, uint64_t seq) const {
    if (peers_[p].direct) {
      return shm::load_word(peers_[p].local + credit_word_offset(lane, seq)) >= seq + 1;
    }
    return shared_->peers[p].credit[cell(lane, seq)].load(std::memory_order_acquire) >= seq + 1;
  }

  // Direct path: puts piece `seq` of `lane` into the peer's slot and signals
  // it. Complete on return (the bytes are in the peer's memory); an error
  // only for a range outside the peer's region (a bug: nothing was written).
  Status send_direct(int p, int lane, uint64_t seq, const void* src, size_t bytes);
  // Hands slot of piece `seq` of `lane` from `p` back to `p` (a signal on the
  // direct path, else an 8-byte write with notify CREDIT). A failed credit
  // write is not the caller's failure: the next call needing the peer sees
  // the channel's sticky error. An error only for a refused signal (a bug).
  Status return_credit(int p, int lane, uint64_t seq);
  // Peers on the direct path; the executor then waits through endpoint().
  int direct_peers() const { return direct_peers_; }
  // This rank's end of the memory channels: its doorbell and the waits on it.
  const shm::MemoryEndpoint& endpoint() const { return *endpoint_; }
  void count_notify_piece() { notify_pieces_.fetch_add(1, std::memory_order_relaxed); }
  void count_landing(size_t copied) {
    if (copied == 0) landed_pieces_.fetch_add(1, std::memory_order_relaxed);
    landing_copied_bytes_.fetch_add(copied, std::memory_order_relaxed);
  }
  void count_staged_piece(bool registered) {
    (registered ? registered_source_pieces_ : staged_pieces_)
        .fetch_add(1, std::memory_order_relaxed);
  }
  // Buffers registered with every transport of the peers (user_memory.h).
  const std::shared_ptr<UserMemory>& user_memory() const { return user_memory_; }
  FabricStats stats() const;

  // First channel error among `peers` (OK when all are healthy).
  Status peer_error(int p) const;
  // The first failure of a detached small send (OK when none failed).
  Status detached_error();
  // Makes every running and later execute() fail with `why`
  // (Communicator::abort): sleeping executors are woken, driving ones see it
  // at their next look at the peers. Idempotent; the first reason stays.
  void abort(Status why);
  // OK, or the reason abort() was given.
  Status aborted();
  // Posts a small send of `bytes` (<= kSmallBytes) from `src` as piece `seq` of
  // `lane` to `p` without waiting for its completion.
  void send_small(int p, int lane, uint64_t seq, const void* src, size_t bytes);

  // One cache line ahead of the sequence words, unused: the words start 64 B in.
  static constexpr size_t kReservedControlBytes = 64;
  static constexpr size_t kSmallBytes = 4096;

 private:
  Fabric() = default;
  Status setup(std::vector<Transport*> transports);
  // Connects a memory channel to every peer where both sides can map.
  Status setup_direct(const std::vector<Transport*>& transports);
  size_t cell(int lane, uint64_t seq) const {
    return static_cast<size_t>(lane) * config_.slots + seq % config_.slots;
  }
  void install_listeners();
  // Every piece sent to a healthy notify-path peer credited back.
  bool credits_in() const;
  void await_credits();
  void find_common_driver();
  void find_mixed_driver();

  int rank_ = 0;
  int world_ = 1;
  FabricConfig config_;
  std::vector<Peer> peers_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<WaitDriver> common_driver_;
  std::shared_ptr<WaitDriver> mixed_driver_;
  std::shared_ptr<WaitDriver> mixed_poll_driver_;
  size_t data_bytes_ = 0;
  size_t control_bytes_ = 0;
  size_t cells_ = 0;  // lanes x slots
  size_t small_bytes_ = 0;
  size_t bell_offset_ = 0;  // this rank's doorbell in the block
  std::unique_ptr<shm::MemoryEndpoint> endpoint_;
  int direct_peers_ = 0;
  std::atomic<uint64_t> direct_pieces_{0};
  std::atomic<uint64_t> notify_pieces_{0};
  std::atomic<uint64_t> landed_pieces_{0};
  std::atomic<uint64_t> landing_copied_bytes_{0};
  std::atomic<uint64_t> staged_pieces_{0};
  std::atomic<uint64_t> registered_source_pieces_{0};
  std::shared_ptr<UserMemory> user_memory_;
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
