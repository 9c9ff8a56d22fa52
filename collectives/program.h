// Program: one rank's schedule for one collective, written in a tiny
// communication vocabulary:
//
//   send(peer, src, n)                write n elements into the peer's slot, with notify
//   recv(peer, dst, n)                wait for the notify, copy the slot into dst
//   recv_reduce(peer, dst, a, n)      wait for the notify, dst = a (op) slot
//   copy(dst, src, n), scale(dst, n)  local work (scale finishes kAvg)
//   reduce(dst, src, n)               local work: dst = dst (op) src
//
// Algorithms (collectives/algorithms/) emit these calls in the order the
// paper's pseudocode would execute them with blocking operations. Messages are
// split into pieces of at most `piece_elems` elements; the sender and the
// receiver split a message the same way, so the k-th piece this rank sends to
// a peer is the k-th piece that peer receives from this rank.
//
// finalize() turns the list into a dataflow graph: an item depends on every
// earlier item whose buffer range it conflicts with (read-after-write,
// write-after-read, write-after-write). The executor runs any item whose
// dependencies are done, so piece k+1 travels while piece k is reduced, and a
// chunk forwarded at step s+1 leaves as soon as its piece was reduced at step s
// (pipelining across steps with no per-step barrier).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "collectives/types.h"
#include "common/dtype.h"

namespace rdmaflow {

enum class ItemKind : uint8_t { kSend, kRecv, kCopy, kScale, kReduce };

struct Item {
  ItemKind kind = ItemKind::kSend;
  bool reduce = false;             // kRecv: dst = operand (op) incoming
  int peer = -1;                   // kSend / kRecv
  uint32_t step = 0;               // algorithm step (for messages and debugging)
  uint64_t ordinal = 0;            // k-th piece sent to / received from `peer`
  const std::byte* src = nullptr;  // kSend: source; kRecv+reduce: operand; kCopy, kReduce: source
  std::byte* dst = nullptr;        // kRecv / kCopy / kScale / kReduce: destination
  size_t elems = 0;
};

class Program {
 public:
  Program(int world, DataType type, ReduceOp op, size_t piece_elems);

  // ---- the vocabulary ----
  void send(int peer, const void* src, size_t elems);
  void recv(int peer, void* dst, size_t elems);
  // dst = operand (op) incoming. `operand` may equal dst.
  void recv_reduce(int peer, void* dst, const void* operand, size_t elems);
  void copy(void* dst, const void* src, size_t elems);
  void scale(void* dst, size_t elems);                    // dst /= world (finishes kAvg)
  void reduce(void* dst, const void* src, size_t elems);  // dst = dst (op) src
  // Marks the start of the next algorithm step (only labels items).
  void next_step() { ++step_; }

  // A collective among a subset of the ranks, written by an algorithm that
  // knows only "rank r of n": while a Group lives, the peers the vocabulary
  // names are indices into `ranks` (virtual ranks) and are recorded as the
  // real ranks they stand for. Groups nest (indices into the enclosing
  // group's ranks). scale() still divides by the program's world.
  class Group {
   public:
    Group(Program& p, std::span<const int> ranks);
    ~Group();
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;

   private:
    Program& p_;
    std::vector<int> saved_;
  };

  // Computes dependencies; call once after the last item.
  void finalize();

  DataType type() const { return type_; }
  ReduceOp op() const { return op_; }
  int world() const { return world_; }
  size_t elem_size() const { return elem_size_; }
  size_t piece_elems() const { return piece_elems_; }
  // Pieces of the messages emitted from now on. For an algorithm whose
  // messages to some peers go better in fewer, larger pieces (Rabenseifner
  // across hosts); both ends of a message must cut it the same way, and a
  // piece must fit a slot.
  void set_piece_elems(size_t n) { piece_elems_ = std::max<size_t>(1, n); }
  const std::vector<Item>& items() const { return items_; }
  // Items that must complete before item i may start.
  const std::vector<uint32_t>& deps(size_t i) const { return deps_[i]; }
  // Number of pieces this rank sends to / receives from `peer`.
  uint64_t sends_to(int peer) const { return sends_[peer]; }
  uint64_t recvs_from(int peer) const { return recvs_[peer]; }
  uint32_t steps() const { return step_ + 1; }

  // Human-readable listing ("step 2: send 1024 to rank 3 ..."), for debugging.
  std::string describe() const;

 private:
  void add(Item item);
  int real(int peer) const { return map_.empty() ? peer : map_[static_cast<size_t>(peer)]; }
  void local(ItemKind kind, void* dst, const void* src, size_t elems);  // copy, scale, reduce

  int world_;
  DataType type_;
  ReduceOp op_;
  size_t elem_size_;
  size_t piece_elems_;
  uint32_t step_ = 0;
  std::vector<int> map_;  // virtual -> real rank inside a Group; empty: identity
  std::vector<Item> items_;
  std::vector<std::vector<uint32_t>> deps_;
  std::vector<uint64_t> sends_;
  std::vector<uint64_t> recvs_;
};

// Element range [begin, begin + size) of block `b` when `count` elements are
// split into `blocks` nearly equal blocks (the first count % blocks get one more).
struct BlockRange {
  size_t begin = 0;
  size_t size = 0;
};
BlockRange block_range(size_t count, size_t blocks, size_t b);

}  // namespace rdmaflow
