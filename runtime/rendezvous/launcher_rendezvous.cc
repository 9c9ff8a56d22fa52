#include "runtime/rendezvous/launcher_rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#ifdef RDMAFLOW_HAVE_PMIX
#include <pmix.h>
#endif

#include "common/log.h"
#include "transport/tcp/tcp_address.h"

namespace rdmaflow {

namespace {

constexpr const char* kOp = "find the rendezvous";

Status failed(const std::string& why) {
  return RDMAFLOW_ERROR(Code::kInvalidArgument, kOp, -1, why);
}

// `host` (a name or literal address) as a socket address, IPv4 preferred.
Result<sockaddr_storage> resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &list);
  if (rc != 0) {
    return RDMAFLOW_ERROR(Code::kNotFound, kOp, -1,
                          "cannot resolve '" + host + "': " + ::gai_strerror(rc));
  }
  sockaddr_storage out{};
  bool found = false;
  for (int family : {AF_INET, AF_INET6}) {
    for (addrinfo* it = list; it != nullptr && !found; it = it->ai_next) {
      if (it->ai_family != family) continue;
      std::memcpy(&out, it->ai_addr, it->ai_addrlen);
      found = true;
    }
  }
  ::freeaddrinfo(list);
  if (!found) return RDMAFLOW_ERROR(Code::kNotFound, kOp, -1, "'" + host + "' has no IP address");
  return out;
}

std::string numeric(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, text, sizeof text);
  } else {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, text, sizeof text);
  }
  return text;
}

bool is_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127;
  }
  return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr);
}

// The interface of the IPv4 default route with the lowest metric, from
// /proc/net/route (columns: Iface Destination Gateway Flags RefCnt Use Metric ...).
std::string default_route_interface() {
  std::ifstream in("/proc/net/route");
  std::string line, best;
  long best_metric = -1;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string iface, dest, gateway;
    unsigned flags = 0;
    long refcnt = 0, use = 0, metric = 0;
    if (!(fields >> iface >> dest >> gateway >> std::hex >> flags >> std::dec >> refcnt >> use >>
          metric)) {
      continue;
    }
    const bool up = (flags & 1U) != 0;
    if (dest == "00000000" && up && (best_metric < 0 || metric < best_metric)) {
      best = iface;
      best_metric = metric;
    }
  }
  return best;
}

// Leading decimal digits of `text` as a port, or 0.
uint16_t leading_port(const std::string& text) {
  unsigned v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr == text.data() || v == 0 || v > 65535) return 0;
  return static_cast<uint16_t>(v);
}

uint64_t number_or_zero(const std::optional<std::string>& text) {
  uint64_t v = 0;
  if (text) std::from_chars(text->data(), text->data() + text->size(), v);
  return v;
}

// ---------------------------------------------------------------- Slurm

Result<std::optional<LauncherRendezvous>> via_slurm(const RankInfo& info, const EnvLookup& env,
                                                    const StartStore& start) {
  const auto nodelist = env("SLURM_STEP_NODELIST");
  const auto procid = env("SLURM_PROCID");
  if (!nodelist || !procid) return std::optional<LauncherRendezvous>();
  if (*procid != std::to_string(info.rank)) {
    return failed("this rank is " + std::to_string(info.rank) + " (" + info.source +
                  ") but SLURM_PROCID=" + *procid +
                  ", so Slurm's node list does not say where rank 0 is; set RDMAFLOW_RENDEZVOUS");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(std::string host, first_slurm_host(*nodelist));
  auto resolved = resolve(host);
  if (!resolved) {
    return failed("rank 0 runs on '" + host + "', the first node of SLURM_STEP_NODELIST=" +
                  *nodelist + ", but " + resolved.status().reason());
  }
  HostPort hp{numeric(*resolved), 0};
  std::string port_from;
  if (auto reserved = env("SLURM_STEP_RESV_PORTS"); reserved && leading_port(*reserved) != 0) {
    hp.port = leading_port(*reserved);
    port_from = "the first of SLURM_STEP_RESV_PORTS=" + *reserved;
  } else {
    const uint64_t job = number_or_zero(env("SLURM_JOB_ID"));
    const uint64_t step = number_or_zero(env("SLURM_STEP_ID"));
    hp.port = static_cast<uint16_t>(20000 + (job * 16 + step) % 12000);
    port_from = "20000 + (SLURM_JOB_ID * 16 + SLURM_STEP_ID) mod 12000";
  }
  if (info.rank == 0) {
    auto served = start(hp);
    if (!served) {
      return served.status().with_op(std::string(kOp) + " through Slurm: rank 0 serves it on '" +
                                     host +
                                     "', the first node of SLURM_STEP_NODELIST=" + *nodelist);
    }
  }
  return std::optional<LauncherRendezvous>(LauncherRendezvous{
      hp, "Slurm: rank 0 on '" + host + "', the first node of SLURM_STEP_NODELIST=" + *nodelist +
              "; port " + std::to_string(hp.port) + " from " + port_from});
}

// ---------------------------------------------------------------- PMIx

#ifdef RDMAFLOW_HAVE_PMIX

constexpr const char* kPmixKey = "rdmaflow.rendezvous";

std::string pmix_error(const char* call, pmix_status_t rc) {
  return std::string(call) + " failed: " + PMIx_Error_string(rc);
}

// Rank 0 publishes "host:port", or "!reason" when it could not start the store,
// so that the others fail with its reason instead of a timeout.
Result<std::optional<LauncherRendezvous>> via_pmix(const RankInfo& info, const EnvLookup& env,
                                                   const StartStore& start, Millis timeout) {
  pmix_proc_t me;
  PMIX_PROC_CONSTRUCT(&me);
  pmix_status_t rc = PMIx_Init(&me, nullptr, 0);
  if (rc != PMIX_SUCCESS) {
    return failed(pmix_error("PMIx_Init", rc) +
                  " (PMIX_RANK is set: started by a PMIx launcher?); set RDMAFLOW_RENDEZVOUS");
  }
  struct Finalize {
    ~Finalize() { PMIx_Finalize(nullptr, 0); }
  } finalize;
  if (me.rank != static_cast<pmix_rank_t>(info.rank)) {
    return failed("this rank is " + std::to_string(info.rank) + " (" + info.source +
                  ") but PMIx rank " + std::to_string(me.rank) + "; set RDMAFLOW_RENDEZVOUS");
  }
  Status rank0_error;
  if (info.rank == 0) {
    std::string published;
    auto host = host_address(env);
    auto served = host ? start(HostPort{*host, 0}) : Result<HostPort>(host.status());
    if (served) {
      published = served->to_string();
    } else {
      rank0_error = served.status();
      published = "!" + rank0_error.to_string();
    }
    pmix_value_t value;
    PMIX_VALUE_LOAD(&value, published.c_str(), PMIX_STRING);
    rc = PMIx_Put(PMIX_GLOBAL, kPmixKey, &value);
    PMIX_VALUE_DESTRUCT(&value);
    if (rc == PMIX_SUCCESS) rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) return failed(pmix_error("PMIx_Put/PMIx_Commit", rc));
  }
  bool collect = true;
  int seconds = static_cast<int>((timeout.count() + 999) / 1000);
  pmix_info_t fence[2];
  PMIX_INFO_LOAD(&fence[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  PMIX_INFO_LOAD(&fence[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
  rc = PMIx_Fence(nullptr, 0, fence, 2);
  PMIX_INFO_DESTRUCT(&fence[0]);
  PMIX_INFO_DESTRUCT(&fence[1]);
  if (rc != PMIX_SUCCESS) return failed(pmix_error("PMIx_Fence", rc));
  if (!rank0_error.is_ok()) return rank0_error;

  pmix_proc_t zero;
  PMIX_LOAD_PROCID(&zero, me.nspace, 0);
  pmix_value_t* got = nullptr;
  rc = PMIx_Get(&zero, kPmixKey, nullptr, 0, &got);
  if (rc != PMIX_SUCCESS || got == nullptr) {
    return failed(pmix_error("PMIx_Get of rank 0's rendezvous", rc));
  }
  const std::string text = got->type == PMIX_STRING && got->data.string ? got->data.string : "";
  PMIX_VALUE_RELEASE(got);
  if (!text.empty() && text.front() == '!') {
    return RDMAFLOW_ERROR(Code::kPeerFailed, kOp, 0,
                          "rank 0 could not serve the rendezvous: " + text.substr(1));
  }
  RDMAFLOW_ASSIGN_OR_RETURN(HostPort hp, parse_host_port(text, "rank 0's PMIx rendezvous"));
  return std::optional<LauncherRendezvous>(
      LauncherRendezvous{hp, "PMIx: rank 0 published it in namespace " + std::string(me.nspace)});
}

#endif  // RDMAFLOW_HAVE_PMIX

}  // namespace

Result<std::string> first_slurm_host(const std::string& nodelist) {
  auto bad = [&](const std::string& why) {
    return failed("SLURM_STEP_NODELIST='" + nodelist + "' " + why);
  };
  std::string first, out;
  int depth = 0;
  for (char c : nodelist) {
    if (c == ',' && depth == 0) break;
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) return bad("has a ']' without '['");
    first += c;
  }
  if (depth != 0) return bad("has a '[' without ']'");
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i] != '[') {
      out += first[i];
      continue;
    }
    const size_t close = first.find(']', i);
    const std::string range = first.substr(i + 1, close - i - 1);
    const std::string lowest = range.substr(0, range.find_first_of(",-"));
    if (lowest.empty()) return bad("has an empty range");
    out += lowest;
    i = close;
  }
  if (out.empty()) return bad("names no host");
  return out;
}

Result<std::string> host_address(const EnvLookup& env) {
  if (auto ifname = env("RDMAFLOW_SOCKET_IFNAME")) {
    RDMAFLOW_ASSIGN_OR_RETURN(auto a, tcp::resolve_listen_address(*ifname));
    return a.to_string();
  }
  const std::string iface = default_route_interface();
  if (!iface.empty()) {
    if (auto a = tcp::resolve_listen_address(iface)) return a->to_string();
  }
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  auto resolved = resolve(name);
  if (resolved && !is_loopback(*resolved)) return numeric(*resolved);
  return failed(std::string("this host has no default route and its name '") + name +
                "' does not resolve to an address other hosts reach; set RDMAFLOW_SOCKET_IFNAME to "
                "the interface the hosts reach each other on");
}

Result<std::string> local_address_toward(const std::string& host) {
  RDMAFLOW_ASSIGN_OR_RETURN(sockaddr_storage to, resolve(host));
  // A UDP connect only asks the kernel for the route; nothing is sent.
  if (to.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in&>(to).sin_port = htons(9);
  } else {
    reinterpret_cast<sockaddr_in6&>(to).sin6_port = htons(9);
  }
  const int fd = ::socket(to.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return failed(std::string("socket: ") + std::strerror(errno));
  const socklen_t len = to.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  sockaddr_storage local{};
  socklen_t local_len = sizeof local;
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&to), len) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return failed("no route to '" + host + "': " + std::strerror(err));
  return numeric(local);
}

Result<std::optional<LauncherRendezvous>> find_launcher_rendezvous(const RankInfo& info,
                                                                   const EnvLookup& env,
                                                                   const StartStore& start,
                                                                   Millis timeout,
                                                                   std::string* why_not) {
  if (env("PMIX_RANK")) {
#ifdef RDMAFLOW_HAVE_PMIX
    return via_pmix(info, env, start, timeout);
#else
    (void)timeout;
    if (why_not) *why_not = "started by a PMIx launcher, but this build has no PMIx";
#endif
  }
  RDMAFLOW_ASSIGN_OR_RETURN(auto slurm, via_slurm(info, env, start));
  if (slurm) return slurm;
  if (why_not && why_not->empty()) {
    *why_not = "no PMIx (PMIX_RANK) or Slurm (SLURM_STEP_NODELIST) launcher to ask";
  }
  return std::optional<LauncherRendezvous>();
}

}  // namespace rdmaflow
