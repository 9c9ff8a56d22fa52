// Runs N ranks of a test as real forked processes.
//
//   TEST(Foo, Bar) {
//     auto r = run_ranks(2, [](int rank, int world, Exchange& ex) {
//       auto addrs = ex.allgather(my_address);   // strings relayed by the parent
//       ...                                        // gtest EXPECT_* work in ranks
//       return 0;                                  // non-zero = failure
//     });
//     RF_EXPECT_RUN_OK(r);   // fails with "rank 1 killed by signal 11 (...)" etc.
//   }
//
// The parent forks the ranks (call it before the test process starts any
// thread), relays Exchange traffic over pipes, and reaps the ranks; a rank that
// exits non-zero, dies of a signal or outlives the timeout fails the run.
// Each rank's stdout and stderr reach the test's output line by line, prefixed
// with "[rank N]", and a failing rank's last line is part of the message.
//
// When the parent has its own part to play while the ranks run (a client of a
// server rank, a late server), start_ranks() returns at once and wait() reaps;
// Exchange requests are answered only inside RankGroup's calls.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace rdmaflow::testing {

using Millis = std::chrono::milliseconds;

class Exchange {
 public:
  int rank() const { return rank_; }
  int world() const { return world_; }

  // Every running rank contributes `mine`; returns the contributions by rank.
  // Ranks that already exited (or were killed) contribute "".
  Result<std::vector<std::string>> allgather(const std::string& mine,
                                             Millis timeout = Millis(30000));
  Status barrier(Millis timeout = Millis(30000));

  // Asks the parent to SIGKILL `rank` (which must be listed in
  // RunOptions::may_be_killed) and returns once it is dead.
  Status kill(int rank, Millis timeout = Millis(10000));

  // Sends `sig` to `rank` through the parent (SIGSTOP returns once the rank is
  // stopped; SIGKILL behaves like kill()).
  Status signal(int rank, int sig, Millis timeout = Millis(10000));

  // Hands `value` to the test body (RankGroup::published, RunResult::published).
  Status publish(const std::string& value);

  // Returns when the test body calls RankGroup::release() for this rank, or
  // when the parent is gone.
  void wait_released();

  // Ends this rank as skipped (e.g. the backend is not viable here).
  [[noreturn]] void skip(const std::string& reason);

  // Internal: set up by start_ranks in each child.
  Exchange(int rank, int world, int to_parent, int from_parent)
      : rank_(rank), world_(world), to_parent_(to_parent), from_parent_(from_parent) {}

 private:
  Status request(uint32_t type, const std::string& payload, Millis timeout, uint32_t& reply_type,
                 std::string& reply, const char* what);

  int rank_;
  int world_;
  int to_parent_;
  int from_parent_;
};

struct RunOptions {
  Millis timeout{60000};        // the whole run; ranks still alive then are killed
  std::set<int> may_be_killed;  // ranks Exchange::kill may terminate
};

struct RunResult {
  bool ok = false;
  bool skipped = false;
  std::string message;                 // what failed, or why the run was skipped
  std::vector<int> exit_codes;         // per rank: exit code, or -signal
  std::vector<std::string> published;  // per rank: the last Exchange::publish value
};

using RankMain = std::function<int(int rank, int world, Exchange& ex)>;

// Ranks started by start_ranks(). Destroying a group that was not waited for
// kills its ranks.
class RankGroup {
 public:
  struct State;
  explicit RankGroup(std::unique_ptr<State> state);
  RankGroup(RankGroup&&) noexcept;
  ~RankGroup();

  // Waits (relaying Exchange traffic) until `rank` publishes a value it has
  // not returned before; nullopt if the rank exits first or time runs out.
  std::optional<std::string> published(int rank, Millis timeout = Millis(30000));
  // Lets `rank` return from Exchange::wait_released().
  void release(int rank);
  // Relays Exchange traffic until every rank has exited (or RunOptions::timeout).
  RunResult wait();

 private:
  std::unique_ptr<State> state_;
};

RankGroup start_ranks(int world, const RankMain& main, const RunOptions& options = {});
RunResult run_ranks(int world, const RankMain& main, const RunOptions& options = {});

// The status carried by a Status or a Result<T>.
inline const Status& status_of(const Status& s) {
  return s;
}
template <typename T>
const Status& status_of(const Result<T>& r) {
  return r.status();
}

}  // namespace rdmaflow::testing

// In a rank's function (which returns int): on error, record a gtest failure and return 1.
#define RF_ASSERT_OK(expr)                                                                       \
  do {                                                                                           \
    const auto& _rf_v = (expr);                                                                  \
    const ::rdmaflow::Status& _rf_s = ::rdmaflow::testing::status_of(_rf_v);                     \
    if (!_rf_s.is_ok()) {                                                                        \
      ADD_FAILURE() << "rank " << ::rdmaflow::testing::current_rank() << ": " << #expr << " -> " \
                    << _rf_s.to_string();                                                        \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

#define RF_ASSERT(cond)                                               \
  do {                                                                \
    if (!(cond)) {                                                    \
      ADD_FAILURE() << "rank " << ::rdmaflow::testing::current_rank() \
                    << ": check failed: " << #cond;                   \
      return 1;                                                       \
    }                                                                 \
  } while (0)

#define RF_ASSIGN_OR_FAIL(lhs, expr) \
  RF_ASSIGN_OR_FAIL_IMPL(RDMAFLOW_CONCAT(_rf_r_, __LINE__), lhs, expr)
#define RF_ASSIGN_OR_FAIL_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  RF_ASSERT_OK(tmp);                           \
  lhs = std::move(tmp).value()

// In the test body: fail (or skip) according to a RunResult.
#define RF_EXPECT_RUN_OK(result)                             \
  do {                                                       \
    const ::rdmaflow::testing::RunResult& _rf_rr = (result); \
    if (_rf_rr.skipped) GTEST_SKIP() << _rf_rr.message;      \
    EXPECT_TRUE(_rf_rr.ok) << _rf_rr.message;                \
  } while (0)

namespace rdmaflow::testing {
int current_rank();  // the rank of this process, -1 in the parent
}  // namespace rdmaflow::testing
