#include "transport/tcp/tcp_landing.h"

#include <algorithm>

namespace rdmaflow::tcp {

bool LandingTable::post(int peer, const void* at, size_t len, void* dst) {
  if (len == 0) return false;
  const auto* a = static_cast<const uint8_t*>(at);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& l : posted_) {
    if (a < l->at + l->len && l->at < a + len) return false;
  }
  auto l = std::make_shared<Landing>();
  l->peer = peer;
  l->at = a;
  l->len = len;
  l->dst = static_cast<uint8_t*>(dst);
  posted_.push_back(std::move(l));
  count_.store(posted_.size(), std::memory_order_relaxed);
  return true;
}

Channel::Landed LandingTable::take(int peer, const void* at) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = std::find_if(posted_.begin(), posted_.end(),
                         [&](const auto& l) { return l->peer == peer && l->at == at; });
  if (it == posted_.end()) return {};
  std::shared_ptr<Landing> l = std::move(*it);
  *it = std::move(posted_.back());
  posted_.pop_back();
  count_.store(posted_.size(), std::memory_order_relaxed);
  l->withdrawn = true;
  left_.wait(lock, [&] { return l->receiving == 0; });
  return l->landed;
}

std::shared_ptr<LandingTable::Landing> LandingTable::match(int peer, const uint8_t* at,
                                                           size_t len) {
  if (count_.load(std::memory_order_relaxed) == 0 || len == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& l : posted_) {
    if (l->peer != peer || at < l->at || at + len > l->at + l->len) continue;
    if (l->withdrawn || l->matched == Channel::Landed::kMaxRanges) return nullptr;
    ++l->matched;
    return l;
  }
  return nullptr;
}

bool LandingTable::enter(Landing& l) {
  std::lock_guard<std::mutex> lock(mu_);
  if (l.withdrawn) return false;
  ++l.receiving;
  return true;
}

void LandingTable::leave(Landing& l) {
  std::lock_guard<std::mutex> lock(mu_);
  if (--l.receiving == 0 && l.withdrawn) left_.notify_all();
}

void LandingTable::landed(Landing& l, size_t offset, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  if (l.withdrawn) return;
  l.landed.ranges[l.landed.count++] = {offset, len};
}

}  // namespace rdmaflow::tcp
