// The consumer of a notify ring (transport/shm/notify_ring.h, poll_ring() in
// ucx_recv.cc) over ring memory a hostile producer wrote: the tail is bounds-
// checked, slots are indexed from the consumer's own counter, every entry's
// sequence number is judged by entry_order(), and a delivered entry names a range
// inside a live grant.
//
// Input: u64 tail | u64 head | u64 next | u8 held (bit i: sequence number
// next + 1 + i already waits as a message) | ring slots (64 bytes each, as many as given).
#include <memory>

#include "fuzz/fuzz_target.h"
#include "transport/common/grant_table.h"
#include "transport/shm/notify_ring.h"

using namespace rdmaflow;

namespace {

constexpr uint32_t kSlots = 16;
constexpr size_t kRegion = 16 << 10;

struct World {
  std::shared_ptr<shm::NotifyRing> ring;
  GrantTable grants{"ucx"};
  std::unique_ptr<uint8_t[]> region{new uint8_t[kRegion]()};
  RemoteKey key;
  World() {
    auto r = shm::NotifyRing::create(kSlots);
    if (!r.is_ok() || !grants.add_region(region.get(), kRegion).is_ok()) std::abort();
    ring = *r;
    auto k = grants.grant(region.get() + 1024, 4096);
    if (!k.is_ok()) std::abort();
    key = *k;
  }
};

World& world() {
  static World w;
  return w;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = world();
  fuzz::Input in(data, size);
  uint64_t tail = 0, head = 0, next = 0;
  uint8_t held = 0;
  if (!in.take(tail) || !in.take(head) || !in.take(next) || !in.take(held)) return 0;
  // The producer's writes: the ring's slots (from the consumer's head on) and its tail.
  std::memset(w.ring->slot(0), 0, size_t{kSlots} * sizeof(shm::RingSlot));
  for (uint32_t i = 0; i < kSlots && in.left() > 0; ++i) {
    shm::RingSlot s;
    auto b = in.bytes(sizeof(s));
    std::memcpy(w.ring->slot(head + i), b.data(), b.size());
    if (w.ring->slot(head + i)->key_id == 0) {  // key id 0: the live grant (see fuzz_tcp_frames)
      w.ring->slot(head + i)->key_id = w.key.key_id;
      w.ring->slot(head + i)->secret = w.key.secret;
    }
  }
  w.ring->header()->tail.store(tail, std::memory_order_release);

  const auto published = shm::ring_published(w.ring->header()->tail.load(), head, kSlots);
  if (!published) return 0;  // the channel fails
  FUZZ_CHECK(*published <= kSlots);
  auto is_held = [&](uint64_t seq) {
    return seq > next && seq - next <= 8 && (held >> (seq - next - 1)) & 1;
  };
  const GrantTable::Reader grants(w.grants);
  for (uint64_t left = *published; left > 0; --left) {
    shm::RingSlot s;
    const uint8_t* p = reinterpret_cast<const uint8_t*>(w.ring->slot(head));
    FUZZ_CHECK(p >= w.ring->base() + sizeof(shm::RingHeader) &&
               p + sizeof(s) <= w.ring->base() + w.ring->length());
    std::memcpy(&s, p, sizeof(s));
    const shm::EntryOrder order = shm::entry_order(s.seq, next, is_held(s.seq));
    if (order == shm::EntryOrder::kBad) return 0;  // the channel fails
    if (order == shm::EntryOrder::kLater) break;
    FUZZ_CHECK(s.seq == next);
    uint8_t* target = nullptr;
    if (!grants.resolve(s.key_id, s.secret, s.offset, s.length, &target, "notify ring", 1)
             .is_ok()) {
      return 0;  // refused: the channel fails (or the entry is dropped if revoked)
    }
    uint8_t* begin = w.region.get() + 1024;
    FUZZ_CHECK(target >= begin && target <= begin + 4096 &&
               s.length <= static_cast<uint64_t>(begin + 4096 - target));
    ++head;
    ++next;
  }
  return 0;
}

fuzz::Seeds fuzz_seeds() {
  auto seed = [](uint64_t tail, uint64_t head, uint64_t next, uint8_t held,
                 std::vector<shm::RingSlot> slots) {
    std::vector<uint8_t> out;
    fuzz::append(out, tail);
    fuzz::append(out, head);
    fuzz::append(out, next);
    out.push_back(held);
    for (const auto& s : slots) fuzz::append(out, s);
    return out;
  };
  auto slot = [](uint64_t seq, uint64_t offset, uint64_t length) {
    shm::RingSlot s;
    s.seq = seq;
    s.offset = offset;
    s.length = length;
    s.notify = seq * 10;
    return s;
  };
  return {
      {"in_order", seed(103, 100, 7, 0, {slot(7, 0, 64), slot(8, 64, 64), slot(9, 128, 64)})},
      {"gap", seed(102, 100, 7, 1, {slot(7, 0, 64), slot(9, 64, 64)})},
      {"wrapped",
       seed(18, 14, 50, 0, {slot(50, 0, 8), slot(51, 8, 8), slot(52, 16, 8), slot(53, 24, 8)})},
  };
}
