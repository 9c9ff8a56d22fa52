// What a Session decodes from its peers (runtime/session/): the dynamic-shape
// header a sender writes into a metadata slot (session_dynamic.h) and the setup
// record of the key exchange (session_layout.h). Either parses or is refused;
// a parsed header's shape, dtype and byte count agree without wrapping, and both
// encode back to what decodes the same.
//
// Input: u8 which (even: dynamic header, odd: setup record) | u8 copies | bytes.
#include "fuzz/fuzz_target.h"
#include "runtime/session/session_dynamic.h"
#include "runtime/session/session_layout.h"

namespace sd = rdmaflow::session_detail;
using rdmaflow::RemoteKey;

namespace {

bool same_key(const RemoteKey& a, const RemoteKey& b) {
  return a.serialize() == b.serialize();
}

void dynamic_header(std::span<const uint8_t> bytes) {
  auto h = sd::decode_dynamic_header(bytes);
  if (!h) return;
  FUZZ_CHECK(h->dims.size() <= sd::kMaxDynamicDims);
  unsigned __int128 n = rdmaflow::dtype_size(h->dtype);
  for (int64_t d : h->dims) {
    FUZZ_CHECK(d >= 0);
    n *= static_cast<uint64_t>(d);
    if (n > UINT64_MAX) n = static_cast<unsigned __int128>(UINT64_MAX) + 1;  // stays wrong
  }
  FUZZ_CHECK(n == h->bytes);
  FUZZ_CHECK(h->inline_payload || (h->key && h->key->length >= h->bytes));
  std::vector<uint8_t> out(bytes.size());
  FUZZ_CHECK(sd::encode_dynamic_header(*h, out).is_ok());  // never longer than what decoded
  auto again = sd::decode_dynamic_header(out);
  FUZZ_CHECK(again.is_ok());
  FUZZ_CHECK(again->dtype == h->dtype && again->inline_payload == h->inline_payload &&
             again->step == h->step && again->bytes == h->bytes && again->dims == h->dims);
  FUZZ_CHECK(again->key.has_value() == h->key.has_value());
  if (h->key) FUZZ_CHECK(same_key(*again->key, *h->key));
  FUZZ_CHECK(again->more_keys.size() == h->more_keys.size());
}

void setup_record(std::span<const uint8_t> bytes, uint32_t copies) {
  auto rec = sd::decode_setup_record(bytes, copies);
  if (!rec) return;
  for (const auto& s : rec->slots) FUZZ_CHECK(s.frame < copies);
  const auto again = sd::encode_setup_record(*rec);
  FUZZ_CHECK(again.size() == bytes.size() && std::equal(again.begin(), again.end(), bytes.begin()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rdmaflow::fuzz::Input in(data, size);
  uint8_t which = 0, copies = 0;
  if (!in.take(which) || !in.take(copies)) return 0;
  if (which % 2 == 0) {
    dynamic_header(in.rest());
  } else {
    setup_record(in.rest(), copies);
  }
  return 0;
}

rdmaflow::fuzz::Seeds fuzz_seeds() {
  RemoteKey key{.backend = "tcp", .key_id = 5, .secret = {77}, .addr = 4096, .length = 1 << 20};
  auto seed = [](uint8_t which, uint8_t copies, std::span<const uint8_t> body) {
    std::vector<uint8_t> out{which, copies};
    rdmaflow::fuzz::append(out, body);
    return out;
  };
  std::vector<uint8_t> meta(256);
  sd::DynamicHeader inl{.dtype = rdmaflow::DataType::kF32, .step = 3, .bytes = 24, .dims = {2, 3}};
  if (!sd::encode_dynamic_header(inl, meta).is_ok()) std::abort();
  rdmaflow::fuzz::Seeds seeds{{"dynamic_inline", seed(0, 0, meta)}};
  sd::DynamicHeader remote = inl;
  remote.inline_payload = false;
  remote.key = key;
  remote.more_keys = {key};
  std::fill(meta.begin(), meta.end(), 0);
  if (!sd::encode_dynamic_header(remote, meta).is_ok()) std::abort();
  seeds.push_back({"dynamic_keys", seed(0, 0, meta)});
  sd::SetupRecord rec;
  rec.slots = {{0, 0, key}, {0, 1, key}, {4, 1, key}};
  rec.credits = {{1, key}};
  seeds.push_back({"setup", seed(1, 2, sd::encode_setup_record(rec))});
  return seeds;
}
