#include "collectives/tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/env.h"
#include "common/log.h"

namespace rdmaflow {

Result<int> Tuner::trials_from_env() {
  const std::optional<std::string> raw = env_string("RDMAFLOW_COLL_TUNE");
  if (!raw || *raw == "auto") return kByTime;
  RDMAFLOW_ASSIGN_OR_RETURN(int64_t v, env_int("RDMAFLOW_COLL_TUNE", 0));
  if (v < 0 || v > kMaxTrials) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "create communicator", -1,
                          "RDMAFLOW_COLL_TUNE must be auto, 0 (off) or up to " +
                              std::to_string(kMaxTrials) + " (trial calls per candidate)");
  }
  return static_cast<int>(v);
}

int Tuner::trials_for(double seconds) const {
  if (trials_ > 0) return trials_;
  const double fit = seconds > 0 ? std::ceil(kBudgetSeconds / seconds) : kMaxTrials;
  return static_cast<int>(std::clamp<double>(fit, kMinTrials, kMaxTrials));
}

Result<size_t> Tuner::min_bytes_from_env() {
  RDMAFLOW_ASSIGN_OR_RETURN(
      int64_t v, env_int("RDMAFLOW_COLL_TUNE_MIN_BYTES", static_cast<int64_t>(kDefaultMinBytes)));
  if (v < 0 || v > (int64_t{1} << 40)) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "create communicator", -1,
                          "RDMAFLOW_COLL_TUNE_MIN_BYTES must be between 0 and 2^40 (bytes)");
  }
  return static_cast<size_t>(v);
}

int Tuner::bucket(size_t bytes) {
  int b = 0;
  while (b < 63 && (size_t{1} << b) < bytes) ++b;
  return b;
}

uint32_t Tuner::key(CollectiveKind kind, size_t bytes) {
  return (static_cast<uint32_t>(kind) << 8) | static_cast<uint32_t>(bucket(bytes));
}

Tuner::Entry& Tuner::entry(CollectiveKind kind, size_t bytes, const CostModel& model) {
  auto& slot = entries_[key(kind, bytes)];
  if (slot) return *slot;
  slot = std::make_unique<Entry>();
  // The candidates of the bucket's first call, kept for the whole bucket: every
  // rank has the same model (measure() agrees on it) and the same first call.
  const std::vector<CostModel::Ranked> ranked = model.ranked(kind, bytes);
  for (const CostModel::Ranked& r : ranked) {
    if (slot->candidates.size() == kMaxCandidates) break;
    if (!slot->candidates.empty() && r.seconds > kFactor * ranked.front().seconds) break;
    slot->candidates.push_back(r.algo);
  }
  slot->trials = ranked.empty() ? kMinTrials : trials_for(ranked.front().seconds);
  slot->seconds.assign(slot->candidates.size(),
                       std::vector<double>(static_cast<size_t>(slot->trials)));
  if (slot->candidates.size() <= 1) {
    // Nothing close: the model's choice, untimed.
    Outcome o;
    o.candidates = slot->candidates;
    o.nanos.assign(o.candidates.size(), 0);
    o.winner = o.candidates.empty() ? Algorithm::kAuto : o.candidates.front();
    o.bucket_bytes = size_t{1} << bucket(bytes);
    slot->outcome = o;
  }
  return *slot;
}

Result<Tuner::Pick> Tuner::pick(CollectiveKind kind, size_t bytes, const CostModel& model,
                                std::chrono::steady_clock::time_point deadline,
                                const Agree& agree) {
  if (!tunes(bytes)) return Pick{};
  std::unique_lock<std::mutex> lock(mu_);
  Entry& e = entry(kind, bytes, model);
  if (e.outcome) return Pick{e.outcome->winner};
  const int n = static_cast<int>(e.candidates.size());
  // A block of the first candidate, not counted, then a block per candidate.
  // Without it the first block alone ran slow after a size change (the
  // calls before may leave the connections idle or in another state; not
  // established): on 4 x 1 at 1 and 2 MiB right after 256 KiB, Rabenseifner's
  // first 5 calls took a median of 4.5-12.3 ms against 2.1 ms forced; with 8
  // the median was 2.3 ms (docs/benchmarks.md, "Selector: the tuner from 64 KiB").
  const int block = e.trials + 1;
  if (e.issued < block * (n + 1)) {
    const int i = e.issued++;
    if (i < block) return Pick{e.candidates.front(), &e, 0, /*warmup=*/true, -1};
    const int c = (i - block) / block, place = (i - block) % block;
    return Pick{e.candidates[static_cast<size_t>(c)], &e, c, place == 0, place - 1};
  }
  // The decision: every trial call of the bucket done here (some may still
  // run on the lanes' workers), then the same figures on every rank.
  if (!cv_.wait_until(lock, deadline, [&] { return e.recorded == e.issued; })) {
    return RDMAFLOW_ERROR(Code::kTimeout, std::string(collective_name(kind)), -1,
                          "tuner: the trial calls of the bucket did not finish (" +
                              std::to_string(e.recorded) + " of " + std::to_string(e.issued) + ")");
  }
  // Each timed call's slowest rank, as a loop waits for it (and as the
  // benchmark times a call): summing each rank's own median instead ranked
  // recursive doubling ahead of the tree on 4 x 1 at 8 B-64 KiB, whose pairs
  // wait for each other in turn, while its slowest rank took 1.8-2.1x the
  // tree's (docs/benchmarks.md, "Selector: timing the near-tied candidates").
  const size_t trials = static_cast<size_t>(e.trials);
  std::vector<int64_t> calls(static_cast<size_t>(n) * trials);
  for (size_t c = 0; c < static_cast<size_t>(n); ++c) {
    for (size_t t = 0; t < trials; ++t) calls[c * trials + t] = std::llround(e.seconds[c][t] * 1e9);
  }
  lock.unlock();
  RDMAFLOW_RETURN_IF_ERROR(agree(calls));
  lock.lock();
  // Then each candidate's median of them: one call a neighbour's burst
  // slowed moves no median.
  std::vector<int64_t> nanos(static_cast<size_t>(n));
  for (size_t c = 0; c < static_cast<size_t>(n); ++c) {
    std::vector<int64_t> s(calls.begin() + static_cast<std::ptrdiff_t>(c * trials),
                           calls.begin() + static_cast<std::ptrdiff_t>((c + 1) * trials));
    std::sort(s.begin(), s.end());
    nanos[c] = s[(s.size() - 1) / 2];
  }
  Outcome o;
  o.candidates = e.candidates;
  o.nanos = nanos;
  o.bucket_bytes = size_t{1} << bucket(bytes);
  o.trials = e.trials;
  // The least median; a tie goes to the model's order.
  const size_t best =
      static_cast<size_t>(std::min_element(nanos.begin(), nanos.end()) - nanos.begin());
  o.winner = e.candidates[best];
  e.outcome = o;
  RDMAFLOW_LOG_INFO("collectives: tuner: {}", describe(kind, o));
  return Pick{o.winner};
}

void Tuner::record(const Pick& trial, double seconds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!trial.warmup) {
      trial.entry->seconds[static_cast<size_t>(trial.candidate)][static_cast<size_t>(trial.slot)] =
          seconds;
    }
    ++trial.entry->recorded;
  }
  cv_.notify_all();
}

const Tuner::Entry* Tuner::find(CollectiveKind kind, size_t bytes) const {
  auto it = entries_.find(key(kind, bytes));
  return it == entries_.end() ? nullptr : it->second.get();
}

std::optional<Tuner::Outcome> Tuner::outcome(CollectiveKind kind, size_t bytes) const {
  if (!tunes(bytes)) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = find(kind, bytes);
  return e == nullptr ? std::nullopt : e->outcome;
}

std::optional<Algorithm> Tuner::winner(CollectiveKind kind, size_t bytes) const {
  if (!tunes(bytes)) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = find(kind, bytes);
  if (e == nullptr || !e->outcome) return std::nullopt;
  return e->outcome->winner;
}

std::string Tuner::describe(CollectiveKind kind, const Outcome& o) {
  std::string s =
      std::string(collective_name(kind)) + " up to " + std::to_string(o.bucket_bytes) + " B:";
  if (o.candidates.size() <= 1)
    return s + " one candidate, " + std::string(algorithm_name(o.winner));
  for (size_t c = 0; c < o.candidates.size(); ++c) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s %s %.1f us", c == 0 ? "" : ",",
                  std::string(algorithm_name(o.candidates[c])).c_str(),
                  static_cast<double>(o.nanos[c]) * 1e-3);
    s += buf;
  }
  return s + " (median of " + std::to_string(o.trials) + " calls' slowest rank each) -> " +
         std::string(algorithm_name(o.winner));
}

}  // namespace rdmaflow
