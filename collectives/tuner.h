// The tuner: where the cost model's estimates of two or three schedules are
// close, time them on the first calls of the size and keep the fastest.
//
// The model's estimates of close schedules are often within a few percent of
// each other while their times differ by 20-30% and move with load (4 x 1 at
// 64 KiB: the double tree 1.33x the binomial tree; 2 x 2 at 16 MiB: the tree
// 1.32x hier; docs/benchmarks.md, "Selector: timing the near-tied
// candidates"). Fixed tables (Open MPI's coll tuned rules, UCC's score maps,
// NCCL's tuner plugin that edits the cost table) cannot follow the machine; a
// trial at run time, as STAR-MPI did, can. Per (collective, size bucket: the
// bytes rounded up to a power of two) the candidates are the algorithms whose
// estimate is within kFactor of the cheapest (at most kMaxCandidates). The
// bucket's first calls run each candidate in turn for a block of 1 + trials
// calls: back to back, as a loop's calls run, since alternating them call by
// call timed another regime (4 x 1 at 64 KiB, recursive doubling took 0.4 ms
// a rank between other schedules and 1.0 ms back to back); the block's first
// call (a new program, the previous schedule's pieces still settling) is not
// counted. Every rank times its own calls; the next call of the bucket waits
// for those to finish,
// and the ranks agree on the winner by one small allreduce of each
// candidate's median time summed over the ranks (integers, so every rank sums
// to the same figure), run with a fixed algorithm by the communicator. From
// then on the bucket takes the winner.
//
// Every rank takes the same algorithm for the same call: calls are issued in
// the same order on every rank, and a call's place in its bucket (not its
// lane, nor when it finishes) says which candidate it runs. Calls in flight on
// other lanes are only waited for at the decision.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/types.h"
#include "common/status.h"

namespace rdmaflow {

class Tuner {
 public:
  // Candidates: estimates within this factor of the cheapest.
  static constexpr double kFactor = 1.3;
  static constexpr size_t kMaxCandidates = 4;
  // RDMAFLOW_COLL_TUNE's default: trial calls per candidate.
  static constexpr int kDefaultTrials = 3;
  static constexpr int kMaxTrials = 100;

  // RDMAFLOW_COLL_TUNE: trial calls per candidate; 0 disables the tuner.
  static Result<int> trials_from_env();

  explicit Tuner(int trials) : trials_(trials) {}

  struct Entry;
  // The algorithm a tunable call of `bytes` takes, and where it reports its time.
  struct Pick {
    Algorithm algo = Algorithm::kAuto;
    Entry* entry = nullptr;  // set for a trial call: record() its time
    int candidate = -1;
    bool warmup = false;  // the block's first call: waited for, not counted
  };
  // Runs the agreement: sums each rank's figures in place, over every rank.
  using Agree = std::function<Status(std::vector<int64_t>& nanos)>;
  // Called in call order from the issuing thread. A trial call takes the next
  // candidate; the first call after the trial waits (until `deadline`) for
  // the trial calls to finish, then agrees through `agree`.
  Result<Pick> pick(CollectiveKind kind, size_t bytes, const CostModel& model,
                    std::chrono::steady_clock::time_point deadline, const Agree& agree);
  // A trial call finished (failed or not) after `seconds` on this rank.
  void record(const Pick& trial, double seconds);

  // What a bucket settled on: the candidates, each one's median time summed
  // over the ranks, and the winner. Empty before the decision.
  struct Outcome {
    std::vector<Algorithm> candidates;
    std::vector<int64_t> nanos;
    Algorithm winner = Algorithm::kAuto;
    size_t bucket_bytes = 0;
  };
  std::optional<Outcome> outcome(CollectiveKind kind, size_t bytes) const;
  // "allreduce up to 64 KiB: tree 310.2 us, dbtree 402.7 us -> tree"
  static std::string describe(CollectiveKind kind, const Outcome& o);
  // The bucket of `bytes`: ceil(log2(bytes)).
  static int bucket(size_t bytes);

  struct Entry {
    std::vector<Algorithm> candidates;
    int issued = 0;                            // trial calls handed out
    int recorded = 0;                          // ... and finished
    std::vector<std::vector<double>> seconds;  // per candidate
    std::optional<Outcome> outcome;
  };

 private:
  Entry& entry(CollectiveKind kind, size_t bytes, const CostModel& model);

  const int trials_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint32_t, std::unique_ptr<Entry>> entries_;
};

}  // namespace rdmaflow
