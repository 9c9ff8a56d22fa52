#include "runtime/rendezvous/store.h"

#include <charconv>

namespace rdmaflow {

namespace {

std::string quoted(const std::string& key) {
  return "'" + key + "'";
}

std::string ms(Millis t) {
  return std::to_string(t.count()) + " ms";
}

}  // namespace

Store::Store(Millis default_timeout) : default_timeout_(default_timeout) {}

Status Store::set(const std::string& key, std::span<const uint8_t> value,
                  std::optional<Millis> timeout) {
  return do_set(key, value, timeout.value_or(default_timeout_));
}

Result<Bytes> Store::get(const std::string& key, std::optional<Millis> timeout) {
  return do_get(key, timeout.value_or(default_timeout_));
}

Status Store::wait(const std::vector<std::string>& keys, std::optional<Millis> timeout) {
  return do_wait(keys, timeout.value_or(default_timeout_));
}

Result<int64_t> Store::add(const std::string& key, int64_t delta, std::optional<Millis> timeout) {
  return do_add(key, delta, timeout.value_or(default_timeout_));
}

Result<int64_t> apply_counter_delta(const std::string& key, const Bytes* current, int64_t delta,
                                    Bytes* updated) {
  int64_t value = 0;
  if (current != nullptr) {
    const char* begin = reinterpret_cast<const char*>(current->data());
    const char* end = begin + current->size();
    auto [ptr, ec] = std::from_chars(begin, end, value);
    if (current->empty() || ec != std::errc() || ptr != end) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, "store add " + quoted(key), -1,
                            "the key holds a value that is not a counter (" +
                                std::to_string(current->size()) + " bytes)");
    }
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    return RDMAFLOW_ERROR(
        Code::kOutOfRange, "store add " + quoted(key), -1,
        "counter overflow: " + std::to_string(value) + " + " + std::to_string(delta));
  }
  *updated = to_bytes(std::to_string(sum));
  return sum;
}

std::string describe_missing_keys(const std::vector<std::string>& missing, size_t total) {
  std::string s;
  size_t shown = 0;
  for (const auto& k : missing) {
    if (shown == 8) {
      s += ", ...";
      break;
    }
    s += (shown++ == 0 ? "" : ", ") + quoted(k);
  }
  return s + " (" + std::to_string(missing.size()) + " of " + std::to_string(total) + " missing)";
}

// ---- MemoryStore ----

MemoryStore::MemoryStore(Millis default_timeout) : Store(default_timeout) {}

Status MemoryStore::do_set(const std::string& key, std::span<const uint8_t> value, Millis) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = Bytes(value.begin(), value.end());
  }
  cv_.notify_all();
  return Status::ok();
}

Result<Bytes> MemoryStore::do_get(const std::string& key, Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return data_.count(key) > 0; })) {
    return RDMAFLOW_ERROR(Code::kTimeout, "store get " + quoted(key), -1,
                          "the key did not appear within " + ms(timeout) + " (" + describe() + ")");
  }
  return data_[key];
}

Status MemoryStore::do_wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto all_present = [&] {
    for (const auto& k : keys) {
      if (data_.count(k) == 0) return false;
    }
    return true;
  };
  if (!cv_.wait_for(lock, timeout, all_present)) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (data_.count(k) == 0) missing.push_back(k);
    }
    return RDMAFLOW_ERROR(Code::kTimeout, "store wait", -1,
                          "keys did not appear within " + ms(timeout) + ": " +
                              describe_missing_keys(missing, keys.size()) + " (" + describe() +
                              ")");
  }
  return Status::ok();
}

Result<int64_t> MemoryStore::do_add(const std::string& key, int64_t delta, Millis) {
  Result<int64_t> result = int64_t{0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    Bytes updated;
    result = apply_counter_delta(key, it == data_.end() ? nullptr : &it->second, delta, &updated);
    if (!result.is_ok()) return result;
    data_[key] = std::move(updated);
  }
  cv_.notify_all();
  return result;
}

// ---- PrefixStore ----

PrefixStore::PrefixStore(std::shared_ptr<Store> base, std::string prefix)
    : Store(base->default_timeout()), base_(std::move(base)), prefix_(std::move(prefix)) {}

Status PrefixStore::do_set(const std::string& key, std::span<const uint8_t> value, Millis timeout) {
  return base_->set(full_key(key), value, timeout);
}

Result<Bytes> PrefixStore::do_get(const std::string& key, Millis timeout) {
  return base_->get(full_key(key), timeout);
}

Status PrefixStore::do_wait(const std::vector<std::string>& keys, Millis timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(full_key(k));
  return base_->wait(full, timeout);
}

Result<int64_t> PrefixStore::do_add(const std::string& key, int64_t delta, Millis timeout) {
  return base_->add(full_key(key), delta, timeout);
}

}  // namespace rdmaflow
