// Helpers for runtime tests that run real processes: fork children that return an
// exit code, a rendezvous server in a process of its own, free loopback ports.
//
// The test process itself stays single-threaded (no server thread in it), so
// forking is always safe; children report failures on stderr and by exit code.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "runtime/rendezvous/tcp_store.h"

namespace rdmaflow::testing {

// In a child: print and fail unless `cond`.
#define CHILD_CHECK(cond)                                                                        \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "[pid %d] %s:%d: check failed: %s\n", ::getpid(), __FILE__, __LINE__, \
                   #cond);                                                                       \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

// In a child: print the status and fail unless it is OK.
#define CHILD_OK(expr)                                                                             \
  do {                                                                                             \
    const auto& _st = (expr);                                                                      \
    if (!_st.is_ok()) {                                                                            \
      std::fprintf(stderr, "[pid %d] %s:%d: %s\n  -> %s\n", ::getpid(), __FILE__, __LINE__, #expr, \
                   ::rdmaflow::testing::status_text(_st).c_str());                                 \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

inline std::string status_text(const Status& s) {
  return s.to_string();
}
template <typename T>
std::string status_text(const Result<T>& r) {
  return r.status().to_string();
}

// A free port on 127.0.0.1 (bound once with port 0, then released).
inline int free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Forks one child per entry; child i runs fn(i) and exits with its return value.
// Returns a pid per child.
inline std::vector<pid_t> spawn(int n, const std::function<int(int)>& fn) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = 98;
      try {
        code = fn(i);
      } catch (...) {
        std::fprintf(stderr, "[pid %d] child %d threw\n", ::getpid(), i);
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  return pids;
}

// Waits for every pid; exit code per child, -signal if killed. Children still
// running after `timeout` are killed (and reported as -SIGKILL).
inline std::vector<int> wait_all(const std::vector<pid_t>& pids,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  std::vector<int> codes(pids.size(), -1000);
  size_t left = pids.size();
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (codes[i] != -1000) continue;
      int st = 0;
      pid_t r = ::waitpid(pids[i], &st, WNOHANG);
      if (r == pids[i]) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (codes[i] == -1000) {
          std::fprintf(stderr, "killing child pid %d after %lld ms\n", pids[i],
                       static_cast<long long>(timeout.count()));
          ::kill(pids[i], SIGKILL);
          ::waitpid(pids[i], nullptr, 0);
          codes[i] = -SIGKILL;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return codes;
}

inline std::vector<int> run_processes(
    int n, const std::function<int(int)>& fn,
    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  return wait_all(spawn(n, fn), timeout);
}

// A TcpStoreServer running in a child process of its own. The child reports its
// port, serves until stop() (or the parent dies), then reports how many requests it
// refused and exits 0 if it was still healthy.
class ServerProcess {
 public:
  explicit ServerProcess(int port = 0, int expected_clients = 64) {
    int to_parent[2], to_child[2];
    if (::pipe(to_parent) != 0 || ::pipe(to_child) != 0) return;
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(to_parent[0]);
      ::close(to_child[1]);
      auto server = TcpStoreServer::start(HostPort{"127.0.0.1", static_cast<uint16_t>(port)},
                                          expected_clients);
      int32_t reported = server.is_ok() ? (*server)->address().port : -1;
      if (!server.is_ok()) std::fprintf(stderr, "%s\n", server.status().to_string().c_str());
      (void)!::write(to_parent[1], &reported, sizeof reported);
      char c;
      while (::read(to_child[0], &c, 1) > 0) {
      }
      uint64_t rejected = server.is_ok() ? (*server)->rejected_requests() : 0;
      (void)!::write(to_parent[1], &rejected, sizeof rejected);
      if (server.is_ok()) (*server)->stop();
      std::fflush(nullptr);
      ::_exit(server.is_ok() ? 0 : 1);
    }
    ::close(to_parent[1]);
    ::close(to_child[0]);
    from_child_ = to_parent[0];
    to_child_ = to_child[1];
    int32_t p = -1;
    if (::read(from_child_, &p, sizeof p) == sizeof p) port_ = p;
  }

  ~ServerProcess() { stop(); }

  int port() const { return port_; }
  HostPort address() const { return HostPort{"127.0.0.1", static_cast<uint16_t>(port_)}; }

  // Stops the server; returns its exit code (0 = healthy to the end).
  int stop() {
    if (pid_ <= 0) return exit_code_;
    ::close(to_child_);
    uint64_t r = 0;
    if (::read(from_child_, &r, sizeof r) == sizeof r) rejected_ = r;
    ::close(from_child_);
    exit_code_ = wait_all({pid_}, std::chrono::seconds(10))[0];
    pid_ = -1;
    return exit_code_;
  }
  uint64_t rejected() const { return rejected_; }

 private:
  pid_t pid_ = -1;
  int port_ = -1;
  int from_child_ = -1;
  int to_child_ = -1;
  int exit_code_ = -1;
  uint64_t rejected_ = 0;
};

}  // namespace rdmaflow::testing
