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

#include "allocator/status.h"
#include "graph/transfer_plan.h"

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

// "step 17" plus, for a transfer, " of transfer 3 'h2'".
std::string step_text(uint64_t step);

// Little-endian append-only writer and bounds-checked reader.
class Writer {
 public:
  Writer& u8(uint8_t v) { return raw(&v, 1); }
  Writer& u32(uint32_t v) { return raw(&v, 4); }
  Writer& u64(uint64_t v) { return raw(&v, 8); }
  Writer& bytes(std::span<const uint8_t> b) {
    u32(static_cast<uint32_t>(b.size()));
    return raw(b.data(), b.size());
  }
  Writer& str(const std::string& s) {
    return bytes({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
  }
  Writer& raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
    return *this;
  }
  std::vector<uint8_t>& out() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  bool u8(uint8_t& v) { return raw(&v, 1); }
  bool u32(uint32_t& v) { return raw(&v, 4); }
  bool u64(uint64_t& v) { return raw(&v, 8); }
  bool bytes(std::vector<uint8_t>& b) {
    uint32_t n = 0;
    if (!u32(n) || n > in_.size() - pos_) return false;
    b.assign(in_.begin() + static_cast<ptrdiff_t>(pos_),
             in_.begin() + static_cast<ptrdiff_t>(pos_ + n));
    pos_ += n;
    return true;
  }
  bool str(std::string& s) {
    std::vector<uint8_t> b;
    if (!bytes(b)) return false;
    s.assign(b.begin(), b.end());
    return true;
  }
  bool raw(void* p, size_t n) {
    if (n > in_.size() - pos_) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

}  // namespace rdmaflow::session_detail
