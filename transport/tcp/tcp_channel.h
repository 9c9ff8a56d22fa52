// TcpChannel: one TCP connection to one peer, emulating one-sided writes and
// reads with framed messages (tcp_frame.h, docs/tcp_transport.md).
//
// Thread model
//  - Receiving, timeouts, failure handling and every completion callback run on
//    the transport's progress thread (IoLoop).
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
#include <boost/asio/ip/tcp.hpp>
#include <boost/container/small_vector.hpp>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/channel.h"
#include "transport/tcp/grant_table.h"
#include "transport/tcp/tcp_frame.h"
#include "transport/tcp/tcp_loop.h"

namespace rdmaflow::tcp {

struct TcpOptions {
  uint64_t chunk_bytes = 1ull << 20;  // payload per write / read-response frame
  bool wait_poll = true;              // RDMAFLOW_TCP_WAIT_POLL: see TcpWaiter
};

// How a user thread waits on this channel (WaitDriver, transport/channel.h).
//
// A waiter sleeping on the inbox's condition variable is woken only after the
// progress thread was woken by the socket and processed the frame: two
// wake-ups in a row per message. Instead the waiter polls the socket itself
// (plus an eventfd the progress thread signals after it delivered something),
// so it wakes up at the same time as the progress thread; it then spins
// briefly until the progress thread has delivered. Frames are still processed
// only by the progress thread. When readable bytes turn out not to be for
// this wait (bulk data, other operations), the waiter falls back to the
// condition variable.
class TcpWaiter final : public WaitDriver {
 public:
  TcpWaiter(int socket_fd, int event_fd) : socket_fd_(socket_fd), event_fd_(event_fd) {}
  ~TcpWaiter() override;
  bool drive(const std::function<bool()>& ready, Clock::time_point deadline) override;
  // Progress thread: something was delivered; wake a waiter blocked in poll().
  void wake();
  // The socket is about to be closed: stop polling it.
  void retire() { retired_.store(true); }
  // A thread is waiting in drive() right now.
  bool active() const { return active_.load(std::memory_order_relaxed) > 0; }

 private:
  int socket_fd_;
  int event_fd_;
  std::atomic<int> polling_{0};
  std::atomic<int> active_{0};
  std::atomic<bool> retired_{false};
};

class TcpChannel final : public Channel, public std::enable_shared_from_this<TcpChannel> {
 public:
  TcpChannel(std::shared_ptr<IoLoop> loop, std::shared_ptr<GrantTable> grants,
             boost::asio::ip::tcp::socket socket, int self_rank, int peer_rank, TcpOptions options);
  ~TcpChannel() override;

  // Starts receiving; call once after construction.
  void start();

  int peer_rank() const override { return peer_; }
  std::string backend() const override { return "tcp"; }
  void write(const void* src, size_t len, const RemoteKey& dst, uint64_t dst_offset,
             std::optional<uint64_t> notify, Callback done, Millis timeout) override;
  void read(void* dst, size_t len, const RemoteKey& src, uint64_t src_offset, Callback done,
            Millis timeout) override;
  void send_message(std::vector<uint8_t> bytes, Callback done, Millis timeout) override;
  void close() override;
  Status error() const override;

  // ---- transport hooks ----
  // Progress thread: completes overdue operations with kTimeout. Returns true
  // while operations are pending.
  bool sweep(Clock::time_point now);
  // Progress thread: fails the channel (sticky) and every pending operation.
  void fail(const Status& error);
  // Failed and no thread is sending: the transport may forget it.
  bool finished() const;
  // After the progress thread stopped: closes the socket.
  void release_socket();

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
    bool op_last[kBatchFrames];  // this frame was the op's final frame
    int op_count = 0;
    int frames = 0;
    bool sent_all() const { return iov_pos == iov_count; }
    void clear() { iov_count = iov_pos = op_count = frames = 0; }
    void advance(size_t n);
  };

  // Receive state, progress thread only.
  struct Rx {
    std::unique_ptr<uint8_t[]> stage;  // small-frame window (header + small payloads)
    size_t begin = 0, end = 0;         // unparsed bytes in stage
    bool in_payload = false;
    bool exact_header = false;  // after a bulk payload, read the next header alone
    FrameHeader hdr;
    uint8_t* target = nullptr;  // where payload bytes go; nullptr = discard
    uint64_t remaining = 0;
    Op* op = nullptr;          // read op whose response chunk is being received
    Status refusal;            // write chunk refused: reason for the NACK
    uint64_t poisoned_op = 0;  // write whose earlier chunk was refused
    bool has_poisoned = false;
    std::vector<uint8_t> bytes;  // message / NACK reason being received
    std::unique_ptr<uint8_t[]> discard;
    bool stopped = false;
  };

  // Ops and slots (mu_ held).
  Op* new_op_locked(int kind, Callback done, Millis timeout);
  Op* find_op_locked(uint64_t id);
  void complete_locked(Op* op, const Status& status, DoneList& done);
  void unlink_locked(Op* op);
  void enqueue_locked(Op* op);
  void enqueue_ctrl_locked(const FrameHeader& header, std::string reason);
  const char* op_name(const Op* op) const;

  // Completion delivery: on the progress thread, directly; elsewhere, posted.
  void deliver(DoneList& done);
  void complete_soon(Callback done, Status status);
  Status check_key(const RemoteKey& key, uint64_t offset, uint64_t len, const char* op) const;
  void submit(Op* op, std::unique_lock<std::mutex>& lock);

  // Sending.
  void pump();
  bool build_batch_locked();
  void settle_batch_locked(DoneList& done);
  void wait_writable();
  void resume_sender();
  void kick_sender();

  // Receiving (progress thread).
  void arm_read();
  void on_readable(const boost::system::error_code& ec);
  bool parse_staged();
  bool on_header();
  bool on_payload_done();
  void begin_payload(uint64_t len, uint8_t* target);
  bool protocol_error(const std::string& why);
  uint8_t* discard_buffer();

  std::shared_ptr<IoLoop> loop_;
  std::shared_ptr<GrantTable> grants_;
  std::shared_ptr<TcpWaiter> waiter_;  // null when RDMAFLOW_TCP_WAIT_POLL=0
  std::optional<boost::asio::ip::tcp::socket> socket_;
  int fd_ = -1;
  int self_;
  int peer_;
  TcpOptions options_;

  mutable std::mutex mu_;
  bool failed_ = false;
  Status error_;
  std::vector<std::unique_ptr<Op>> slots_;
  std::vector<uint32_t> free_slots_;
  size_t pending_user_ops_ = 0;
  Op* send_head_ = nullptr;  // FIFO of ops with frames still to emit
  Op* send_tail_ = nullptr;
  std::vector<Ctrl> ctrl_;  // ACK / NACK frames, sent before the next FIFO frame
  size_t ctrl_head_ = 0;
  Sender sender_ = Sender::kIdle;
  std::condition_variable sender_cv_;
  Batch batch_;

  Rx rx_;
};

}  // namespace rdmaflow::tcp
