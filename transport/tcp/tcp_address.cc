#include "transport/tcp/tcp_address.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>
#include <optional>

#include "common/env.h"

namespace rdmaflow::tcp {

namespace ip = boost::asio::ip;

namespace {

std::optional<ip::address> interface_address(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<ip::address> v4, v6;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || ifname != it->ifa_name) continue;
    if (it->ifa_addr->sa_family == AF_INET && !v4) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(it->ifa_addr);
      ip::address_v4::bytes_type b;
      std::memcpy(b.data(), &sin->sin_addr, 4);
      v4 = ip::address_v4(b);
    } else if (it->ifa_addr->sa_family == AF_INET6 && !v6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(it->ifa_addr);
      ip::address_v6::bytes_type b;
      std::memcpy(b.data(), &sin6->sin6_addr, 16);
      ip::address_v6 a(b, sin6->sin6_scope_id);
      v6 = a;
    }
  }
  freeifaddrs(list);
  if (v4) return ip::address(*v4);
  if (v6) return ip::address(*v6);
  return std::nullopt;
}

}  // namespace

Result<ip::address> resolve_listen_address(const std::string& ifname, const std::string& fallback) {
  std::string name = ifname;
  if (name.empty()) name = env_string("RDMAFLOW_SOCKET_IFNAME").value_or("");
  if (name.empty()) name = fallback;
  if (name.empty()) return ip::address(ip::address_v4::loopback());
  boost::system::error_code ec;
  ip::address literal = ip::make_address(name, ec);
  if (!ec) return literal;
  if (auto a = interface_address(name)) return *a;
  return RDMAFLOW_ERROR(Code::kNotFound, "listen", -1,
                        "'" + name +
                            "' (TransportConfig::ifname / RDMAFLOW_SOCKET_IFNAME) is neither an "
                            "IP address nor an interface with an address");
}

std::string format_address(const ip::tcp::endpoint& endpoint) {
  const ip::address& a = endpoint.address();
  std::string host = a.to_string();
  if (a.is_v6()) host = "[" + host + "]";
  return "tcp://" + host + ":" + std::to_string(endpoint.port());
}

Result<ip::tcp::endpoint> parse_address(const std::string& address) {
  auto bad = [&](const std::string& why) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "parse tcp address", -1,
                          "'" + address + "': " + why + " (expected tcp://host:port)");
  };
  std::string s = address;
  if (s.rfind("tcp://", 0) == 0) s = s.substr(6);
  size_t colon = s.rfind(':');
  if (colon == std::string::npos) return bad("no port");
  std::string host = s.substr(0, colon);
  std::string port_text = s.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return bad("bad port '" + port_text + "'");
  }
  boost::system::error_code aec;
  ip::address a = ip::make_address(host, aec);
  if (aec) return bad("bad host '" + host + "'");
  return ip::tcp::endpoint(a, static_cast<uint16_t>(port));
}

}  // namespace rdmaflow::tcp
