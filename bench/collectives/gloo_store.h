// Gloo's rendezvous through rdmaflow's store: the ranks of the bench meet Gloo
// where they met rdmaflow (the bootstrap's TcpStore), so Gloo runs wherever
// rdmaflow does, across hosts included, without a shared file system.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/rendezvous/store.h"

namespace rdmaflow::bench {

class GlooStore : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<rdmaflow::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    const auto* p = reinterpret_cast<const uint8_t*>(data.data());
    check(store_->set(key, std::span<const uint8_t>(p, data.size())));
  }

  std::vector<char> get(const std::string& key) override {
    auto got = store_->get(key);
    check(got.status());
    return std::vector<char>(got->begin(), got->end());
  }

  void wait(const std::vector<std::string>& keys) override { check(store_->wait(keys)); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    check(store_->wait(keys, timeout));
  }

 private:
  // Gloo reports store failures as exceptions.
  static void check(const Status& st) {
    if (!st.is_ok()) throw std::runtime_error("Gloo rendezvous: " + st.to_string());
  }

  std::shared_ptr<rdmaflow::Store> store_;
};

}  // namespace rdmaflow::bench
