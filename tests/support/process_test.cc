#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>

#include "tests/support/process.h"

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

TEST(Harness, FailureNamesTheRanksLastLine) {
  auto r = run_ranks(2, [](int rank, int, Exchange&) {
    if (rank == 1) {
      std::printf("about to fail\n");
      std::fprintf(stderr, "the reason, on stderr");
      return 2;
    }
    return 0;
  });
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("rank 1 exited with code 2 (its last line: the reason, on stderr)"),
            std::string::npos)
      << r.message;
}

TEST(Harness, ReportsAThrowingRank) {
  auto r = run_ranks(1, [](int, int, Exchange&) -> int { throw std::runtime_error("boom"); });
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("rank 0 exited with code 98 (its last line: rank 0 threw: boom)"),
            std::string::npos)
      << r.message;
}

TEST(Harness, StartedRanksPublishAndWaitToBeReleased) {
  RankGroup group = start_ranks(2, [](int rank, int, Exchange& ex) {
    RF_ASSERT_OK(ex.publish("ready " + std::to_string(rank)));
    ex.wait_released();
    RF_ASSERT_OK(ex.publish("done " + std::to_string(rank)));
    return 0;
  });
  // The test body does its part while the ranks run.
  EXPECT_EQ(group.published(1).value_or("nothing"), "ready 1");
  EXPECT_EQ(group.published(0).value_or("nothing"), "ready 0");
  EXPECT_FALSE(group.published(0, Millis(50)).has_value());  // still waiting to be released
  group.release(0);
  group.release(1);
  RunResult r = group.wait();
  RF_EXPECT_RUN_OK(r);
  EXPECT_EQ(r.published, (std::vector<std::string>{"done 0", "done 1"}));
}

TEST(Harness, ADroppedGroupKillsItsRanks) {
  pid_t pid = -1;
  {
    RankGroup group = start_ranks(1, [](int, int, Exchange& ex) {
      RF_ASSERT_OK(ex.publish(std::to_string(::getpid())));
      ::pause();
      return 0;
    });
    pid = std::stoi(group.published(0).value_or("-1"));
  }
  ASSERT_GT(pid, 0);
  EXPECT_NE(::kill(pid, 0), 0);  // reaped: no such process
}

}  // namespace
}  // namespace rdmaflow::testing
