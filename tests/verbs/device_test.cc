// The verbs backend on this machine's devices, without forking: viability and
// the reason given when there is no RDMA device.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "transport/transport.h"
#include "transport/verbs/device.h"

namespace rdmaflow {
namespace {

// What ibv_get_device_list says, independently of the backend.
struct DeviceProbe {
  bool list_failed = false;
  int err = 0;
  int count = 0;
};
DeviceProbe probe() {
  DeviceProbe p;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&p.count);
  p.err = errno;
  p.list_failed = list == nullptr;
  if (list != nullptr) ibv_free_device_list(list);
  if (p.list_failed) p.count = 0;
  return p;
}

TEST(VerbsViability, ReasonTextForNoDevice) {
  EXPECT_EQ(verbs::no_device_reason(false, 0, 0),
            "no RDMA device found (ibv_get_device_list returned 0 devices); load rdma_rxe and "
            "add a link: see docs/soft-roce.md");
  EXPECT_EQ(verbs::no_device_reason(true, ENOSYS, 0),
            "no RDMA device found (ibv_get_device_list failed: " + std::string(strerror(ENOSYS)) +
                "; the kernel has no RDMA support loaded); load rdma_rxe and add a link: see "
                "docs/soft-roce.md");
  EXPECT_EQ(verbs::no_device_reason(true, EACCES, 0),
            "no RDMA device found (ibv_get_device_list failed: " + std::string(strerror(EACCES)) +
                "); load rdma_rxe and add a link: see docs/soft-roce.md");
}

TEST(VerbsViability, RegisteredAheadOfTcp) {
  auto names = transport_backend_names();
  auto verbs = std::find(names.begin(), names.end(), "verbs");
  auto tcp = std::find(names.begin(), names.end(), "tcp");
  ASSERT_NE(verbs, names.end()) << "the verbs backend is not registered";
  if (tcp != names.end()) {
    EXPECT_LT(verbs - names.begin(), tcp - names.begin());
  }
}

TEST(VerbsViability, NoDeviceMeansNotViableWithTheReason) {
  DeviceProbe p = probe();
  if (p.count > 0) {
    GTEST_SKIP() << "this machine has " << p.count
                 << " RDMA device(s); the no-device path cannot be checked here";
  }
  TransportConfig config;
  config.rank = 0;
  auto t = make_transport("verbs", config);
  ASSERT_FALSE(t.is_ok()) << "a verbs transport was created without any RDMA device";
  EXPECT_EQ(t.status().code(), Code::kNotViable) << t.status().to_string();
  std::string why = p.list_failed
                        ? "ibv_get_device_list failed: " + std::string(strerror(p.err)) +
                              (p.err == ENOSYS ? "; the kernel has no RDMA support loaded" : "")
                        : "ibv_get_device_list returned 0 devices";
  EXPECT_EQ(t.status().reason(), "no RDMA device found (" + why +
                                     "); load rdma_rxe and add a link: see docs/soft-roce.md");
  EXPECT_EQ(t.status().op(), "create verbs transport");
  std::cout << "[ INFO     ] verbs not viable here: " << t.status().to_string() << "\n";
}

TEST(VerbsViability, MalformedKnobIsReportedEvenWithoutDevice) {
  setenv("RDMAFLOW_IB_PORT", "first", 1);
  auto t = make_transport("verbs", TransportConfig{});
  unsetenv("RDMAFLOW_IB_PORT");
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
  EXPECT_NE(t.status().reason().find("RDMAFLOW_IB_PORT='first' is not an integer"),
            std::string::npos)
      << t.status().to_string();
}

TEST(VerbsViability, UnknownDeviceNameIsNotViable) {
  setenv("RDMAFLOW_IB_DEVICE", "rf_no_such_dev", 1);
  auto t = make_transport("verbs", TransportConfig{});
  unsetenv("RDMAFLOW_IB_DEVICE");
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), Code::kNotViable);
  const std::string& r = t.status().reason();
  bool no_device = r.find("no RDMA device found") != std::string::npos;
  bool named =
      r.find("RDMAFLOW_IB_DEVICE='rf_no_such_dev' is not an RDMA device here") != std::string::npos;
  EXPECT_TRUE(no_device || named) << r;
}

}  // namespace
}  // namespace rdmaflow
