// RemoteKey parsing (transport/remote_key.h): a key from a peer either parses or
// is refused; a parsed key serializes back to exactly its bytes (one encoding, so
// nothing the parser ignores can smuggle data), and covers() never grants a byte
// outside [0, length).
//
// Input: a serialized RemoteKey, then two u64 (an offset and a length to check).
#include "fuzz/fuzz_target.h"
#include "transport/remote_key.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 16) return 0;
  const std::span<const uint8_t> bytes(data, size - 16);
  rdmaflow::fuzz::Input tail(data + size - 16, 16);
  uint64_t offset = 0, len = 0;
  tail.take(offset);
  tail.take(len);
  auto key = rdmaflow::RemoteKey::deserialize(bytes);
  if (!key) return 0;
  const auto again = key->serialize();
  FUZZ_CHECK(again.size() == bytes.size() && std::equal(again.begin(), again.end(), bytes.begin()));
  const bool inside = static_cast<unsigned __int128>(offset) + len <= key->length;
  FUZZ_CHECK(key->covers(offset, len) == inside);
  return 0;
}

rdmaflow::fuzz::Seeds fuzz_seeds() {
  auto seed = [](rdmaflow::RemoteKey k, uint64_t offset, uint64_t len) {
    auto out = k.serialize();
    rdmaflow::fuzz::append(out, offset);
    rdmaflow::fuzz::append(out, len);
    return out;
  };
  rdmaflow::RemoteKey tcp{
      .backend = "tcp", .key_id = 3, .secret = {0x1234}, .addr = 0x7f0000001000, .length = 4096};
  rdmaflow::RemoteKey ucx = tcp;
  ucx.backend = "ucx";
  ucx.blob.assign(96, 0xab);
  return {{"tcp", seed(tcp, 100, 200)}, {"ucx", seed(ucx, 4000, 200)}};
}
