// The executor's run of one program (Run), shared by its two files:
// executor.cc prepares, lands receives, starts items and completes;
// executor_wait.cc waits while nothing can move. Internal: not part of the API.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/fabric.h"
#include "collectives/program.h"
#include "common/status.h"

namespace rdmaflow::executor_detail {

using Clock = std::chrono::steady_clock;

// Write completions, filled on progress threads, drained by the executor.
struct Completions {
  std::mutex mu;
  std::vector<uint32_t> done;
  Status error;
  int error_peer = -1;
  size_t in_flight = 0;  // guarded by mu
  // Set (under mu) with every entry of done / error: the executor polls this
  // flag, not the mutex.
  std::atomic<bool> pending{false};
};

// One execute() call. The phases, in order: prepare() turns the program's
// dependency lists into a dependents graph and reads the lane's sequence
// bases; the run loops (run_direct() for same-host direct peers, run_driven()
// otherwise) call step() to start every ready item and, while nothing can
// move, wait; complete() settles the lane afterwards.
class Run {
 public:
  Run(Fabric& fabric, const Program& program, int lane, Clock::time_point deadline,
      const std::string& what);

  Status execute();

 private:
  // Reused by the calls on this thread (no allocation per call).
  struct Scratch {
    std::vector<uint32_t> remaining, dep_begin, dependents, cursor, ready, inflight, drained;
    std::vector<uint64_t> send_base, recv_base;
    // Receives by peer and ordinal: recv_items[recv_begin[p] + ordinal].
    std::vector<uint32_t> recv_begin, recv_items;
    std::vector<uint8_t> recv_state;    // per item: RecvState
    Clock::time_point no_poll_until{};  // preempted while polling: sleep until then
  };
  static Scratch& thread_scratch();

  bool done() const { return finished_ == n_ || !failure_.is_ok(); }

  enum RecvState : uint8_t { kWaiting = 0, kLanding = 1, kConsumed = 2 };

  // Prepare (executor.cc).
  void prepare();
  bool may_land() const;
  std::byte* slot_of(int peer, uint64_t seq);
  void index_receives();
  uint32_t recv_item(int peer, uint64_t ordinal) const;

  // Landing (executor.cc; FabricConfig::land_min).
  void land(uint32_t i);
  void take_landing(const Item& it, uint32_t i, const std::byte* slot);
  void withdraw_landings();

  // Start items (executor.cc).
  void finish(uint32_t i);
  bool step();
  bool drain_completions();
  bool start(uint32_t i);
  void run_local(const Item& it);
  bool start_send(uint32_t i, const Item& it);
  bool start_recv(uint32_t i, const Item& it);

  // Wait (executor_wait.cc).
  bool blocked(Clock::time_point now);
  std::string waiting_text() const;
  Status timeout_error() const;
  void run_direct();
  bool run_mixed(WaitDriver& driver);
  void run_driven();
  void progressed(Clock::time_point t);
  Clock::time_point poll_end() const;
  bool spin_in_common_driver(WaitDriver& driver, Clock::time_point t0, uint64_t& epoch);
  bool poll_common_driver(WaitDriver& driver, Clock::time_point t0, uint64_t& epoch);
  void spin_in_peer_driver(WaitDriver& driver, Clock::time_point now, uint64_t& epoch);
  bool spin_in_driver(WaitDriver& driver, Clock::time_point t0, uint64_t& epoch, bool step_first);
  void sleep_in_common_driver(WaitDriver& driver, Clock::time_point now, uint64_t& epoch);
  void sleep_on_signal(Clock::time_point now, uint64_t epoch);

  // Complete (executor.cc).
  Status complete();

  Fabric& fabric_;
  const Program& program_;
  const std::vector<Item>& items_;
  const size_t n_;
  const int lane_;
  const int world_;
  const size_t es_;
  const FabricConfig& cfg_;
  const Clock::duration patience_;  // how long the call may go without progress
  Clock::time_point deadline_;      // moved by progress (blocked())
  const std::string& what_;
  Signal& sig_;
  const int yield_every_;
  Scratch& scratch_;

  std::shared_ptr<Completions> comps_;  // made by the first write that needs one
  size_t finished_ = 0;
  bool landing_ = false;      // may_land(): the landing bookkeeping below is kept
  size_t landings_ = 0;       // receives whose landing is posted
  size_t finished_seen_ = 0;  // finished_ when blocked() last moved the deadline
  Status failure_;
  Clock::time_point spin_until_;      // spin (drive, poll) rather than sleep until then
  Clock::time_point poll_until_;      // not crowded: poll rather than drive until then
  Clock::time_point next_peer_scan_;  // blocked() looks at every peer's channel then
  int waiting_peer_ = -1;             // set by blocked(): the peer we wait on, or -1
  int64_t waiting_item_ = -1;         // ... and the item, or -1: write completions
};

}  // namespace rdmaflow::executor_detail
