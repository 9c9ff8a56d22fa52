// The cost model's choices (collectives/cost_model.h): where its terms are
// meant to make the selector differ (crowded hosts, two levels, reductions
// out of cache), checked on the model alone, in one process. The schedules
// themselves are checked by schedule_test.cc, the real calls by
// collectives_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "collectives/algorithms/registry.h"
#include "collectives/cost_model.h"
#include "collectives/topology.h"
#include "tests/collectives/reference.h"

namespace rdmaflow {
namespace {

// The model's choices where they are meant to differ: tiny allreduces take the
// fewest messages when every rank has a core, and the fewest dependent rounds
// when the host is oversubscribed (a reschedule per round); large ones move the
// fewest bytes either way.
TEST(CostModel, RoundsDecideTinyAllreduceOnACrowdedHost) {
  CostParams fast;
  fast.alpha = 1e-6;
  fast.beta = 0.2e-9;
  fast.gamma = 0.02e-9;
  CostParams crowded = fast;
  crowded.round = 5e-6;
  const CostModel four(4, fast), four_crowded(4, crowded);
  EXPECT_EQ(four.choose(CollectiveKind::kAllreduce, 8), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(four_crowded.choose(CollectiveKind::kAllreduce, 8), Algorithm::kDirect);
  EXPECT_EQ(four_crowded.choose(CollectiveKind::kAllgather, 32), Algorithm::kDirect);
  // Odd worlds: one round beats folding in and out.
  EXPECT_EQ(CostModel(3, fast).choose(CollectiveKind::kAllreduce, 8), Algorithm::kDirect);
  EXPECT_EQ(CostModel(2, fast).choose(CollectiveKind::kAllreduce, 8),
            Algorithm::kRecursiveDoubling);
  for (const CostModel* m : {&four, &four_crowded}) {
    const Algorithm big = m->choose(CollectiveKind::kAllreduce, size_t{64} << 20);
    EXPECT_TRUE(big == Algorithm::kRing || big == Algorithm::kRabenseifner) << algorithm_name(big);
    EXPECT_EQ(m->rounds(CollectiveKind::kAllreduce, Algorithm::kDirect), 1);
    EXPECT_EQ(m->rounds(CollectiveKind::kAllreduce, Algorithm::kRecursiveDoubling), 2);
    EXPECT_EQ(m->rounds(CollectiveKind::kAllreduce, Algorithm::kRing), 6);
  }
  EXPECT_EQ(CostModel(5, fast).rounds(CollectiveKind::kAllreduce, Algorithm::kRecursiveDoubling),
            4);
}

// Two ranks exchange each message both ways at once, a rank per CPU: two
// pieces per message are enough (docs/benchmarks.md, "TCP path"); wider
// worlds keep four for their pipelines. Both between 64 KiB and the slot.
TEST(CostModel, TwoRanksCutHalfAShare) {
  constexpr size_t kKiB = 1024, lo = 64 * kKiB, slot = 512 * kKiB;
  EXPECT_EQ(call_piece_bytes(1024 * kKiB, 2, lo, slot), 256 * kKiB);
  EXPECT_EQ(call_piece_bytes(512 * kKiB, 2, lo, slot), 128 * kKiB);
  EXPECT_EQ(call_piece_bytes(16384 * kKiB, 2, lo, slot), slot);
  EXPECT_EQ(call_piece_bytes(64 * kKiB, 2, lo, slot), lo);
  EXPECT_EQ(call_piece_bytes(1024 * kKiB, 4, lo, slot), 64 * kKiB);
  EXPECT_EQ(call_piece_bytes(4096 * kKiB, 4, lo, slot), 256 * kKiB);
}

// A reduced byte costs what the kernel takes where the call's buffers are: in
// cache up to about a third of the cache (input, received piece, output), then
// more and more of it from memory. Measured at creation on 2 ranks over
// loopback tcp: 0.034 ns/B in cache, 0.45 out of it (docs/benchmarks.md,
// "Selector: gamma out of cache").
TEST(CostModel, ReductionsOutOfCacheCostMemory) {
  CostParams p;
  p.gamma = 0.034e-9;
  p.gamma_cold = 0.452e-9;
  p.cache_bytes = 1 << 20;
  EXPECT_DOUBLE_EQ(p.gamma_at(64 << 10), p.gamma);
  EXPECT_DOUBLE_EQ(p.gamma_at(300 << 10), p.gamma);
  double last = p.gamma;
  for (double m = 512 << 10; m <= double{256 << 20}; m *= 2) {
    EXPECT_GT(p.gamma_at(m), last) << m;
    EXPECT_LT(p.gamma_at(m), p.gamma_cold) << m;
    last = p.gamma_at(m);
  }
  EXPECT_GT(p.gamma_at(16 << 20), 0.9 * p.gamma_cold);
  CostParams warm = p;
  warm.gamma_cold = 0;  // not measured: gamma at every size
  EXPECT_DOUBLE_EQ(warm.gamma_at(256 << 20), warm.gamma);

  // 2 ranks over loopback tcp, the costs one sweep measured (alpha 21 us, beta
  // 0.57 ns/B): with the in-cache gamma only, recursive doubling, which
  // reduces the whole buffer on both ranks, took 1 MiB-16 MiB and measured
  // 1.4-1.6x the fastest; Rabenseifner and the ring reduce half of it.
  CostParams loop = p;
  loop.alpha = 21.14e-6;
  loop.beta = 0.573e-9;
  warm = loop;
  warm.gamma_cold = 0;
  for (size_t m : {size_t{1} << 20, size_t{4} << 20, size_t{16} << 20}) {
    EXPECT_EQ(CostModel(2, warm).choose(CollectiveKind::kAllreduce, m),
              Algorithm::kRecursiveDoubling)
        << m;
    const Algorithm a = CostModel(2, loop).choose(CollectiveKind::kAllreduce, m);
    EXPECT_TRUE(a == Algorithm::kRing || a == Algorithm::kRabenseifner)
        << m << ": " << algorithm_name(a);
  }
  // Small calls stay in cache, and with them the fewest messages.
  EXPECT_EQ(CostModel(2, loop).choose(CollectiveKind::kAllreduce, 64 << 10),
            Algorithm::kRecursiveDoubling);
}

// Crowded ranks (4 simulated hosts on 2 cores) share the CPUs, so a call
// costs every rank's sends, not its longest chain of rounds, plus the chain
// its first piece travels. These are measured costs of a sweep
// (docs/benchmarks.md, "Selector: throughput and chain"). The sums
// themselves are checked on the schedules the builders emit (below).
TEST(CostModel, CrowdedRanksPayForEverySend) {
  CostParams link;
  link.alpha = 38.69e-6;
  link.beta = 0.857e-9;
  link.gamma = 0.036e-9;
  link.round = 5e-6;
  CostParams crowded = link;
  crowded.cpus = 2;
  const CostModel four(4, link), four_crowded(4, crowded);
  EXPECT_EQ(four.choose(CollectiveKind::kAllreduce, 8), Algorithm::kRecursiveDoubling);
  // 8 B: the fewest messages. 64 KiB: the double tree, whose halves fill its
  // trees in half the binomial tree's bytes: within 1.14x of the fastest in 14
  // of 15 interleaved sweeps of 4 x 1 (1.33x in one) and the fastest on the
  // quiet machine, where the binomial tree was 2.31x (docs/benchmarks.md).
  EXPECT_EQ(four_crowded.choose(CollectiveKind::kAllreduce, 8), Algorithm::kTree);
  EXPECT_EQ(four_crowded.choose(CollectiveKind::kAllreduce, 64 << 10),
            Algorithm::kDoubleBinaryTree);
  for (size_t m : {size_t{256} << 10, size_t{4} << 20, size_t{16} << 20, size_t{256} << 20}) {
    const Algorithm a = four_crowded.choose(CollectiveKind::kAllreduce, m);
    // Every rank sends and reduces what the trees do; their paths break the tie.
    EXPECT_TRUE(a == Algorithm::kRing || a == Algorithm::kRabenseifner)
        << m << ": " << algorithm_name(a);
  }
  // Kinds without the sums keep the rounds' costs.
  EXPECT_EQ(four_crowded.choose(CollectiveKind::kAllgather, 32),
            CostModel(4, link).choose(CollectiveKind::kAllgather, 32));
  // A crowded message costs its CPU, kMessageBytes at beta, not alpha: alpha
  // (a ping-pong's half round trip, which waits for the partner to be
  // scheduled) measured 18-175 us on 4 x 1 in one session, and the choice
  // must not follow it. Nor the reductions out of cache (0.11-0.79 ns/B in
  // the 4 x 1 and 2 x 2 sweeps of "Selector: gamma out of cache"): ring, the
  // trees and Rabenseifner reduce the same.
  auto same_choices = [&](const CostParams& other, const std::string& what) {
    const CostModel m(4, other);
    for (size_t bytes : {size_t{8}, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20}) {
      EXPECT_EQ(m.choose(CollectiveKind::kAllreduce, bytes),
                four_crowded.choose(CollectiveKind::kAllreduce, bytes))
          << what << ", " << bytes << " B";
    }
  };
  for (double alpha : {18e-6, 175e-6}) {
    CostParams other = crowded;
    other.alpha = alpha;
    same_choices(other, "alpha " + std::to_string(alpha));
  }
  for (double cold : {0.11e-9, 0.79e-9}) {
    CostParams other = crowded;
    other.gamma_cold = cold;
    same_choices(other, "gamma out of cache " + std::to_string(cold));
  }

  CostParams host = crowded, wire = crowded;
  host.alpha = 1.46e-6;
  host.beta = 0.098e-9;
  wire.alpha = 27.82e-6;
  wire.beta = 0.824e-9;
  const CostModel two(2, 2, host, wire);
  EXPECT_EQ(two.choose(CollectiveKind::kAllreduce, 8), Algorithm::kTree);
  // From 64 KiB, hier: it sends what the tree sends (numbered host by host,
  // the tree's one edge between the hosts carries the buffer each way, as
  // hier's two lanes do with half each), and its lanes fill in half the
  // tree's bytes over the link: on the quiet machine hier was the fastest at
  // 64 KiB, 256 KiB, 1 MiB and 16 MiB (the tree 1.29x it at 64 KiB and 16 MiB;
  // docs/benchmarks.md, "Network targets in one run"). With other jobs on
  // the cores the tree wins at 64 KiB: the model counts the host's CPUs, not
  // what is left of them ("Selector: throughput and chain").
  for (size_t m : {size_t{64} << 10, size_t{256} << 10, size_t{1} << 20, size_t{16} << 20}) {
    EXPECT_EQ(two.choose(CollectiveKind::kAllreduce, m), Algorithm::kHier) << m;
  }

  // The chains: the first piece's trip, a step's message at most a piece.
  // The double tree's halves take half the binomial tree's bytes while a half
  // is at most a piece, the same beyond; the ring's steps are blocks.
  const CostTerms small = four_crowded.work_terms(64 << 10),
                  large = four_crowded.work_terms(16 << 20);
  const auto chain = [](Algorithm a, const CostTerms& t) {
    return find_algorithm(a)->work(CollectiveKind::kAllreduce, t).chain;
  };
  EXPECT_DOUBLE_EQ(chain(Algorithm::kDoubleBinaryTree, small), chain(Algorithm::kTree, small) / 2);
  EXPECT_DOUBLE_EQ(chain(Algorithm::kDoubleBinaryTree, large), chain(Algorithm::kTree, large));
  EXPECT_DOUBLE_EQ(chain(Algorithm::kRing, large), 6 * large.k);
  EXPECT_DOUBLE_EQ(chain(Algorithm::kRing, small), 6 * (64 << 10) / 4.0);

  // The sums against the schedules: every send of every rank's program, to
  // its host or to another. Exact where the algorithm's file derives them
  // from its schedule (the double tree counts its own trees' edges); folds
  // within 35%.
  for (const auto& [hosts, q] :
       {std::pair{4, 1}, std::pair{2, 2}, std::pair{8, 1}, std::pair{2, 4}, std::pair{3, 1}}) {
    const int n = hosts * q;
    const size_t count = 64 * 1024, piece = 16 * 1024;  // f32 elements
    CostParams h = host, l = wire;
    h.piece_bytes = l.piece_bytes = piece * 4;
    const CostModel model = q > 1 ? CostModel(hosts, q, h, l) : CostModel(n, l);
    const HostGroups g = HostGroups::uniform(hosts, q);
    for (Algorithm algo : algorithms_for(CollectiveKind::kAllreduce)) {
      if (algo == Algorithm::kHier && q == 1) continue;
      Work sent, root;  // every rank's; rank 0's (the tree's root)
      for (int r = 0; r < n; ++r) {
        std::vector<float> in(count, 1.0f), out(count);
        CollArgs a;
        a.in = reinterpret_cast<const std::byte*>(in.data());
        a.out = reinterpret_cast<std::byte*>(out.data());
        a.count = count;
        a.rank = r;
        a.world = n;
        a.hosts = &g;
        a.model = &model;
        std::vector<float> tmp(temp_elems(a, algo) + 2);
        a.tmp = reinterpret_cast<std::byte*>(tmp.data());
        Program p(n, DataType::kF32, ReduceOp::kSum, piece);
        ASSERT_TRUE(build_program(a, algo, p).is_ok());
        p.finalize();
        for (const Item& it : p.items()) {
          const auto bytes = static_cast<double>(it.elems * 4);
          if (it.kind == ItemKind::kReduce || (it.kind == ItemKind::kRecv && it.reduce)) {
            sent.reduced += bytes;
            if (r == 0) root.top_memory += bytes;
          }
          if ((it.kind == ItemKind::kRecv && !it.reduce) ||
              (it.kind == ItemKind::kCopy && it.src != it.dst)) {
            sent.copied += bytes;
            if (r == 0) root.top_memory += bytes;
          }
          if (it.kind != ItemKind::kSend) continue;
          const bool leaves = q == 1 || g.host_of(it.peer) != g.host_of(r);
          sent.add(leaves, 1, bytes);
          if (r == 0) root.add_top(leaves, bytes);
        }
      }
      const Work w = find_algorithm(algo)->work(CollectiveKind::kAllreduce, model.terms(count * 4));
      const bool exact = n != 3;
      const double tol = exact ? 0.01 : 0.35;
      const std::string what =
          std::to_string(hosts) + "x" + std::to_string(q) + " " + std::string(algorithm_name(algo));
      const double bytes = sent.bytes + sent.host_bytes;
      const double messages = sent.messages + sent.host_messages;
      EXPECT_NEAR(w.bytes + w.host_bytes, bytes, tol * bytes) << what;
      EXPECT_NEAR(w.messages + w.host_messages, messages, tol * messages) << what;
      EXPECT_NEAR(w.reduced, sent.reduced, tol * sent.reduced) << what;
      EXPECT_NEAR(w.copied, sent.copied, tol * sent.copied + 1) << what;
      EXPECT_EQ(w.uneven, algo == Algorithm::kTree) << what;
      if (algo == Algorithm::kTree) {  // the root's share
        EXPECT_DOUBLE_EQ(w.top_bytes, root.top_bytes) << what;
        EXPECT_DOUBLE_EQ(w.top_host_bytes, root.top_host_bytes) << what;
        EXPECT_NEAR(w.top_memory, root.top_memory, tol * root.top_memory) << what;
      }
      EXPECT_NEAR(w.bytes, sent.bytes, tol * sent.bytes + 1) << what;
      EXPECT_NEAR(w.messages, sent.messages, tol * sent.messages + 1) << what;
    }
  }
}

// A level of 4 ranks on the cluster's 2 CPUs as a communicator's creation
// measured it (the round is the default on a crowded host).
CostParams crowded_level(double alpha, double beta, double gamma, double gamma_cold) {
  CostParams p;
  p.alpha = alpha;
  p.beta = beta;
  p.gamma = gamma;
  p.gamma_cold = gamma_cold;
  p.round = 5e-6;
  p.cpus = 2;
  return p;
}

// Copies out of the slots: on 2 hosts x 2 ranks the binomial tree and hier
// send, reduce and copy the same bytes in all (hier.cc), but the tree's
// copies are the result on three of the four ranks and its reductions a
// buffer fewer, so while copies were not counted the tree's crowded cost was
// below hier's by about a buffer reduced. With the costs the quiet machine
// measured at creation in the targets run at 7ebe099 (docs/benchmarks.md,
// "Network targets in one run"), main took the tree from 4 MiB, which
// measured 1.22x hier at 16 MiB and 1.10x at 64 MiB; counted, hier.
TEST(CostModel, CopiesOutOfTheSlotsCount) {
  const CostModel two(2, 2, crowded_level(1.26e-6, 0.195e-9, 0.034e-9, 0.136e-9),
                      crowded_level(101.09e-6, 0.820e-9, 0.034e-9, 0.136e-9));
  for (size_t bytes : {size_t{4} << 20, size_t{16} << 20, size_t{64} << 20}) {
    EXPECT_EQ(two.choose(CollectiveKind::kAllreduce, bytes), Algorithm::kHier) << bytes;
    const CostTerms t = two.work_terms(bytes);
    const auto memory = [&](Algorithm a) {
      const Work w = find_algorithm(a)->work(CollectiveKind::kAllreduce, t);
      return std::pair{w.reduced, w.copied};
    };
    const auto [tree_reduced, tree_copied] = memory(Algorithm::kTree);
    const auto [hier_reduced, hier_copied] = memory(Algorithm::kHier);
    EXPECT_DOUBLE_EQ(tree_copied, 3.0 * static_cast<double>(bytes));
    EXPECT_DOUBLE_EQ(hier_copied, 2.0 * static_cast<double>(bytes));
    EXPECT_DOUBLE_EQ(tree_reduced + tree_copied, hier_reduced + hier_copied);
  }
}

// The tree's root: on 2 hosts x 2 ranks it and the first rank of the other
// host send, reduce and copy half of all the tree does, twice what any rank
// of hier does. The CPUs cannot share out what it does beyond what one CPU
// runs anyway: with a CPU per rank that is a rank's share and the root's
// excess counts; with 4 ranks on 2 CPUs a CPU runs half the sums, more than
// the root does, and the excess is nothing (docs/benchmarks.md, "Selector:
// 2 x 2, hier against the tree at 1-4 MiB"). 8 bytes stay with the tree.
TEST(CostModel, TheTreesRootIsSharedOutOnlyBeyondACpusShare) {
  const CostParams within = crowded_level(1.90e-6, 0.111e-9, 0.035e-9, 0.192e-9);
  const CostParams link = crowded_level(21.74e-6, 1.381e-9, 0.035e-9, 0.192e-9);
  const size_t m = size_t{16} << 20;
  const CostModel two(2, 2, within, link);
  EXPECT_EQ(two.choose(CollectiveKind::kAllreduce, 8), Algorithm::kTree);
  const Work w =
      find_algorithm(Algorithm::kTree)->work(CollectiveKind::kAllreduce, two.work_terms(m));
  EXPECT_TRUE(w.uneven);
  EXPECT_DOUBLE_EQ(w.top_bytes, static_cast<double>(m));       // down to the other host
  EXPECT_DOUBLE_EQ(w.top_host_bytes, static_cast<double>(m));  // down to its neighbour
  EXPECT_DOUBLE_EQ(w.top_memory, 2.0 * static_cast<double>(m));
  EXPECT_FALSE(
      find_algorithm(Algorithm::kHier)->work(CollectiveKind::kAllreduce, two.work_terms(m)).uneven);
  const double g = link.gamma_at(static_cast<double>(m));
  // 4 ranks on 2 CPUs: the root's m over the link, m within and 2m of memory
  // are within a CPU's half of the sums (2m, 4m, 6m).
  EXPECT_EQ(two.crowded_terms(w, g).excess, 0.0);
  // A CPU per rank: beyond the mean rank's share (m / 2, m, 1.5m), the root's
  // m / 2 over the link and m / 2 of memory.
  CostParams within4 = within, link4 = link;
  within4.cpus = link4.cpus = 4;
  const CostModel own(2, 2, within4, link4);
  const double half = 0.5 * static_cast<double>(m);
  EXPECT_NEAR(own.crowded_terms(w, g).excess, half * link.beta + half * g,
              1e-9 * (half * link.beta + half * g));
}

// The 2 x 2 layout of the targets run of 2026-11-27 16:09 UTC (creation's
// measured costs from its JSON): the tree 1.00 and hier 1.17 of the fastest
// at 4 MiB. With the root's excess counted against a rank's share the model
// put the tree 1.26x hier there and took hier; counted against a CPU's share
// the two sum the same and the tree's shorter chain takes it. On the same
// run's 4 x 1 layout the choices stay (the tree at 8 B, the double tree at
// 64 KiB, Rabenseifner from 1 MiB).
TEST(CostModel, TwoByTwoTakesTheTreeAtFourMiB) {
  const auto level = [](double alpha, double beta, double gamma, double gamma_cold) {
    CostParams p = crowded_level(alpha, beta, gamma, gamma_cold);
    p.cache_bytes = 2 << 20;  // the run's
    return p;
  };
  const CostModel two(2, 2, level(0.535e-6, 0.0644e-9, 0.0234e-9, 0.1476e-9),
                      level(12.73e-6, 0.8217e-9, 0.0234e-9, 0.1476e-9));
  EXPECT_EQ(two.choose(CollectiveKind::kAllreduce, size_t{4} << 20), Algorithm::kTree);
  EXPECT_EQ(two.choose(CollectiveKind::kAllreduce, 8), Algorithm::kTree);
  const CostModel four(4, level(33.49e-6, 1.478e-9, 0.0215e-9, 0.1805e-9));
  EXPECT_EQ(four.choose(CollectiveKind::kAllreduce, 8), Algorithm::kTree);
  EXPECT_EQ(four.choose(CollectiveKind::kAllreduce, size_t{64} << 10),
            Algorithm::kDoubleBinaryTree);
  for (size_t bytes : {size_t{1} << 20, size_t{16} << 20}) {
    EXPECT_EQ(four.choose(CollectiveKind::kAllreduce, bytes), Algorithm::kRabenseifner) << bytes;
  }
}

// The flat algorithms per tier: the binomial tree's levels (rooted at rank 0,
// ranks 2^l apart), recursive doubling's rounds and Rabenseifner's steps
// between ranks of one host are costed at the host's costs; those between
// hosts at the link's, shared by the host's ranks where every rank crosses
// at once (not the tree's: one rank of a host crosses per level); every
// ring step has an edge between hosts and stays at the link's.
TEST(CostModel, FlatStepsWithinAHostAtTheHostsCosts) {
  CostParams within, link;
  within.alpha = 1.2e-6;
  within.beta = 0.1e-9;
  link.alpha = 13.7e-6;
  link.beta = 0.83e-9;
  within.gamma = link.gamma = 0.021e-9;
  const CostModel two(2, 2, within, link), same(2, 2, link, link), one(4, link), host(4, within);
  const auto cost = [](const CostModel& c, Algorithm algo, size_t bytes) {
    return c.cost(CollectiveKind::kAllreduce, algo, bytes);
  };
  for (size_t bytes : {size_t{8}, size_t{256} << 10, size_t{1} << 20, size_t{64} << 20}) {
    const double m = static_cast<double>(bytes), k = static_cast<double>(link.piece_bytes);
    const double g = link.gamma_at(m), flat = cost(one, Algorithm::kTree, bytes);
    EXPECT_NEAR(cost(same, Algorithm::kTree, bytes), flat, 1e-12 * flat) << bytes;
    EXPECT_LT(cost(two, Algorithm::kTree, bytes), flat) << bytes;
    EXPECT_GT(cost(two, Algorithm::kTree, bytes), cost(host, Algorithm::kTree, bytes)) << bytes;
    // The tree's first level (ranks 1 -> 0 and 3 -> 2) within the host: a
    // piece's hop each way and the buffer at the host's costs.
    EXPECT_NEAR(flat - cost(two, Algorithm::kTree, bytes),
                2 * (link.alpha - within.alpha + std::min(m, k) * (link.beta - within.beta)) +
                    m * (link.beta - within.beta),
                1e-9 * flat)
        << bytes;
    // Recursive doubling: the round within the host at its costs, the round
    // between hosts with both of a host's ranks on its link.
    const double rd = link.alpha + 2 * m * link.beta + within.alpha + m * within.beta + 2 * m * g;
    EXPECT_NEAR(cost(two, Algorithm::kRecursiveDoubling, bytes), rd, 1e-9 * rd) << bytes;
    // Rabenseifner: the halves between the hosts, the quarters within.
    const double rab = 2 * (link.alpha + m / 2 * 2 * link.beta) +
                       2 * (within.alpha + m / 4 * within.beta) + 0.75 * m * g +
                       std::max(1.0, std::ceil(m / 2 / k)) * link.alpha;
    EXPECT_NEAR(cost(two, Algorithm::kRabenseifner, bytes), rab, 1e-9 * rab) << bytes;
    EXPECT_DOUBLE_EQ(cost(two, Algorithm::kRing, bytes), cost(one, Algorithm::kRing, bytes));
    // Broadcast is rooted anywhere: its levels stay at the link's costs.
    EXPECT_DOUBLE_EQ(two.cost(CollectiveKind::kBroadcast, Algorithm::kTree, bytes),
                     one.cost(CollectiveKind::kBroadcast, Algorithm::kTree, bytes));
  }
}

// The 2 x 2 layout of the targets run of 2026-11-27 19:20 UTC (creation's
// measured costs from its JSON): the tree the fastest from 4 to 256 MiB,
// hier 1.08x it at 64 MiB. The tree and hier send, reduce, copy and fill as
// much there; the crowded path's share told them apart, and it costed both
// of the tree's levels at the link's costs: hier. With its first level at
// the host's, the tree (docs/benchmarks.md, "Selector: the flat algorithms'
// paths per tier (2 x 2 below 1 MiB)").
TEST(CostModel, TwoByTwoTakesTheTreeWhereItsFirstLevelStaysInTheHost) {
  const auto level = [](double alpha, double beta) {
    CostParams p = crowded_level(alpha, beta, 0.02141e-9, 0.1255e-9);
    p.cache_bytes = 2 << 20;  // the run's
    return p;
  };
  const CostModel two(2, 2, level(1.2232e-6, 0.09860e-9), level(13.668e-6, 0.8309e-9));
  for (size_t bytes : {size_t{4} << 20, size_t{16} << 20, size_t{64} << 20}) {
    EXPECT_EQ(two.choose(CollectiveKind::kAllreduce, bytes), Algorithm::kTree) << bytes;
  }
  EXPECT_EQ(two.choose(CollectiveKind::kAllreduce, 8), Algorithm::kTree);
}

// The costs of each level as measured on the cluster (docs/scaling.md).
std::pair<CostParams, CostParams> cluster_levels() {
  CostParams within, between;
  within.alpha = 0.1e-6;
  within.beta = 0.058e-9;
  within.gamma = between.gamma = 0.022e-9;
  between.alpha = 17.5e-6;
  between.beta = 0.837e-9;
  return {within, between};
}

// Two levels: hier where a host's ranks reach each other for much less than
// the other hosts (the cluster's figures, docs/scaling.md), from 64 KiB; at
// 8 B recursive doubling, whose first round stays within the host: a message
// within and one between, against hier's two within and one between. The
// flat algorithms where both levels cost the same (hier then moves more
// bytes in all); never hier on one level or with one rank per host.
TEST(CostModel, HierWhereTheHostIsCheaperThanTheLink) {
  const auto [within, between] = cluster_levels();
  const CostModel two(2, 2, within, between), same(2, 2, between, between);
  EXPECT_TRUE(two.two_level());
  EXPECT_EQ(two.world(), 4);
  EXPECT_EQ(two.choose(CollectiveKind::kAllreduce, 8), Algorithm::kRecursiveDoubling);
  for (size_t bytes : {size_t{8}, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20}) {
    if (bytes > 8) {
      EXPECT_EQ(two.choose(CollectiveKind::kAllreduce, bytes), Algorithm::kHier) << bytes;
    }
    const Algorithm lanes = two.between_hosts(bytes / 2);
    EXPECT_NE(lanes, Algorithm::kHier);
    EXPECT_DOUBLE_EQ(two.cost(CollectiveKind::kAllreduce, Algorithm::kHier, bytes),
                     two.hierarchical(lanes, bytes));
    EXPECT_LE(two.hierarchical(lanes, bytes), two.hierarchical(Algorithm::kRing, bytes));
  }
  // The lanes share the host's link: hier moves the buffer once over it, a
  // flat ring 1.5 times; with the host's own copies hier is about 1.3x cheaper.
  const size_t m = size_t{16} << 20;
  const double ratio = two.cost(CollectiveKind::kAllreduce, Algorithm::kRing, m) /
                       two.cost(CollectiveKind::kAllreduce, Algorithm::kHier, m);
  EXPECT_GT(ratio, 1.3);
  EXPECT_LT(ratio, 1.5);
  EXPECT_NE(same.choose(CollectiveKind::kAllreduce, m), Algorithm::kHier);
  for (const CostModel& flat : {CostModel(4, between), CostModel(4, 1, within, between)}) {
    EXPECT_FALSE(flat.two_level());
    EXPECT_TRUE(std::isinf(flat.cost(CollectiveKind::kAllreduce, Algorithm::kHier, m)));
    EXPECT_NE(flat.choose(CollectiveKind::kAllreduce, 8), Algorithm::kHier);
    EXPECT_NE(flat.choose(CollectiveKind::kAllreduce, m), Algorithm::kHier);
  }
  // Flat algorithms over two levels cost what they cost on the between-host level.
  EXPECT_DOUBLE_EQ(two.cost(CollectiveKind::kAllreduce, Algorithm::kRing, m),
                   CostModel(4, between).cost(CollectiveKind::kAllreduce, Algorithm::kRing, m));
  // Dependent rounds: one step of each ring within the host, the lanes' between.
  EXPECT_EQ(two.rounds(CollectiveKind::kAllreduce, Algorithm::kHier),
            2 + CostModel(2, between).rounds(CollectiveKind::kAllreduce, two.between_hosts(0)));
}

// The lanes' algorithm is chosen by its path, crowded or not: every allreduce
// over 2 hosts moves the same bytes, so their crowded costs tie and the
// choice fell to noise (tree at 1 MiB, Rabenseifner at 16 MiB). 2 hosts take
// recursive doubling (one exchange each way at once), which measured 0.6-0.9x
// the time of ring lanes on the cluster's 2 x 2 (docs/benchmarks.md).
TEST(CostModel, HierLanesByTheirPath) {
  auto [within, between] = cluster_levels();
  within.round = between.round = 5e-6;
  for (int cpus : {0, 2}) {
    within.cpus = between.cpus = cpus;
    const CostModel two(2, 2, within, between);
    for (size_t bytes :
         {size_t{8}, size_t{64} << 10, size_t{256} << 10, size_t{1} << 20, size_t{16} << 20}) {
      EXPECT_EQ(two.between_hosts(bytes / 2), Algorithm::kRecursiveDoubling)
          << cpus << " cpus, " << bytes;
    }
  }
}

// The other collectives on the same two levels: hier's lanes carry what
// crosses a host's link once, so it is chosen for reduce_scatter and
// allgather of large buffers and for the barrier (one round over the link
// instead of lg n), never where both levels cost the same or on one level;
// its cost is the sum of its phases with the lanes' choice. Its broadcast and
// reduce move as many bytes over the link as a flat chain or tree in host
// order, so auto never takes them (hier.cc).
TEST(CostModel, HierForTheOtherCollectivesWhereItPays) {
  const auto [within, between] = cluster_levels();
  const CostModel two(2, 2, within, between), same(2, 2, between, between);
  const size_t m = size_t{16} << 20;
  for (CollectiveKind kind : {CollectiveKind::kReduceScatter, CollectiveKind::kAllgather}) {
    EXPECT_EQ(two.choose(kind, m), Algorithm::kHier) << collective_name(kind);
    EXPECT_NE(same.choose(kind, m), Algorithm::kHier) << collective_name(kind);
    const Algorithm lanes = two.between_hosts(kind, m / 2);
    EXPECT_NE(lanes, Algorithm::kHier);
    EXPECT_DOUBLE_EQ(two.cost(kind, Algorithm::kHier, m),
                     two.hier_estimate(kind, lanes, m).seconds);
  }
  for (CollectiveKind kind : {CollectiveKind::kBroadcast, CollectiveKind::kReduce}) {
    EXPECT_TRUE(std::isinf(two.cost(kind, Algorithm::kHier, m))) << collective_name(kind);
    EXPECT_NE(two.choose(kind, 64 << 10), Algorithm::kHier) << collective_name(kind);
  }
  EXPECT_EQ(two.choose(CollectiveKind::kBarrier, 0), Algorithm::kHier);
  // One dissemination round between the hosts, one within before and after.
  EXPECT_EQ(two.rounds(CollectiveKind::kBarrier, Algorithm::kHier), 3);
  EXPECT_LT(two.cost(CollectiveKind::kBarrier, Algorithm::kHier, 0),
            two.cost(CollectiveKind::kBarrier, Algorithm::kDissemination, 0));
  for (const CostModel& flat : {CostModel(4, between), CostModel(4, 1, within, between)}) {
    for (CollectiveKind kind : test::kHierKinds) {
      EXPECT_TRUE(std::isinf(flat.cost(kind, Algorithm::kHier, m))) << collective_name(kind);
      EXPECT_NE(flat.choose(kind, m), Algorithm::kHier) << collective_name(kind);
    }
  }
}

}  // namespace
}  // namespace rdmaflow
