#include "common/job_secret.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/env.h"
#include "common/log.h"

namespace rdmaflow {

namespace {

constexpr size_t kMinSecret = 16;
constexpr size_t kMaxSecret = 4096;
constexpr size_t kHostSecretBytes = 32;

Status bad(const std::string& why) {
  return RDMAFLOW_ERROR(Code::kInvalidArgument, "load job secret", -1, why);
}

std::string errno_text() {
  return std::strerror(errno);
}

// Reads a secret file of this user only: a secret others can read is no secret,
// and a symlink could hand us somebody else's file.
Result<std::vector<uint8_t>> read_private_file(const std::string& path, const char* what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return bad(std::string(what) + " " + path + ": cannot open: " + errno_text());
  struct stat st {};
  std::vector<uint8_t> out;
  std::string problem;
  if (::fstat(fd, &st) != 0) {
    problem = "cannot stat: " + errno_text();
  } else if (!S_ISREG(st.st_mode)) {
    problem = "not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    problem = "owned by uid " + std::to_string(st.st_uid) + ", not by this user";
  } else if ((st.st_mode & 077) != 0) {
    problem = "readable or writable by others (run: chmod 600 " + path + ")";
  } else if (st.st_size < static_cast<off_t>(kMinSecret) ||
             st.st_size > static_cast<off_t>(kMaxSecret)) {
    problem = "holds " + std::to_string(st.st_size) + " bytes; a secret has " +
              std::to_string(kMinSecret) + ".." + std::to_string(kMaxSecret);
  } else {
    out.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    out.resize(got);
    // A trailing newline is an editor's, not part of the secret (the same file
    // written by `echo` and by `printf` must give the same secret).
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    if (out.size() < kMinSecret) problem = "holds fewer than 16 bytes";
  }
  ::close(fd);
  if (!problem.empty()) return bad(std::string(what) + " " + path + ": " + problem);
  return out;
}

// A directory of this user's only, made if missing; false if it is anyone else's.
bool private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return false;
  struct stat st {};
  return ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
         (st.st_mode & 077) == 0;
}

// Creates `path` with fresh random bytes unless it exists. Racing processes agree:
// each writes its own temporary file and link(2)s it into place, which fails for
// every one but the first; the losers then read the winner's file.
Status create_host_secret(const std::string& path) {
  uint8_t bytes[kHostSecretBytes];
  if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) {
    return bad("getrandom for the host secret failed: " + errno_text());
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return bad("cannot create " + tmp + ": " + errno_text());
  const bool written = ::write(fd, bytes, sizeof bytes) == static_cast<ssize_t>(sizeof bytes);
  ::close(fd);
  const bool linked = written && (::link(tmp.c_str(), path.c_str()) == 0 || errno == EEXIST);
  ::unlink(tmp.c_str());
  if (!linked) return bad("cannot write the host secret " + path + ": " + errno_text());
  return Status::ok();
}

Result<JobSecret> host_default_secret() {
  // $XDG_RUNTIME_DIR is per user and in memory; HOME outlives reboots; /tmp is the
  // last resort, accepted only if the directory there is ours alone.
  std::vector<std::string> dirs;
  if (auto d = env_string("XDG_RUNTIME_DIR")) dirs.push_back(*d + "/rdmaflow");
  if (auto h = env_string("HOME")) dirs.push_back(*h + "/.cache/rdmaflow");
  dirs.push_back("/tmp/rdmaflow-" + std::to_string(::geteuid()));
  std::string tried;
  for (const std::string& dir : dirs) {
    if (!private_dir(dir)) {
      tried += (tried.empty() ? "" : ", ") + dir;
      continue;
    }
    const std::string path = dir + "/host-secret";
    if (::access(path.c_str(), F_OK) != 0) RDMAFLOW_RETURN_IF_ERROR(create_host_secret(path));
    RDMAFLOW_ASSIGN_OR_RETURN(auto key, read_private_file(path, "host secret"));
    return JobSecret{SecretSource::kHostDefault, std::move(key), path};
  }
  return bad("no private directory for the per-user host secret (tried " + tried +
             "); set RDMAFLOW_JOB_SECRET_FILE (docs/security.md)");
}

}  // namespace

Result<JobSecret> load_job_secret() {
  if (auto auth = env_string("RDMAFLOW_AUTH")) {
    if (*auth == "0") {
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true)) {
        RDMAFLOW_LOG_WARN(
            "RDMAFLOW_AUTH=0: connections are not authenticated; any process that reaches a "
            "port of this job can read and write its registered memory");
      }
      return JobSecret{SecretSource::kDisabled, {}, "RDMAFLOW_AUTH=0"};
    }
    if (*auth != "1") return bad("RDMAFLOW_AUTH='" + *auth + "' is neither 0 nor 1");
  }
  if (auto s = env_string("RDMAFLOW_JOB_SECRET")) {
    if (s->size() < kMinSecret || s->size() > kMaxSecret) {
      return bad("RDMAFLOW_JOB_SECRET has " + std::to_string(s->size()) + " bytes; use " +
                 std::to_string(kMinSecret) + ".." + std::to_string(kMaxSecret) +
                 " (e.g. openssl rand -hex 32)");
    }
    return JobSecret{SecretSource::kEnv, std::vector<uint8_t>(s->begin(), s->end()),
                     "RDMAFLOW_JOB_SECRET"};
  }
  if (auto path = env_string("RDMAFLOW_JOB_SECRET_FILE")) {
    RDMAFLOW_ASSIGN_OR_RETURN(auto key, read_private_file(*path, "RDMAFLOW_JOB_SECRET_FILE"));
    return JobSecret{SecretSource::kFile, std::move(key), *path};
  }
  return host_default_secret();
}

std::string multi_host_secret_advice() {
  return "no job secret is configured, and the per-user host secret only serves ranks on one "
         "host: give every rank the same RDMAFLOW_JOB_SECRET_FILE (or RDMAFLOW_JOB_SECRET), "
         "or set RDMAFLOW_AUTH=0 to run without authentication (docs/security.md)";
}

}  // namespace rdmaflow
