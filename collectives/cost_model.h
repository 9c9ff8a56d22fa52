// The alpha-beta-gamma cost model (Hockney; Thakur, Rabenseifner & Gropp) that
// picks an algorithm per call: alpha = seconds per message, beta = seconds per
// byte on the wire, gamma = seconds per byte reduced. alpha and beta are
// measured on the communicator's own channels when it is created (a few
// ping-pongs between rank pairs, bounded in time: a pair on one host for the
// within-host level, a pair on two hosts for the between-host level); gamma
// by timing the f32 sum kernel, in cache and out of it (a call's reduction
// reads its input and writes its output, and from a few MiB those no longer
// fit a core's cache: CostParams::gamma_at). Every rank uses the maximum over
// ranks, so all pick the same.
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
  double gamma = 0.25e-9;  // s per byte reduced, the call's buffers in cache
  // s per byte reduced out of cache (buffers that do not fit cache_bytes);
  // 0: gamma at every size. Measured at creation, the kernel took 0.02-0.06
  // ns/B in cache and 0.11-0.15 out of it (docs/benchmarks.md, "Selector: gamma
  // out of cache").
  double gamma_cold = 0;
  // The cache a rank's reductions run in: its core's L2 (RDMAFLOW_COLL_CACHE_BYTES).
  size_t cache_bytes = 1 << 20;
  // What a reduced byte costs in a call whose largest buffer is `bytes`: the
  // call reads its input and a received piece and writes its output or
  // scratch, about 3x its bytes; the share of them beyond the cache comes from
  // memory, at gamma_cold.
  double gamma_at(double bytes) const;
  // s per dependent round beyond alpha: on an oversubscribed host a rank that
  // waits for its partner waits for the partner to be scheduled, once per
  // round, so fewer rounds beat fewer messages there. 0 when every rank has a core.
  double round = 0;
  // > 0: the ranks are crowded onto this many CPUs (more ranks than cores):
  // a call then costs the CPU work of every rank's sends over these CPUs
  // (CostModel::crowded), not its longest chain of rounds.
  int cpus = 0;
  // A call is cut into pieces of call_piece_bytes(), between these two.
  size_t piece_bytes = 512 * 1024;
  size_t min_piece_bytes = 64 * 1024;
  std::string to_string() const;
};

// The piece a call of `total` bytes (its largest buffer; reduce_scatter's
// input, allgather's output) over `world` ranks is cut into: a quarter of a
// rank's share (half of it with two ranks), between `smallest` and `largest`
// (the slot). The communicator cuts calls so and the model counts messages
// so. Each piece over tcp costs a frame, a credit frame back and a wake-up;
// with 32 KiB, 64 KiB allreduce on 4 cluster hosts x 1 took 798 us against
// 703 and 256 KiB 1994 against 1580 (docs/benchmarks.md, "One wait over every
// peer's socket"). 128 KiB lost at 1 MiB in one run. Two ranks (loopback tcp,
// a rank per core) gain nothing from a deeper pipeline: each runs its sends,
// receives and reductions on one thread, in parallel with the other, so 1 MiB
// in 256 KiB pieces took 0.65-0.75x the time of 128 KiB pieces
// (docs/benchmarks.md, "TCP path (issue #14 point 1)"); 512 KiB (one piece
// per message) was slower than 256 KiB.
size_t call_piece_bytes(size_t total, int world, size_t smallest, size_t largest);

class CostModel;

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
  double k = 1;         // piece bytes (terms: a slot; work_terms: the call's)
  // Ranks per host, numbered host by host (as launchers number them); 1 on
  // one level, where every send is costed at the model's one level.
  double q = 1;
  // The host's alpha and beta on two levels: what a step whose every edge
  // stays within a host costs (a and b on one level). A flat algorithm's
  // path waits at each step for that step's slowest edge: a step between
  // ranks fewer than q apart waits on the host's memory, not the link.
  double ha = 0, hb = 0;
  // The model that made these terms: an algorithm composed of others (hier)
  // costs its parts with it.
  const CostModel* model = nullptr;
  // Pieces add a message each; pipelines need their depth in pieces to fill.
  double pieces(double msg) const { return std::max(1.0, std::ceil(msg / k)); }
  // Whether a send between ranks `distance` apart leaves the host.
  bool leaves_host(double distance) const { return q <= 1 || distance >= q; }
  // The alpha and beta of a send between ranks `distance` apart.
  double alpha_at(double distance) const { return leaves_host(distance) ? a : ha; }
  double beta_at(double distance) const { return leaves_host(distance) ? b : hb; }
  // The beta of a step in which every rank sends to the rank `distance`
  // away (recursive doubling, Rabenseifner): between hosts the q ranks of a
  // host send over its link at once, and it carries q messages.
  double exchange_beta(double distance) const { return leaves_host(distance) ? q * b : hb; }
};

// The sends of one call summed over every rank, and its chain. On a crowded
// host the ranks take turns on the CPUs, and every message and byte costs CPU
// time (the system calls, wake-ups and copies of the network stack) whichever
// rank it is on: the sums over the CPUs are the call's throughput. The chain
// is its latency: the bytes the first piece carries along the longest path of
// dependent sends before every rank has work (each step's message, at most a
// piece): the pipeline's fill, which the CPUs cannot share out. Equal sums
// (ring, both trees and Rabenseifner send and reduce the same) are told apart
// by it: the double tree's halves fill its tree in half the binomial tree's
// bytes (docs/benchmarks.md, "Selector: throughput and chain").
struct Work {
  double messages = 0, bytes = 0;            // to other hosts (one level: every send)
  double host_messages = 0, host_bytes = 0;  // within a host (two levels)
  double reduced = 0;                        // bytes reduced, at gamma
  // Bytes copied out of a slot (a plain receive: the result coming back down
  // a tree, an allgather's blocks) or from buffer to buffer, at gamma too:
  // the copy reads the slot and writes the output as the reduction does (on 2
  // hosts x 2 ranks at c3c16a9, 8 MiB copied out of a slot took 1907 us inside
  // the pieces, 8 MiB reduced from one 1509; docs/benchmarks.md, "Profile at
  // c3c16a9"). Uncounted, the tree (every rank but the root copies the
  // result) tied hier (a host's ranks copy only the other ranks' blocks) on 2
  // x 2 and was taken where it measured 1.1-1.3x slower ("Selector: copies
  // out of the slots and the tree's root").
  double copied = 0;
  double chain = 0, host_chain = 0;  // the chain's bytes over the link / within a host
  // The busiest rank's own share where the ranks' shares differ (the
  // binomial tree's root and the rank below it on the next host: every send,
  // reduction and copy of their subtrees goes through them, twice what any
  // rank of hier does on 2 hosts x 2 ranks); `uneven` false: every rank does
  // a world's share of the sums. Crowded CPUs share out the sums only as far
  // as the busiest rank's share is within a CPU's (CostModel::crowded).
  // Its messages are not counted: with them the model moved 8 B to
  // recursive doubling, up to 2.18x slower, where the tree is right.
  bool uneven = false;
  double top_bytes = 0;       // its bytes sent to other hosts (one level: all)
  double top_host_bytes = 0;  // its bytes sent within its host
  double top_memory = 0;      // its bytes reduced and copied
  void add(bool leaves, double msgs, double b) {
    (leaves ? messages : host_messages) += msgs;
    (leaves ? bytes : host_bytes) += b;
  }
  // A send of the busiest rank, beside its share of add()'s sums.
  void add_top(bool leaves, double b) {
    uneven = true;
    (leaves ? top_bytes : top_host_bytes) += b;
  }
  // One step of the chain: a message of `b` bytes, cut into pieces of `piece`.
  void step(bool leaves, double b, double piece) {
    (leaves ? chain : host_chain) += std::min(b, piece);
  }
  Work& operator+=(const Work& o) {
    messages += o.messages;
    bytes += o.bytes;
    host_messages += o.host_messages;
    host_bytes += o.host_bytes;
    reduced += o.reduced;
    copied += o.copied;
    uneven = uneven || o.uneven;
    top_bytes += o.top_bytes;
    top_host_bytes += o.top_host_bytes;
    top_memory += o.top_memory;
    chain += o.chain;
    host_chain += o.host_chain;
    return *this;
  }
};

// One level: every pair of ranks costs the same (one host; one rank per host;
// hosts of different sizes, costed with the between-host costs). Two levels:
// `hosts` hosts of `per_host` ranks each, with the costs of each level. There
// each step of a flat algorithm waits for its slowest hop: the ring's every
// step crosses hosts and is costed at the between-host costs; the binomial
// tree's lowest levels, recursive doubling's first rounds and Rabenseifner's
// nearest steps pair ranks of one host and are costed at the host's
// (CostTerms::beta_at; their work counts them so too). hier is costed per
// level: a reduce-scatter within the host, an allreduce of the host's
// 1/per_host share between the hosts by per_host lanes at once that share the
// host's link, an allgather within the host.
class CostModel {
 public:
  CostModel() = default;
  CostModel(int world, CostParams params) : world_(world), p_(params), within_(params) {}
  CostModel(int hosts, int per_host, CostParams within, CostParams between)
      : world_(hosts * per_host),
        hosts_(hosts),
        per_host_(per_host),
        p_(between),
        within_(within) {}

  // Dependent rounds of `algo` for `kind` (a rank waits for a partner once per round).
  double rounds(CollectiveKind kind, Algorithm algo) const;
  // Estimated seconds of `algo` for a call moving `bytes` (the bytes of the
  // largest buffer of the call); +inf when the algorithm does not implement the
  // collective (or, hier, on one level).
  double cost(CollectiveKind kind, Algorithm algo, size_t bytes) const;
  // The cheapest algorithm for the call.
  Algorithm choose(CollectiveKind kind, size_t bytes) const;
  // Seconds of `w` on crowded CPUs: its throughput (each tier's messages and
  // bytes at its message_seconds() and beta, the reductions and copies at `gamma`,
  // over params().cpus) and its chain (each tier's chain bytes at its beta),
  // plus, where the ranks' shares are uneven, the busiest rank's work beyond
  // a CPU's share of the sums: a rank runs on one CPU at a time and its
  // partners wait on its pieces, so the CPUs cannot share out what it does
  // beyond what one CPU does anyway. With more ranks than CPUs a CPU's share
  // is more than a rank's: on 2 hosts x 2 ranks on 2 CPUs the tree's root
  // sends half the link's bytes and a quarter of the host's and does a third
  // of the memory work, no more of any than the half a CPU runs, and costs
  // nothing beyond the sums. Against the mean rank's share (as
  // before) the root's excess put the tree 20-25% above its measured time
  // from 256 KiB to 256 MiB in every 2 x 2 sweep of the three targets runs
  // of 2026-11-27 and took hier, 1.06-1.17x the tree there
  // (docs/benchmarks.md, "Selector: 2 x 2, hier against the tree at 1-4 MiB").
  double crowded(const Work& w, double gamma) const;
  // The same, term by term (each already over the CPUs where it is shared).
  struct CrowdedTerms {
    double messages = 0, bytes = 0, memory = 0;  // the sums, over params().cpus
    double excess = 0;                           // the busiest rank's, beyond its share
    double chain = 0;
    double total() const { return messages + bytes + memory + excess + chain; }
  };
  CrowdedTerms crowded_terms(const Work& w, double gamma) const;
  // What a message costs crowded CPUs: the system calls, frames, credit and
  // wake-up of one send, as many seconds as kMessageBytes take at the level's
  // beta. Not alpha: a ping-pong's half round trip waits for the partner to
  // be scheduled, and measured 18-175 us on one layout in one session
  // (docs/benchmarks.md, "Selector: throughput and chain").
  static constexpr double kMessageBytes = 22 * 1024;
  static double message_seconds(const CostParams& level);
  // The share of an algorithm's path in its crowded cost (the tie-break of
  // equal work and chain).
  static constexpr double kPathShare = 0.05;
  bool crowded() const { return p_.cpus > 0; }
  // The flat algorithms' costs: between hosts on two levels.
  const CostParams& params() const { return p_; }
  // The costs within a host (params() on one level).
  const CostParams& within() const { return within_; }
  int world() const { return world_; }
  int hosts() const { return hosts_; }
  int per_host() const { return per_host_; }
  bool two_level() const { return hosts_ > 1 && per_host_ > 1; }
  // The terms of an estimate for a call moving `bytes` (pieces of a slot).
  CostTerms terms(size_t bytes) const;
  // The same in the pieces the call is cut into (call_piece_bytes), for the
  // work of crowded ranks, which counts every message.
  CostTerms work_terms(size_t bytes) const;

  // hier's allreduce between the hosts of a lane on its block of
  // `block_bytes`: the cheapest flat allreduce over `hosts` ranks on links
  // that carry every lane at once.
  Algorithm between_hosts(size_t block_bytes) const;
  // The same for hier's lane phase of `kind` (a lane's call of `lane_bytes`).
  Algorithm between_hosts(CollectiveKind kind, size_t lane_bytes) const;
  // hier with `between` for the lanes: its dependent rounds, and its seconds
  // without them (two levels only).
  struct Estimate {
    double rounds = 0;
    double seconds = 0;
  };
  Estimate hier_estimate(Algorithm between, size_t bytes) const;
  // The same for hier's `kind`, a call of `bytes` (the call's largest buffer),
  // phase by phase: within the host by the host's costs, the lanes' phase
  // (`between`, on 1/per_host of the bytes) by the link's costs with the
  // host's lanes sharing its link.
  Estimate hier_estimate(CollectiveKind kind, Algorithm between, size_t bytes) const;
  // Seconds of hier with `between` for the lanes, rounds included; +inf on one level.
  double hierarchical(Algorithm between, size_t bytes) const;
  // The costs of each level, for logs and benchmarks.
  std::string to_string() const;
  // Every algorithm that implements `kind` with its estimate for a call of
  // `bytes`, cheapest first (ties in table order): the candidates the tuner
  // (collectives/tuner.h) times when the estimates are close.
  struct Ranked {
    Algorithm algo = Algorithm::kAuto;
    double seconds = 0;
  };
  std::vector<Ranked> ranked(CollectiveKind kind, size_t bytes) const;

 private:
  int world_ = 1;
  int hosts_ = 1;
  int per_host_ = 1;
  CostParams p_;
  CostParams within_;
  // This model with the crowded message cost for alpha and nothing crowded:
  // the paths of the crowded tie-break.
  CostModel crowded_paths() const;
};

// The algorithms that implement `kind`, in table order (registry.h).
std::vector<Algorithm> algorithms_for(CollectiveKind kind);

}  // namespace rdmaflow
