// The store torch.distributed hands a backend (a PrefixStore over the job's
// TCPStore, or whatever init_method made), as rdmaflow's Store: the bootstrap
// meets through it, so torchrun's variables are all a user sets.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "runtime/rendezvous/store.h"

namespace rdmaflow::torch_backend {

class TorchStore : public Store {
 public:
  TorchStore(c10::intrusive_ptr<c10d::Store> store, Millis timeout)
      : Store(timeout), store_(std::move(store)) {}

  std::string describe() const override { return "torch.distributed's store"; }

 protected:
  Status do_set(const std::string& key, std::span<const uint8_t> value, Millis) override {
    return guard("set", key,
                 [&] { store_->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
  }
  Result<Bytes> do_get(const std::string& key, Millis timeout) override {
    Bytes out;
    Status st = guard("get", key, [&] {
      store_->wait({key}, timeout);
      std::vector<uint8_t> v = store_->get(key);
      out.assign(v.begin(), v.end());
    });
    if (!st.is_ok()) return st;
    return out;
  }
  Status do_wait(const std::vector<std::string>& keys, Millis timeout) override {
    return guard("wait", keys.empty() ? std::string() : keys.front(),
                 [&] { store_->wait(keys, timeout); });
  }
  Result<int64_t> do_add(const std::string& key, int64_t delta, Millis) override {
    int64_t out = 0;
    Status st = guard("add", key, [&] { out = store_->add(key, delta); });
    if (!st.is_ok()) return st;
    return out;
  }

 private:
  // torch's stores throw (c10::Error, std::runtime_error); a timeout says so
  // in its text.
  template <typename F>
  Status guard(const char* what, const std::string& key, F&& f) {
    try {
      f();
      return Status::ok();
    } catch (const std::exception& e) {
      const std::string text = e.what();
      const Code code =
          text.find("imeout") != std::string::npos ? Code::kTimeout : Code::kPeerFailed;
      return RDMAFLOW_ERROR(code, std::string("torch store ") + what + " '" + key + "'", -1,
                            text.substr(0, text.find('\n')));
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace rdmaflow::torch_backend
