// Declarations the three files of TcpChannel share (tcp_channel.cc, tcp_send.cc,
// tcp_recv.cc); not part of the backend's interface.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "transport/tcp/tcp_channel.h"

namespace rdmaflow::tcp {

constexpr size_t kStageBytes = 16 << 10;  // small-frame receive window

inline std::string errno_text(int err) {
  return std::string(std::strerror(err));
}

// Each waiting thread has one eventfd, poked by IoLoop::wake_waiters(). Inline
// (one definition program-wide): the fd drive() registers must be the one
// deliver() leaves out.
struct ThreadEventFd {
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ~ThreadEventFd() {
    if (fd >= 0) ::close(fd);
  }
};

inline int thread_event_fd() {
  thread_local ThreadEventFd efd;
  return efd.fd;
}

// Writes posted with hold 0 (a slot credit a rank with a core of its own
// returns at once) from inside a driving waiter's ready(), i.e. the
// executor's step, are gathered and leave when ready() returns, with whatever
// that step posted after them: the credit for a piece, then the piece its
// reduction enabled (a ring's or Rabenseifner's allgather), in one sendmsg
// where there were two. Nothing is held past the step, so the peer gets the
// credit when it did before, and no tick is needed (tcp_drive.cc).
class StepGather {
 public:
  StepGather();
  ~StepGather();  // the outermost one sends what was gathered
  StepGather(const StepGather&) = delete;
  StepGather& operator=(const StepGather&) = delete;
  static bool active();
  static void add(std::shared_ptr<TcpChannel> channel);
};

// The WaitDriver of a channel's operations and (`exclusive`: only this
// channel can satisfy the wait) of its inbox (tcp_drive.cc). It joins the
// drivers of other channels of the same transport into one that waits on all
// of their sockets at once (WaitDriver::join).
std::shared_ptr<WaitDriver> make_channel_driver(std::weak_ptr<TcpChannel> channel, bool exclusive);

// One operation: a user write / read / message, or the serving side of a peer's
// read. Pooled in the channel's OpTable (no allocation per operation once warm);
// its id (generation << 32 | slot) rides in its frames, so a late reply never
// matches a recycled slot. Listed in the channel's OpLedger until it completes.
struct TcpChannel::Op : OpRecord {
  enum Kind : int { kWrite, kRead, kMessage, kServeRead };
  Kind kind = kWrite;
  bool queued = false;    // in the send FIFO (frames left to emit)
  bool in_batch = false;  // a frame of it is in the batch on the wire
  bool held = false;      // queued by post_write_deferred, counted in held_count_
  bool finish_pending = false;
  Callback done;
  FrameHeader header;  // template of this op's frames
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  uint64_t len = 0;
  uint64_t emitted = 0;   // payload bytes placed into batches
  uint64_t received = 0;  // read: response bytes received
  // Serving a read: the grant it reads through, checked again whenever the grant
  // table's generation moved (a revoke) before more of its bytes leave.
  uint64_t key_id = 0, key_offset = 0;
  KeySecret key_secret;
  uint64_t grant_gen = 0;
  std::vector<uint8_t> message;
  Status finish_status;
  Op* prev = nullptr;  // send FIFO
  Op* next = nullptr;

  const char* name() const {
    switch (kind) {
      case kWrite:
        return "write";
      case kRead:
        return "read";
      case kMessage:
        return "send message";
      case kServeRead:
        return "serve read";
    }
    return "operation";
  }
};

}  // namespace rdmaflow::tcp
