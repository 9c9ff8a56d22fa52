#include "collectives/cost_model.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "collectives/topology.h"

namespace rdmaflow {

std::string CostParams::to_string() const {
  char buf[160];
  int len = std::snprintf(buf, sizeof(buf), "alpha=%.2fus beta=%.3fns/B (%.2f GB/s) gamma=%.3fns/B",
                          alpha * 1e6, beta * 1e9, beta > 0 ? 1e-9 / beta : 0.0, gamma * 1e9);
  if (round > 0 && len > 0 && static_cast<size_t>(len) < sizeof(buf)) {
    std::snprintf(buf + len, sizeof(buf) - static_cast<size_t>(len), " round=%.1fus", round * 1e6);
  }
  return buf;
}

std::vector<Algorithm> algorithms_for(CollectiveKind kind) {
  std::vector<Algorithm> out;
  for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kDoubleBinaryTree,
                      Algorithm::kRabenseifner, Algorithm::kRecursiveDoubling, Algorithm::kPairwise,
                      Algorithm::kDissemination, Algorithm::kDirect}) {
    if (algorithm_supports(a, kind)) out.push_back(a);
  }
  return out;
}

double CostModel::rounds(CollectiveKind kind, Algorithm algo) const {
  if (world_ <= 1) return 0;
  const double n = world_;
  const double lgp = std::log2(floor_pow2(world_));
  const double lg = ceil_log2(world_);
  const double fold = floor_pow2(world_) != world_ ? 2 : 0;
  using K = CollectiveKind;
  using A = Algorithm;
  switch (algo) {
    case A::kRing:
      if (kind == K::kAllreduce) return 2 * (n - 1);
      return kind == K::kReduce ? n : n - 1;
    case A::kTree:
    case A::kDoubleBinaryTree:
      return kind == K::kAllreduce || kind == K::kBarrier ? 2 * lg : lg;
    case A::kRabenseifner:
      return (kind == K::kAllreduce ? 2 * lgp : kind == K::kReduce ? lgp + 1 : lgp) + fold;
    case A::kRecursiveDoubling:
      return lgp + fold;
    case A::kPairwise:
      return n - 1;
    case A::kDissemination:
      return lg;
    case A::kDirect:
      return 1;
    case A::kAuto:
      return 0;
  }
  return 0;
}

double CostModel::cost(CollectiveKind kind, Algorithm algo, size_t bytes) const {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (!algorithm_supports(algo, kind) || algo == Algorithm::kAuto) return kInf;
  if (world_ <= 1) return 0;
  return p_.round * rounds(kind, algo) + wire_cost(kind, algo, bytes);
}

double CostModel::wire_cost(CollectiveKind kind, Algorithm algo, size_t bytes) const {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double n = world_;
  const double m = static_cast<double>(bytes);
  const double a = p_.alpha, b = p_.beta, g = p_.gamma;
  const int pof2 = floor_pow2(world_);
  const double p = pof2;
  const double lgp = std::log2(p);
  const double lg = ceil_log2(world_);
  const bool folded = pof2 != world_;
  // Pieces add a message each; pipelines need their depth in pieces to fill.
  const double k = static_cast<double>(p_.piece_bytes);
  auto pieces = [&](double msg) { return std::max(1.0, std::ceil(msg / k)); };
  using K = CollectiveKind;
  using A = Algorithm;
  switch (kind) {
    case K::kAllreduce:
      switch (algo) {
        case A::kRing:
          return 2 * (n - 1) * a * pieces(m / n) + 2 * (n - 1) / n * m * b + (n - 1) / n * m * g;
        case A::kRabenseifner:
          return 2 * lgp * a + 2 * (p - 1) / p * m * b + (p - 1) / p * m * g +
                 (folded ? 3 * a + 2 * m * b + 0.5 * m * g : 0) + pieces(m / 2) * a;
        case A::kRecursiveDoubling:
          return lgp * (a + m * b + m * g) + (folded ? 2 * a + 2 * m * b + m * g : 0);
        case A::kTree:
          return 2 * lg * (a + std::min(m, k) * b) + 2 * lg * m * b + lg * m * g;
        case A::kDoubleBinaryTree:
          return 2 * lg * (a + std::min(m / 2, k) * b) + 2 * m * b + m * g + pieces(m / 2) * a;
        case A::kDirect:  // one round of n - 1 concurrent messages, like the direct allgather
          return a + (n - 1) * (pieces(m) * 0.5 * a + m * (b + g));
        default:
          return kInf;
      }
    case K::kReduceScatter:  // m = input bytes (world blocks)
      switch (algo) {
        case A::kRing:
          return (n - 1) * a * pieces(m / n) + (n - 1) / n * m * (b + g);
        case A::kRabenseifner:
          return lgp * a + (p - 1) / p * m * (b + g) + (folded ? 2 * a + m * b + 0.5 * m * g : 0);
        case A::kRecursiveDoubling:
          return lgp * (a + m * b + m * g) + (folded ? 2 * a + 2 * m * b + m * g : 0);
        default:
          return kInf;
      }
    case K::kAllgather:  // m = output bytes
      switch (algo) {
        case A::kRing:
          return (n - 1) * a * pieces(m / n) + (n - 1) / n * m * b;
        case A::kRecursiveDoubling:
          return lgp * a + (p - 1) / p * m * b + (folded ? 2 * a + m * b : 0);
        case A::kDirect:
          return a + (n - 1) * (0.5 * a) + (n - 1) / n * m * b;
        default:
          return kInf;
      }
    case K::kBroadcast:
      switch (algo) {
        case A::kTree:
          return lg * (a + std::min(m, k) * b) + lg * m * b;
        case A::kRing:
          return (n - 1) * (a + std::min(m, k) * b) + m * b + pieces(m) * a;
        default:
          return kInf;
      }
    case K::kReduce:
      switch (algo) {
        case A::kTree:
          return lg * (a + std::min(m, k) * b) + lg * m * (b + g);
        case A::kRing:
          return n * a * pieces(m / n) + (n - 1) / n * m * (2 * b + g);
        case A::kRabenseifner:
          return (lgp + 1) * a + 2 * (p - 1) / p * m * b + (p - 1) / p * m * g +
                 (folded ? 2 * a + m * b + 0.5 * m * g : 0);
        default:
          return kInf;
      }
    case K::kBarrier:
      if (algo == A::kDissemination) return lg * a;
      if (algo == A::kTree) return 2 * lg * a;
      return kInf;
    case K::kAlltoall:
      if (algo == A::kPairwise) return (n - 1) * a + (n - 1) / n * m * b;
      return kInf;
  }
  return kInf;
}

Algorithm CostModel::choose(CollectiveKind kind, size_t bytes) const {
  Algorithm best = Algorithm::kAuto;
  double best_cost = std::numeric_limits<double>::infinity();
  for (Algorithm a : algorithms_for(kind)) {
    const double c = cost(kind, a, bytes);
    if (c < best_cost) {
      best = a;
      best_cost = c;
    }
  }
  return best;
}

}  // namespace rdmaflow
