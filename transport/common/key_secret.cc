#include "transport/common/key_secret.h"

#include <pthread.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

#include "common/log.h"

namespace rdmaflow {

namespace {

struct Pool {
  static constexpr size_t kValues = 32;
  std::mutex mu;
  uint64_t values[kValues] = {};
  size_t next = kValues;  // kValues: empty
};

Pool* g_pool = nullptr;  // set once, by pool(), before the fork handlers exist

// A child must not hand out the values its parent still holds: it drops them. The
// mutex is held across fork() so the child never inherits it locked by a thread
// that does not exist there.
void before_fork() {
  g_pool->mu.lock();
}
void after_fork_in_parent() {
  g_pool->mu.unlock();
}
void after_fork_in_child() {
  std::memset(g_pool->values, 0, sizeof(g_pool->values));
  g_pool->next = Pool::kValues;
  g_pool->mu.unlock();
}

Pool& pool() {
  // Never freed: a key may be exported from another object's static destructor.
  static Pool* const p = [] {
    g_pool = new Pool;
    if (int rc = ::pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
        rc != 0) {
      RDMAFLOW_LOG_WARN(
          "key secrets: pthread_atfork failed ({}); a forked child shares the "
          "parent's unused secrets",
          std::strerror(rc));
    }
    return g_pool;
  }();
  return *p;
}

}  // namespace

Result<KeySecret> key_secret() {
  RDMAFLOW_ASSIGN_OR_RETURN(const uint64_t lo, key_random64());
  RDMAFLOW_ASSIGN_OR_RETURN(const uint64_t hi, key_random64());
  return KeySecret{lo, hi};
}

Result<uint64_t> key_random64() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.next == Pool::kValues) {
    auto* out = reinterpret_cast<uint8_t*>(p.values);
    size_t got = 0;
    while (got < sizeof(p.values)) {
      const ssize_t n = ::getrandom(out + got, sizeof(p.values) - got, 0);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n < 0 && errno != EINTR) {
        return RDMAFLOW_ERROR(Code::kInternal, "make key secret", -1,
                              std::string("getrandom failed: ") + std::strerror(errno));
      }
    }
    p.next = 0;
  }
  const uint64_t v = p.values[p.next];
  p.values[p.next++] = 0;  // a value leaves the pool once
  return v;
}

}  // namespace rdmaflow
