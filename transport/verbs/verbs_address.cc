#include "transport/verbs/verbs_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>

namespace rdmaflow::verbs {

namespace {
constexpr std::string_view kScheme = "verbs://";

Status bad(std::string_view text, const std::string& why) {
  return RDMAFLOW_ERROR(Code::kInvalidArgument, "parse verbs address", -1,
                        "'" + std::string(text) + "': " + why +
                            " (expected verbs://<ip>:<port> or verbs://[<ipv6>]:<port>)");
}

// Splits an optional "%scope" off an IPv6 literal.
std::pair<std::string, std::string> split_scope(const std::string& host) {
  auto pct = host.find('%');
  if (pct == std::string::npos) return {host, ""};
  return {host.substr(0, pct), host.substr(pct + 1)};
}
}  // namespace

Result<VerbsAddress> parse_verbs_address(std::string_view text) {
  if (text.substr(0, kScheme.size()) != kScheme) return bad(text, "missing 'verbs://' prefix");
  std::string_view rest = text.substr(kScheme.size());
  VerbsAddress out;
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    auto close = rest.find(']');
    if (close == std::string_view::npos) return bad(text, "unterminated '[' in IPv6 address");
    out.host = std::string(rest.substr(1, close - 1));
    out.ipv6 = true;
    rest = rest.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return bad(text, "missing ':<port>' after ']'");
    port_text = rest.substr(1);
  } else {
    auto colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad(text, "missing ':<port>'");
    out.host = std::string(rest.substr(0, colon));
    if (out.host.find(':') != std::string::npos) {
      return bad(text, "IPv6 addresses must be written in brackets");
    }
    port_text = rest.substr(colon + 1);
  }
  if (out.host.empty()) return bad(text, "empty host");
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || ptr != port_text.data() + port_text.size()) {
    return bad(text, "port '" + std::string(port_text) + "' is not a number");
  }
  if (port == 0 || port > 65535) return bad(text, "port " + std::to_string(port) + " out of range");
  out.port = static_cast<uint16_t>(port);

  if (out.ipv6) {
    in6_addr a6{};
    if (inet_pton(AF_INET6, split_scope(out.host).first.c_str(), &a6) != 1) {
      return bad(text, "'" + out.host + "' is not a numeric IPv6 address");
    }
  } else {
    in_addr a4{};
    if (inet_pton(AF_INET, out.host.c_str(), &a4) != 1) {
      return bad(text, "'" + out.host + "' is not a numeric IPv4 address");
    }
  }
  return out;
}

std::string format_verbs_address(const VerbsAddress& addr) {
  if (addr.ipv6) return std::string(kScheme) + "[" + addr.host + "]:" + std::to_string(addr.port);
  return std::string(kScheme) + addr.host + ":" + std::to_string(addr.port);
}

std::string describe_sockaddr(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  VerbsAddress a;
  if (sa != nullptr && sa->sa_family == AF_INET) {
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &s4->sin_addr, buf, sizeof buf);
    a.port = ntohs(s4->sin_port);
  } else if (sa != nullptr && sa->sa_family == AF_INET6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &s6->sin6_addr, buf, sizeof buf);
    a.port = ntohs(s6->sin6_port);
    a.ipv6 = true;
  } else {
    return "an unknown address";
  }
  a.host = buf;
  return format_verbs_address(a);
}

Result<socklen_t> to_sockaddr(const VerbsAddress& addr, sockaddr_storage* out) {
  std::memset(out, 0, sizeof(*out));
  if (addr.ipv6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(out);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(addr.port);
    auto [ip, scope] = split_scope(addr.host);
    if (inet_pton(AF_INET6, ip.c_str(), &s6->sin6_addr) != 1) {
      return bad(addr.host, "not a numeric IPv6 address");
    }
    if (!scope.empty()) {
      s6->sin6_scope_id = if_nametoindex(scope.c_str());
      if (s6->sin6_scope_id == 0) return bad(addr.host, "unknown interface '" + scope + "'");
    }
    return static_cast<socklen_t>(sizeof(sockaddr_in6));
  }
  auto* s4 = reinterpret_cast<sockaddr_in*>(out);
  s4->sin_family = AF_INET;
  s4->sin_port = htons(addr.port);
  if (inet_pton(AF_INET, addr.host.c_str(), &s4->sin_addr) != 1) {
    return bad(addr.host, "not a numeric IPv4 address");
  }
  return static_cast<socklen_t>(sizeof(sockaddr_in));
}

bool is_loopback_ip(std::string_view ip) {
  std::string s(ip);
  in_addr a4{};
  if (inet_pton(AF_INET, s.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (inet_pton(AF_INET6, split_scope(s).first.c_str(), &a6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
}

std::optional<std::string> ipv4_subnet(std::string_view ipv4, int prefix_len) {
  in_addr a{};
  if (prefix_len < 0 || prefix_len > 32 || inet_pton(AF_INET, std::string(ipv4).c_str(), &a) != 1) {
    return std::nullopt;
  }
  const uint32_t mask = prefix_len == 0 ? 0 : ~uint32_t{0} << (32 - prefix_len);
  in_addr net{};
  net.s_addr = htonl(ntohl(a.s_addr) & mask);
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &net, text, sizeof(text));
  return std::string(text) + "/" + std::to_string(prefix_len);
}

std::optional<std::string> local_ipv4_subnet(std::string_view ipv4) {
  in_addr want{};
  if (inet_pton(AF_INET, std::string(ipv4).c_str(), &want) != 1) return std::nullopt;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::string> out;
  for (ifaddrs* i = list; i != nullptr && !out; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_netmask == nullptr || i->ifa_addr->sa_family != AF_INET) {
      continue;
    }
    const auto* addr = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (addr->sin_addr.s_addr != want.s_addr) continue;
    const auto* mask = reinterpret_cast<const sockaddr_in*>(i->ifa_netmask);
    out = ipv4_subnet(ipv4, __builtin_popcount(ntohl(mask->sin_addr.s_addr)));
  }
  freeifaddrs(list);
  return out;
}

std::string roce_fabric(const std::optional<std::string>& gid_ipv4) {
  if (gid_ipv4) {
    if (auto subnet = local_ipv4_subnet(*gid_ipv4)) return "roce " + *subnet;
  }
  return "roce";
}

bool fabrics_reach(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  if (a == b) return true;
  const auto roce = [](const std::string& f) { return f == "roce" || f.starts_with("roce "); };
  return roce(a) && roce(b) && (a == "roce" || b == "roce");
}

}  // namespace rdmaflow::verbs
