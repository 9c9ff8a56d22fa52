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
      for (CollectiveKind kind : test::kHierKinds) {
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
  for (CollectiveKind kind : test::kHierKinds) {
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
