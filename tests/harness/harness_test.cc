#include <signal.h>
#include <unistd.h>

#include "tests/harness/process_harness.h"

namespace rdmaflow::testing {
namespace {

TEST(Harness, AllgatherRelaysEveryRanksString) {
  auto r = run_ranks(4, [](int rank, int world, Exchange& ex) {
    for (int round = 0; round < 3; ++round) {
      std::string mine = "rank" + std::to_string(rank) + "/" + std::to_string(round);
      RF_ASSIGN_OR_FAIL(auto all, ex.allgather(mine));
      RF_ASSERT(static_cast<int>(all.size()) == world);
      for (int i = 0; i < world; ++i) {
        EXPECT_EQ(all[i], "rank" + std::to_string(i) + "/" + std::to_string(round));
      }
    }
    // Binary bytes survive the relay.
    std::string bin(300, '\0');
    for (size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<char>(i * 7 + rank);
    RF_ASSIGN_OR_FAIL(auto all, ex.allgather(bin));
    EXPECT_EQ(all[static_cast<size_t>(rank)], bin);
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST(Harness, ReportsNonZeroExit) {
  auto r = run_ranks(2, [](int rank, int, Exchange&) { return rank == 1 ? 3 : 0; });
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("rank 1 exited with code 3"), std::string::npos) << r.message;
}

TEST(Harness, ReportsGtestFailureInsideARank) {
  auto r = run_ranks(2, [](int rank, int, Exchange&) {
    if (rank == 0) ADD_FAILURE() << "deliberate failure inside rank 0 (expected by this test)";
    return 0;
  });
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("rank 0 exited with code 1"), std::string::npos) << r.message;
}

TEST(Harness, ReportsSignals) {
  auto r = run_ranks(2, [](int rank, int, Exchange&) {
    if (rank == 1) ::raise(SIGTERM);  // not intercepted by sanitizers
    return 0;
  });
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("rank 1 killed by signal 15"), std::string::npos) << r.message;
}

TEST(Harness, KillsRanksThatOutliveTheTimeout) {
  RunOptions o;
  o.timeout = Millis(300);
  auto start = std::chrono::steady_clock::now();
  auto r = run_ranks(
      2,
      [](int rank, int, Exchange&) {
        if (rank == 0) ::pause();
        return 0;
      },
      o);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("timed out after 300 ms"), std::string::npos) << r.message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(Harness, KillHelperTerminatesARankAndAllgatherSkipsIt) {
  RunOptions o;
  o.may_be_killed = {2};
  auto r = run_ranks(
      3,
      [](int rank, int, Exchange& ex) {
        if (rank == 2) {
          ::pause();  // killed by rank 0
          return 1;
        }
        if (rank == 0) RF_ASSERT_OK(ex.kill(2));
        RF_ASSIGN_OR_FAIL(auto all, ex.allgather("x"));
        EXPECT_EQ(all[0], "x");
        EXPECT_EQ(all[1], "x");
        EXPECT_EQ(all[2], "");
        return 0;
      },
      o);
  RF_EXPECT_RUN_OK(r);
  EXPECT_EQ(r.exit_codes[2], -SIGKILL);
}

TEST(Harness, KillOfAnUnlistedRankIsRefused) {
  auto r = run_ranks(2, [](int rank, int, Exchange& ex) {
    if (rank == 0) {
      Status st = ex.kill(1);
      EXPECT_FALSE(st.is_ok());
      EXPECT_NE(st.to_string().find("may_be_killed"), std::string::npos) << st.to_string();
    }
    return 0;
  });
  RF_EXPECT_RUN_OK(r);
}

TEST(Harness, SkipIsReported) {
  auto r = run_ranks(2, [](int rank, int, Exchange& ex) -> int {
    if (rank == 0) ex.skip("backend not viable here");
    return 0;
  });
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.message, "backend not viable here");
}

}  // namespace
}  // namespace rdmaflow::testing
