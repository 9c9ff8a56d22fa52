// Rabenseifner's algorithm (Thakur, Rabenseifner & Gropp 2005): a
// reduce-scatter by recursive halving (step k exchanges half of the current
// window with the rank 2^k away... from the far end) followed by an allgather
// by recursive doubling. 2 log2(p) messages, 2(p-1)/p of the data on the wire.
//
// A world that is not a power of two is folded the TRG way first: in each pair
// (2i, 2i+1) of the first 2r ranks, the even rank sends the second half of its
// vector and receives the first half; each reduces its half; the even rank then
// sends its reduced half to the odd one, which carries the pair through the
// power-of-two phase and hands the result back at the end.
//
// Pieces. A message to a rank on another host that fits a slot (the cost
// model's largest piece, which a caller's piece size caps) goes as one piece:
// there every piece costs a frame, a credit and a wake-up of both ranks on
// cores the hosts' kernels share, and the pipelining smaller pieces buy (a
// piece reduced while the next travels) saved less than that: on 4 hosts x
// 1 rank over tcp, one piece per step beat the call's 64 KiB pieces at 256
// KiB and 1 MiB (docs/benchmarks.md "Rabenseifner: one piece per step
// between hosts"). Within a host (the direct path: a put and a signal) the
// call's pieces stay. Both ends of a message cut it the same way: the choice
// depends only on the pair's hosts and the shared configuration.
#include <algorithm>
#include <limits>

#include "collectives/algorithms/registry.h"
#include "collectives/cost_model.h"
#include "collectives/topology.h"

namespace rdmaflow {
namespace {

// Sets the pieces of a step's messages by where its peer is (above); the
// call's pieces again when it goes.
class StepPieces {
 public:
  StepPieces(const CollArgs& a, Program& p) : a_(a), p_(p), call_(p.piece_elems()) {
    network_ = call_;
    if (a.hosts != nullptr && a.model != nullptr && a.hosts->world() == a.world) {
      network_ = std::max(call_, a.model->params().piece_bytes / a.es());
    }
  }
  ~StepPieces() { p_.set_piece_elems(call_); }
  StepPieces(const StepPieces&) = delete;
  StepPieces& operator=(const StepPieces&) = delete;

  // The pieces of the next message (of `elems`) to or from `peer`.
  void message(int peer, size_t elems) {
    const bool one = network_ != call_ && elems <= network_ &&
                     a_.hosts->host_of(peer) != a_.hosts->host_of(a_.rank);
    p_.set_piece_elems(one ? network_ : call_);
  }

 private:
  const CollArgs& a_;
  Program& p_;
  size_t call_, network_;
};

// Element range of virtual blocks [lo, hi) when `layout` maps virtual block v
// to its element range.
template <typename Layout>
BlockRange span(Layout layout, int lo, int hi) {
  if (lo >= hi) return {layout(lo).begin, 0};
  BlockRange first = layout(lo), last = layout(hi - 1);
  return {first.begin, last.begin + last.size - first.begin};
}

// The fold's first half: afterwards the odd rank of a pair holds both ranks'
// contributions in `acc` (full length `total`); returns where the power-of-two
// phase reads this rank's current data from.
const std::byte* fold_in(const CollArgs& a, Program& p, const Fold& f, std::byte* acc,
                         size_t total) {
  if (f.partner < 0) return a.in;
  const size_t es = a.es();
  const size_t h = total / 2;
  StepPieces pieces(a, p);
  const int q = f.partner;
  if (f.folded_away()) {
    pieces.message(q, total - h);
    p.send(q, a.in + h * es, total - h);
    pieces.message(q, h);
    p.recv_reduce(q, acc, a.in, h);
    p.send(q, acc, h);
  } else {
    pieces.message(q, h);
    p.send(q, a.in, h);
    pieces.message(q, total - h);
    p.recv_reduce(q, acc + h * es, a.in + h * es, total - h);
    pieces.message(q, h);
    p.recv(q, acc, h);
  }
  p.next_step();
  return acc;
}

// Recursive halving over the p virtual ranks: on return this rank's window is
// virtual block vrank, reduced over everyone, in `acc`.
template <typename Layout>
void halving(const CollArgs& a, Program& p, const Fold& f, Layout layout, const std::byte* cur,
             std::byte* acc) {
  const size_t es = a.es();
  StepPieces pieces(a, p);
  int lo = 0, hi = f.pof2;
  for (int d = f.pof2 / 2; d >= 1; d /= 2) {
    const int peer = fold_real_rank(f, f.vrank ^ d);
    const int mid = (lo + hi) / 2;
    const bool low = (f.vrank & d) == 0;
    BlockRange give = low ? span(layout, mid, hi) : span(layout, lo, mid);
    BlockRange keep = low ? span(layout, lo, mid) : span(layout, mid, hi);
    pieces.message(peer, give.size);
    p.send(peer, cur + give.begin * es, give.size);
    pieces.message(peer, keep.size);
    p.recv_reduce(peer, acc + keep.begin * es, cur + keep.begin * es, keep.size);
    if (low) {
      hi = mid;
    } else {
      lo = mid;
    }
    cur = acc;
    p.next_step();
  }
  if (f.pof2 == 1) p.copy(acc, cur, span(layout, 0, 1).size);
}

// Recursive doubling allgather of the virtual blocks in `buf`.
template <typename Layout>
void doubling(const CollArgs& a, Program& p, const Fold& f, Layout layout, std::byte* buf) {
  const size_t es = a.es();
  StepPieces pieces(a, p);
  for (int d = 1; d < f.pof2; d *= 2) {
    const int pv = f.vrank ^ d;
    const int lo = f.vrank & ~(d - 1), plo = pv & ~(d - 1);
    BlockRange mine = span(layout, lo, lo + d), theirs = span(layout, plo, plo + d);
    const int peer = fold_real_rank(f, pv);
    pieces.message(peer, mine.size);
    p.send(peer, buf + mine.begin * es, mine.size);
    pieces.message(peer, theirs.size);
    p.recv(peer, buf + theirs.begin * es, theirs.size);
    p.next_step();
  }
}

}  // namespace

void rabenseifner_allreduce(const CollArgs& a, Program& p) {
  if (a.world == 1) return p.copy(a.out, a.in, a.count);
  const Fold f = make_fold(a.world, a.rank);
  const std::byte* cur = fold_in(a, p, f, a.out, a.count);
  if (f.folded_away()) {
    p.recv(f.partner, a.out, a.count);
    return;
  }
  auto layout = [&](int v) { return block_range(a.count, f.pof2, v); };
  halving(a, p, f, layout, cur, a.out);
  if (a.op == ReduceOp::kAvg) {
    BlockRange mine = layout(f.vrank);
    p.scale(a.out_at(mine.begin), mine.size);
  }
  doubling(a, p, f, layout, a.out);
  if (f.partner >= 0) p.send(f.partner, a.out, a.count);
}

void rabenseifner_reduce_scatter(const CollArgs& a, Program& p) {
  const size_t c = a.count;
  if (a.world == 1) return p.copy(a.out, a.in, c);
  const Fold f = make_fold(a.world, a.rank);
  const size_t total = c * a.world;
  const std::byte* cur = fold_in(a, p, f, a.tmp, total);
  if (f.folded_away()) {
    p.recv(f.partner, a.out, c);
    return;
  }
  // Virtual block v holds the real blocks of the ranks it stands for.
  auto layout = [&](int v) {
    const size_t first = fold_first_real(f, v), last = fold_last_real(f, v);
    return BlockRange{first * c, (last - first + 1) * c};
  };
  halving(a, p, f, layout, cur, a.tmp);
  if (a.op == ReduceOp::kAvg) {
    BlockRange mine = layout(f.vrank);
    p.scale(a.tmp_at(mine.begin), mine.size);
  }
  if (f.partner >= 0) p.send(f.partner, a.tmp_at(f.partner * c), c);
  p.copy(a.out, a.tmp_at(a.rank * c), c);
}

void rabenseifner_reduce(const CollArgs& a, Program& p) {
  if (a.world == 1) return p.copy(a.out, a.in, a.count);
  const Fold f = make_fold(a.world, a.rank);
  const bool is_root = a.rank == a.root;
  std::byte* acc = is_root ? a.out : a.tmp;
  const std::byte* cur = fold_in(a, p, f, acc, a.count);
  auto layout = [&](int v) { return block_range(a.count, f.pof2, v); };
  if (!f.folded_away()) {
    halving(a, p, f, layout, cur, acc);
    BlockRange mine = layout(f.vrank);
    if (a.op == ReduceOp::kAvg) p.scale(acc + mine.begin * a.es(), mine.size);
    if (!is_root) p.send(a.root, acc + mine.begin * a.es(), mine.size);
  }
  if (is_root) {
    // Gather: every virtual rank's block straight to the root.
    for (int v = 0; v < f.pof2; ++v) {
      if (v == f.vrank) continue;
      BlockRange b = layout(v);
      p.recv(fold_real_rank(f, v), a.out_at(b.begin), b.size);
    }
  }
}

size_t rabenseifner_scratch(const CollArgs& a) {
  if (a.kind == CollectiveKind::kReduceScatter) return static_cast<size_t>(a.world) * a.count;
  return a.kind == CollectiveKind::kReduce ? a.count : 0;
}

double rabenseifner_rounds(CollectiveKind kind, const CostTerms& t) {
  const double lgp = t.lgp, fold = t.folded ? 2 : 0;
  return (kind == CollectiveKind::kAllreduce ? 2 * lgp
          : kind == CollectiveKind::kReduce  ? lgp + 1
                                             : lgp) +
         fold;
}

// Allreduce: the halving step at distance d and the doubling step at the same
// distance each send d/p of the buffer from every one of the p ranks; a folded
// pair sends 2.5 buffers (three halves in, the result out). The chain: every
// step, a fold's half in, its reduced half and the result out.
Work rabenseifner_work(CollectiveKind kind, const CostTerms& t) {
  Work w;
  if (kind != CollectiveKind::kAllreduce) return w;
  for (double d = 1; d < t.p; d *= 2) {
    w.add(t.leaves_host(d), 2 * t.p * t.pieces(t.m * d / t.p), 2 * t.m * d);
    w.step(t.leaves_host(d), 2 * t.m * d / t.p, 2 * t.k);
  }
  if (t.folded) {
    w.add(t.leaves_host(1), (t.n - t.p) * (3 * t.pieces(t.m / 2) + t.pieces(t.m)),
          2.5 * t.m * (t.n - t.p));
    w.step(t.leaves_host(1), t.m, 2 * t.k);  // two halves
    w.step(t.leaves_host(1), t.m, t.k);
  }
  w.reduced = (t.p - 1 + (t.n - t.p)) * t.m;  // the halving's blocks; a fold's halves
  w.copied = (t.n - 1) * t.m;                 // the doubling's blocks; a folded rank's result
  return w;
}

double rabenseifner_cost(CollectiveKind kind, const CostTerms& t) {
  const double m = t.m, a = t.a, b = t.b, g = t.g, p = t.p, lgp = t.lgp;
  const bool folded = t.folded;
  switch (kind) {
    case CollectiveKind::kAllreduce: {
      // The halving and doubling steps at distance d carry d/p of the buffer,
      // each at the costs of its own edges (CostTerms::exchange_beta): on
      // two levels the steps between ranks of a host (and a fold's pairs)
      // wait on the host, those between hosts on a link every rank of the
      // host sends over at once. On one level: 2 lgp a + 2 (p - 1)/p m b.
      double steps = 0;
      for (double d = 1; d < p; d *= 2)
        steps += 2 * (t.alpha_at(d) + m * d / p * t.exchange_beta(d));
      const double fold = 3 * t.alpha_at(1) + 2 * m * t.exchange_beta(1) + 0.5 * m * g;
      return steps + (p - 1) / p * m * g + (folded ? fold : 0) +
             t.pieces(m / 2) * t.alpha_at(p / 2);
    }
    case CollectiveKind::kReduceScatter:  // m = input bytes (world blocks)
      return lgp * a + (p - 1) / p * m * (b + g) + (folded ? 2 * a + m * b + 0.5 * m * g : 0);
    case CollectiveKind::kReduce:
      return (lgp + 1) * a + 2 * (p - 1) / p * m * b + (p - 1) / p * m * g +
             (folded ? 2 * a + m * b + 0.5 * m * g : 0);
    default:
      return std::numeric_limits<double>::infinity();
  }
}

}  // namespace rdmaflow
