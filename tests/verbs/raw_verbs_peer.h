// A raw RDMA CM client for the conformance tests: it connects to a verbs
// listener with whatever private data it is given and SENDs whatever bytes it
// is given, skipping every check rdmaflow's own transport makes. It is what a
// buggy or hostile peer looks like to the listener (the verbs counterpart of
// RawConn, the raw TCP socket).
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace rdmaflow::testing {

class RawVerbsPeer {
 public:
  RawVerbsPeer() = default;
  RawVerbsPeer(const RawVerbsPeer&) = delete;
  RawVerbsPeer& operator=(const RawVerbsPeer&) = delete;
  ~RawVerbsPeer();

  // Connects to `address` ("verbs://ip:port") with `private_data` in the
  // connect request. OK once established; kConnectionFailed when refused, with
  // the text the listener put in its reject; kTimeout when nothing happens.
  Status connect(const std::string& address, std::span<const uint8_t> private_data,
                 std::chrono::milliseconds timeout);

  // The private data of the listener's accept (its handshake challenge and Hello).
  const std::vector<uint8_t>& accept_data() const { return accept_data_; }

  // One SEND of `bytes` on the established queue pair, waited for.
  Status send(std::span<const uint8_t> bytes, std::chrono::milliseconds timeout);

  // One RDMA WRITE (or READ) of `len` bytes at `addr` with `rkey`, waited for:
  // what a peer that skips rdmaflow's checks does with a key it learned.
  Status rdma(bool write, uint64_t addr, uint32_t rkey, uint32_t len,
              std::chrono::milliseconds timeout, uint8_t fill = 0x5a);

  // The next message the listener SENT (its bytes), waited for.
  Result<std::vector<uint8_t>> recv(std::chrono::milliseconds timeout);

  // True once the listener's side disconnected (or the QP failed) within `timeout`.
  bool disconnected_within(std::chrono::milliseconds timeout);

 private:
  Result<rdma_cm_event_type> next_event(std::chrono::milliseconds timeout, std::string* reject);

  rdma_event_channel* ec_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  Status wait_send(uint64_t wr_id, std::chrono::milliseconds timeout);

  std::vector<uint8_t> accept_data_;
  std::deque<ibv_wc> received_;  // receive completions polled while waiting for a send
  std::vector<uint8_t> buf_;     // one send buffer, then the receive buffers
  ibv_mr* mr_ = nullptr;
  bool qp_ = false;
  bool disconnected_ = false;
  int last_status_ = 0;  // of the last rdma_cm event
};

}  // namespace rdmaflow::testing
