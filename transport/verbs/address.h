// Listener addresses of the verbs backend: "verbs://<ip>:<port>", where <ip> is
// the IPv4 address of the RDMA netdev (e.g. the interface an rxe link sits on)
// or a bracketed IPv6 address ("verbs://[fe80::1%eth0]:7000").
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "allocator/status.h"

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

// Fills a sockaddr_in / sockaddr_in6 for rdma_resolve_addr / rdma_bind_addr.
Result<socklen_t> to_sockaddr(const VerbsAddress& addr, sockaddr_storage* out);

// True for 127.0.0.0/8, ::1 and ::ffff:127.x: addresses no RDMA netdev owns.
bool is_loopback_ip(std::string_view ip);

}  // namespace rdmaflow::verbs
