#include "transport/verbs/gid.h"

#include <cstdio>

namespace rdmaflow::verbs {

std::string_view gid_type_name(GidType type) {
  switch (type) {
    case GidType::kIB:
      return "IB";
    case GidType::kRoCEv1:
      return "RoCE v1";
    case GidType::kRoCEv2:
      return "RoCE v2";
    case GidType::kUnknown:
      break;
  }
  return "unknown";
}

GidType parse_sysfs_gid_type(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text == "RoCE v2") return GidType::kRoCEv2;
  if (text == "IB/RoCE v1" || text == "RoCE v1") return GidType::kRoCEv1;
  if (text == "IB") return GidType::kIB;
  return GidType::kUnknown;
}

bool gid_is_zero(const GidBytes& gid) {
  for (uint8_t b : gid) {
    if (b != 0) return false;
  }
  return true;
}

std::optional<std::string> gid_ipv4(const GidBytes& gid) {
  for (int i = 0; i < 10; ++i) {
    if (gid[i] != 0) return std::nullopt;
  }
  if (gid[10] != 0xff || gid[11] != 0xff) return std::nullopt;
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%u.%u.%u.%u", gid[12], gid[13], gid[14], gid[15]);
  return std::string(buf);
}

std::string gid_to_string(const GidBytes& gid) {
  if (auto v4 = gid_ipv4(gid)) return "::ffff:" + *v4;
  std::string out;
  char buf[8];
  for (int i = 0; i < 16; i += 2) {
    std::snprintf(buf, sizeof(buf), "%s%02x%02x", i == 0 ? "" : ":", gid[i], gid[i + 1]);
    out += buf;
  }
  return out;
}

namespace {
std::string describe(const GidEntry& e) {
  return "index " + std::to_string(e.index) + " (" + std::string(gid_type_name(e.type)) + ", " +
         gid_to_string(e.gid) + ")";
}

std::string list_table(std::span<const GidEntry> table) {
  std::string out;
  for (const auto& e : table) {
    if (gid_is_zero(e.gid)) continue;
    out += (out.empty() ? "" : "; ") + describe(e);
  }
  return out.empty() ? "none" : out;
}
}  // namespace

Result<GidChoice> choose_gid(std::span<const GidEntry> table,
                             std::optional<uint32_t> override_index,
                             std::optional<std::string> want_ipv4) {
  auto pick = [](const GidEntry& e, std::string reason) {
    GidChoice c;
    c.entry = e;
    c.ipv4 = gid_ipv4(e.gid);
    c.reason = describe(e) + ": " + std::move(reason);
    return c;
  };

  if (override_index) {
    for (const auto& e : table) {
      if (e.index != *override_index || gid_is_zero(e.gid)) continue;
      std::string why = "set by RDMAFLOW_IB_GID_INDEX";
      if (e.type != GidType::kRoCEv2 || !gid_ipv4(e.gid)) {
        why += " (note: not a RoCE v2 IPv4-mapped GID; rdma_cm may use another one)";
      }
      return pick(e, why);
    }
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, "choose GID", -1,
        "RDMAFLOW_IB_GID_INDEX=" + std::to_string(*override_index) +
            " is not a valid entry of the port's GID table; valid: " + list_table(table));
  }

  const GidEntry* v2_v4 = nullptr;
  const GidEntry* v2_v4_match = nullptr;
  const GidEntry* v2_other = nullptr;
  const GidEntry* v1_v4 = nullptr;
  const GidEntry* other = nullptr;
  for (const auto& e : table) {
    if (gid_is_zero(e.gid)) continue;
    auto v4 = gid_ipv4(e.gid);
    if (e.type == GidType::kRoCEv2 && v4) {
      if (!v2_v4) v2_v4 = &e;
      if (want_ipv4 && *v4 == *want_ipv4 && !v2_v4_match) v2_v4_match = &e;
    } else if (e.type == GidType::kRoCEv2) {
      if (!v2_other) v2_other = &e;
    } else if (e.type == GidType::kRoCEv1 && v4) {
      if (!v1_v4) v1_v4 = &e;
    } else if (!other) {
      other = &e;
    }
  }
  if (v2_v4_match) return pick(*v2_v4_match, "RoCE v2 IPv4-mapped GID of " + *want_ipv4);
  if (v2_v4) {
    std::string why = "first RoCE v2 IPv4-mapped GID";
    if (want_ipv4) why += " (none holds " + *want_ipv4 + ")";
    return pick(*v2_v4, why);
  }
  if (v2_other) return pick(*v2_other, "RoCE v2 GID (no IPv4-mapped RoCE v2 GID on this port)");
  if (v1_v4) return pick(*v1_v4, "RoCE v1 IPv4-mapped GID (no RoCE v2 GID on this port)");
  if (other) return pick(*other, "first valid GID (no RoCE GID: InfiniBand or unknown link)");
  return RDMAFLOW_ERROR(Code::kNotViable, "choose GID", -1,
                        "the port's GID table has no valid entry (is the netdev up with an "
                        "IP address?)");
}

}  // namespace rdmaflow::verbs
