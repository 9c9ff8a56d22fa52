// Listener addresses of the verbs backend: "verbs://<ip>:<port>", where <ip> is
// the IPv4 address of the RDMA netdev (e.g. the interface an rxe link sits on)
// or a bracketed IPv6 address ("verbs://[fe80::1%eth0]:7000").
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace rdmaflow::verbs {

struct VerbsAddress {
  std::string host;  // numeric IPv4 or IPv6 (no brackets)
  uint16_t port = 0;
  bool ipv6 = false;
};

// Parses "verbs://host:port". Host names are refused: rdma_cm resolves IP
// addresses to devices, and a name lookup could pick a non-RDMA interface.
Result<VerbsAddress> parse_verbs_address(std::string_view text);

std::string format_verbs_address(const VerbsAddress& addr);

// "verbs://ip:port" of an rdma_cm peer address (rdma_get_peer_addr), or
// "an unknown address": how refusals name a peer that has no rank yet.
std::string describe_sockaddr(const sockaddr* sa);

// Fills a sockaddr_in / sockaddr_in6 for rdma_resolve_addr / rdma_bind_addr.
Result<socklen_t> to_sockaddr(const VerbsAddress& addr, sockaddr_storage* out);

// True for 127.0.0.0/8, ::1 and ::ffff:127.x: addresses no RDMA netdev owns.
bool is_loopback_ip(std::string_view ip);

// The IPv4 subnet "10.0.0.0/24" of `ipv4` under `prefix_len` (0..32), or
// nullopt for a malformed address or length.
std::optional<std::string> ipv4_subnet(std::string_view ipv4, int prefix_len);

// The subnet of the local interface that holds `ipv4` (getifaddrs), e.g.
// "10.0.0.0/24"; nullopt when no interface holds it.
std::optional<std::string> local_ipv4_subnet(std::string_view ipv4);

// The verbs backend's fabric for transport selection: "ib <subnet prefix>"
// on InfiniBand; on RoCE "roce <IPv4 subnet>" when the GID's address is on a
// local interface, else "roce" (subnet unknown).
std::string roce_fabric(const std::optional<std::string>& gid_ipv4);

// Whether two verbs backends' fabrics (TransportCapabilities::fabric) reach
// each other: the same InfiniBand subnet prefix, or RoCE on the same IPv4
// subnet. A RoCE device whose subnet is unknown ("roce") is taken to reach any
// RoCE device over IP. Empty reaches nothing.
bool fabrics_reach(const std::string& a, const std::string& b);

}  // namespace rdmaflow::verbs
