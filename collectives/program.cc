#include "collectives/program.h"

#include <algorithm>
#include <sstream>

namespace rdmaflow {

Program::Program(int world, DataType type, ReduceOp op, size_t piece_elems)
    : world_(world),
      type_(type),
      op_(op),
      elem_size_(dtype_size(type)),
      piece_elems_(std::max<size_t>(1, piece_elems)),
      sends_(static_cast<size_t>(std::max(world, 1)), 0),
      recvs_(static_cast<size_t>(std::max(world, 1)), 0) {}

void Program::add(Item item) {
  item.step = step_;
  items_.push_back(item);
}

Program::Group::Group(Program& p, std::span<const int> ranks) : p_(p), saved_(p.map_) {
  std::vector<int> map(ranks.begin(), ranks.end());
  for (int& r : map) r = p.real(r);
  p_.map_ = std::move(map);
}

Program::Group::~Group() {
  p_.map_ = std::move(saved_);
}

void Program::send(int peer, const void* src, size_t elems) {
  peer = real(peer);
  const auto* p = static_cast<const std::byte*>(src);
  for (size_t off = 0; off < elems; off += piece_elems_) {
    Item it;
    it.kind = ItemKind::kSend;
    it.peer = peer;
    it.ordinal = sends_[peer]++;
    it.src = p + off * elem_size_;
    it.elems = std::min(piece_elems_, elems - off);
    add(it);
  }
}

void Program::recv(int peer, void* dst, size_t elems) {
  peer = real(peer);
  auto* p = static_cast<std::byte*>(dst);
  for (size_t off = 0; off < elems; off += piece_elems_) {
    Item it;
    it.kind = ItemKind::kRecv;
    it.peer = peer;
    it.ordinal = recvs_[peer]++;
    it.dst = p + off * elem_size_;
    it.elems = std::min(piece_elems_, elems - off);
    add(it);
  }
}

void Program::recv_reduce(int peer, void* dst, const void* operand, size_t elems) {
  peer = real(peer);
  auto* p = static_cast<std::byte*>(dst);
  const auto* a = static_cast<const std::byte*>(operand);
  for (size_t off = 0; off < elems; off += piece_elems_) {
    Item it;
    it.kind = ItemKind::kRecv;
    it.reduce = true;
    it.peer = peer;
    it.ordinal = recvs_[peer]++;
    it.dst = p + off * elem_size_;
    it.src = a + off * elem_size_;
    it.elems = std::min(piece_elems_, elems - off);
    add(it);
  }
}

void Program::local(ItemKind kind, void* dst, const void* src, size_t elems) {
  if (elems == 0) return;
  Item it;
  it.kind = kind;
  it.dst = static_cast<std::byte*>(dst);
  it.src = static_cast<const std::byte*>(src);
  it.elems = elems;
  add(it);
}

void Program::copy(void* dst, const void* src, size_t elems) {
  if (dst != src) local(ItemKind::kCopy, dst, src, elems);
}

void Program::scale(void* dst, size_t elems) {
  local(ItemKind::kScale, dst, nullptr, elems);
}

void Program::reduce(void* dst, const void* src, size_t elems) {
  local(ItemKind::kReduce, dst, src, elems);
}

namespace {

struct Access {
  const std::byte* lo = nullptr;
  const std::byte* hi = nullptr;
  bool empty() const { return lo == hi; }
};

bool overlap(const Access& a, const Access& b) {
  return !a.empty() && !b.empty() && a.lo < b.hi && b.lo < a.hi;
}

}  // namespace

void Program::finalize() {
  const size_t n = items_.size();
  std::vector<Access> reads(n), writes(n);
  for (size_t i = 0; i < n; ++i) {
    const Item& it = items_[i];
    const size_t bytes = it.elems * elem_size_;
    switch (it.kind) {
      case ItemKind::kSend:
        reads[i] = {it.src, it.src + bytes};
        break;
      case ItemKind::kRecv:
        writes[i] = {it.dst, it.dst + bytes};
        if (it.reduce) reads[i] = {it.src, it.src + bytes};
        break;
      case ItemKind::kCopy:
      case ItemKind::kReduce:
        // A reduce also reads dst, which it writes: the write range already
        // orders it against every earlier and later access to dst.
        writes[i] = {it.dst, it.dst + bytes};
        reads[i] = {it.src, it.src + bytes};
        break;
      case ItemKind::kScale:
        writes[i] = {it.dst, it.dst + bytes};
        reads[i] = writes[i];
        break;
    }
  }
  deps_.assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < i; ++j) {
      // RAW, WAR and WAW hazards between an earlier item j and item i.
      if (overlap(writes[j], reads[i]) || overlap(reads[j], writes[i]) ||
          overlap(writes[j], writes[i])) {
        deps_[i].push_back(static_cast<uint32_t>(j));
      }
    }
  }
}

std::string Program::describe() const {
  std::ostringstream os;
  for (size_t i = 0; i < items_.size(); ++i) {
    const Item& it = items_[i];
    os << "#" << i << " step " << it.step << ": ";
    switch (it.kind) {
      case ItemKind::kSend:
        os << "send " << it.elems << " to rank " << it.peer << " (piece " << it.ordinal << ")";
        break;
      case ItemKind::kRecv:
        os << (it.reduce ? "recv+reduce " : "recv ") << it.elems << " from rank " << it.peer
           << " (piece " << it.ordinal << ")";
        break;
      case ItemKind::kCopy:
        os << "copy " << it.elems;
        break;
      case ItemKind::kScale:
        os << "scale " << it.elems;
        break;
      case ItemKind::kReduce:
        os << "reduce " << it.elems;
        break;
    }
    if (!deps_.empty() && !deps_[i].empty()) {
      os << " after";
      for (uint32_t d : deps_[i]) os << " #" << d;
    }
    os << "\n";
  }
  return os.str();
}

BlockRange block_range(size_t count, size_t blocks, size_t b) {
  const size_t base = count / blocks;
  const size_t rem = count % blocks;
  return {b * base + std::min(b, rem), base + (b < rem ? 1 : 0)};
}

}  // namespace rdmaflow
