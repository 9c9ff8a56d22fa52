// SessionLayout: one rank's view of a TransferPlan, indexed for the step path,
// and the small binary codec the setup exchange uses.
//
// Memory: `copies` frames of `frame_bytes` each, contiguous; step s uses frame
// s mod copies. A planned region at `offset` lives at
// base + frame * frame_bytes + offset.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"
#include "graph/transfer_plan.h"
#include "transport/remote_key.h"

namespace rdmaflow::session_detail {

struct SessionLayout {
  const graph::TransferPlan* plan = nullptr;
  const graph::RankPlan* me = nullptr;
  int rank = 0;
  uint32_t copies = 1;
  uint64_t frame_bytes = 0;
  std::vector<graph::TransferId> sends;  // transfers this rank sends
  std::vector<graph::TransferId> recvs;  // transfers this rank receives
  std::vector<int> senders;              // ranks that send to this rank, ascending
  std::vector<int> receivers;            // ranks this rank sends to, ascending
  // Output buffers (PlannedBuffer of kind kOutput) of this rank, by tensor name.
  std::map<std::string, size_t> output_by_tensor;  // index into me->buffers
  // The schedule order the executor contract asks for (docs/graph-plans.md):
  // this rank's Recv transfers in schedule order, and, by transfer id, how
  // many of them come before each of its Sends. A Send may only start once
  // those Recvs of its step completed: the planner shared a peer's receive
  // slots on that order.
  std::vector<graph::TransferId> recv_order;
  std::vector<uint32_t> recvs_before_send;

  static Result<SessionLayout> build(const graph::TransferPlan& plan, int rank);

  const graph::TransferSpec& spec(graph::TransferId t) const { return plan->transfers[t]; }
  uint32_t frame_of(uint64_t step) const { return static_cast<uint32_t>(step % copies); }
  uint64_t total_bytes() const { return frame_bytes * copies; }
  // "transfer 3 'h2' (rank 0 -> 1)" for error messages.
  std::string describe(graph::TransferId t) const;
};

// One rank's record in the setup key exchange (session_one_sided.cc): a key for
// every frame of every receive slot it grants, and the word each rank that sends
// to it lands credits in. Little endian:
//   u32 n | n x (u32 transfer | u32 frame | u32 len | RemoteKey) |
//   u32 m | m x (u32 rank | u32 len | RemoteKey)
// A record comes from a peer: the decoder checks every count against what is left
// and every key, and a frame against `copies`.
struct SetupRecord {
  struct Slot {
    uint32_t transfer = 0;
    uint32_t frame = 0;
    RemoteKey key;
  };
  struct Credit {
    uint32_t rank = 0;
    RemoteKey key;
  };
  std::vector<Slot> slots;
  std::vector<Credit> credits;
};
std::vector<uint8_t> encode_setup_record(const SetupRecord& r);
// kProtocolError saying what is malformed.
Result<SetupRecord> decode_setup_record(std::span<const uint8_t> in, uint32_t copies);

// "step 17" plus, for a transfer, " of transfer 3 'h2'".
std::string step_text(uint64_t step);

}  // namespace rdmaflow::session_detail
