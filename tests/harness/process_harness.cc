#include "tests/harness/process_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>

namespace rdmaflow::testing {

namespace {

using Clock = std::chrono::steady_clock;

// Pipe messages: u32 type | u32 length | bytes.
enum Msg : uint32_t {
  kAllgather = 1,      // child -> parent: contribution
  kAllgatherDone = 2,  // parent -> child: serialized contributions
  kKillDone = 4,       // parent -> child: "" or error text (answers kSignal)
  kSkip = 5,           // child -> parent: reason
  kSignal = 6,         // child -> parent: u32 rank | u32 signal; answered with kKillDone
};

constexpr int kSkipExitCode = 77;
int g_rank = -1;

bool write_all(int fd, const void* data, size_t len) {
  auto* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool send_msg(int fd, uint32_t type, const std::string& payload) {
  uint32_t head[2] = {type, static_cast<uint32_t>(payload.size())};
  return write_all(fd, head, sizeof(head)) && write_all(fd, payload.data(), payload.size());
}

// Reads exactly len bytes, waiting at most until deadline. 1 ok, 0 timeout, -1 EOF/error.
int read_exact(int fd, void* data, size_t len, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (len > 0) {
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left < 0) left = 0;
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) return 0;
    ssize_t n = ::read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return 1;
}

std::string pack(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) {
    uint32_t n = static_cast<uint32_t>(s.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out += s;
  }
  return out;
}

std::vector<std::string> unpack(const std::string& data, int count) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (int i = 0; i < count && pos + 4 <= data.size(); ++i) {
    uint32_t n;
    std::memcpy(&n, data.data() + pos, 4);
    pos += 4;
    out.push_back(data.substr(pos, n));
    pos += n;
  }
  return out;
}

int thread_count() {
  int count = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ++count;
    }
    ::closedir(d);
  }
  return count;
}

std::string describe_exit(int rank, int code) {
  if (code >= 0)
    return "rank " + std::to_string(rank) + " exited with code " + std::to_string(code);
  return "rank " + std::to_string(rank) + " killed by signal " + std::to_string(-code) + " (" +
         strsignal(-code) + ")";
}

}  // namespace

int current_rank() {
  return g_rank;
}

Status Exchange::request(uint32_t type, const std::string& payload, Millis timeout,
                         uint32_t& reply_type, std::string& reply, const char* what) {
  if (!send_msg(to_parent_, type, payload)) {
    return RDMAFLOW_ERROR(Code::kPeerFailed, what, -1, "harness parent went away");
  }
  auto deadline = Clock::now() + timeout;
  uint32_t head[2];
  int r = read_exact(from_parent_, head, sizeof(head), deadline);
  if (r == 0) {
    return RDMAFLOW_ERROR(Code::kTimeout, what, -1,
                          "no answer within " + std::to_string(timeout.count()) + " ms");
  }
  if (r < 0) return RDMAFLOW_ERROR(Code::kPeerFailed, what, -1, "harness parent went away");
  reply.assign(head[1], '\0');
  if (head[1] > 0 && read_exact(from_parent_, reply.data(), head[1], deadline) != 1) {
    return RDMAFLOW_ERROR(Code::kPeerFailed, what, -1, "truncated answer from the harness parent");
  }
  reply_type = head[0];
  return Status::ok();
}

Result<std::vector<std::string>> Exchange::allgather(const std::string& mine, Millis timeout) {
  uint32_t type = 0;
  std::string reply;
  RDMAFLOW_RETURN_IF_ERROR(request(kAllgather, mine, timeout, type, reply, "allgather"));
  if (type != kAllgatherDone) {
    return RDMAFLOW_ERROR(Code::kProtocolError, "allgather", -1, "unexpected harness answer");
  }
  return unpack(reply, world_);
}

Status Exchange::barrier(Millis timeout) {
  return allgather("", timeout).status();
}

Status Exchange::kill(int rank, Millis timeout) {
  return signal(rank, SIGKILL, timeout);
}

Status Exchange::signal(int rank, int sig, Millis timeout) {
  uint32_t type = 0;
  std::string reply;
  uint32_t body[2] = {static_cast<uint32_t>(rank), static_cast<uint32_t>(sig)};
  RDMAFLOW_RETURN_IF_ERROR(request(kSignal, std::string(reinterpret_cast<char*>(body), 8), timeout,
                                   type, reply, "signal rank"));
  if (type != kKillDone || !reply.empty()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "signal rank", rank, reply);
  }
  return Status::ok();
}

void Exchange::skip(const std::string& reason) {
  send_msg(to_parent_, kSkip, reason);
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(kSkipExitCode);
}

RunResult run_ranks(int world, const RankMain& main, const RunOptions& options) {
  RunResult result;
  result.exit_codes.assign(static_cast<size_t>(world), 0);
  if (int threads = thread_count(); threads > 1) {
    result.message = "run_ranks must fork before the test process starts threads (found " +
                     std::to_string(threads) + ")";
    return result;
  }
  struct Child {
    pid_t pid = -1;
    int to_child = -1;    // parent writes
    int from_child = -1;  // parent reads
    bool exited = false;
    int code = 0;
    std::string inbuf;
    std::optional<std::string> contribution;
  };
  std::vector<Child> kids(static_cast<size_t>(world));
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < world; ++r) {
    int up[2], down[2];
    if (::pipe2(up, O_CLOEXEC) != 0 || ::pipe2(down, O_CLOEXEC) != 0) {
      result.message = std::string("pipe: ") + std::strerror(errno);
      return result;
    }
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(up[0]);
      ::close(down[1]);
      for (int k = 0; k < r; ++k) {
        ::close(kids[static_cast<size_t>(k)].to_child);
        ::close(kids[static_cast<size_t>(k)].from_child);
      }
      ::signal(SIGPIPE, SIG_IGN);
      g_rank = r;
      Exchange ex(r, world, up[1], down[0]);
      int rc = main(r, world, ex);
      if (rc == 0 && ::testing::Test::HasFailure()) rc = 1;
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(rc);
    }
    ::close(up[1]);
    ::close(down[0]);
    Child& c = kids[static_cast<size_t>(r)];
    c.pid = pid;
    c.to_child = down[1];
    c.from_child = up[0];
    if (pid < 0) {
      result.message = std::string("fork: ") + std::strerror(errno);
      c.exited = true;
      c.code = 1;
    }
  }

  auto reap = [&](Child& c, bool block) {
    if (c.exited || c.pid < 0) return;
    int status = 0;
    pid_t p = ::waitpid(c.pid, &status, block ? 0 : WNOHANG);
    if (p != c.pid) return;
    c.exited = true;
    c.code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  };
  std::set<int> killed;
  std::string skip_reason;
  auto deadline = Clock::now() + options.timeout;
  bool timed_out = false;

  auto try_finish_allgather = [&] {
    bool any = false;
    for (auto& c : kids) {
      if (c.exited) continue;
      if (!c.contribution) return;
      any = true;
    }
    if (!any) return;
    std::vector<std::string> all;
    for (auto& c : kids) all.push_back(c.contribution.value_or(""));
    std::string packed = pack(all);
    for (auto& c : kids) {
      if (c.exited || !c.contribution) continue;
      send_msg(c.to_child, kAllgatherDone, packed);
      c.contribution.reset();
    }
  };

  signal(SIGPIPE, SIG_IGN);
  for (;;) {
    bool all_exited = true;
    for (auto& c : kids) {
      reap(c, false);
      all_exited = all_exited && c.exited;
    }
    if (all_exited) break;
    if (Clock::now() >= deadline) {
      timed_out = true;
      for (auto& c : kids) {
        if (!c.exited) ::kill(c.pid, SIGKILL);
      }
      for (auto& c : kids) reap(c, true);
      break;
    }
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int r = 0; r < world; ++r) {
      Child& c = kids[static_cast<size_t>(r)];
      if (c.from_child >= 0) {
        fds.push_back({c.from_child, POLLIN, 0});
        who.push_back(r);
      }
    }
    int n = ::poll(fds.data(), fds.size(), 20);
    if (n <= 0) {
      try_finish_allgather();
      continue;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Child& c = kids[static_cast<size_t>(who[i])];
      char buf[65536];
      ssize_t got = ::read(c.from_child, buf, sizeof(buf));
      if (got <= 0) {
        ::close(c.from_child);
        c.from_child = -1;
        reap(c, true);  // its pipe closed: it is exiting
        continue;
      }
      c.inbuf.append(buf, static_cast<size_t>(got));
      while (c.inbuf.size() >= 8) {
        uint32_t head[2];
        std::memcpy(head, c.inbuf.data(), 8);
        if (c.inbuf.size() < 8 + head[1]) break;
        std::string payload = c.inbuf.substr(8, head[1]);
        c.inbuf.erase(0, 8 + head[1]);
        if (head[0] == kAllgather) {
          c.contribution = payload;
        } else if (head[0] == kSkip) {
          skip_reason = payload;
        } else if (head[0] == kSignal && payload.size() == 8) {
          uint32_t body[2];
          std::memcpy(body, payload.data(), 8);
          uint32_t target = body[0];
          int sig = static_cast<int>(body[1]);
          std::string err;
          if (target >= static_cast<uint32_t>(world)) {
            err = "no rank " + std::to_string(target);
          } else if (sig == SIGKILL && !options.may_be_killed.count(static_cast<int>(target))) {
            err = "rank " + std::to_string(target) + " is not in RunOptions::may_be_killed";
          } else {
            Child& t = kids[target];
            if (!t.exited) {
              ::kill(t.pid, sig);
              if (sig == SIGKILL) {
                reap(t, true);
              } else if (sig == SIGSTOP) {
                int status = 0;
                if (::waitpid(t.pid, &status, WUNTRACED) == t.pid && !WIFSTOPPED(status)) {
                  t.exited = true;
                  t.code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
                }
              }
            }
            if (sig == SIGKILL) killed.insert(static_cast<int>(target));
          }
          send_msg(c.to_child, kKillDone, err);
        }
      }
    }
    for (auto& c : kids) reap(c, false);
    try_finish_allgather();
  }
  for (auto& c : kids) {
    if (c.from_child >= 0) ::close(c.from_child);
    if (c.to_child >= 0) ::close(c.to_child);
  }

  std::string failures;
  bool any_skip = false;
  for (int r = 0; r < world; ++r) {
    const Child& c = kids[static_cast<size_t>(r)];
    result.exit_codes[static_cast<size_t>(r)] = c.code;
    if (c.code == 0) continue;
    if (c.code == -SIGKILL && killed.count(r)) continue;
    if (c.code == kSkipExitCode) {
      any_skip = true;
      continue;
    }
    if (!failures.empty()) failures += "; ";
    failures += describe_exit(r, c.code);
  }
  if (timed_out) {
    failures = "timed out after " + std::to_string(options.timeout.count()) +
               " ms; ranks still running were killed" + (failures.empty() ? "" : ": " + failures);
  }
  if (!failures.empty()) {
    result.message = failures;
    return result;
  }
  if (any_skip) {
    result.skipped = true;
    result.message = skip_reason.empty() ? "skipped by a rank" : skip_reason;
    return result;
  }
  result.ok = true;
  return result;
}

}  // namespace rdmaflow::testing
