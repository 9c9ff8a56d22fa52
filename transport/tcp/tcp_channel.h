// TcpChannel: one TCP connection to one peer, emulating one-sided writes and
// reads with framed messages (tcp_wire.h, docs/tcp_transport.md).
//
// Thread model
//  - Receiving, timeouts, failure handling and completion callbacks run on the
//    transport's progress thread (IoLoop) -- or, for latency, on a user thread
//    blocked in a wait on this channel: such a waiter *drives* the channel
//    (drive(), the WaitDriver of its inbox and of its operations' Completion /
//    CompletionGroup callbacks). It takes the socket from the progress thread,
//    polls it itself and runs the receive path, so a notification costs one
//    wake-up (the waiter's) instead of two (progress thread, then waiter). One
//    thread at a time runs the receive path (rx_mu_). Callbacks never run on a
//    thread inside write()/read()/send_message().
//  - Sending is "combining": whichever thread finds the sender idle becomes the
//    sender and writes queued frames with non-blocking sendmsg() until the
//    socket is full or a budget is spent, then hands the rest to the progress
//    thread (which waits for the socket to become writable). So a small write
//    issued by a user thread goes onto the wire without a thread hop.
//  - An operation completes exactly once: on its ACK / response, on refusal, on
//    its deadline, on channel failure (sticky, names the peer) or on close().
//    An operation whose frame is half way onto the wire when its deadline
//    passes cannot be withdrawn without desynchronizing the stream, so that
//    timeout fails the whole channel.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <boost/container/small_vector.hpp>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/channel.h"
#include "transport/common/grant_table.h"
#include "transport/common/op_table.h"
#include "transport/common/sticky_error.h"
#include "transport/tcp/tcp_frame.h"
#include "transport/tcp/tcp_landing.h"
#include "transport/tcp/tcp_progress.h"
#include "transport/tcp/tcp_wire.h"

namespace rdmaflow::tcp {

struct TcpOptions {
  uint64_t chunk_bytes = 1ull << 20;  // payload per write / read-response frame
  int64_t drive_us = 2000;            // RDMAFLOW_TCP_WAIT_POLL: how long a waiter drives; 0 = never
  uint64_t stripe_min = 1ull << 20;   // RDMAFLOW_TCP_STRIPE_MIN: writes this big are striped
  uint64_t zerocopy_min = 0;          // RDMAFLOW_TCP_ZEROCOPY: MSG_ZEROCOPY from this size; 0 = off
  // RDMAFLOW_TCP_QUICKACK: a receive turn that empties the socket after taking
  // this many segments (of the connection's MSS) has the kernel ACK at once
  // (TCP_QUICKACK) rather than on its delayed-ACK timer; 0 = never.
  uint64_t quickack_segments = 16;
  FrameLimits limits;  // RDMAFLOW_MAX_FRAME_BYTES, RDMAFLOW_MAX_MESSAGE_BYTES
  // RDMAFLOW_MAX_PEER_QUEUED: replies (ACKs, refusals, served reads) the peer may
  // leave queued here by not reading them; one more fails the channel.
  uint64_t max_peer_queued = uint64_t{1} << 18;
};

class TcpChannel final : public Channel,
                         public FdWatcher,
                         public std::enable_shared_from_this<TcpChannel> {
 public:
  // Takes ownership of `fd`, a connected TCP socket (handshake done).
  TcpChannel(std::shared_ptr<IoLoop> loop, std::shared_ptr<GrantTable> grants,
             std::shared_ptr<LandingTable> landings, int fd, int self_rank, int peer_rank,
             TcpOptions options);
  ~TcpChannel() override;

  // Starts receiving; call once after construction.
  void start();

  int peer_rank() const override { return peer_; }
  std::string backend() const override { return "tcp"; }
  ChannelCapabilities capabilities() const override { return {.any_source_memory = true}; }
  void write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
             std::optional<uint64_t> notify, Callback done, Millis timeout) override;
  // A WRITE frame flagged NO_ACK: the peer sends no ACK; the operation
  // completes once sent, its callback delivered by the next receive turn or
  // tick (no thread hop of its own). Large writes on several streams are
  // plain writes.
  void post_write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                  std::optional<uint64_t> notify, Callback done, Millis timeout) override;
  // A posted write queued without starting the sender (see "Held writes"
  // below): it leaves with the next frame this channel sends, or when it
  // makes more than `hold` held, or at the transport's tick 1-2 ms later.
  void post_write_deferred(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                           std::optional<uint64_t> notify, Callback done, Millis timeout,
                           int hold) override;
  // The socket's read puts a landed write's bytes at dst (tcp_landing.h).
  bool post_landing(const void* at, size_t len, void* dst) override {
    return landings_->post(peer_, at, len, dst);
  }
  Landed take_landing(const void* at) override { return landings_->take(peer_, at); }
  void read(void* dst, size_t len, const RemoteKey& src, uint64_t src_offset, Callback done,
            Millis timeout) override;
  void send_message(std::vector<uint8_t> bytes, Callback done, Millis timeout) override;
  void close() override;
  Status error() const override;

  // ---- transport hooks ----
  // Progress thread: completes overdue operations with kTimeout. Returns true
  // while operations are pending.
  bool sweep(Clock::time_point now);
  // Operations of the user's still pending (the sweep's answer without the
  // sweep): the ticker must not stop under them, whatever tick it is. A
  // posted write sent from a user thread waits in sent_no_ack_ for a receive
  // turn, a driving waiter or the sweep to complete it; on a channel nothing
  // comes back on (a ring's forward link) only the sweep does.
  bool has_user_ops() const;
  // Progress thread: fails the channel (sticky) and every pending operation.
  void fail(const Status& error);
  // Failed and no thread is sending: the transport may forget it.
  bool finished() const;
  // After the progress thread stopped: closes the socket.
  void release_socket();

  // Sends ACKs a driving waiter held back (see receive_turn) once they have
  // waited `after`; the transport's ticker calls it every millisecond. True
  // while ACKs are still held back.
  bool flush_deferred(Clock::time_point now, Clock::duration after);

  // Held writes (post_write_deferred). They sit in the send FIFO with the
  // sender idle; any frame the channel sends next takes them along (one
  // sendmsg), and nothing but a frame of its own starts the sender for them:
  // not the ACK flush, not the end of a receive turn. The backstop is this
  // call, which the transport's ticker makes every millisecond: it sends them
  // once the oldest has waited `after`. So a peer waiting for one gets it
  // within `after` plus a tick whatever this process does. True while some
  // are still held.
  bool flush_held(Clock::time_point now, Clock::duration after);
  // Sends the held writes now (with the frames behind them) unless a sender
  // is busy, which takes them anyway. StepGather's end (tcp_drive.cc).
  void send_held();
  // Writes held back so far, and of them those the ticker had to send (for
  // tests and tuning).
  uint64_t held_writes() const { return held_total_.load(std::memory_order_relaxed); }
  uint64_t held_flushed_by_tick() const { return held_ticked_.load(std::memory_order_relaxed); }
  // sendmsg calls of the send path and recvmsg calls of the receive path
  // that brought bytes (an empty poll, EAGAIN, is not counted: how often a
  // waiter looks depends on timing), for tests and profiles.
  uint64_t send_calls() const { return tx_calls_.load(std::memory_order_relaxed); }
  uint64_t receive_calls() const { return rx_calls_.load(std::memory_order_relaxed); }

  // Gives the socket back to the progress thread when no waiter drove it for
  // `after` (see drive()). True while it is still leased.
  bool release_lease(Clock::time_point now, Clock::duration after);

  // MSG_ZEROCOPY (tcp_zerocopy.cc): reads the kernel's reports of zero-copy
  // sends it is done with off the error queue. True while some are outstanding
  // (the transport's ticker calls it every millisecond until then).
  bool drain_zerocopy();
  // Sends and copies so far (copied: the kernel copied after all, as over
  // loopback and veth).
  uint64_t zerocopy_sends() const { return zc_sent_.load(std::memory_order_relaxed); }
  uint64_t zerocopy_copied() const { return zc_copied_.load(std::memory_order_relaxed); }

  // FdWatcher (progress thread).
  void on_fd_event(uint32_t events) override;

  // WaitDriver body (see the thread model above): receives on this thread
  // until `ready()`, the deadline, or RDMAFLOW_TCP_WAIT_POLL microseconds.
  bool drive(const std::function<bool()>& ready, Clock::time_point deadline, bool exclusive);

  // The steps of a drive, also run over several channels at once by one
  // waiter (tcp_drive.cc, GroupDriver). begin_drive() takes the socket from
  // the progress thread (false: another waiter drives it, or the channel
  // stopped receiving); drive_turn() runs the receive path after poll()
  // reported `revents` on fd(); end_drive() keeps the socket leased after a
  // satisfied wait (`ok`), else hands it back to the progress thread.
  bool begin_drive();
  void drive_turn(short revents);
  void end_drive(bool ok);
  // A driving waiter about to block: completes the posted (NO_ACK) writes
  // that left since the last receive turn, running their callbacks on this
  // thread. Without it a waiter whose wait such a completion satisfies (the
  // collectives' executor, waiting for its pieces to leave) would sleep until
  // the next frame arrives or the 10 ms sweep. True when it completed any.
  bool settle_posted();
  int fd() const { return fd_; }
  bool receiving() const { return !rx_stopped_.load(); }
  const std::shared_ptr<IoLoop>& loop() const { return loop_; }

  // RDMAFLOW_TCP_STREAMS > 1 (tcp_stripes.cc): the other connections to the
  // same peer. This channel (stream 0) carries every notify, message and read
  // and a share of each striped write; the stripes carry only shares of
  // striped writes. Set once, before the channel is handed out.
  void set_stripes(std::vector<std::shared_ptr<TcpChannel>> stripes,
                   std::vector<std::shared_ptr<Channel>> handles);

 private:
  struct Op;
  struct Done {
    Callback cb;
    Status status;
  };
  using DoneList = boost::container::small_vector<Done, 4>;
  enum class Sender : uint8_t { kIdle, kActive, kParked };

  struct Ctrl {
    FrameHeader header;
    std::string reason;
  };

  // The frames of one sendmsg() (which may take several calls when partial).
  static constexpr int kBatchFrames = 32;
  struct Batch {
    FrameHeader headers[kBatchFrames];
    std::string reasons[kBatchFrames];
    iovec iov[2 * kBatchFrames];
    int iov_count = 0;
    int iov_pos = 0;
    Op* ops[kBatchFrames];
    bool op_last[kBatchFrames];    // this frame was the op's final frame
    uint64_t from[kBatchFrames];   // write / serve-read chunk: offset into the op's range
    uint64_t bytes[kBatchFrames];  // and its payload bytes
    int op_count = 0;
    int frames = 0;
    bool serving = false;              // carries bytes of a read served from a grant
    bool zero_copy[2 * kBatchFrames];  // iov[i] is a write's payload sent with MSG_ZEROCOPY
    bool sent_all() const { return iov_pos == iov_count; }
    void clear() {
      iov_count = iov_pos = op_count = frames = 0;
      serving = false;
    }
    void advance(size_t n);
  };

  // Receive state: touched only by the thread running the receive path (rx_mu_).
  struct Rx {
    std::unique_ptr<uint8_t[]> stage;  // small-frame window (header + small payloads)
    size_t begin = 0, end = 0;         // unparsed bytes in stage
    bool in_payload = false;
    bool bulk_window = false;  // after a bulk payload, read kBulkWindow bytes (tcp_recv.cc)
    FrameHeader hdr;
    uint8_t* target = nullptr;  // where payload bytes go; nullptr = discard
    bool granted = false;       // target is a grant's memory: place inside the fence
    // A write moved to a landing (Channel::post_landing): target is in its dst,
    // `landing_offset` from its start; placed between enter() and leave().
    std::shared_ptr<LandingTable::Landing> landing;
    size_t landing_offset = 0;
    uint64_t gen = 0;  // the grant table's generation when target was resolved
    uint64_t remaining = 0;
    Op* op = nullptr;          // read op whose response chunk is being received
    Status refusal;            // write chunk refused: reason for the NACK
    uint64_t poisoned_op = 0;  // write whose earlier chunk was refused
    bool has_poisoned = false;
    std::vector<uint8_t> bytes;  // message / NACK reason being received
    std::unique_ptr<uint8_t[]> discard;
  };

  // Ops (tcp_channel.cc; mu_ held).
  Op* new_op_locked(int kind, Callback done, Millis timeout);
  // Exactly once per op: queues its callback (user ops) and recycles its slot.
  void complete_locked(Op* op, const Status& status, DoneList& done);
  void unlink_locked(Op* op);
  void enqueue_locked(Op* op);
  void enqueue_ctrl_locked(const FrameHeader& header, std::string reason);

  // Completion delivery: directly on the progress thread (and, with
  // `receive_path`, on a driving waiter); elsewhere posted to the progress thread.
  void deliver(DoneList& done, bool receive_path = false);
  void complete_soon(Callback done, Status status);
  void rearm_locked();  // epoll interest of fd_ (arm_mu_ held)

  // Striping (tcp_stripes.cc). An operation issued while a striped write is
  // in flight is held and issued, in order, after that write's notify (or
  // completion) was issued: the stream-0 order every peer sees is kept.
  struct Held {
    std::function<void()> issue;
    bool striped = false;  // a striped write: the rest waits for its completion
  };
  // True when the operation was held or started as a striped write.
  bool route(bool big, std::function<void()>& issue);
  void write_striped(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                     std::optional<uint64_t> notify, Callback done, Millis timeout);
  void issue_held();
  void close_stripes();
  // Fails every stripe with `error` (a failing channel takes its stripes along).
  void fail_stripes(const Status& error);
  struct Share {  // the whole striped write a share belongs to
    uint64_t base = 0;
    uint64_t total = 0;
  };
  // `hold` >= 0: a held write (post_write_deferred); -1: sent at once.
  void write_now(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                 std::optional<uint64_t> notify, Callback done, Millis timeout,
                 const Share* share = nullptr, bool no_ack = false, int hold = -1);
  void write_routed(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
                    std::optional<uint64_t> notify, Callback done, Millis timeout, bool no_ack,
                    int hold = -1);
  // NO_ACK writes that were sent (mu_): their completions wait for the next
  // receive turn or sweep, which run them without a thread hop.
  void settle_sent_locked(DoneList& done);
  void read_now(void* dst, size_t len, const RemoteKey& src, uint64_t src_offset, Callback done,
                Millis timeout);
  void send_message_now(std::vector<uint8_t> bytes, Callback done, Millis timeout);

  void enable_zerocopy();

  // Sending (tcp_send.cc).
  Status check_key(const RemoteKey& key, uint64_t offset, uint64_t len, const char* op) const;
  void submit(Op* op, std::unique_lock<std::mutex>& lock);
  void submit_held(Op* op, std::unique_lock<std::mutex>& lock, int hold);
  void pump();
  bool build_batch_locked();
  void settle_batch_locked(DoneList& done);
  void wait_writable();
  void set_interest(bool want_out);  // EPOLLOUT interest for a parked sender
  void resume_sender();
  void kick_sender();

  // Receiving (tcp_recv.cc; rx_mu_ held by the calling thread).
  void receive_turn(bool block);
  void ack_now(size_t taken);  // TCP_QUICKACK after a turn that emptied the socket
  bool holds_rx() const { return rx_holder_.load() == std::this_thread::get_id(); }
  bool parse_staged();
  bool on_header();
  bool on_payload_done();
  void begin_payload(uint64_t len, uint8_t* target);
  bool protocol_error(const std::string& why);
  // Fails the channel: the peer presented a wrong secret for a live grant.
  bool forged_key(const Status& why);
  // (mu_) True when the peer has left as many replies queued as it may
  // (RDMAFLOW_MAX_PEER_QUEUED); the receive path then fails the channel (queue_full()).
  bool peer_queue_full_locked() const;
  bool queue_full();
  uint8_t* discard_buffer();

  std::shared_ptr<IoLoop> loop_;
  std::shared_ptr<GrantTable> grants_;
  std::shared_ptr<LandingTable> landings_;  // the transport's, shared by every stream
  std::shared_ptr<WaitDriver> driver_;      // null when RDMAFLOW_TCP_WAIT_POLL=0
  int fd_ = -1;
  uint64_t watch_id_ = 0;
  int self_;
  int peer_;
  TcpOptions options_;

  StickyError error_;  // set first thing in fail(); checked by the issuing paths
  mutable std::mutex mu_;
  bool failed_ = false;   // fail() completed the operations
  OpTable<Op> ops_;       // (mu_) every op's slot: user ops and reads being served
  OpLedger<Op> pending_;  // (mu_) the ops not yet completed, oldest first
  size_t pending_user_ops_ = 0;
  Op* send_head_ = nullptr;  // FIFO of ops with frames still to emit
  Op* send_tail_ = nullptr;
  std::vector<uint64_t> sent_no_ack_;  // ids of sent NO_ACK writes not yet completed
  std::atomic<bool> has_sent_no_ack_{false};
  std::vector<Ctrl> ctrl_;  // ACK / NACK frames, sent before the next FIFO frame
  size_t held_count_ = 0;   // (mu_) held writes in the FIFO (Op::held)
  std::atomic<bool> has_held_{false};
  std::atomic<Clock::rep> held_since_ns_{0};  // when the oldest held write was queued
  std::atomic<uint64_t> held_total_{0};
  std::atomic<uint64_t> held_ticked_{0};
  std::atomic<uint64_t> rx_calls_{0};
  std::atomic<uint64_t> tx_calls_{0};
  size_t ctrl_head_ = 0;
  Sender sender_ = Sender::kIdle;
  std::condition_variable sender_cv_;
  Batch batch_;

  // Receive side: who watches the socket, who runs the receive path.
  std::mutex rx_mu_;  // held while running the receive path or touching rx_
  std::atomic<std::thread::id> rx_holder_{};
  std::atomic<bool> rx_stopped_{false};
  std::mutex arm_mu_;        // epoll interest of fd_
  bool want_out_ = false;    // a parked sender waits for EPOLLOUT
  bool rx_waiter_ = false;   // waiters own the socket (no EPOLLIN for the loop): driving or leased
  bool rx_driving_ = false;  // a waiter is in drive() right now
  Clock::time_point lease_since_;
  bool unwatched_ = false;
  std::atomic<int> driving_{0};
  bool rx_delivered_ = false;  // this receive turn pushed a notify / message (rx_mu_)
  std::atomic<bool> ack_deferred_{false};
  std::atomic<Clock::rep> deferred_since_ns_{0};
  Rx rx_;

  uint64_t quickack_bytes_ = 0;         // ack_now(): set by start() from the MSS; 0 = off
  std::atomic<uint64_t> zc_sent_{0};    // sendmsg calls with MSG_ZEROCOPY that sent bytes
  std::atomic<uint64_t> zc_done_{0};    // of them, reported done by the kernel
  std::atomic<uint64_t> zc_copied_{0};  // of those, copied by the kernel after all

  std::mutex stripe_mu_;
  std::atomic<bool> striped_{false};  // stripes_ was set non-empty (the fast path's test)
  std::vector<std::shared_ptr<TcpChannel>> stripes_;      // set before the channel is handed out
  std::vector<std::shared_ptr<Channel>> stripe_handles_;  // closing them closes the stripes
  bool striping_ = false;  // (stripe_mu_) a striped write is in flight
  std::deque<Held> held_;  // (stripe_mu_)

  // Brackets each placement into a grant's memory (GrantTable::enter/leave). false:
  // the grant was revoked meanwhile; the rest of the chunk is discarded and refused.
  bool enter_target();
  void leave_target();
  // A read being served (mu_ held): is [from, from + len) of its grant still granted?
  // Resolves again only when a revoke moved the grant table's generation.
  bool serve_granted_locked(Op* op, uint64_t from, uint64_t len);
};

}  // namespace rdmaflow::tcp
