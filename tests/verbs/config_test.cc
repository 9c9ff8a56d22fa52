#include <gtest/gtest.h>

#include <cstdlib>

#include "transport/verbs/config.h"

namespace rdmaflow::verbs {
namespace {

class VerbsConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* v :
         {"RDMAFLOW_IB_DEVICE", "RDMAFLOW_IB_PORT", "RDMAFLOW_IB_GID_INDEX", "RDMAFLOW_IB_SQ_DEPTH",
          "RDMAFLOW_IB_RECV_CREDITS", "RDMAFLOW_IB_MSG_SIZE", "RDMAFLOW_IB_MAX_PEERS",
          "RDMAFLOW_IB_GRANT_PROTECTION"}) {
      unsetenv(v);
    }
  }
};

TEST_F(VerbsConfigTest, DefaultsAreAuto) {
  auto c = VerbsConfig::from_env();
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_FALSE(c->device.has_value());
  EXPECT_FALSE(c->port.has_value());
  EXPECT_FALSE(c->gid_index.has_value());
  EXPECT_EQ(c->sq_depth, 128u);
  EXPECT_EQ(c->recv_credits, 64u);
  EXPECT_EQ(c->msg_size, 8192u);
  EXPECT_EQ(c->max_peers, 64u);
}

TEST_F(VerbsConfigTest, GrantProtectionIsAutoWindowOrSlab) {
  EXPECT_EQ(VerbsConfig::from_env()->grant_protection, VerbsConfig::GrantProtection::kAuto);
  setenv("RDMAFLOW_IB_GRANT_PROTECTION", "window", 1);
  EXPECT_EQ(VerbsConfig::from_env()->grant_protection, VerbsConfig::GrantProtection::kWindow);
  setenv("RDMAFLOW_IB_GRANT_PROTECTION", "slab", 1);
  EXPECT_EQ(VerbsConfig::from_env()->grant_protection, VerbsConfig::GrantProtection::kSlab);
  setenv("RDMAFLOW_IB_GRANT_PROTECTION", "mr", 1);
  auto bad = VerbsConfig::from_env();
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().reason().find("RDMAFLOW_IB_GRANT_PROTECTION"), std::string::npos);
}

TEST_F(VerbsConfigTest, ReadsEveryKnob) {
  setenv("RDMAFLOW_IB_DEVICE", "rxe0", 1);
  setenv("RDMAFLOW_IB_PORT", "2", 1);
  setenv("RDMAFLOW_IB_GID_INDEX", "0", 1);
  setenv("RDMAFLOW_IB_SQ_DEPTH", "512", 1);
  setenv("RDMAFLOW_IB_RECV_CREDITS", "16", 1);
  setenv("RDMAFLOW_IB_MSG_SIZE", "4096", 1);
  setenv("RDMAFLOW_IB_MAX_PEERS", "8", 1);
  auto c = VerbsConfig::from_env();
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->device, std::optional<std::string>("rxe0"));
  EXPECT_EQ(c->port, std::optional<uint32_t>(2));
  EXPECT_EQ(c->gid_index, std::optional<uint32_t>(0));
  EXPECT_EQ(c->sq_depth, 512u);
  EXPECT_EQ(c->recv_credits, 16u);
  EXPECT_EQ(c->msg_size, 4096u);
  EXPECT_EQ(c->max_peers, 8u);
}

TEST_F(VerbsConfigTest, MalformedOrOutOfRangeNamesTheVariable) {
  struct Case {
    const char* var;
    const char* value;
    const char* why;
  };
  for (const Case& c : {Case{"RDMAFLOW_IB_PORT", "one", "is not an integer"},
                        Case{"RDMAFLOW_IB_PORT", "0", "outside [1, 255]"},
                        Case{"RDMAFLOW_IB_GID_INDEX", "-1", "outside"},
                        Case{"RDMAFLOW_IB_GID_INDEX", "3x", "is not an integer"},
                        Case{"RDMAFLOW_IB_SQ_DEPTH", "1", "outside"},
                        Case{"RDMAFLOW_IB_RECV_CREDITS", "3", "outside [4, 4096]"},
                        Case{"RDMAFLOW_IB_MSG_SIZE", "100", "outside"},
                        Case{"RDMAFLOW_IB_MAX_PEERS", "0", "outside"}}) {
    clear();
    setenv(c.var, c.value, 1);
    auto r = VerbsConfig::from_env();
    ASSERT_FALSE(r.is_ok()) << c.var << "=" << c.value;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().reason().find(c.var), std::string::npos) << r.status().reason();
    EXPECT_NE(r.status().reason().find(c.why), std::string::npos) << r.status().reason();
  }
}

}  // namespace
}  // namespace rdmaflow::verbs
