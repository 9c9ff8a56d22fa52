// What communicator.cc and communicator_v.cc share: a call's state, the
// lanes that run calls in order, and the Request's shared state; and the
// configuration create() reads from the environment (communicator_config.cc).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "collectives/algorithms/registry.h"
#include "collectives/communicator.h"
#include "collectives/compressed.h"
#include "collectives/program.h"

namespace rdmaflow {

using Clock = std::chrono::steady_clock;

namespace detail {
struct OpState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  Algorithm algorithm = Algorithm::kAuto;
  CollectiveKind kind = CollectiveKind::kAllreduce;

  void complete(Status st) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      status = std::move(st);
    }
    cv.notify_all();
  }
};
}  // namespace detail

struct Communicator::Call {
  CollArgs args;
  Algorithm algo = Algorithm::kAuto;
  size_t piece_elems = 1;
  int lane = 0;
  uint64_t ticket = 0;
  Millis timeout{0};                       // how long the call may go without progress once it runs
  const std::string* what = nullptr;       // "allreduce[ring]", from call_label()
  std::optional<CodecCall> codec;          // compressed on the wire (compressed.h)
  std::string codec_label;                 // "allreduce[topk:0.1]": `what` of such a call
  std::shared_ptr<detail::OpState> state;  // start() only: what the Request waits on
  Tuner::Pick tune;                        // a trial call of the tuner: entry set
  // Set for calls that run their own programs (alltoallv): execute_call runs
  // it instead of building the registry's program from `args`.
  std::function<Status(Lane& lane)> body;
};

struct Communicator::Lane {
  int index = 0;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t next_ticket = 0;  // tickets handed out in call order
  uint64_t turn = 0;         // the ticket allowed to run
  std::deque<std::shared_ptr<Call>> queue;
  std::thread worker;
  bool stop = false;
  std::byte* tmp = nullptr;  // local temporary memory of the running call
  size_t tmp_bytes = 0;
  // The last call's program, run again as it is when the next call has the
  // same arguments (a training loop's, a benchmark's): no rebuild per call.
  std::unique_ptr<Program> program;
  CollArgs program_args;
  Algorithm program_algo = Algorithm::kAuto;
  size_t program_piece = 0;
  ~Lane() { std::free(tmp); }
};

// send() and recv() with one peer in one direction, run in posting order on
// the queue's worker.
struct Communicator::P2pQueue {
  struct Job {
    std::function<Status()> run;
    std::shared_ptr<detail::OpState> state;
    std::string what;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> jobs;
  std::thread worker;
  bool stop = false;
};

// What create() takes from CommunicatorOptions and the RDMAFLOW_COLL_*
// environment for its Fabric, and what it needs of it beyond.
struct FabricKnobs {
  FabricConfig cfg;
  bool crowded = false;      // more ranks on this host than CPUs (they poll and yield)
  int collective_lanes = 0;  // cfg.lanes without send()/recv()'s
};

// Reads the knobs in create()'s order and refuses a bad one, naming it;
// with RDMAFLOW_COLL_BIND=1 it binds the process's threads to a CPU. `world`
// stands for the ranks of this host when the launcher does not say.
Result<FabricKnobs> fabric_config_from_env(const CommunicatorOptions& options, int world);

// An integer knob: `given` when positive, else the environment variable
// `name` (default `fallback`), refused below `min`.
Result<int64_t> knob(const char* name, int64_t given, int64_t fallback, int64_t min);

// The model of the layout: two levels where hosts have several ranks each,
// else one (the between-host costs once ranks span hosts).
inline CostModel model_for(const HostGroups& g, const CostParams& within,
                           const CostParams& between) {
  if (g.hierarchical()) return CostModel(g.hosts(), g.per_host(), within, between);
  return CostModel(g.world(), g.hosts() > 1 ? between : within);
}

}  // namespace rdmaflow
