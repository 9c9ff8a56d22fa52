#include "transport/shm/peer_process.h"

#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

namespace rdmaflow::shm {

namespace {

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Field 22 (starttime) of /proc/<pid>/stat; 0 when unreadable.
uint64_t process_start_time(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');  // the command name may contain spaces and ')'
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) {  // fields 1 and 2 are before ')'
    if (!(fields >> field)) return 0;
  }
  uint64_t v = 0;
  std::from_chars(field.data(), field.data() + field.size(), v);
  return v;
}

}  // namespace

const ProcessIdentity& self_identity() {
  static const ProcessIdentity id = [] {
    ProcessIdentity p;
    p.boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
    if (p.boot_id.empty() || p.boot_id.find(':') != std::string::npos) p.boot_id = "unknown";
    struct stat st {};
    if (::stat("/proc/self/ns/pid", &st) == 0) p.pid_ns = st.st_ino;
    p.pid = ::getpid();
    p.start_time = process_start_time(p.pid);
    return p;
  }();
  return id;
}

bool same_host(const ProcessIdentity& a, const ProcessIdentity& b) {
  return a.boot_id == b.boot_id && a.boot_id != "unknown" && a.pid_ns == b.pid_ns && a.pid_ns != 0;
}

Result<int> open_peer_pidfd(const ProcessIdentity& peer, int peer_rank, const char* op) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(peer.pid), 0));
  if (fd < 0) {
    const int err = errno;
    if (err == ESRCH) {
      return RDMAFLOW_ERROR(Code::kConnectionFailed, op, peer_rank,
                            "peer process " + std::to_string(peer.pid) + " is not running");
    }
    return RDMAFLOW_ERROR(
        Code::kConnectionFailed, op, peer_rank,
        "pidfd_open(" + std::to_string(peer.pid) + ") failed: " + std::strerror(err));
  }
  // The pidfd pins the process; now make sure it is the one that published the identity.
  if (peer.start_time != 0 && process_start_time(peer.pid) != peer.start_time) {
    ::close(fd);
    return RDMAFLOW_ERROR(Code::kConnectionFailed, op, peer_rank,
                          "peer process " + std::to_string(peer.pid) +
                              " exited (its pid now belongs to another process)");
  }
  return fd;
}

bool peer_exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

}  // namespace rdmaflow::shm
