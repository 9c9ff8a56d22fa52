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
// bucket's first calls run a warm-up block of the first candidate (not
// counted), then each candidate in turn for a block of 1 + trials calls
// (trials by time: as many as the cheapest estimate fits in 20 ms, 3-100):
// back to back, as a loop's calls run, since alternating them call by
// call timed another regime (4 x 1 at 64 KiB, recursive doubling took 0.4 ms
// a rank between other schedules and 1.0 ms back to back); the block's first
// call (a new program, the previous schedule's pieces still settling) is not
// counted. Every rank times its own calls; the next call of the bucket waits
// for those to finish, and one small allreduce (the maximum, of integer
// nanoseconds: the same figures on every rank; run with a fixed algorithm by
// the communicator) gives each timed call's slowest rank. The candidate with
// the least median of those wins, and the bucket takes it from then on.
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
  // RDMAFLOW_COLL_TUNE's default (unset or "auto"): trial calls per candidate
  // by time, as many as the model's estimate of the bucket's cheapest
  // schedule fits in kBudgetSeconds, between kMinTrials and kMaxTrials; a
  // number fixes them. With 3 per candidate, on the cluster under load 4-11,
  // near-ties at 8 B-16 MiB settled within the trial's own noise (4 x 1 at
  // 8 B: recursive doubling taken, 2.26x the tree; docs/benchmarks.md,
  // "Selector: timing the near-tied candidates"). By time, a 64 KiB call (a
  // few hundred us) gets tens of trials and a 4 MiB one (milliseconds) 3.
  static constexpr int kByTime = -1;
  static constexpr int kMinTrials = 3;
  static constexpr int kMaxTrials = 100;
  static constexpr double kBudgetSeconds = 0.02;
  // The most calls a bucket's trial takes: a warm-up block of the first
  // candidate and a block of 1 + trials calls per candidate.
  static constexpr size_t kMostTrialCalls = (kMaxTrials + 1) * (kMaxCandidates + 1);
  // RDMAFLOW_COLL_TUNE_MIN_BYTES's default: calls from 64 KiB are tuned; 8 B
  // keeps the model's choice (the tree on the cluster's layouts, the fastest
  // in every targets run). From 64 KiB the model's estimates of the trees,
  // the ring, Rabenseifner and hier tie within a few % on the crowded
  // cluster and it took the double tree on 4 x 1 at 64 KiB, Rabenseifner
  // from 4 MiB and hier on 2 x 2 at 256 KiB-1 MiB, 1.1-1.4x the fastest; the
  // trial (by time, after its warm-up block) took the fastest or one within
  // 10% of it at each of 16 size-runs ("Selector: the tuner from 64 KiB").
  static constexpr size_t kDefaultMinBytes = size_t{64} << 10;

  // RDMAFLOW_COLL_TUNE: trial calls per candidate, kByTime, or 0 (off).
  static Result<int> trials_from_env();
  // RDMAFLOW_COLL_TUNE_MIN_BYTES: the least call (its largest buffer) tuned.
  static Result<size_t> min_bytes_from_env();

  explicit Tuner(int trials, size_t min_bytes = 0) : trials_(trials), min_bytes_(min_bytes) {}

  // The trial calls per candidate of a bucket whose cheapest estimate is
  // `seconds`: the fixed number, or by time.
  int trials_for(double seconds) const;

  // Whether calls of `bytes` (the call's largest buffer) are tuned; the
  // model's choice stands for the others. The same on every rank.
  bool tunes(size_t bytes) const { return bytes >= min_bytes_; }

  struct Entry;
  // The algorithm a tunable call of `bytes` takes, and where it reports its time.
  struct Pick {
    Algorithm algo = Algorithm::kAuto;
    Entry* entry = nullptr;  // set for a trial call: record() its time
    int candidate = -1;
    bool warmup = false;  // the block's first call: waited for, not counted
    int slot = -1;        // else its place among the candidate's timed calls
  };
  // Runs the agreement: the maximum over the ranks of each figure, in place.
  using Agree = std::function<Status(std::vector<int64_t>& nanos)>;
  // Called in call order from the issuing thread. An untuned size (tunes())
  // gets no algorithm: the model's stands. A trial call takes the next
  // candidate; the first call after the trial waits (until `deadline`) for
  // the trial calls to finish, then agrees through `agree`.
  Result<Pick> pick(CollectiveKind kind, size_t bytes, const CostModel& model,
                    std::chrono::steady_clock::time_point deadline, const Agree& agree);
  // A trial call finished (failed or not) after `seconds` on this rank.
  void record(const Pick& trial, double seconds);

  // What a bucket settled on: the candidates, each one's median over its
  // timed calls of the slowest rank's time, and the winner. Empty before the
  // decision.
  struct Outcome {
    std::vector<Algorithm> candidates;
    std::vector<int64_t> nanos;
    Algorithm winner = Algorithm::kAuto;
    size_t bucket_bytes = 0;
    int trials = 0;  // timed calls per candidate
  };
  std::optional<Outcome> outcome(CollectiveKind kind, size_t bytes) const;
  // Only its winner, for a call's selection (no copy of the figures).
  std::optional<Algorithm> winner(CollectiveKind kind, size_t bytes) const;
  // "allreduce up to 64 KiB: tree 310.2 us, dbtree 402.7 us -> tree"
  static std::string describe(CollectiveKind kind, const Outcome& o);
  // The bucket of `bytes`: ceil(log2(bytes)).
  static int bucket(size_t bytes);

  struct Entry {
    std::vector<Algorithm> candidates;
    int trials = 0;                            // timed calls per candidate
    int issued = 0;                            // trial calls handed out
    int recorded = 0;                          // ... and finished
    std::vector<std::vector<double>> seconds;  // per candidate, per timed call
    std::optional<Outcome> outcome;
  };

 private:
  static uint32_t key(CollectiveKind kind, size_t bytes);
  const Entry* find(CollectiveKind kind, size_t bytes) const;  // under mu_
  Entry& entry(CollectiveKind kind, size_t bytes, const CostModel& model);

  const int trials_;
  const size_t min_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint32_t, std::unique_ptr<Entry>> entries_;
};

}  // namespace rdmaflow
