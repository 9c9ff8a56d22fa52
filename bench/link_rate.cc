#include "bench/link_rate.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace rdmaflow::bench {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kOp = "measure the link rate";
constexpr size_t kChunk = 1 << 20;
constexpr std::chrono::seconds kSetupTimeout(30);

Status failed(const std::string& why) {
  return RDMAFLOW_ERROR(Code::kConnectionFailed, kOp, -1, why);
}

std::string errno_text(const char* call) {
  return std::string(call) + ": " + std::strerror(errno);
}

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Result<sockaddr_in> ipv4(const std::string& host, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, kOp, -1, "'" + host + "' is no IPv4 address");
  }
  return a;
}

// Listens on `host`, any free port; *port gets it.
Result<Fd> listen_any(const std::string& host, int backlog, uint16_t* port) {
  RDMAFLOW_ASSIGN_OR_RETURN(sockaddr_in a, ipv4(host, 0));
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.fd < 0) return failed(errno_text("socket"));
  if (::bind(fd.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(fd.fd, backlog) != 0) {
    return failed("listen on " + host + ": " + std::strerror(errno));
  }
  socklen_t len = sizeof a;
  ::getsockname(fd.fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

Result<Fd> accept_within(int listen_fd, Clock::time_point deadline) {
  pollfd p{listen_fd, POLLIN, 0};
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
  if (ready <= 0)
    return failed("the sender did not connect within " + std::to_string(kSetupTimeout.count()) +
                  " s");
  Fd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
  if (fd.fd < 0) return failed(errno_text("accept"));
  return fd;
}

Result<Fd> connect_to(const std::string& host, uint16_t port) {
  RDMAFLOW_ASSIGN_OR_RETURN(sockaddr_in a, ipv4(host, port));
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.fd < 0) return failed(errno_text("socket"));
  if (::connect(fd.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    return failed("connect to " + host + ":" + std::to_string(port) + ": " + std::strerror(errno));
  }
  return fd;
}

// Reads until EOF; the times of the first and the last byte.
struct Received {
  uint64_t bytes = 0;
  Clock::time_point first, last;
  std::string error;
};

void drain(int fd, Received& r) {
  std::vector<char> buf(kChunk);
  for (;;) {
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      r.error = errno_text("recv");
      return;
    }
    if (n == 0) return;
    const auto now = Clock::now();
    if (r.bytes == 0) r.first = now;
    r.last = now;
    r.bytes += static_cast<uint64_t>(n);
  }
}

void blast(int fd, Clock::time_point until, std::string& error) {
  std::vector<char> buf(kChunk, 7);
  while (Clock::now() < until) {
    size_t off = 0;
    while (off < buf.size()) {
      const ssize_t n = ::send(fd, buf.data() + off, buf.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error = errno_text("send");
        return;
      }
      off += static_cast<size_t>(n);
    }
  }
  ::shutdown(fd, SHUT_WR);
}

// One measurement over `streams` connections; MB/s on the receiver, 0 on the sender.
Result<double> one_rate(bool sender, int listen_fd, const std::string& host, uint16_t port,
                        int streams, double seconds) {
  std::vector<Fd> fds;
  const auto deadline = Clock::now() + kSetupTimeout;
  for (int i = 0; i < streams; ++i) {
    if (sender) {
      RDMAFLOW_ASSIGN_OR_RETURN(Fd fd, connect_to(host, port));
      fds.push_back(std::move(fd));
    } else {
      RDMAFLOW_ASSIGN_OR_RETURN(Fd fd, accept_within(listen_fd, deadline));
      fds.push_back(std::move(fd));
    }
  }
  std::vector<std::thread> threads;
  if (sender) {
    std::vector<std::string> errors(fds.size());
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(seconds));
    for (size_t i = 0; i < fds.size(); ++i) {
      threads.emplace_back([&, i] { blast(fds[i].fd, until, errors[i]); });
    }
    for (auto& t : threads) t.join();
    for (const auto& e : errors) {
      if (!e.empty()) return failed("sending: " + e);
    }
    // Wait for the receiver to close, so that the next measurement starts on an
    // idle link.
    char byte;
    for (auto& fd : fds) (void)!::recv(fd.fd, &byte, 1, 0);
    return 0.0;
  }
  std::vector<Received> got(fds.size());
  for (size_t i = 0; i < fds.size(); ++i)
    threads.emplace_back([&, i] { drain(fds[i].fd, got[i]); });
  for (auto& t : threads) t.join();
  uint64_t bytes = 0;
  Clock::time_point first = Clock::time_point::max(), last = Clock::time_point::min();
  for (const auto& r : got) {
    if (!r.error.empty()) return failed("receiving: " + r.error);
    if (r.bytes == 0) continue;
    bytes += r.bytes;
    first = std::min(first, r.first);
    last = std::max(last, r.last);
  }
  const double s = std::chrono::duration<double>(last - first).count();
  if (bytes == 0 || s <= 0) return failed("no bytes arrived");
  return static_cast<double>(bytes) / s / 1e6;
}

std::string local_hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

nlohmann::json LinkRate::to_json() const {
  return {{"single_stream_MBps", single_MBps},
          {"multi_stream_MBps", multi_MBps},
          {"streams", streams},
          {"best_MBps", best_MBps()},
          {"seconds", seconds},
          {"from", from},
          {"to", to},
          {"method", "plain TCP socket blast (1 MiB send() calls), timed on the receiver"}};
}

LinkRate LinkRate::from_json(const nlohmann::json& j) {
  LinkRate r;
  r.single_MBps = j.value("single_stream_MBps", 0.0);
  r.multi_MBps = j.value("multi_stream_MBps", 0.0);
  r.streams = j.value("streams", 0);
  r.seconds = j.value("seconds", 0.0);
  r.from = j.value("from", std::string());
  r.to = j.value("to", std::string());
  return r;
}

std::string LinkRate::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s -> %s, plain TCP sockets: 1 stream %.0f MB/s, %d streams %.0f MB/s "
                "(%.1f s each)",
                from.c_str(), to.c_str(), single_MBps, streams, multi_MBps, seconds);
  return buf;
}

Result<LinkRate> measure_link_rate(bool sender, const std::string& listen_address,
                                   const Exchange& exchange, double seconds, int streams) {
  streams = std::max(streams, 1);
  Fd listener;
  uint16_t port = 0;
  std::string mine = local_hostname();
  if (!sender) {
    RDMAFLOW_ASSIGN_OR_RETURN(listener, listen_any(listen_address, streams, &port));
    mine += " " + listen_address + " " + std::to_string(port);
  }
  RDMAFLOW_ASSIGN_OR_RETURN(std::string theirs, exchange(mine));
  std::string host = listen_address;
  std::string peer_name = theirs.substr(0, theirs.find(' '));
  if (sender) {
    char h[64] = {};
    unsigned p = 0;
    if (std::sscanf(theirs.c_str(), "%*s %63s %u", h, &p) != 2 || p == 0 || p > 65535) {
      return RDMAFLOW_ERROR(Code::kProtocolError, kOp, -1,
                            "the receiver sent '" + theirs + "', not 'name address port'");
    }
    host = h;
    port = static_cast<uint16_t>(p);
  }
  LinkRate rate;
  rate.streams = streams;
  rate.seconds = seconds;
  rate.from = sender ? local_hostname() : peer_name;
  rate.to = sender ? peer_name : local_hostname();
  RDMAFLOW_ASSIGN_OR_RETURN(rate.single_MBps,
                            one_rate(sender, listener.fd, host, port, 1, seconds));
  RDMAFLOW_ASSIGN_OR_RETURN(rate.multi_MBps,
                            one_rate(sender, listener.fd, host, port, streams, seconds));
  // The receiver's figures, to both sides.
  RDMAFLOW_ASSIGN_OR_RETURN(std::string measured,
                            exchange(sender ? std::string() : rate.to_json().dump()));
  if (sender) {
    auto j = nlohmann::json::parse(measured, nullptr, false);
    if (j.is_discarded()) {
      return RDMAFLOW_ERROR(Code::kProtocolError, kOp, -1, "the receiver's figures are malformed");
    }
    rate = LinkRate::from_json(j);
  }
  return rate;
}

}  // namespace rdmaflow::bench
