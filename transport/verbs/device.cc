#include "transport/verbs/device.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/log.h"

namespace rdmaflow::verbs {

std::string no_device_reason(bool list_failed, int err, int count) {
  std::string why;
  if (list_failed) {
    why = "ibv_get_device_list failed: " + std::string(std::strerror(err));
    if (err == ENOSYS) why += "; the kernel has no RDMA support loaded";
  } else {
    why = "ibv_get_device_list returned " + std::to_string(count) + " devices";
  }
  return "no RDMA device found (" + why + "); load rdma_rxe and add a link: see docs/soft-roce.md";
}

Result<std::vector<std::string>> list_rdma_devices() {
  int n = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&n);
  int err = errno;
  if (list == nullptr || n <= 0) {
    if (list != nullptr) ibv_free_device_list(list);
    return RDMAFLOW_ERROR(Code::kNotViable, "create verbs transport", -1,
                          no_device_reason(list == nullptr, err, n));
  }
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.emplace_back(ibv_get_device_name(list[i]));
  ibv_free_device_list(list);
  return names;
}

namespace {
GidType from_ibv_gid_type(uint32_t t) {
  switch (t) {
    case IBV_GID_TYPE_IB:
      return GidType::kIB;
    case IBV_GID_TYPE_ROCE_V1:
      return GidType::kRoCEv1;
    case IBV_GID_TYPE_ROCE_V2:
      return GidType::kRoCEv2;
    default:
      return GidType::kUnknown;
  }
}

GidType sysfs_gid_type(const std::string& dev, uint32_t port, uint32_t index) {
  std::ifstream in("/sys/class/infiniband/" + dev + "/ports/" + std::to_string(port) +
                   "/gid_attrs/types/" + std::to_string(index));
  std::stringstream ss;
  ss << in.rdbuf();
  return in ? parse_sysfs_gid_type(ss.str()) : GidType::kUnknown;
}

std::string mtu_name(ibv_mtu mtu) {
  switch (mtu) {
    case IBV_MTU_256:
      return "256";
    case IBV_MTU_512:
      return "512";
    case IBV_MTU_1024:
      return "1024";
    case IBV_MTU_2048:
      return "2048";
    case IBV_MTU_4096:
      return "4096";
  }
  return "?";
}
}  // namespace

std::vector<GidEntry> read_gid_table(ibv_context* ctx, uint32_t port, int table_len,
                                     int port_count) {
  std::vector<GidEntry> out;
  if (table_len <= 0) return out;
  // ibv_query_gid_table returns the valid entries of every port.
  std::vector<ibv_gid_entry> all(static_cast<size_t>(table_len) *
                                 static_cast<size_t>(port_count < 1 ? 1 : port_count));
  ssize_t n = ibv_query_gid_table(ctx, all.data(), all.size(), 0);
  if (n >= 0) {
    for (ssize_t i = 0; i < n; ++i) {
      if (all[i].port_num != port) continue;
      GidEntry e;
      e.index = all[i].gid_index;
      e.type = from_ibv_gid_type(all[i].gid_type);
      std::memcpy(e.gid.data(), all[i].gid.raw, 16);
      out.push_back(e);
    }
    return out;
  }
  // Older kernels: one entry at a time, then sysfs for the type.
  for (int idx = 0; idx < table_len; ++idx) {
    GidEntry e;
    e.index = static_cast<uint32_t>(idx);
    ibv_gid_entry ge{};
    if (ibv_query_gid_ex(ctx, port, static_cast<uint32_t>(idx), &ge, 0) == 0) {
      e.type = from_ibv_gid_type(ge.gid_type);
      std::memcpy(e.gid.data(), ge.gid.raw, 16);
    } else {
      ibv_gid gid{};
      if (ibv_query_gid(ctx, static_cast<uint8_t>(port), idx, &gid) != 0) continue;
      std::memcpy(e.gid.data(), gid.raw, 16);
      e.type = sysfs_gid_type(ibv_get_device_name(ctx->device), port, e.index);
    }
    if (!gid_is_zero(e.gid)) out.push_back(e);
  }
  return out;
}

Result<PortChoice> choose_port(ibv_context* ctx, const VerbsConfig& config) {
  std::string dev = ibv_get_device_name(ctx->device);
  ibv_device_attr dattr{};
  if (int rc = ibv_query_device(ctx, &dattr); rc != 0) {
    return RDMAFLOW_ERROR(Code::kNotViable, "create verbs transport", -1,
                          "ibv_query_device(" + dev + ") failed: " + std::strerror(rc));
  }
  std::string skipped;
  uint32_t first = config.port.value_or(1);
  uint32_t last = config.port.value_or(dattr.phys_port_cnt);
  if (config.port && *config.port > dattr.phys_port_cnt) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "create verbs transport", -1,
                          "RDMAFLOW_IB_PORT=" + std::to_string(*config.port) + " but " + dev +
                              " has " + std::to_string(dattr.phys_port_cnt) + " port(s)");
  }
  for (uint32_t port = first; port <= last; ++port) {
    ibv_port_attr pattr{};
    if (int rc = ibv_query_port(ctx, static_cast<uint8_t>(port), &pattr); rc != 0) {
      skipped +=
          " port " + std::to_string(port) + ": ibv_query_port failed (" + std::strerror(rc) + ");";
      continue;
    }
    if (pattr.state != IBV_PORT_ACTIVE) {
      skipped += " port " + std::to_string(port) + " is " + ibv_port_state_str(pattr.state) +
                 " (is the netdev up?);";
      continue;
    }
    auto table = read_gid_table(ctx, port, pattr.gid_tbl_len, dattr.phys_port_cnt);
    auto gid = choose_gid(table, config.gid_index);
    if (!gid.is_ok()) {
      if (config.gid_index) return gid.status();
      skipped += " port " + std::to_string(port) + ": " + gid.status().reason() + ";";
      continue;
    }
    PortChoice c;
    c.device = dev;
    c.port = port;
    c.ethernet = pattr.link_layer == IBV_LINK_LAYER_ETHERNET;
    c.active_mtu = 128u << pattr.active_mtu;
    c.gid = std::move(gid).value();
    c.summary = dev + " port " + std::to_string(port) + " (" +
                (c.ethernet ? "RoCE" : "InfiniBand") + ", active mtu " +
                mtu_name(pattr.active_mtu) + "), GID " + c.gid.reason;
    return c;
  }
  return RDMAFLOW_ERROR(Code::kNotViable, "create verbs transport", -1,
                        "no usable port on " + dev + ":" + skipped + " see docs/soft-roce.md");
}

}  // namespace rdmaflow::verbs
