// Checks every algorithm's schedule in one process: the Programs of all ranks
// are run against each other by a tiny in-memory interpreter that delivers
// pieces in random order, reads a send's source only when it is delivered
// (so a missing write-after-read dependency corrupts data), and enforces the
// slot credits (so a schedule that could deadlock on credits is caught).
// The transports are tested by the process tests (collectives_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string_view>
#include <tuple>
#include <utility>

#include "collectives/algorithms/registry.h"
#include "collectives/cost_model.h"
#include "collectives/reduce_kernels.h"
#include "collectives/topology.h"
#include "common/tsan.h"
#include "tests/collectives/reference.h"

namespace rdmaflow {
namespace {

struct SimRank {
  std::vector<std::byte> in, out, tmp;
  std::unique_ptr<Program> prog;
  std::vector<int> remaining;
  std::vector<std::vector<uint32_t>> dependents;
  std::vector<uint8_t> state;     // 0 waiting, 1 in flight (send), 2 done
  std::set<uint32_t> candidates;  // dependencies done, not finished
};

// Runs the world; returns "" or a description of the failure.
std::string simulate(CollectiveKind kind, Algorithm algo, DataType t, ReduceOp op, int world,
                     size_t count, int root, size_t piece, int slots, uint32_t seed, bool in_place,
                     const HostGroups* hosts = nullptr, const CostModel* model = nullptr) {
  const size_t es = dtype_size(t);
  std::vector<SimRank> ranks(world);
  for (int r = 0; r < world; ++r) {
    SimRank& s = ranks[r];
    s.in.resize(test::input_elems(kind, count, world) * es + 1);
    s.out.resize(test::output_elems(kind, count, world) * es + 1);
    test::make_input(kind, t, op, r, world, seed, s.in.data(), count);
    CollArgs a;
    a.kind = kind;
    a.in = s.in.data();
    a.out = s.out.data();
    a.count = count;
    a.type = t;
    a.op = op;
    a.root = root;
    a.rank = r;
    a.world = world;
    a.hosts = hosts;
    a.model = model;
    if (in_place) {
      if (kind == CollectiveKind::kAllgather) {
        std::memcpy(s.out.data() + r * count * es, s.in.data(), count * es);
        a.in = s.out.data() + r * count * es;
      } else if (kind == CollectiveKind::kReduceScatter) {
        s.out = s.in;
        a.in = s.out.data();
        a.out = s.out.data() + r * count * es;
      } else {
        s.out = s.in;
        s.out.resize(std::max(s.out.size(), test::output_elems(kind, count, world) * es + 1));
        a.in = a.out = s.out.data();
      }
    }
    s.tmp.resize(temp_elems(a, algo) * es + 8);
    a.tmp = s.tmp.data();
    s.prog = std::make_unique<Program>(world, t, op, piece);
    Status st = build_program(a, algo, *s.prog);
    if (!st.is_ok()) return st.to_string();
    s.prog->finalize();
    const size_t n = s.prog->items().size();
    s.remaining.resize(n);
    s.dependents.assign(n, {});
    s.state.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
      s.remaining[i] = static_cast<int>(s.prog->deps(i).size());
      for (uint32_t d : s.prog->deps(i)) s.dependents[d].push_back(static_cast<uint32_t>(i));
      if (s.remaining[i] == 0) s.candidates.insert(static_cast<uint32_t>(i));
    }
    // Keep the output pointer the checker reads from.
    if (in_place && kind == CollectiveKind::kReduceScatter) {
      // out view starts at block r
    }
  }
  // Delivered pieces: (from, to, ordinal) -> bytes; consumed ordinals per (to, from).
  std::map<std::tuple<int, int, uint64_t>, std::vector<std::byte>> wire;
  std::set<std::tuple<int, int, uint64_t>> consumed;  // (receiver, sender, ordinal)
  std::mt19937 rng(seed * 7 + world);

  auto finish = [&](int r, uint32_t i) {
    SimRank& s = ranks[r];
    s.state[i] = 2;
    s.candidates.erase(i);
    for (uint32_t d : s.dependents[i]) {
      if (--s.remaining[d] == 0) s.candidates.insert(d);
    }
  };
  for (;;) {
    // (rank, item, action) with action 0 = start, 1 = deliver an in-flight send
    std::vector<std::tuple<int, uint32_t, int>> ready;
    for (int r = 0; r < world; ++r) {
      SimRank& s = ranks[r];
      const auto& items = s.prog->items();
      for (uint32_t i : s.candidates) {
        const Item& it = items[i];
        if (s.state[i] == 1) {
          ready.emplace_back(r, i, 1);
          continue;
        }
        if (s.state[i] != 0 || s.remaining[i] != 0) continue;
        if (it.kind == ItemKind::kSend) {
          if (it.ordinal >= static_cast<uint64_t>(slots) &&
              !consumed.count({it.peer, r, it.ordinal - slots}))
            continue;
        } else if (it.kind == ItemKind::kRecv) {
          if (!wire.count({it.peer, r, it.ordinal})) continue;
        }
        ready.emplace_back(r, i, 0);
      }
    }
    if (ready.empty()) break;
    auto [r, i, action] = ready[rng() % ready.size()];
    SimRank& s = ranks[r];
    const Item& it = s.prog->items()[i];
    const size_t bytes = it.elems * es;
    switch (it.kind) {
      case ItemKind::kSend:
        if (action == 0) {
          s.state[i] = 1;
        } else {
          wire[{r, it.peer, it.ordinal}] = std::vector<std::byte>(it.src, it.src + bytes);
          finish(r, i);
        }
        break;
      case ItemKind::kRecv: {
        auto key = std::make_tuple(it.peer, r, it.ordinal);
        auto& data = wire[key];
        if (data.size() != bytes) {
          return "rank " + std::to_string(r) + " expected " + std::to_string(bytes) +
                 " bytes from rank " + std::to_string(it.peer) + " piece " +
                 std::to_string(it.ordinal) + ", got " + std::to_string(data.size());
        }
        if (it.reduce) {
          reduce_buffers(t, op, it.dst, it.src, data.data(), it.elems);
        } else {
          std::memcpy(it.dst, data.data(), bytes);
        }
        wire.erase(key);
        consumed.insert({r, it.peer, it.ordinal});
        finish(r, i);
        break;
      }
      case ItemKind::kCopy:
        std::memmove(it.dst, it.src, bytes);
        finish(r, i);
        break;
      case ItemKind::kScale:
        scale_average(t, it.dst, it.elems, world);
        finish(r, i);
        break;
      case ItemKind::kReduce:
        reduce_buffers(t, op, it.dst, it.dst, it.src, it.elems);
        finish(r, i);
        break;
    }
  }
  for (int r = 0; r < world; ++r) {
    const auto& st = ranks[r].state;
    for (size_t i = 0; i < st.size(); ++i) {
      if (st[i] != 2) {
        return "deadlock: rank " + std::to_string(r) + " stuck at item " + std::to_string(i) +
               "\n" + ranks[r].prog->describe();
      }
    }
  }
  if (!wire.empty()) return "undelivered pieces left on the wire";
  for (int r = 0; r < world; ++r) {
    const std::byte* out = ranks[r].out.data();
    if (in_place && kind == CollectiveKind::kReduceScatter) out += r * count * es;
    std::string first;
    size_t wrong = test::check_output(kind, t, op, r, world, root, seed, out, count, &first);
    if (wrong)
      return "rank " + std::to_string(r) + ": " + std::to_string(wrong) + " wrong, " + first;
  }
  return "";
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

bool reduces(CollectiveKind k) {
  return k == CollectiveKind::kAllreduce || k == CollectiveKind::kReduceScatter ||
         k == CollectiveKind::kReduce;
}

TEST(Schedule, EveryAlgorithmEveryWorldSize) {
  const DataType types[] = {DataType::kF32, DataType::kF64, DataType::kF16, DataType::kBF16,
                            DataType::kI32, DataType::kI64, DataType::kU8};
  uint32_t seed = 1;
  // Under ThreadSanitizer one repetition per cell and no largest count: the
  // simulation is one thread (nothing for it to check) and ran past ctest's
  // 300 s there (50-90 s plain), still with one repetition. Under
  // AddressSanitizer one repetition per cell (every cell still runs; the
  // repetitions only rotate types, reductions and pieces): three took
  // 226-257 s of ctest's 300 and once ran past it.
  const int reps = kThreadSanitizer || kAddressSanitizer ? 1 : 3;
  for (const KindAlgorithm& c : supported_pairs()) {
    for (int world = 1; world <= 8; ++world) {
      const bool per_rank = c.kind == CollectiveKind::kReduceScatter ||
                            c.kind == CollectiveKind::kAllgather ||
                            c.kind == CollectiveKind::kAlltoall;
      const size_t counts[] = {0, 1, static_cast<size_t>(world > 1 ? world - 1 : 1), 37,
                               per_rank ? 53u : 301u};
      for (size_t count : std::span(counts).first(kThreadSanitizer ? 4 : 5)) {
        for (bool in_place : {false, true}) {
          for (int rep = 0; rep < reps; ++rep) {
            // Rotate through types and reductions; the process tests run the full product.
            const DataType t = types[seed % 7];
            const ReduceOp op = reduces(c.kind) ? kAllReduceOps[(seed / 7) % 5] : ReduceOp::kSum;
            const bool barrier = c.kind == CollectiveKind::kBarrier;
            const int root = world > 1 ? static_cast<int>(seed % world) : 0;
            const size_t piece = 1 + seed % 9;
            // A barrier is a one-byte u8 max-reduction, as Communicator::barrier runs it.
            std::string err = simulate(c.kind, c.algo, barrier ? DataType::kU8 : t,
                                       barrier ? ReduceOp::kMax : op, world, barrier ? 1 : count,
                                       root, piece, 1 + seed % 3, seed, in_place && !barrier);
            ASSERT_EQ(err, "") << collective_name(c.kind) << "/" << algorithm_name(c.algo)
                               << " world " << world << " count " << count << " " << dtype_name(t)
                               << " " << reduce_op_name(op) << " root " << root << " piece "
                               << piece << (in_place ? " in-place" : "");
            ++seed;
          }
        }
      }
    }
  }
}

TEST(Topology, BinaryTreesSpanEveryRank) {
  for (int n = 1; n <= 64; ++n) {
    for (int which = 0; which < 3; ++which) {
      std::vector<TreeNode> nodes;
      for (int r = 0; r < n; ++r) {
        if (which == 0) nodes.push_back(binary_tree(n, r));
        if (which == 1) nodes.push_back(double_binary_tree(n, r).second);
        if (which == 2) nodes.push_back(binomial_tree(n, r, n / 2));
      }
      int roots = 0;
      std::vector<int> parent_of(n, -2);
      for (int r = 0; r < n; ++r) {
        if (nodes[r].parent < 0) ++roots;
        if (which < 2) {
          ASSERT_LE(nodes[r].children.size(), 2u);
        }
        for (int c : nodes[r].children) {
          ASSERT_GE(c, 0);
          ASSERT_LT(c, n);
          ASSERT_EQ(parent_of[c], -2) << "rank " << c << " has two parents";
          parent_of[c] = r;
        }
      }
      ASSERT_EQ(roots, 1) << "n=" << n << " tree " << which;
      for (int r = 0; r < n; ++r) {
        if (nodes[r].parent >= 0) {
          ASSERT_EQ(parent_of[r], nodes[r].parent) << "n=" << n << " rank " << r;
        }
        // Walk up: reaches the root within n hops (no cycle).
        int x = r, hops = 0;
        while (nodes[x].parent >= 0 && hops <= n) x = nodes[x].parent, ++hops;
        ASSERT_LE(hops, n);
      }
    }
    // A rank is internal in at most one of the two trees (for n > 2).
    if (n > 2) {
      for (int r = 0; r < n; ++r) {
        DoubleTree dt = double_binary_tree(n, r);
        EXPECT_FALSE(!dt.first.children.empty() && !dt.second.children.empty() &&
                     dt.first.parent >= 0 && dt.second.parent >= 0)
            << "n=" << n << " rank " << r << " internal in both trees";
      }
    }
  }
}

TEST(Topology, FoldPairsTheFirstRanks) {
  for (int n = 1; n <= 20; ++n) {
    int active = 0;
    for (int r = 0; r < n; ++r) {
      Fold f = make_fold(n, r);
      EXPECT_TRUE(is_pow2(f.pof2));
      if (!f.folded_away()) {
        ++active;
        EXPECT_EQ(fold_real_rank(f, f.vrank), r);
      }
    }
    EXPECT_EQ(active, floor_pow2(n));
  }
}

const CollectiveKind kHierKinds[] = {CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter,
                                     CollectiveKind::kAllgather, CollectiveKind::kBroadcast,
                                     CollectiveKind::kReduce,    CollectiveKind::kBarrier};

// hier over layouts of hosts: two levels (hosts numbered host by host or
// interleaved), one host, one rank per host, hosts of different sizes; with
// cost models that pick different algorithms for the lanes between hosts;
// counts that do not divide by the ranks per host or the hosts.
TEST(Schedule, HierOverHostLayouts) {
  const DataType types[] = {DataType::kF32, DataType::kF64, DataType::kF16, DataType::kBF16,
                            DataType::kI32, DataType::kI64, DataType::kU8};
  std::vector<std::vector<uint64_t>> layouts;
  for (auto [hosts, q] :
       {std::pair{2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}, {3, 3}, {4, 1}, {1, 4}}) {
    std::vector<uint64_t> by_host, interleaved;
    for (int r = 0; r < hosts * q; ++r) {
      by_host.push_back(static_cast<uint64_t>(r / q));
      interleaved.push_back(static_cast<uint64_t>(r % hosts));
    }
    layouts.push_back(by_host);
    if (hosts > 1 && q > 1) layouts.push_back(interleaved);
  }
  layouts.push_back({0, 0, 1});
  layouts.push_back({7, 3, 3, 7, 9});
  CostParams latency, bandwidth;  // between hosts: messages dear, or bytes dear
  latency.alpha = 1e-3;
  latency.beta = 1e-12;
  bandwidth.alpha = 1e-9;
  bandwidth.beta = 1e-6;
  std::map<std::pair<CollectiveKind, Algorithm>, int>
      lanes;  // the lanes' algorithms the models chose
  uint32_t seed = 1;
  for (const auto& keys : layouts) {
    const HostGroups g(keys);
    const int world = g.world();
    std::vector<CostModel> models;
    for (const CostParams& between : {latency, bandwidth, CostParams{}}) {
      models.push_back(g.hierarchical() ? CostModel(g.hosts(), g.per_host(), CostParams{}, between)
                                        : CostModel(world, between));
    }
    for (size_t mi = 0; mi <= models.size(); ++mi) {
      const CostModel* model = mi < models.size() ? &models[mi] : nullptr;
      const size_t counts[] = {1, static_cast<size_t>(world - 1), static_cast<size_t>(world + 1),
                               37, 301};
      for (CollectiveKind kind : kHierKinds) {
        const bool barrier = kind == CollectiveKind::kBarrier;
        // The other kinds on fewer cells: the simulator is slow (seconds per kind and
        // layout). Under ThreadSanitizer allreduce too (past ctest's 300 s there, 15 s plain).
        const bool all = kind == CollectiveKind::kAllreduce && !kThreadSanitizer;
        for (size_t count : counts) {
          if (!all && count != counts[2] && count != counts[3]) continue;
          for (bool in_place : {false, true}) {
            if (!all && in_place != (seed % 2 == 0)) continue;
            // A barrier is a one-byte u8 max-reduction, as Communicator::barrier runs it.
            const DataType t = barrier ? DataType::kU8 : types[seed % 7];
            const ReduceOp op = barrier         ? ReduceOp::kMax
                                : reduces(kind) ? kAllReduceOps[(seed / 7) % 5]
                                                : ReduceOp::kSum;
            const size_t piece = 1 + seed % 9;
            const int root = static_cast<int>(seed % static_cast<uint32_t>(world));
            if (model != nullptr && g.hierarchical() && !barrier) {
              ++lanes[{kind, model->between_hosts(kind, count * dtype_size(t))}];
            }
            std::string err =
                simulate(kind, Algorithm::kHier, t, op, world, barrier ? 1 : count, root, piece,
                         1 + seed % 3, seed, in_place && !barrier, &g, model);
            ASSERT_EQ(err, "") << collective_name(kind) << " " << g.describe() << " model " << mi
                               << " count " << count << " " << dtype_name(t) << " "
                               << reduce_op_name(op) << " root " << root << " piece " << piece
                               << (in_place ? " in-place" : "");
            ++seed;
          }
        }
      }
    }
  }
  // The models above pick more than one algorithm for the lanes of every kind
  // with a choice (ring, Rabenseifner, recursive doubling, direct, tree).
  for (CollectiveKind kind : kHierKinds) {
    if (kind == CollectiveKind::kBarrier) continue;  // dissemination on lane 0
    int picked = 0;
    for (const auto& [key, n] : lanes) picked += key.first == kind ? 1 : 0;
    EXPECT_GE(picked, 2) << collective_name(kind);
  }
}

// Rabenseifner sends a message to another host that fits a slot (the
// model's largest piece) as one piece, others in the call's pieces: both
// ends cut every message alike (the simulator fails on a size mismatch),
// and across hosts fewer pieces go.
TEST(Schedule, RabenseifnerSlotPiecesAcrossHosts) {
  CostParams cp;
  cp.piece_bytes = 16 * sizeof(float);  // a slot of 16 f32
  uint32_t seed = 1;
  for (const std::vector<uint64_t>& keys : std::vector<std::vector<uint64_t>>{
           {0, 1, 2, 3}, {0, 0, 1, 1}, {0, 1, 0, 1}, {0, 1, 2, 3, 4}, {0, 0, 1, 1, 2, 2}}) {
    const HostGroups g(keys);
    const CostModel model =
        g.hierarchical() ? CostModel(g.hosts(), g.per_host(), cp, cp) : CostModel(g.world(), cp);
    for (CollectiveKind kind :
         {CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter, CollectiveKind::kReduce}) {
      for (size_t count : {size_t{20}, size_t{37}, size_t{301}}) {
        const std::string err =
            simulate(kind, Algorithm::kRabenseifner, DataType::kF32, ReduceOp::kSum, g.world(),
                     count, 0, 1 + seed % 3, 1 + seed % 3, seed, false, &g, &model);
        ASSERT_EQ(err, "") << collective_name(kind) << " " << g.describe() << " count " << count;
        ++seed;
      }
    }
  }
  // 4 hosts x 1 rank, 64 f32 in pieces of 2: steps of 32, 16, 16, 32
  // elements go in 1 + 1 + 1 + 1 pieces with slots of 32 rather than
  // 16 + 8 + 8 + 16; with slots of 16 the steps of 32 keep the call's pieces;
  // on one host the call's pieces stay.
  auto sends = [&](const std::vector<uint64_t>& keys, size_t slot_elems) {
    const HostGroups g(keys);
    CostParams slots = cp;
    slots.piece_bytes = slot_elems * sizeof(float);
    const CostModel model(g.world(), slots);
    std::vector<float> in(64, 1.0f), out(64);
    CollArgs a;
    a.in = reinterpret_cast<const std::byte*>(in.data());
    a.out = reinterpret_cast<std::byte*>(out.data());
    a.count = 64;
    a.world = 4;
    a.hosts = &g;
    a.model = &model;
    Program prog(4, DataType::kF32, ReduceOp::kSum, 2);
    EXPECT_TRUE(build_program(a, Algorithm::kRabenseifner, prog).is_ok());
    uint64_t n = 0;
    for (int peer = 1; peer < 4; ++peer) n += prog.sends_to(peer);
    EXPECT_EQ(prog.piece_elems(), 2u);  // the call's pieces again afterwards
    return n;
  };
  EXPECT_EQ(sends({0, 1, 2, 3}, 32), 4u);
  EXPECT_EQ(sends({0, 1, 2, 3}, 16), 34u);
  EXPECT_EQ(sends({0, 0, 0, 0}, 32), 48u);
}

// Hosts are numbered by their lowest rank, local ranks in rank order.
TEST(Topology, HostGroupsFromKeys) {
  const uint64_t keys[] = {5, 5, 9, 5, 9, 7};
  const HostGroups g(keys);
  EXPECT_EQ(g.world(), 6);
  EXPECT_EQ(g.hosts(), 3);
  EXPECT_EQ(g.per_host(), 0);
  EXPECT_FALSE(g.hierarchical());
  EXPECT_EQ(g.describe(), "3 hosts (3, 2, 1 ranks)");
  EXPECT_EQ(g.host_of(3), 0);
  EXPECT_EQ(g.local_rank(3), 2);
  EXPECT_EQ(g.host_of(4), 1);
  EXPECT_EQ(g.local_rank(4), 1);
  EXPECT_EQ(g.lane(1), (std::vector<int>{1, 4}));
  EXPECT_EQ(g.lane(0), (std::vector<int>{0, 2, 5}));
  const HostGroups u = HostGroups::uniform(3, 2);
  EXPECT_TRUE(u.hierarchical());
  EXPECT_EQ(u.describe(), "3 hosts x 2 ranks");
  EXPECT_EQ(u.lane(1), (std::vector<int>{1, 3, 5}));
  EXPECT_FALSE(HostGroups::single_host(4).hierarchical());
  EXPECT_FALSE(HostGroups::uniform(4, 1).hierarchical());
  EXPECT_EQ(HostGroups::uniform(4, 1).describe(), "4 hosts x 1 rank");
  EXPECT_NE(this_host_key(), 0u);
  EXPECT_EQ(this_host_key(), this_host_key());
}

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
      Work sent;
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
          if (it.kind == ItemKind::kReduce || (it.kind == ItemKind::kRecv && it.reduce)) {
            sent.reduced += static_cast<double>(it.elems * 4);
          }
          if (it.kind != ItemKind::kSend) continue;
          sent.add(q == 1 || g.host_of(it.peer) != g.host_of(r), 1,
                   static_cast<double>(it.elems * 4));
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
      EXPECT_NEAR(w.bytes, sent.bytes, tol * sent.bytes + 1) << what;
      EXPECT_NEAR(w.messages, sent.messages, tol * sent.messages + 1) << what;
    }
  }
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
// the other hosts (the cluster's figures, docs/scaling.md), at every size;
// the flat algorithms where both levels cost the same (hier then moves more
// bytes in all); never hier on one level or with one rank per host.
TEST(CostModel, HierWhereTheHostIsCheaperThanTheLink) {
  const auto [within, between] = cluster_levels();
  const CostModel two(2, 2, within, between), same(2, 2, between, between);
  EXPECT_TRUE(two.two_level());
  EXPECT_EQ(two.world(), 4);
  for (size_t bytes : {size_t{8}, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20}) {
    EXPECT_EQ(two.choose(CollectiveKind::kAllreduce, bytes), Algorithm::kHier) << bytes;
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
    for (CollectiveKind kind : kHierKinds) {
      EXPECT_TRUE(std::isinf(flat.cost(kind, Algorithm::kHier, m))) << collective_name(kind);
      EXPECT_NE(flat.choose(kind, m), Algorithm::kHier) << collective_name(kind);
    }
  }
}

// The registry is the one list of algorithms: every row has a name and a
// collective, names and aliases parse back to the row, and the names the
// environment knobs have always accepted still do.
TEST(Registry, EveryRowParsesAndImplementsSomething) {
  EXPECT_EQ(parse_algorithm("auto"), Algorithm::kAuto);
  EXPECT_EQ(algorithm_name(Algorithm::kAuto), "auto");
  EXPECT_FALSE(parse_algorithm("nonsense").has_value());
  for (const AlgorithmInfo& info : algorithm_table()) {
    EXPECT_EQ(find_algorithm(info.id), &info);
    EXPECT_EQ(parse_algorithm(info.name), info.id) << info.name;
    EXPECT_EQ(algorithm_name(info.id), info.name);
    for (std::string_view alias : info.aliases) {
      if (!alias.empty()) {
        EXPECT_EQ(parse_algorithm(alias), info.id) << alias;
      }
    }
    bool any = false;
    for (CollectiveKind k : kAllCollectives) any |= algorithm_supports(info.id, k);
    EXPECT_TRUE(any) << info.name;
  }
  const std::pair<const char*, Algorithm> known[] = {
      {"ring", Algorithm::kRing},
      {"tree", Algorithm::kTree},
      {"binomial", Algorithm::kTree},
      {"binomial_tree", Algorithm::kTree},
      {"dbtree", Algorithm::kDoubleBinaryTree},
      {"double_binary_tree", Algorithm::kDoubleBinaryTree},
      {"double_tree", Algorithm::kDoubleBinaryTree},
      {"rabenseifner", Algorithm::kRabenseifner},
      {"halving_doubling", Algorithm::kRabenseifner},
      {"rhd", Algorithm::kRabenseifner},
      {"rd", Algorithm::kRecursiveDoubling},
      {"recursive_doubling", Algorithm::kRecursiveDoubling},
      {"pairwise", Algorithm::kPairwise},
      {"dissemination", Algorithm::kDissemination},
      {"direct", Algorithm::kDirect},
      {"hier", Algorithm::kHier},
      {"hierarchical", Algorithm::kHier},
  };
  for (const auto& [name, algo] : known) EXPECT_EQ(parse_algorithm(name), algo) << name;
  size_t pairs = 0;
  for (CollectiveKind k : kAllCollectives) pairs += algorithms_for(k).size();
  EXPECT_EQ(supported_pairs().size(), pairs);
}

}  // namespace
}  // namespace rdmaflow
