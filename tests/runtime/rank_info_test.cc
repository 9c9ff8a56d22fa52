// Rank detection from each launcher's variables, and every malformed case.
#include "runtime/rendezvous/rank_info.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

namespace rdmaflow {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

RankInfo detect_ok(const Env& env) {
  auto r = detect_rank_info(lookup(env));
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : RankInfo{};
}

// Detection fails, and the message names `variable`.
void expect_error_naming(const Env& env, const std::string& variable) {
  auto r = detect_rank_info(lookup(env));
  ASSERT_FALSE(r.is_ok()) << "detected " << r->to_string();
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().to_string().find(variable), std::string::npos)
      << r.status().to_string() << " does not name " << variable;
}

TEST(RankInfo, NothingSetIsOneProcess) {
  RankInfo info = detect_ok({});
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_size, 1);
  EXPECT_EQ(info.single_host, true);
  EXPECT_NE(info.source.find("single process"), std::string::npos) << info.source;
}

TEST(RankInfo, RdmaflowVariables) {
  RankInfo info = detect_ok({{"RDMAFLOW_RANK", "2"}, {"RDMAFLOW_WORLD_SIZE", "4"}});
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 2);  // assumed equal to the rank when not given
  EXPECT_EQ(info.local_size, 0);
  EXPECT_FALSE(info.single_host.has_value());
  EXPECT_NE(info.source.find("RDMAFLOW_RANK"), std::string::npos) << info.source;

  info = detect_ok({{"RDMAFLOW_RANK", "3"},
                    {"RDMAFLOW_WORLD_SIZE", "4"},
                    {"RDMAFLOW_LOCAL_RANK", "1"},
                    {"RDMAFLOW_LOCAL_SIZE", "2"}});
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 2);
  EXPECT_EQ(info.single_host, false);

  info = detect_ok(
      {{"RDMAFLOW_RANK", "1"}, {"RDMAFLOW_WORLD_SIZE", "2"}, {"RDMAFLOW_LOCAL_SIZE", "2"}});
  EXPECT_EQ(info.single_host, true);
  EXPECT_EQ(info.local_rank, 1);
}

TEST(RankInfo, OpenMpiVariables) {
  RankInfo info = detect_ok({{"OMPI_COMM_WORLD_RANK", "5"},
                             {"OMPI_COMM_WORLD_SIZE", "8"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_EQ(info.single_host, false);
  EXPECT_NE(info.source.find("Open MPI"), std::string::npos) << info.source;
  EXPECT_NE(info.source.find("OMPI_COMM_WORLD_RANK"), std::string::npos) << info.source;

  info = detect_ok({{"OMPI_COMM_WORLD_RANK", "3"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(info.single_host, true);
}

TEST(RankInfo, PmiVariables) {
  RankInfo info = detect_ok(
      {{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "3"}});
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 3);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.single_host, true);
  EXPECT_NE(info.source.find("PMI"), std::string::npos) << info.source;

  info = detect_ok({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}});
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_FALSE(info.single_host.has_value());
}

TEST(RankInfo, SlurmVariables) {
  RankInfo info = detect_ok({{"SLURM_PROCID", "6"},
                             {"SLURM_NTASKS", "8"},
                             {"SLURM_LOCALID", "2"},
                             {"SLURM_STEP_NUM_NODES", "2"}});
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.single_host, false);
  EXPECT_NE(info.source.find("Slurm"), std::string::npos) << info.source;

  info = detect_ok({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_NNODES", "1"}});
  EXPECT_EQ(info.single_host, true);
  EXPECT_EQ(info.local_size, 2);

  // Older Slurm: SLURM_NPROCS instead of SLURM_NTASKS.
  info = detect_ok({{"SLURM_PROCID", "1"}, {"SLURM_NPROCS", "2"}});
  EXPECT_EQ(info.world_size, 2);
  EXPECT_NE(info.source.find("SLURM_NPROCS"), std::string::npos) << info.source;
}

TEST(RankInfo, SourcesArePreferredInOrder) {
  Env all = {{"RDMAFLOW_RANK", "1"},
             {"RDMAFLOW_WORLD_SIZE", "2"},
             {"OMPI_COMM_WORLD_RANK", "3"},
             {"OMPI_COMM_WORLD_SIZE", "4"},
             {"PMI_RANK", "5"},
             {"PMI_SIZE", "6"},
             {"SLURM_PROCID", "7"},
             {"SLURM_NTASKS", "8"}};
  EXPECT_EQ(detect_ok(all).world_size, 2);
  all.erase("RDMAFLOW_RANK");
  all.erase("RDMAFLOW_WORLD_SIZE");
  EXPECT_EQ(detect_ok(all).world_size, 4);
  all.erase("OMPI_COMM_WORLD_RANK");
  all.erase("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(detect_ok(all).world_size, 6);
  all.erase("PMI_RANK");
  all.erase("PMI_SIZE");
  EXPECT_EQ(detect_ok(all).world_size, 8);
}

TEST(RankInfo, GarbageIsAnErrorNamingTheVariable) {
  expect_error_naming({{"RDMAFLOW_RANK", "one"}, {"RDMAFLOW_WORLD_SIZE", "4"}}, "RDMAFLOW_RANK");
  expect_error_naming({{"RDMAFLOW_RANK", "1"}, {"RDMAFLOW_WORLD_SIZE", "4x"}},
                      "RDMAFLOW_WORLD_SIZE");
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", " 1"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
                      "OMPI_COMM_WORLD_RANK");
  expect_error_naming({{"PMI_RANK", "0"}, {"PMI_SIZE", "2.5"}}, "PMI_SIZE");
  expect_error_naming({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "99999999999"}}, "SLURM_NTASKS");
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "1"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "x"}},
                      "OMPI_COMM_WORLD_LOCAL_RANK");
  expect_error_naming({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NUM_NODES", "-"}},
                      "SLURM_STEP_NUM_NODES");
}

TEST(RankInfo, NegativeValuesAreErrors) {
  expect_error_naming({{"RDMAFLOW_RANK", "-1"}, {"RDMAFLOW_WORLD_SIZE", "4"}}, "RDMAFLOW_RANK");
  expect_error_naming({{"PMI_RANK", "0"}, {"PMI_SIZE", "-2"}}, "PMI_SIZE");
  expect_error_naming({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}, "SLURM_NTASKS");
  expect_error_naming(
      {{"RDMAFLOW_RANK", "0"}, {"RDMAFLOW_WORLD_SIZE", "2"}, {"RDMAFLOW_LOCAL_RANK", "-1"}},
      "RDMAFLOW_LOCAL_RANK");
}

TEST(RankInfo, InconsistentValuesAreErrors) {
  // rank >= world
  expect_error_naming({{"RDMAFLOW_RANK", "4"}, {"RDMAFLOW_WORLD_SIZE", "4"}}, "RDMAFLOW_RANK");
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "9"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
                      "OMPI_COMM_WORLD_SIZE");
  // Only half of a pair.
  expect_error_naming({{"RDMAFLOW_RANK", "1"}}, "RDMAFLOW_WORLD_SIZE");
  expect_error_naming({{"PMI_SIZE", "4"}}, "PMI_RANK");
  expect_error_naming({{"SLURM_PROCID", "1"}}, "SLURM_NTASKS");
  // A half-set stronger source is not silently skipped for a weaker one.
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "1"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}},
                      "OMPI_COMM_WORLD_SIZE");
  // Local rank / size that do not fit.
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "3"},
                       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
                      "OMPI_COMM_WORLD_LOCAL_RANK");
  expect_error_naming({{"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "2"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}},
                      "OMPI_COMM_WORLD_LOCAL_SIZE");
  expect_error_naming({{"PMI_RANK", "1"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "2"}},
                      "MPI_LOCALRANKID");
  expect_error_naming({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NUM_NODES", "3"}},
                      "SLURM_STEP_NUM_NODES");
  // Local rank not given and the global rank cannot be a local one.
  expect_error_naming(
      {{"RDMAFLOW_RANK", "3"}, {"RDMAFLOW_WORLD_SIZE", "4"}, {"RDMAFLOW_LOCAL_SIZE", "2"}},
      "RDMAFLOW_LOCAL_RANK");
}

// The real process environment, not an injected one.
TEST(RankInfo, ReadsTheProcessEnvironment) {
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  auto r = detect_rank_info();
  ::setenv("OMPI_COMM_WORLD_RANK", "", 1);  // empty counts as unset
  auto empty = detect_rank_info();
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    ::unsetenv(v);
  }
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->world_size, 2);
  EXPECT_EQ(r->single_host, true);
  ASSERT_FALSE(empty.is_ok());
  EXPECT_NE(empty.status().reason().find("OMPI_COMM_WORLD_RANK"), std::string::npos);
}

}  // namespace
}  // namespace rdmaflow
