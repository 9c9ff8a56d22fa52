#include "tests/support/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
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
  kPublish = 7,        // child -> parent: a value for the test body
  kRelease = 8,        // parent -> child: return from wait_released()
};

constexpr int kSkipExitCode = 77;
constexpr int kThrewExitCode = 98;
int g_rank = -1;

// The parent's ends of every group's pipes: a rank forked while another group
// runs closes them, so that each group's ranks see EOF when the parent is gone.
std::set<int>& parent_fds() {
  static std::set<int> fds;
  return fds;
}

void close_parent_fd(int& fd) {
  if (fd < 0) return;
  parent_fds().erase(fd);
  ::close(fd);
  fd = -1;
}

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
    int wait_ms = -1;  // no deadline
    if (deadline != Clock::time_point::max()) {
      auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
      wait_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
    }
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, wait_ms);
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

Status Exchange::publish(const std::string& value) {
  if (!send_msg(to_parent_, kPublish, value)) {
    return RDMAFLOW_ERROR(Code::kPeerFailed, "publish", -1, "harness parent went away");
  }
  return Status::ok();
}

void Exchange::wait_released() {
  auto forever = Clock::time_point::max();
  for (;;) {
    uint32_t head[2];
    if (read_exact(from_parent_, head, sizeof(head), forever) != 1) return;
    std::string body(head[1], '\0');
    if (head[1] > 0 && read_exact(from_parent_, body.data(), head[1], forever) != 1) return;
    if (head[0] == kRelease) return;
  }
}

void Exchange::skip(const std::string& reason) {
  send_msg(to_parent_, kSkip, reason);
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(kSkipExitCode);
}

// ------------------------------------------------------------------ parent

struct RankGroup::State {
  struct Child {
    pid_t pid = -1;
    int to_child = -1;    // parent writes messages
    int from_child = -1;  // parent reads messages
    int output = -1;      // parent reads the rank's stdout and stderr
    bool exited = false;
    int code = 0;
    std::string inbuf;
    std::string partial_line;
    std::string last_line;
    std::optional<std::string> contribution;
    std::vector<std::string> published;
    size_t published_taken = 0;
  };

  int world = 0;
  RunOptions options;
  Clock::time_point deadline;
  std::vector<Child> kids;
  std::set<int> killed;
  std::string skip_reason;
  std::string setup_error;
  bool waited = false;

  void reap(Child& c, bool block);
  void forward_output(int rank, bool final);
  void handle(int rank, uint32_t type, const std::string& payload);
  void try_finish_allgather();
  void pump(int poll_ms);
  bool all_exited();
  void drain();
  void kill_all();
  void close_all();
};

void RankGroup::State::reap(Child& c, bool block) {
  if (c.exited || c.pid < 0) return;
  int status = 0;
  pid_t p = ::waitpid(c.pid, &status, block ? 0 : WNOHANG);
  if (p != c.pid) return;
  c.exited = true;
  c.code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// Passes the rank's complete lines on to this process's stdout, each prefixed
// with the rank; once the pipe is closed, or when `final`, the rest too.
void RankGroup::State::forward_output(int rank, bool final) {
  Child& c = kids[static_cast<size_t>(rank)];
  if (c.output < 0) return;
  bool closed = false;
  char buf[65536];
  for (;;) {
    ssize_t got = ::read(c.output, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got > 0) {
      c.partial_line.append(buf, static_cast<size_t>(got));
      continue;
    }
    closed = got == 0 || errno != EAGAIN;
    break;
  }
  size_t nl;
  while ((nl = c.partial_line.find('\n')) != std::string::npos) {
    std::string line = c.partial_line.substr(0, nl);
    c.partial_line.erase(0, nl + 1);
    if (!line.empty()) c.last_line = line;
    std::printf("[rank %d] %s\n", rank, line.c_str());
  }
  if (closed || final) {
    if (!c.partial_line.empty()) {
      c.last_line = c.partial_line;
      std::printf("[rank %d] %s\n", rank, c.partial_line.c_str());
      c.partial_line.clear();
    }
    close_parent_fd(c.output);
  }
  std::fflush(stdout);
}

void RankGroup::State::handle(int rank, uint32_t type, const std::string& payload) {
  Child& c = kids[static_cast<size_t>(rank)];
  if (type == kAllgather) {
    c.contribution = payload;
  } else if (type == kSkip) {
    skip_reason = payload;
  } else if (type == kPublish) {
    c.published.push_back(payload);
  } else if (type == kSignal && payload.size() == 8) {
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

void RankGroup::State::try_finish_allgather() {
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
}

// One round: reaps, waits up to poll_ms for messages or output, and answers.
void RankGroup::State::pump(int poll_ms) {
  for (auto& c : kids) reap(c, false);
  std::vector<pollfd> fds;
  std::vector<std::pair<int, bool>> who;  // rank, is output
  for (int r = 0; r < world; ++r) {
    Child& c = kids[static_cast<size_t>(r)];
    if (c.from_child >= 0) {
      fds.push_back({c.from_child, POLLIN, 0});
      who.emplace_back(r, false);
    }
    if (c.output >= 0) {
      fds.push_back({c.output, POLLIN, 0});
      who.emplace_back(r, true);
    }
  }
  int n = ::poll(fds.data(), fds.size(), poll_ms);
  for (size_t i = 0; n > 0 && i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    const auto [r, is_output] = who[i];
    Child& c = kids[static_cast<size_t>(r)];
    if (is_output) {
      forward_output(r, false);
      continue;
    }
    char buf[65536];
    ssize_t got = ::read(c.from_child, buf, sizeof(buf));
    if (got <= 0) {
      close_parent_fd(c.from_child);
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
      handle(r, head[0], payload);
    }
  }
  for (auto& c : kids) reap(c, false);
  try_finish_allgather();
}

bool RankGroup::State::all_exited() {
  for (auto& c : kids) {
    if (!c.exited) return false;
  }
  return true;
}

// A rank reaped right after its last message (a publish, then exit) may
// leave that message unread in its pipe: read what the pipes still hold. A
// few rounds without waiting: the data is there already, and a descendant
// that keeps a pipe open must not hold wait() up.
void RankGroup::State::drain() {
  for (int round = 0; round < 64; ++round) {
    bool open = false;
    for (auto& c : kids) open = open || c.from_child >= 0;
    if (!open) return;
    pump(0);
  }
}

void RankGroup::State::kill_all() {
  for (auto& c : kids) {
    if (!c.exited && c.pid > 0) ::kill(c.pid, SIGKILL);
  }
  for (auto& c : kids) reap(c, true);
}

void RankGroup::State::close_all() {
  for (int r = 0; r < world; ++r) {
    Child& c = kids[static_cast<size_t>(r)];
    forward_output(r, true);
    close_parent_fd(c.from_child);
    close_parent_fd(c.to_child);
  }
}

RankGroup::RankGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}
RankGroup::RankGroup(RankGroup&&) noexcept = default;

RankGroup::~RankGroup() {
  if (!state_ || state_->waited) return;
  state_->kill_all();
  state_->close_all();
}

std::optional<std::string> RankGroup::published(int rank, Millis timeout) {
  State& s = *state_;
  if (rank < 0 || rank >= s.world || s.waited) return std::nullopt;
  auto deadline = std::min(s.deadline, Clock::now() + timeout);
  auto& c = s.kids[static_cast<size_t>(rank)];
  while (c.published.size() <= c.published_taken) {
    if (c.exited || Clock::now() >= deadline) return std::nullopt;
    s.pump(20);
  }
  return c.published[c.published_taken++];
}

void RankGroup::release(int rank) {
  State& s = *state_;
  if (rank < 0 || rank >= s.world) return;
  auto& c = s.kids[static_cast<size_t>(rank)];
  if (!c.exited) send_msg(c.to_child, kRelease, "");
}

RunResult RankGroup::wait() {
  State& s = *state_;
  RunResult result;
  result.exit_codes.assign(static_cast<size_t>(s.world), 0);
  result.published.assign(static_cast<size_t>(s.world), "");
  if (s.waited) {
    result.message = "RankGroup::wait() called twice";
    return result;
  }
  bool timed_out = false;
  while (!s.all_exited()) {
    if (Clock::now() >= s.deadline) {
      timed_out = true;
      s.kill_all();
      break;
    }
    s.pump(20);
  }
  s.drain();
  s.close_all();
  s.waited = true;

  std::string failures = s.setup_error;
  bool any_skip = false;
  for (int r = 0; r < s.world; ++r) {
    const State::Child& c = s.kids[static_cast<size_t>(r)];
    result.exit_codes[static_cast<size_t>(r)] = c.code;
    if (!c.published.empty()) result.published[static_cast<size_t>(r)] = c.published.back();
    if (c.code == 0) continue;
    if (c.code == -SIGKILL && s.killed.count(r)) continue;
    if (c.code == kSkipExitCode) {
      any_skip = true;
      continue;
    }
    if (!failures.empty()) failures += "; ";
    failures += describe_exit(r, c.code);
    if (!c.last_line.empty()) failures += " (its last line: " + c.last_line + ")";
  }
  if (timed_out) {
    failures = "timed out after " + std::to_string(s.options.timeout.count()) +
               " ms; ranks still running were killed" + (failures.empty() ? "" : ": " + failures);
  }
  if (!failures.empty()) {
    result.message = failures;
    return result;
  }
  if (any_skip) {
    result.skipped = true;
    result.message = s.skip_reason.empty() ? "skipped by a rank" : s.skip_reason;
    return result;
  }
  result.ok = true;
  return result;
}

namespace {

// In the child: stdout and stderr go to `output`, line by line so that a crash
// loses nothing already printed.
[[noreturn]] void run_child(int rank, int world, const RankMain& main, int to_parent,
                            int from_parent, int output) {
  for (int fd : parent_fds()) ::close(fd);
  ::dup2(output, STDOUT_FILENO);
  ::dup2(output, STDERR_FILENO);
  ::close(output);
  // A buffer of our own: glibc keeps a stream that has already been written
  // fully buffered when setvbuf is given none.
  static char line_buffer[1 << 16];
  std::setvbuf(stdout, line_buffer, _IOLBF, sizeof line_buffer);
  ::signal(SIGPIPE, SIG_IGN);
  g_rank = rank;
  Exchange ex(rank, world, to_parent, from_parent);
  int rc = kThrewExitCode;
  try {
    rc = main(rank, world, ex);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d threw: %s\n", rank, e.what());
  } catch (...) {
    std::fprintf(stderr, "rank %d threw\n", rank);
  }
  if (rc == 0 && ::testing::Test::HasFailure()) rc = 1;
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(rc);
}

}  // namespace

RankGroup start_ranks(int world, const RankMain& main, const RunOptions& options) {
  auto s = std::make_unique<RankGroup::State>();
  s->world = world;
  s->options = options;
  // Under ThreadSanitizer the ranks run several times slower (every access of
  // the instrumented code is a call): the same test gets four times the time.
#if defined(__SANITIZE_THREAD__)
  s->deadline = Clock::now() + 4 * options.timeout;
#else
  s->deadline = Clock::now() + options.timeout;
#endif
  s->kids.resize(static_cast<size_t>(world));
  if (int threads = thread_count(); threads > 1) {
    s->setup_error = "start_ranks must fork before the test process starts threads (found " +
                     std::to_string(threads) + ")";
    for (auto& c : s->kids) c.exited = true;
    return RankGroup(std::move(s));
  }
  ::signal(SIGPIPE, SIG_IGN);
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < world; ++r) {
    auto& c = s->kids[static_cast<size_t>(r)];
    int up[2], down[2], out[2];
    if (::pipe2(up, O_CLOEXEC) != 0 || ::pipe2(down, O_CLOEXEC) != 0 ||
        ::pipe2(out, O_CLOEXEC) != 0) {
      s->setup_error = std::string("pipe: ") + std::strerror(errno);
      for (int k = r; k < world; ++k) s->kids[static_cast<size_t>(k)].exited = true;
      break;
    }
    // Room for a rank's output while the test body is busy elsewhere.
    ::fcntl(out[0], F_SETPIPE_SZ, 1 << 20);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(up[0]);
      ::close(down[1]);
      ::close(out[0]);
      run_child(r, world, main, up[1], down[0], out[1]);
    }
    ::close(up[1]);
    ::close(down[0]);
    ::close(out[1]);
    ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
    c.pid = pid;
    c.to_child = down[1];
    c.from_child = up[0];
    c.output = out[0];
    parent_fds().insert({c.to_child, c.from_child, c.output});
    if (pid < 0) {
      s->setup_error = std::string("fork: ") + std::strerror(errno);
      c.exited = true;
      c.code = 1;
    }
  }
  return RankGroup(std::move(s));
}

RunResult run_ranks(int world, const RankMain& main, const RunOptions& options) {
  return start_ranks(world, main, options).wait();
}

}  // namespace rdmaflow::testing
