// Addresses of the TCP backend: "tcp://127.0.0.1:41234" or "tcp://[::1]:41234".
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <string>

#include "common/status.h"

namespace rdmaflow::tcp {

// Picks the local address to listen on. `ifname` is an interface name (resolved
// with getifaddrs, IPv4 preferred) or a literal IPv4/IPv6 address; empty means
// RDMAFLOW_SOCKET_IFNAME, then `fallback` (TransportConfig::reach_address), then
// 127.0.0.1.
Result<boost::asio::ip::address> resolve_listen_address(const std::string& ifname,
                                                        const std::string& fallback = {});

std::string format_address(const boost::asio::ip::tcp::endpoint& endpoint);

// Accepts "tcp://host:port", "host:port" and "[v6]:port" with literal addresses.
Result<boost::asio::ip::tcp::endpoint> parse_address(const std::string& address);

}  // namespace rdmaflow::tcp
