// The full correctness matrix, in real processes: every algorithm x every type
// x every reduction x world sizes 1..8 x counts 0, 1, fewer than the ranks,
// odd, and 1 MiB + 1 elements (per-rank collectives: 1 MiB / world + 1 per
// rank), in and out of place, against a reference computed locally. One test
// per (backend, world size), label "collectives-full".
#include <gtest/gtest.h>

#include <ostream>

#include "tests/collectives/coll_util.h"

namespace rdmaflow::testing {
namespace {

struct MatrixCase {
  BackendRow backend;
  int world;
};

// How ctest lists the case ("# GetParam() = tcp, world size 4").
void PrintTo(const MatrixCase& c, std::ostream* os) {
  *os << c.backend.label << ", world size " << c.world;
}

class Matrix : public ::testing::TestWithParam<MatrixCase> {};

const DataType kTypes[] = {DataType::kF32, DataType::kF64, DataType::kF16, DataType::kBF16,
                           DataType::kI32, DataType::kI64, DataType::kU8};

bool reduces(CollectiveKind k) {
  return k == CollectiveKind::kAllreduce || k == CollectiveKind::kReduceScatter ||
         k == CollectiveKind::kReduce;
}
bool per_rank(CollectiveKind k) {
  return k == CollectiveKind::kReduceScatter || k == CollectiveKind::kAllgather ||
         k == CollectiveKind::kAlltoall;
}

TEST_P(Matrix, EveryAlgorithmTypeReductionAndCount) {
  const MatrixCase mc = GetParam();
  RunOptions ro;
  ro.timeout = Millis(1800000);
  auto r = run_ranks(
      mc.world,
      [&](int rank, int n, Exchange& ex) {
        CommNode node;
        RF_ASSERT_OK(make_comm_node(mc.backend, rank, n, ex, node));
        ReferenceCache cache;
        size_t calls = 0;
        for (DataType t : kTypes) {
          for (ReduceOp op : kAllReduceOps) {
            const uint32_t seed = 1 + static_cast<uint32_t>(t) * 8 + static_cast<uint32_t>(op);
            for (const KindAlgorithm& a : supported_pairs()) {
              if (!reduces(a.kind) && op != ReduceOp::kSum) continue;
              if (a.kind == CollectiveKind::kBarrier && t != DataType::kF32) continue;
              const size_t big = per_rank(a.kind) ? (size_t{1} << 20) / n + 1 : (1u << 20) + 1;
              const size_t counts[] = {0, 1, static_cast<size_t>(std::max(1, n - 1)), 37, big};
              for (size_t ci = 0; ci < std::size(counts); ++ci) {
                CallSpec c;
                c.kind = a.kind;
                c.algo = a.algo;
                c.type = t;
                c.op = op;
                c.count = counts[ci];
                c.root = static_cast<int>((ci + seed) % n);
                c.in_place = (ci + seed) % 2 == 1 && a.kind != CollectiveKind::kBarrier;
                c.seed = seed;
                std::string first;
                auto wrong = run_and_check_cached(*node.comm, c, cache, &first);
                RF_ASSERT_OK(wrong);
                EXPECT_EQ(*wrong, 0u) << "rank " << rank << ": " << describe(c, n) << ": " << first;
                if (*wrong) return 1;
                ++calls;
              }
            }
          }
        }
        if (rank == 0) std::printf("world %d: %zu calls checked\n", n, calls);
        // Nobody tears down its channels while a peer may still finish its last call.
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      ro);
  if (r.skipped) GTEST_SKIP() << r.message;
  ASSERT_TRUE(r.ok) << r.message;
}

std::vector<MatrixCase> cases() {
  std::vector<MatrixCase> out;
  for (const BackendRow& b : backend_rows()) {
    for (int w = 1; w <= b.max_world; ++w) out.push_back({b, w});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Full, Matrix, ::testing::ValuesIn(cases()), [](const auto& info) {
  return info.param.backend.label + "_world" + std::to_string(info.param.world);
});

}  // namespace
}  // namespace rdmaflow::testing
