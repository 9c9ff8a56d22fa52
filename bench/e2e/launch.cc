#include "bench/e2e/launch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
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

}  // namespace

Result<nlohmann::json> launch(const LaunchSpec& spec) {
  const char* op = "launch job";
  const int port = dev::free_port();
  char out_template[] = "/tmp/rdmaflow-e2e-XXXXXX";
  int fd = ::mkstemp(out_template);
  if (fd < 0 || port < 0) {
    return RDMAFLOW_ERROR(Code::kInternal, op, -1, "no temporary file or free port");
  }
  ::close(fd);
  const std::string out_path = out_template;
  const std::string exe = self_exe();
  const std::string job = spec.job.dump();
  std::fflush(nullptr);
  std::vector<pid_t> pids;
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
  // Reap; a failed rank ends the job.
  const auto deadline = std::chrono::steady_clock::now() + spec.timeout;
  std::string failure;
  size_t alive = pids.size();
  std::vector<bool> done(pids.size(), false);
  if (pids.size() != static_cast<size_t>(spec.ranks)) failure = "fork failed";
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
          failure = "rank " + std::to_string(i) +
                    (WIFEXITED(status) ? " exited with code " + std::to_string(WEXITSTATUS(status))
                                       : " died of signal " + std::to_string(WTERMSIG(status)));
        }
      }
    }
    if (!failure.empty() || std::chrono::steady_clock::now() > deadline) {
      if (failure.empty()) failure = "the job did not finish within the timeout";
      // Give the others a moment to fail by themselves (they name the cause), then stop them.
      std::this_thread::sleep_for(std::chrono::milliseconds(progressed ? 200 : 0));
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

HostView host_view() {
  TransportConfig tc;
  LocalProbe probe = probe_transports("auto", tc);
  for (auto& t : probe.transports) t->shutdown();
  HostView v;
  auto d = decide_pair(0, probe.record, 1, probe.record);
  if (d) {
    v.auto_transport = d->transport;
    v.auto_reason = d->reason;
  } else {
    v.auto_reason = d.status().reason();
  }
  v.medium["grpc"] = Medium::kSocket;
  for (const auto& b : probe.record.backends) {
    if (const BackendReport* r = probe.record.usable(b.name)) {
      const Endpoint e0{0, probe.record.hostname, &r->caps};
      const Endpoint e1{1, probe.record.hostname, &r->caps};
      v.medium[b.name] = transport_reach(b.name, e0, e1, /*same_host=*/true).medium;
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
