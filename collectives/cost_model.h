// The alpha-beta-gamma cost model (Hockney; Thakur, Rabenseifner & Gropp) that
// picks an algorithm per call: alpha = seconds per message, beta = seconds per
// byte on the wire, gamma = seconds per byte reduced. alpha and beta are
// measured on the communicator's own channels when it is created (a few
// ping-pongs between rank pairs, bounded in time); gamma by timing the f32 sum
// kernel. Every rank uses the maximum over ranks, so all pick the same.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "collectives/types.h"

namespace rdmaflow {

struct CostParams {
  double alpha = 10e-6;    // s per message
  double beta = 0.5e-9;    // s per byte
  double gamma = 0.25e-9;  // s per byte reduced
  // s per dependent round beyond alpha: on an oversubscribed host a rank that
  // waits for its partner waits for the partner to be scheduled, once per
  // round, so fewer rounds beat fewer messages there. 0 when every rank has a core.
  double round = 0;
  size_t piece_bytes = 512 * 1024;
  std::string to_string() const;
};

// The quantities of one estimate, computed once by the model and handed to
// the algorithm's cost and rounds functions (registry.h).
struct CostTerms {
  double n = 1;         // ranks
  double m = 0;         // bytes of the call's largest buffer
  double a = 0;         // alpha
  double b = 0;         // beta
  double g = 0;         // gamma
  double p = 1;         // the largest power of two <= n
  double lgp = 0;       // log2(p)
  double lg = 0;        // ceil(log2(n))
  bool folded = false;  // n is not a power of two: a fold step before and after
  double k = 1;         // piece bytes
  // Pieces add a message each; pipelines need their depth in pieces to fill.
  double pieces(double msg) const { return std::max(1.0, std::ceil(msg / k)); }
};

class CostModel {
 public:
  CostModel() = default;
  CostModel(int world, CostParams params) : world_(world), p_(params) {}

  // Dependent rounds of `algo` for `kind` (a rank waits for a partner once per round).
  double rounds(CollectiveKind kind, Algorithm algo) const;
  // Estimated seconds of `algo` for a call moving `bytes` (the bytes of the
  // largest buffer of the call); +inf when the algorithm does not implement the
  // collective.
  double cost(CollectiveKind kind, Algorithm algo, size_t bytes) const;
  // The cheapest algorithm for the call.
  Algorithm choose(CollectiveKind kind, size_t bytes) const;
  const CostParams& params() const { return p_; }
  int world() const { return world_; }
  // The terms of an estimate for a call moving `bytes`.
  CostTerms terms(size_t bytes) const;

 private:
  int world_ = 1;
  CostParams p_;
};

// The algorithms that implement `kind`, in table order (registry.h).
std::vector<Algorithm> algorithms_for(CollectiveKind kind);

}  // namespace rdmaflow
