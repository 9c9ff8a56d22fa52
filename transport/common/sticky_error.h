// A channel's sticky error: the contract says that once a channel fails, every
// pending and every later operation completes with that error, naming the peer.
//
// The first error set wins; later ones are dropped (set() returns false), so
// the backend fails its pending operations once, with the error that caused it.
// ok() is one atomic load: issuing paths check it before anything else, without
// a lock (`if (!error_.ok()) return reject(error_.for_op("write"))`). The error
// is written once, before ok() turns false, and never again, so a reader that
// saw !ok() reads it without a lock.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

#include "common/status.h"

namespace rdmaflow {

class StickyError {
 public:
  // Makes `error` (not OK) the sticky error unless one is set already. True
  // when it did: the caller then fails what is pending.
  bool set(const Status& error) {
    if (error.is_ok()) return false;
    std::lock_guard<std::mutex> lock(set_mu_);
    if (failed_.load(std::memory_order_relaxed)) return false;
    error_ = error;
    failed_.store(true, std::memory_order_release);
    return true;
  }

  bool ok() const { return !failed_.load(std::memory_order_acquire); }

  // OK, or the sticky error.
  Status get() const { return ok() ? Status::ok() : error_; }

  // The sticky error reported for `op` ("write", "read", ...): the same code,
  // reason, peer and origin. OK while the channel is healthy.
  Status for_op(std::string op) const {
    return ok() ? Status::ok() : error_.with_op(std::move(op));
  }

 private:
  std::mutex set_mu_;  // setters only
  std::atomic<bool> failed_{false};
  Status error_;
};

}  // namespace rdmaflow
