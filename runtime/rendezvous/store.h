// Store: the small key-value service ranks rendezvous through, in the spirit of
// Gloo's rendezvous::Store. Keys are strings, values are bytes; a key is written
// once by whoever knows it and read by everyone who needs it, waiting until it
// appears. Counters (add) make barriers.
//
// Implementations: MemoryStore (one process, e.g. world size 1), TcpStore
// (runtime/rendezvous/tcp_store.h: rank 0 serves, every rank is a client), PrefixStore (a
// namespace on top of another store).
//
// Every call has a timeout; without one, the store's default (RDMAFLOW_TIMEOUT_MS)
// applies. Errors name the operation, the key and where the store lives.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace rdmaflow {

using Millis = std::chrono::milliseconds;
using Bytes = std::vector<uint8_t>;

inline Bytes to_bytes(std::string_view s) {
  return Bytes(s.begin(), s.end());
}
inline std::string as_string(std::span<const uint8_t> b) {
  return std::string(b.begin(), b.end());
}

class Store {
 public:
  explicit Store(Millis default_timeout);
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Stores `value` under `key`, replacing an earlier value, and wakes its waiters.
  Status set(const std::string& key, std::span<const uint8_t> value,
             std::optional<Millis> timeout = std::nullopt);

  // The value of `key`, waiting until some rank has set it.
  Result<Bytes> get(const std::string& key, std::optional<Millis> timeout = std::nullopt);

  // Waits until every key in `keys` is present.
  Status wait(const std::vector<std::string>& keys, std::optional<Millis> timeout = std::nullopt);

  // Adds `delta` to the counter at `key` (absent = 0) and returns the new value.
  // Counters are stored as decimal text, so get() on one reads e.g. "3".
  Result<int64_t> add(const std::string& key, int64_t delta,
                      std::optional<Millis> timeout = std::nullopt);

  // Where the store lives, for error messages: "rendezvous 127.0.0.1:29500".
  virtual std::string describe() const = 0;

  Millis default_timeout() const { return default_timeout_; }

 protected:
  virtual Status do_set(const std::string& key, std::span<const uint8_t> value, Millis timeout) = 0;
  virtual Result<Bytes> do_get(const std::string& key, Millis timeout) = 0;
  virtual Status do_wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  virtual Result<int64_t> do_add(const std::string& key, int64_t delta, Millis timeout) = 0;

 private:
  Millis default_timeout_;
};

// Applies `delta` to a counter value stored as decimal text; shared by every store
// so counters read the same everywhere. Fails when `current` is not a counter.
Result<int64_t> apply_counter_delta(const std::string& key, const Bytes* current, int64_t delta,
                                    Bytes* updated);

// Names the keys missing from a wait, for timeout messages: "'a', 'b' (2 of 5 missing)".
std::string describe_missing_keys(const std::vector<std::string>& missing, size_t total);

// A store living in this process; safe to use from many threads.
class MemoryStore : public Store {
 public:
  explicit MemoryStore(Millis default_timeout);
  std::string describe() const override { return "in-process store"; }

 protected:
  Status do_set(const std::string& key, std::span<const uint8_t> value, Millis timeout) override;
  Result<Bytes> do_get(const std::string& key, Millis timeout) override;
  Status do_wait(const std::vector<std::string>& keys, Millis timeout) override;
  Result<int64_t> do_add(const std::string& key, int64_t delta, Millis timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> data_;
};

// A namespace inside another store: key "k" is stored as "<prefix>/k". Layers give
// each user its own prefix so their keys cannot collide.
class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix);
  std::string describe() const override { return base_->describe(); }
  const std::string& prefix() const { return prefix_; }
  std::string full_key(const std::string& key) const { return prefix_ + "/" + key; }

 protected:
  Status do_set(const std::string& key, std::span<const uint8_t> value, Millis timeout) override;
  Result<Bytes> do_get(const std::string& key, Millis timeout) override;
  Status do_wait(const std::vector<std::string>& keys, Millis timeout) override;
  Result<int64_t> do_add(const std::string& key, int64_t delta, Millis timeout) override;

 private:
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace rdmaflow
