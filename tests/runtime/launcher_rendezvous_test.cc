// Finding the rendezvous through the launcher: Slurm's node lists, the Slurm
// path end to end on this host (a real store server on the port Slurm would
// reserve), and the errors that name what is wrong. The PMIx path runs under
// real launchers in tests/cluster.
#include "runtime/rendezvous/launcher_rendezvous.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "tools/free_port.h"

namespace rdmaflow {
namespace {

using Env = std::map<std::string, std::string>;
using namespace std::chrono_literals;

EnvLookup lookup(const Env& env) {
  return [env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

RankInfo slurm_rank(int rank, int world) {
  RankInfo info;
  info.rank = rank;
  info.world_size = world;
  info.single_host = false;
  info.source = "Slurm (SLURM_PROCID/SLURM_NTASKS)";
  return info;
}

TEST(LauncherRendezvous, FirstSlurmHost) {
  EXPECT_EQ(*first_slurm_host("h0"), "h0");
  EXPECT_EQ(*first_slurm_host("h[0-3]"), "h0");
  EXPECT_EQ(*first_slurm_host("node[07-09,12],gpu[1-2]"), "node07");
  EXPECT_EQ(*first_slurm_host("a,b"), "a");
  EXPECT_EQ(*first_slurm_host("rack[2-3]-n[5,9]"), "rack2-n5");
  for (const char* bad : {"h[0-1", "h]0[", "[]", ""}) {
    auto r = first_slurm_host(bad);
    ASSERT_FALSE(r.is_ok()) << bad << " gave " << *r;
    EXPECT_NE(r.status().to_string().find("SLURM_STEP_NODELIST"), std::string::npos);
  }
}

TEST(LauncherRendezvous, NoLauncherSaysWhatItLookedFor) {
  std::string why;
  auto r = find_launcher_rendezvous(slurm_rank(1, 2), lookup({}), nullptr, 1000ms, &why);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_FALSE(r->has_value());
  EXPECT_NE(why.find("SLURM_STEP_NODELIST"), std::string::npos) << why;
}

// Rank 0 serves on the first node at the first reserved port; rank 1 is told
// the same address without starting anything.
TEST(LauncherRendezvous, SlurmFirstNodeAndReservedPort) {
  const int port = dev::free_port();
  ASSERT_GT(port, 0);
  const Env env = {{"SLURM_STEP_NODELIST", "localhost,h[1-3]"},
                   {"SLURM_STEP_RESV_PORTS", std::to_string(port) + "-" + std::to_string(port + 1)},
                   {"SLURM_PROCID", "0"}};
  std::unique_ptr<TcpStoreServer> server;
  int started = 0;
  StartStore start = [&](const HostPort& at) -> Result<HostPort> {
    ++started;
    RDMAFLOW_ASSIGN_OR_RETURN(server, TcpStoreServer::start(at, 1));
    return server->address();
  };
  auto r0 = find_launcher_rendezvous(slurm_rank(0, 4), lookup(env), start, 1000ms);
  ASSERT_TRUE(r0.is_ok()) << r0.status().to_string();
  ASSERT_TRUE(r0->has_value());
  EXPECT_EQ(started, 1);
  EXPECT_EQ((*r0)->address.port, port);
  auto toward = local_address_toward((*r0)->address.host);
  ASSERT_TRUE(toward.is_ok()) << toward.status().to_string();
  EXPECT_EQ(*toward, "127.0.0.1");
  EXPECT_NE((*r0)->source.find("'localhost'"), std::string::npos) << (*r0)->source;

  Env other = env;
  other["SLURM_PROCID"] = "1";
  auto r1 = find_launcher_rendezvous(slurm_rank(1, 4), lookup(other), start, 1000ms);
  ASSERT_TRUE(r1.is_ok()) << r1.status().to_string();
  EXPECT_EQ(started, 1);
  EXPECT_EQ((*r1)->address.to_string(), (*r0)->address.to_string());
  server->stop();
}

TEST(LauncherRendezvous, SlurmPortFromJobAndStepWithoutReservation) {
  const Env env = {{"SLURM_STEP_NODELIST", "localhost"},
                   {"SLURM_PROCID", "3"},
                   {"SLURM_JOB_ID", "1234"},
                   {"SLURM_STEP_ID", "2"}};
  auto r = find_launcher_rendezvous(slurm_rank(3, 4), lookup(env), nullptr, 1000ms);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)->address.port, 20000 + (1234 * 16 + 2) % 12000);
}

TEST(LauncherRendezvous, SlurmErrorsNameTheCause) {
  // The rank does not come from Slurm's numbering.
  Env env = {{"SLURM_STEP_NODELIST", "localhost"}, {"SLURM_PROCID", "2"}};
  auto r = find_launcher_rendezvous(slurm_rank(1, 4), lookup(env), nullptr, 1000ms);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("SLURM_PROCID=2"), std::string::npos);
  // The first node does not resolve.
  env = {{"SLURM_STEP_NODELIST", "no-such-node.invalid"}, {"SLURM_PROCID", "1"}};
  r = find_launcher_rendezvous(slurm_rank(1, 4), lookup(env), nullptr, 1000ms);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("no-such-node.invalid"), std::string::npos)
      << r.status().to_string();
  // Rank 0 cannot serve there: the error says which node it had to be on.
  env = {{"SLURM_STEP_NODELIST", "localhost"}, {"SLURM_PROCID", "0"}};
  StartStore refuse = [](const HostPort&) -> Result<HostPort> {
    return RDMAFLOW_ERROR(Code::kConnectionFailed, "serve", 0, "address in use");
  };
  r = find_launcher_rendezvous(slurm_rank(0, 4), lookup(env), refuse, 1000ms);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("first node of SLURM_STEP_NODELIST"), std::string::npos)
      << r.status().to_string();
}

TEST(LauncherRendezvous, HostAddressFollowsSocketIfname) {
  auto a = host_address(lookup({{"RDMAFLOW_SOCKET_IFNAME", "lo"}}));
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(*a, "127.0.0.1");
  auto bad = host_address(lookup({{"RDMAFLOW_SOCKET_IFNAME", "no-such-if0"}}));
  EXPECT_FALSE(bad.is_ok());
}

}  // namespace
}  // namespace rdmaflow
