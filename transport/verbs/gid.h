// Choosing the GID (source address) a verbs port uses.
//
// On RoCE every IP address of the netdev appears in the port's GID table
// twice: once as RoCE v1 (Ethernet, not routable) and once as RoCE v2 (UDP/IP,
// port 4791). rdmaflow prefers the RoCE v2 entry holding an IPv4-mapped address
// (::ffff:a.b.c.d), which is what rdma_cm picks for an IPv4 connection on a
// modern kernel and what works across an IP router. RDMAFLOW_IB_GID_INDEX
// overrides the choice. Pure logic: the device code feeds it the table.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace rdmaflow::verbs {

enum class GidType : uint8_t { kIB, kRoCEv1, kRoCEv2, kUnknown };

using GidBytes = std::array<uint8_t, 16>;

struct GidEntry {
  uint32_t index = 0;
  GidType type = GidType::kUnknown;
  GidBytes gid{};
};

struct GidChoice {
  GidEntry entry;
  std::optional<std::string> ipv4;  // set when the GID is IPv4-mapped
  std::string reason;               // why this entry was chosen, for logs and errors
};

std::string_view gid_type_name(GidType type);

// Parses the text of /sys/class/infiniband/<dev>/ports/<p>/gid_attrs/types/<i>
// ("RoCE v2", "IB/RoCE v1", with or without a trailing newline).
GidType parse_sysfs_gid_type(std::string_view text);

bool gid_is_zero(const GidBytes& gid);
// "::ffff:a.b.c.d" -> "a.b.c.d".
std::optional<std::string> gid_ipv4(const GidBytes& gid);
// IPv4-mapped GIDs as "::ffff:10.0.0.1", others as 8 groups of 4 hex digits.
std::string gid_to_string(const GidBytes& gid);

// Picks a GID from `table` (zero entries are ignored). With `override_index`
// the entry at that index must exist; without it, the order of preference is:
// RoCE v2 IPv4-mapped (matching `want_ipv4` if given), RoCE v2 other, RoCE v1
// IPv4-mapped, then the first IB / other GID. kNotViable when nothing is usable.
Result<GidChoice> choose_gid(std::span<const GidEntry> table,
                             std::optional<uint32_t> override_index,
                             std::optional<std::string> want_ipv4 = std::nullopt);

}  // namespace rdmaflow::verbs
