// The rendezvous store server's side of its protocol (runtime/rendezvous/
// tcp_store_protocol.h, called by tcp_store.cc): frames beyond the limit end the
// connection, a body parses into a request or is refused, a parsed request
// re-encodes to the same bytes (one encoding, the client's), and sets and adds
// apply to a data map as the server applies them.
//
// Input: what a client sends, frames of u32 length | body.
#include <map>

#include "fuzz/fuzz_target.h"
#include "runtime/rendezvous/store.h"
#include "runtime/rendezvous/tcp_store_protocol.h"

namespace wire = rdmaflow::store_wire;

namespace {
const wire::Limits kLimits{.max_frame = 512, .max_key = 64};  // scaled to -max_len
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rdmaflow::fuzz::Input in(data, size);
  std::map<std::string, rdmaflow::Bytes> store;
  uint32_t len = 0;
  while (in.take(len)) {
    if (!wire::check_frame_length(len, kLimits).empty()) return 0;  // refused, closed
    FUZZ_CHECK(len <= kLimits.max_frame);
    auto body = in.bytes(len);
    if (body.size() < len) return 0;  // the client hung up mid-frame
    auto q = wire::parse_request(body, kLimits);
    if (!q) continue;  // kError reply, the connection stays usable
    const auto again = wire::encode_request(*q);
    FUZZ_CHECK(again.size() == body.size() && std::equal(again.begin(), again.end(), body.begin()));
    FUZZ_CHECK(q->keys.size() <= wire::kMaxWaitKeys);
    for (const auto& k : q->keys) FUZZ_CHECK(k.size() <= kLimits.max_key);
    if (q->op == wire::Op::kSet) {
      store[q->keys[0]] = q->value;
    } else if (q->op == wire::Op::kAdd) {
      auto it = store.find(q->keys[0]);
      rdmaflow::Bytes updated;
      auto sum = rdmaflow::apply_counter_delta(
          q->keys[0], it == store.end() ? nullptr : &it->second, q->delta, &updated);
      if (sum.is_ok()) store[q->keys[0]] = std::move(updated);
    }
  }
  return 0;
}

rdmaflow::fuzz::Seeds fuzz_seeds() {
  auto frame = [](const wire::Request& q) {
    rdmaflow::ByteWriter w;
    w.out() = wire::encode_request(q);
    return w.frame();
  };
  wire::Request set{.op = wire::Op::kSet, .keys = {"rank/0/addr"}, .value = {1, 2, 3, 4}};
  wire::Request get{.op = wire::Op::kGet, .timeout_ms = 10, .keys = {"rank/0/addr"}};
  wire::Request wait{.op = wire::Op::kWait, .timeout_ms = 5, .keys = {"a", "bb", "ccc"}};
  wire::Request add{.op = wire::Op::kAdd, .keys = {"counter"}, .delta = -3};
  wire::Request bye{.op = wire::Op::kBye, .rank = 1};
  std::vector<uint8_t> session;
  for (const auto& q : {set, get, add, add, wait, bye}) rdmaflow::fuzz::append(session, frame(q));
  return {{"set", frame(set)}, {"get", frame(get)}, {"wait", frame(wait)},
          {"add", frame(add)}, {"bye", frame(bye)}, {"session", session}};
}
