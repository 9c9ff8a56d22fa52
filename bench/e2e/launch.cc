#include "bench/e2e/launch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "common/env.h"
#include "runtime/selection/transport_select.h"
#include "tools/free_port.h"

namespace rdmaflow::e2e {

namespace {

std::string self_exe() {
  std::vector<char> buf(4096);
  ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string();
}

// The ranks' variables a forked job sets, which must not leak into a job that
// mpirun describes.
constexpr const char* kForkedJobVars[] = {"RDMAFLOW_RANK", "RDMAFLOW_WORLD_SIZE",
                                          "RDMAFLOW_LOCAL_RANK", "RDMAFLOW_LOCAL_SIZE",
                                          "RDMAFLOW_RENDEZVOUS"};

// Forks `spec.ranks` workers of this binary on this host.
std::vector<pid_t> start_forked(const LaunchSpec& spec, const std::string& exe,
                                const std::string& job, const std::string& out_path) {
  const int port = dev::free_port();
  std::vector<pid_t> pids;
  if (port < 0) return pids;
  for (int r = 0; r < spec.ranks; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) break;
    if (pid == 0) {
      ::setenv("RDMAFLOW_RANK", std::to_string(r).c_str(), 1);
      ::setenv("RDMAFLOW_WORLD_SIZE", std::to_string(spec.ranks).c_str(), 1);
      ::setenv("RDMAFLOW_LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("RDMAFLOW_LOCAL_SIZE", std::to_string(spec.ranks).c_str(), 1);
      ::setenv("RDMAFLOW_RENDEZVOUS", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
      if (!spec.transport.empty()) ::setenv("RDMAFLOW_TRANSPORT", spec.transport.c_str(), 1);
      for (const auto& [name, value] : spec.env) ::setenv(name.c_str(), value.c_str(), 1);
      ::setenv("RDMAFLOW_E2E_JOB", job.c_str(), 1);
      ::setenv("RDMAFLOW_E2E_OUT", out_path.c_str(), 1);
      char* argv[] = {const_cast<char*>(exe.c_str()), const_cast<char*>("--e2e-worker"), nullptr};
      ::execv(exe.c_str(), argv);
      std::_Exit(127);
    }
    pids.push_back(pid);
  }
  return pids;
}

// Starts mpirun with the workers on the hosts; its pid, or -1.
pid_t start_mpirun(const LaunchSpec& spec, const std::string& exe, const std::string& job,
                   const std::string& out_path) {
  const HostLayout& layout = *spec.hosts;
  std::string hosts;
  for (const auto& [name, slots] : layout.take(spec.ranks)) {
    hosts += (hosts.empty() ? "" : ",") + name + ":" + std::to_string(slots);
  }
  std::vector<std::string> args = {"mpirun", "--bind-to", "none"};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  if (!layout.rsh_agent.empty()) {
    args.insert(args.end(), {"--mca", "plm_rsh_agent", layout.rsh_agent});
  }
  args.insert(args.end(), layout.mpirun_args.begin(), layout.mpirun_args.end());
  args.insert(args.end(), {"-H", hosts, "-np", std::to_string(spec.ranks)});
  // The job's variables, exported to every rank (-x NAME takes mpirun's value).
  std::vector<std::pair<std::string, std::string>> vars = {{"RDMAFLOW_E2E_JOB", job},
                                                           {"RDMAFLOW_E2E_OUT", out_path}};
  if (!spec.transport.empty()) vars.emplace_back("RDMAFLOW_TRANSPORT", spec.transport);
  vars.insert(vars.end(), spec.env.begin(), spec.env.end());
  // The timeline trace reaches the ranks on other hosts too (docs/observability.md).
  if (const char* v = std::getenv("RDMAFLOW_TRACE")) vars.emplace_back("RDMAFLOW_TRACE", v);
  if (const char* v = std::getenv("RDMAFLOW_TRACE_EVENTS")) {
    vars.emplace_back("RDMAFLOW_TRACE_EVENTS", v);
  }
  for (const auto& v : vars) args.insert(args.end(), {"-x", v.first});
  args.insert(args.end(), {exe, "--e2e-worker"});
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  for (const char* v : kForkedJobVars) ::unsetenv(v);
  if (spec.transport.empty()) ::unsetenv("RDMAFLOW_TRANSPORT");
  for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
  // mpirun's own output (its daemons' messages) must not mix into the tables.
  ::dup2(STDERR_FILENO, STDOUT_FILENO);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execvp("mpirun", argv.data());
  std::fprintf(stderr, "e2e: cannot run mpirun: %s\n", std::strerror(errno));
  std::_Exit(127);
}

// Waits for every process; a failed one ends the job (the others are stopped).
std::string reap(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout,
                 const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string failure;
  size_t alive = pids.size();
  std::vector<bool> done(pids.size(), false);
  while (alive > 0) {
    bool progressed = false;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      pid_t got = ::waitpid(pids[i], &status, WNOHANG);
      if (got == pids[i]) {
        done[i] = true;
        --alive;
        progressed = true;
        if (failure.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
          failure = what + (pids.size() > 1 ? " " + std::to_string(i) : std::string()) +
                    (WIFEXITED(status) ? " exited with code " + std::to_string(WEXITSTATUS(status))
                                       : " died of signal " + std::to_string(WTERMSIG(status)));
        }
      }
    }
    if (!failure.empty() || std::chrono::steady_clock::now() > deadline) {
      if (failure.empty()) failure = "the job did not finish within the timeout";
      // Give the others a moment to fail by themselves (they name the cause),
      // then stop them: mpirun gets SIGTERM first, to take its ranks down.
      std::this_thread::sleep_for(std::chrono::milliseconds(progressed ? 200 : 0));
      for (size_t i = 0; i < pids.size(); ++i) {
        if (!done[i]) ::kill(pids[i], SIGTERM);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      for (size_t i = 0; i < pids.size(); ++i) {
        if (!done[i]) ::kill(pids[i], SIGKILL);
      }
      for (size_t i = 0; i < pids.size(); ++i) {
        if (!done[i]) ::waitpid(pids[i], nullptr, 0);
      }
      break;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return failure;
}

}  // namespace

Result<HostLayout> HostLayout::parse(const std::string& text) {
  HostLayout l;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t colon = item.find(':');
    std::string name = item.substr(0, colon);
    int slots = 1;
    if (colon != std::string::npos) {
      const std::string n = item.substr(colon + 1);
      char* end = nullptr;
      const long v = std::strtol(n.c_str(), &end, 10);
      if (n.empty() || *end != '\0' || v < 1 || v > 1024) {
        return RDMAFLOW_ERROR(Code::kInvalidArgument, "parse --hosts", -1,
                              "'" + item + "' in '" + text + "': slots must be 1..1024");
      }
      slots = static_cast<int>(v);
    }
    if (name.empty()) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, "parse --hosts", -1,
                            "'" + text + "' has an empty host name (HOST[:SLOTS],...)");
    }
    l.hosts.emplace_back(name, slots);
  }
  if (l.hosts.empty()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "parse --hosts", -1,
                          "'" + text + "' names no host (HOST[:SLOTS],...)");
  }
  return l;
}

int HostLayout::slots() const {
  int n = 0;
  for (const auto& h : hosts) n += h.second;
  return n;
}

std::vector<std::pair<std::string, int>> HostLayout::take(int ranks) const {
  if (ranks == slots()) return hosts;
  std::vector<std::pair<std::string, int>> out;
  for (const auto& h : hosts) out.emplace_back(h.first, 0);
  for (int placed = 0, i = 0; placed < ranks; i = (i + 1) % static_cast<int>(out.size())) {
    out[static_cast<size_t>(i)].second++;
    ++placed;
  }
  std::erase_if(out, [](const auto& h) { return h.second == 0; });
  return out;
}

std::vector<std::string> HostLayout::place(int ranks) const {
  std::vector<std::string> out;
  for (const auto& [name, n] : take(ranks)) out.insert(out.end(), static_cast<size_t>(n), name);
  return out;
}

Result<std::string> shared_path(const HostLayout* hosts, const std::string& name) {
  std::string dir = "/tmp";
  if (hosts != nullptr) {
    const std::string exe = self_exe();
    dir = exe.substr(0, exe.rfind('/'));
  }
  std::string path = dir + "/rdmaflow-e2e-" + name + "-XXXXXX";
  int fd = ::mkstemp(path.data());
  if (fd < 0) {
    return RDMAFLOW_ERROR(Code::kInternal, "launch job", -1,
                          "cannot create a file in " + dir + ": " + std::strerror(errno));
  }
  ::close(fd);
  return path;
}

Result<nlohmann::json> launch(const LaunchSpec& spec) {
  const char* op = "launch job";
  if (spec.hosts != nullptr && spec.ranks > spec.hosts->slots()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          "the job has " + std::to_string(spec.ranks) + " ranks, the hosts " +
                              std::to_string(spec.hosts->slots()) + " slots");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(const std::string out_path, shared_path(spec.hosts, "result"));
  const std::string exe = self_exe();
  const std::string job = spec.job.dump();
  std::fflush(nullptr);
  std::string failure;
  if (spec.hosts == nullptr) {
    const std::vector<pid_t> pids = start_forked(spec, exe, job, out_path);
    if (pids.size() != static_cast<size_t>(spec.ranks)) failure = "fork failed";
    std::string reaped = reap(pids, spec.timeout, "rank");
    if (failure.empty()) failure = reaped;
  } else {
    const pid_t pid = start_mpirun(spec, exe, job, out_path);
    failure = pid < 0 ? "fork failed" : reap({pid}, spec.timeout, "mpirun");
  }
  std::ifstream in(out_path);
  std::stringstream ss;
  ss << in.rdbuf();
  ::unlink(out_path.c_str());
  if (!failure.empty()) return RDMAFLOW_ERROR(Code::kPeerFailed, op, -1, failure);
  auto result = nlohmann::json::parse(ss.str(), nullptr, false);
  if (result.is_discarded()) {
    return RDMAFLOW_ERROR(Code::kProtocolError, op, 0, "rank 0 wrote no result");
  }
  return result;
}

Result<bench::LinkRate> measure_link(const HostLayout& hosts, double seconds) {
  if (hosts.hosts.size() < 2) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "measure the link rate", -1,
                          "needs two hosts; --hosts names one");
  }
  LaunchSpec spec;
  spec.ranks = 2;
  spec.hosts = &hosts;
  spec.job = {{"kind", "link"}, {"seconds", seconds}, {"streams", 4}};
  spec.timeout = std::chrono::milliseconds(60000 + static_cast<int64_t>(seconds * 2000));
  RDMAFLOW_ASSIGN_OR_RETURN(nlohmann::json result, launch(spec));
  return bench::LinkRate::from_json(result);
}

HostView host_view(const HostLayout* hosts) {
  TransportConfig tc;
  LocalProbe probe = probe_transports("auto", tc);
  for (auto& t : probe.transports) t->shutdown();
  HostView v;
  // A rank of another host like this one.
  RankCapabilities other = probe.record;
  other.host_id += "'";
  if (hosts != nullptr && hosts->hosts.size() > 1) {
    probe.record.hostname = hosts->hosts[0].first;
    other.hostname = hosts->hosts[1].first;
  } else {
    other.hostname = "another host";
  }
  auto d = decide_pair(0, probe.record, 1, probe.record);
  if (d) {
    v.auto_transport = d->transport;
    v.auto_reason = d->reason;
  } else {
    v.auto_reason = d.status().reason();
  }
  auto across = decide_pair(0, probe.record, 1, other);
  if (across) {
    v.auto_across = across->transport;
    v.auto_across_reason = across->reason;
  } else {
    v.auto_across_reason = across.status().reason();
  }
  v.medium["grpc"] = Medium::kSocket;
  v.medium_across["grpc"] = medium_name(Medium::kSocket);
  for (const auto& b : probe.record.backends) {
    if (const BackendReport* r = probe.record.usable(b.name)) {
      const Endpoint e0{0, probe.record.hostname, &r->caps};
      const Endpoint e1{1, probe.record.hostname, &r->caps};
      const Endpoint e1_across{1, other.hostname, &r->caps};
      v.medium[b.name] = transport_reach(b.name, e0, e1, /*same_host=*/true).medium;
      const Medium m = transport_reach(b.name, e0, e1_across, /*same_host=*/false).medium;
      const auto& c = r->caps.components;
      // Named on a pair it would not offer itself for (UCX between hosts
      // without RDMA), a backend still runs over its own TCP when it has one.
      if (m == Medium::kNone && std::find(c.begin(), c.end(), "tcp") != c.end()) {
        v.medium_across[b.name] = "socket (" + b.name + " TCP)";
      } else {
        v.medium_across[b.name] = medium_name(m);
      }
    }
  }
  return v;
}

std::string HostView::medium_text(const std::string& transport) const {
  const auto m = medium.find(transport == "auto" ? auto_transport : transport);
  const Medium which = m == medium.end() ? Medium::kNone : m->second;
  std::string text = medium_name(which);
  if (which == Medium::kSharedMemory) text += " (same host)";
  return text;
}

std::string HostView::medium_text(const std::string& transport,
                                  const std::vector<std::string>& hosts) const {
  const std::set<std::string> distinct(hosts.begin(), hosts.end());
  const bool pairs_within = distinct.size() < hosts.size();
  if (distinct.size() <= 1) return medium_text(transport);
  const auto m = medium_across.find(transport == "auto" ? auto_across : transport);
  const std::string across = m == medium_across.end() ? medium_name(Medium::kNone) : m->second;
  if (!pairs_within) return across;
  const std::string within = medium_text(transport);
  return within == across ? across : within + " + " + across;
}

Result<nlohmann::json> worker_job() {
  auto job = env_string("RDMAFLOW_E2E_JOB");
  if (!job) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "start worker", -1,
                          "RDMAFLOW_E2E_JOB is not set (workers are started by the launcher)");
  }
  auto j = nlohmann::json::parse(*job, nullptr, false);
  if (j.is_discarded()) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "start worker", -1, "malformed RDMAFLOW_E2E_JOB");
  }
  return j;
}

Status write_result(const nlohmann::json& result) {
  auto path = env_string("RDMAFLOW_E2E_OUT");
  if (!path) return Status::ok();
  std::ofstream out(*path, std::ios::trunc);
  out << result.dump();
  if (!out) {
    return RDMAFLOW_ERROR(Code::kInternal, "write result", -1, "cannot write " + *path);
  }
  return Status::ok();
}

}  // namespace rdmaflow::e2e
