// Landings of one tcp transport (Channel::post_landing): where a peer's
// writes into granted memory go instead, so that the socket's copy puts them
// where the receiver wants them. Shared by every channel and stripe of the
// transport, keyed by the local address a write would land at and the peer
// it comes from.
//
// The receive path asks match() when a write frame's header is read; a frame
// lies inside one landing or is not moved. Each read or copy of its bytes
// into dst runs between enter() and leave(), and landed() records the frame
// once its last byte is in, before its notify is delivered. take() withdraws
// a landing: from then on nothing more is put at dst, and it waits for a
// read in progress to leave (a receive call into dst never blocks long: the
// drivers' SO_RCVTIMEO is at most 0.5 ms).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/channel.h"

namespace rdmaflow::tcp {

class LandingTable {
 public:
  struct Landing {
    int peer = -1;
    const uint8_t* at = nullptr;
    size_t len = 0;
    uint8_t* dst = nullptr;
    // Guarded by the table's mutex.
    bool withdrawn = false;
    int receiving = 0;  // reads or copies into dst in progress
    int matched = 0;    // frames moved (each has its range in `landed` when done)
    Channel::Landed landed;
  };

  // False when [at, at + len) overlaps a landing already posted.
  bool post(int peer, const void* at, size_t len, void* dst);
  Channel::Landed take(int peer, const void* at);

  // The landing of `peer` that holds all of [at, at + len), or null; cheap
  // while none is posted.
  std::shared_ptr<Landing> match(int peer, const uint8_t* at, size_t len);
  bool enter(Landing& l);  // false: withdrawn, nothing more goes to dst
  void leave(Landing& l);
  void landed(Landing& l, size_t offset, size_t len);  // a frame is all in dst

 private:
  std::mutex mu_;
  std::condition_variable left_;
  std::vector<std::shared_ptr<Landing>> posted_;
  std::atomic<size_t> count_{0};
};

}  // namespace rdmaflow::tcp
