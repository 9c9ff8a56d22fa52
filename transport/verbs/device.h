// Finding the RDMA device, port and GID the verbs transport uses, and telling
// the user plainly when there is none ("not viable" instead of a crash).
#pragma once

#include <infiniband/verbs.h>

#include <string>
#include <vector>

#include "common/status.h"
#include "transport/verbs/config.h"
#include "transport/verbs/gid.h"

namespace rdmaflow::verbs {

// The reason text when ibv_get_device_list() finds nothing: `list_failed` when
// it returned NULL (with `err` = errno), else it returned `count` == 0 devices.
std::string no_device_reason(bool list_failed, int err, int count);

// Names of the RDMA devices libibverbs sees; kNotViable with no_device_reason()
// when there are none.
Result<std::vector<std::string>> list_rdma_devices();

struct PortChoice {
  std::string device;
  uint32_t port = 1;
  bool ethernet = false;  // RoCE (link layer Ethernet) rather than InfiniBand
  uint32_t active_mtu = 0;
  GidChoice gid;
  std::string
      summary;  // "rxe0 port 1 (RoCE, mtu 1024), GID index 1 (RoCE v2, ::ffff:10.0.0.1): ..."
};

// Chooses the port and GID on an opened device (RDMAFLOW_IB_PORT /
// RDMAFLOW_IB_GID_INDEX honoured). kNotViable when no port is ACTIVE.
Result<PortChoice> choose_port(ibv_context* ctx, const VerbsConfig& config);

// Reads the port's GID table (ibv_query_gid_table, then per-index
// ibv_query_gid_ex, then sysfs as fallbacks for older kernels).
std::vector<GidEntry> read_gid_table(ibv_context* ctx, uint32_t port, int table_len,
                                     int port_count);

}  // namespace rdmaflow::verbs
