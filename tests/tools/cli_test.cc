// The tools' command lines, checked by running the built binaries.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tools/cli.h"

namespace {

struct Tool {
  const char* name;
  const char* path;  // empty when this build has no such tool
  std::vector<std::string> options;
  std::string operands = "";  // what a command line needs besides options
};

const std::vector<Tool>& tools() {
  static const std::vector<Tool> kTools = {
      {"p2p",
       RDMAFLOW_TOOL_P2P,
       {"--transport", "--quick", "--json", "--spin", "--seconds", "--lat-min", "--lat-max",
        "--bw-min", "--bw-max", "--rank", "--rendezvous"}},
      {"rdmaflow_coll_bench",
       RDMAFLOW_TOOL_RDMAFLOW_COLL_BENCH,
       {"--op", "--type", "--redop", "--sizes", "--min", "--max", "--factor", "--iters", "--warmup",
        "--vs", "--json", "--transport", "--algo", "--rounds", "--load", "--socket-ring"}},
      {"e2e", RDMAFLOW_TOOL_E2E, {"--steps", "--transports", "--quick", "--json"}},
      {"rdmaflow-demo",
       RDMAFLOW_TOOL_RDMAFLOW_DEMO,
       {"--steps", "--widths", "--batch", "--transports", "--ranks", "--lr", "--json"}},
      {"plan_bench",
       RDMAFLOW_TOOL_PLAN_BENCH,
       {"--ops", "--ranks", "--width", "--repeat", "--random-placement", "--json", "--model",
        "--dim", "--train"}},
      {"rdmaflow-plan",
       RDMAFLOW_TOOL_RDMAFLOW_PLAN,
       {"MODEL", "--dim", "--ranks", "--placement", "--partition", "--tolerance", "--train",
        "--json", "--depth", "--alignment", "--dynamic-hint", "--no-reuse", "--list",
        "--write-plan", "--write-placement"},
       "graph.json"},
      {"rdmaflow-replay",
       RDMAFLOW_TOOL_RDMAFLOW_REPLAY,
       {"MODEL", "--ranks", "--dim", "--train", "--steps", "--depth", "--vary", "--gflops",
        "--transports", "--link-seconds", "--json"},
       "model.onnx"},
      {"rdmaflow-make-examples", RDMAFLOW_TOOL_RDMAFLOW_MAKE_EXAMPLES, {"OUT_DIR"}, "out"},
      {"rdmaflow_cost_model",
       RDMAFLOW_TOOL_RDMAFLOW_COST_MODEL,
       {"--op", "--hosts", "--per-host", "--alpha", "--beta", "--gamma", "--intra-alpha",
        "--intra-beta", "--round", "--piece", "--sizes", "--json"},
       "--alpha 1e-5 --beta 1e-9 --gamma 1e-10 --sizes 8"},
  };
  return kTools;
}

struct Outcome {
  int exit_code = -1;
  std::string output;
};

// Runs `path args` through the shell; `merge_stderr` adds stderr to the output.
Outcome run_tool(const std::string& path, const std::string& args, bool merge_stderr = true) {
  const std::string cmd = "'" + path + "' " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  Outcome r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const Tool& tool(const std::string& name) {
  for (const auto& t : tools()) {
    if (name == t.name) return t;
  }
  throw std::runtime_error("no tool " + name);
}

#define SKIP_IF_NOT_BUILT(t) \
  if (std::string((t).path).empty()) GTEST_SKIP() << (t).name << " is not part of this build"

TEST(ToolsCli, HelpNamesEveryOption) {
  for (const auto& t : tools()) {
    if (std::string(t.path).empty()) continue;
    SCOPED_TRACE(t.name);
    Outcome r = run_tool(t.path, "--help");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("Usage:"), std::string::npos) << r.output;
    for (const auto& o : t.options) EXPECT_NE(r.output.find(o), std::string::npos) << o;
  }
}

TEST(ToolsCli, UnknownArgumentListsTheValidOptions) {
  for (const auto& t : tools()) {
    if (std::string(t.path).empty()) continue;
    SCOPED_TRACE(t.name);
    Outcome r = run_tool(t.path, t.operands + " --no-such-option");
    EXPECT_EQ(r.exit_code, rdmaflow::cli::kUsageError) << r.output;
    EXPECT_NE(r.output.find("--no-such-option"), std::string::npos) << r.output;
    for (const auto& o : t.options) EXPECT_NE(r.output.find(o), std::string::npos) << o;
  }
}

TEST(ToolsCli, HelpShowsSizeDefaultsAsSizes) {
  const Tool& t = tool("p2p");
  SKIP_IF_NOT_BUILT(t);
  Outcome r = run_tool(t.path, "--help");
  EXPECT_NE(r.output.find("--bw-max SIZE=256M"), std::string::npos) << r.output;
}

TEST(ToolsCli, BadSizeIsRefusedNamingTheOption) {
  const Tool& t = tool("p2p");
  SKIP_IF_NOT_BUILT(t);
  for (const char* bad : {"16Q", "-5", "1.5M", "M"}) {
    Outcome r = run_tool(t.path, std::string("--bw-min ") + bad);
    EXPECT_EQ(r.exit_code, rdmaflow::cli::kUsageError) << r.output;
    EXPECT_NE(r.output.find(std::string("--bw-min: '") + bad + "' is not a size"),
              std::string::npos)
        << r.output;
  }
}

// plan_bench --ops abc used to be atoi'd to 0.
TEST(ToolsCli, BadNumberIsRefusedNamingTheOption) {
  const Tool& t = tool("plan_bench");
  SKIP_IF_NOT_BUILT(t);
  Outcome r = run_tool(t.path, "--ops abc");
  EXPECT_EQ(r.exit_code, rdmaflow::cli::kUsageError) << r.output;
  EXPECT_NE(r.output.find("--ops"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("abc"), std::string::npos) << r.output;
  r = run_tool(t.path, "--ops 0");
  EXPECT_EQ(r.exit_code, rdmaflow::cli::kUsageError) << r.output;
  EXPECT_NE(r.output.find("--ops: must be at least 1, not 0"), std::string::npos) << r.output;
}

// p2p --bw-min 16M used to measure from 16 bytes up: one bandwidth row of
// 16 MiB now, the latency rows bounded the same way.
TEST(ToolsCli, P2pReadsSizeSuffixes) {
  const Tool& t = tool("p2p");
  SKIP_IF_NOT_BUILT(t);
  Outcome r =
      run_tool(t.path,
               "--transport tcp --lat-min 8 --lat-max 8 --bw-min 16M --bw-max 16M --seconds 0.01 "
               "--json",
               /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  ASSERT_EQ(j["rows"].size(), 1u) << r.output;
  const auto& row = j["rows"][0];
  ASSERT_EQ(row["bandwidth_MBps"].size(), 1u) << r.output;
  EXPECT_EQ(row["bandwidth_MBps"][0]["size"].get<uint64_t>(), 16u << 20);
  ASSERT_EQ(row["latency_us"].size(), 1u) << r.output;
  EXPECT_EQ(row["latency_us"][0]["size"].get<uint64_t>(), 8u);
}

// p2p --interleave: the socket's round trips and the transport's in one loop
// (both under the same CPU placement), each timed on its own and recorded as
// interleaved; two sizes, two transports.
TEST(ToolsCli, P2pInterleavesTheSocketReference) {
  const Tool& t = tool("p2p");
  SKIP_IF_NOT_BUILT(t);
  Outcome r = run_tool(t.path,
                       "--transport tcp --transport ucx_shm --interleave --lat-min 8 "
                       "--lat-max 1K --quick --bw-max 1K --link-seconds 0 --no-grpc --json",
                       /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  size_t measured = 0;
  for (const auto& row : j["rows"]) {
    if (row.contains("skipped")) continue;  // a build without UCX
    ++measured;
    EXPECT_TRUE(row.value("latency_interleaved", false)) << row.dump();
    ASSERT_GE(row["latency_us"].size(), 2u) << row.dump();
    for (const auto& l : row["latency_us"]) {
      EXPECT_GT(l["transport_p50"].get<double>(), 0) << l.dump();
      EXPECT_GT(l["socket_p50"].get<double>(), 0) << l.dump();
      EXPECT_GT(l["transport"].get<double>(), 0) << l.dump();
    }
  }
  EXPECT_GE(measured, 1u) << r.output;
}

// The JSON a tool wrote to `path` (discarded when missing or malformed).
nlohmann::json read_json(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return nlohmann::json(nlohmann::json::value_t::discarded);
  auto j = nlohmann::json::parse(f, nullptr, false);
  std::fclose(f);
  return j;
}

// --vs socket, --socket-ring and --load: the socket ping-pong is a row beside
// rdmaflow's, timed, never checked for a reduction; the plain-socket ring is
// measured once, before the rows; the load is recorded. Two ranks under
// mpirun, over tcp (no figure is judged: benchmarks hold those).
TEST(ToolsCli, CollBenchSocketReferenceUnderLoad) {
  const Tool& t = tool("rdmaflow_coll_bench");
  SKIP_IF_NOT_BUILT(t);
  const std::string mpirun = RDMAFLOW_TOOLS_MPIRUN;
  if (mpirun.empty()) GTEST_SKIP() << "no mpirun";
  const std::string json = ::testing::TempDir() + "coll_bench_socket.json";
  Outcome r = run_tool(mpirun, "--allow-run-as-root --oversubscribe -np 2 '" + std::string(t.path) +
                                   "' --transport tcp --sizes 8,4K -n 5 -w 1 --vs socket "
                                   "--socket-ring 0.2 --load 1 --json '" +
                                   json + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("competing load: 1 busy process"), std::string::npos) << r.output;
  const nlohmann::json j = read_json(json);
  ASSERT_FALSE(j.is_discarded()) << json;
  EXPECT_EQ(j["load"].get<int>(), 1);
  EXPECT_NE(r.output.find("# socket ring: plain TCP"), std::string::npos) << r.output;
  ASSERT_TRUE(j.contains("socket_ring")) << j.dump();
  EXPECT_GT(j["socket_ring"]["MBps"].get<double>(), 0.0);
  EXPECT_GT(j["socket_ring"]["seconds"].get<double>(), 0.0);
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const auto& row : j["rows"]) {
    EXPECT_EQ(row["rdmaflow"]["wrong"].get<uint64_t>(), 0u);
    ASSERT_TRUE(row.contains("socket")) << row.dump();
    EXPECT_EQ(row["socket"]["algo"].get<std::string>(), "pingpong");
    EXPECT_GT(row["socket"]["time_us"].get<double>(), 0.0);
    // Every column's process CPU time per call, all ranks summed (ticks: may be 0).
    for (const char* col : {"rdmaflow", "socket"}) {
      ASSERT_TRUE(row[col].contains("cpu_us_per_call")) << row.dump();
      EXPECT_GE(row[col]["cpu_us_per_call"].get<double>(), 0.0) << row.dump();
    }
  }
}

// --vs plain: the plain-socket allreduce floor runs beside rdmaflow on 2 and
// 3 ranks (3: the fold of recursive doubling and Rabenseifner, ring chunks and
// halvings of unequal and of no elements at 8 B and 4100 B), its result
// checked like every column's (the trial runs every algorithm on the same
// buffers first), its trial of every algorithm in the JSON and the note that
// names the one run.
TEST(ToolsCli, CollBenchPlainSocketFloor) {
  const Tool& t = tool("rdmaflow_coll_bench");
  SKIP_IF_NOT_BUILT(t);
  const std::string mpirun = RDMAFLOW_TOOLS_MPIRUN;
  if (mpirun.empty()) GTEST_SKIP() << "no mpirun";
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const std::string json =
        ::testing::TempDir() + "coll_bench_plain_" + std::to_string(ranks) + ".json";
    Outcome r = run_tool(mpirun, "--allow-run-as-root --oversubscribe -np " +
                                     std::to_string(ranks) + " '" + std::string(t.path) +
                                     "' --transport tcp --sizes 8,4100,1M -n 4 -w 1 --vs plain "
                                     "--json '" +
                                     json + "'");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("# plain: f32 sum allreduce over a full mesh"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("#   plain: rd "), std::string::npos) << r.output;
    const nlohmann::json j = read_json(json);
    ASSERT_FALSE(j.is_discarded()) << json;
    ASSERT_EQ(j["rows"].size(), 3u) << j.dump();
    for (const auto& row : j["rows"]) {
      ASSERT_TRUE(row.contains("plain")) << row.dump();
      const auto& p = row["plain"];
      EXPECT_EQ(p["wrong"].get<uint64_t>(), 0u) << row.dump();
      EXPECT_GT(p["time_us"].get<double>(), 0.0);
      const std::string algo = p["algo"].get<std::string>();
      ASSERT_TRUE(p.contains("trial")) << row.dump();
      // The row ran the fastest of the trial.
      std::string fastest;
      for (const char* name : {"rd", "rabenseifner", "ring"}) {
        const double us = p["trial"][std::string(name) + "_us"].get<double>();
        EXPECT_GT(us, 0.0) << name;
        if (fastest.empty() || us < p["trial"][fastest + "_us"].get<double>()) fastest = name;
      }
      EXPECT_EQ(algo, fastest);
    }
  }
  // Other operations and types have no plain column: n/a, not a wrong result.
  Outcome other =
      run_tool(mpirun, "--allow-run-as-root --oversubscribe -np 2 '" + std::string(t.path) +
                           "' --transport tcp --op allgather --sizes 64 -n 2 --vs plain");
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_NE(other.output.find("n/a"), std::string::npos) << other.output;
}

// --algo all --rounds: every algorithm and the selector's column are timed in
// each round (a median per round in the JSON, progress per round on stderr),
// the selector line compares the selector's column with the fastest forced
// one and with its own algorithm forced. Two ranks over tcp; no figure is
// judged.
TEST(ToolsCli, CollBenchAlgoAllInterleavesRounds) {
  const Tool& t = tool("rdmaflow_coll_bench");
  SKIP_IF_NOT_BUILT(t);
  const std::string mpirun = RDMAFLOW_TOOLS_MPIRUN;
  if (mpirun.empty()) GTEST_SKIP() << "no mpirun";
  const std::string json = ::testing::TempDir() + "coll_bench_rounds.json";
  Outcome r =
      run_tool(mpirun, "--allow-run-as-root --oversubscribe -np 2 '" + std::string(t.path) +
                           "' --transport tcp --algo all --rounds 3 --sizes 8,64K -n 6 -w 1 "
                           "--json '" +
                           json + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("# 65536 B: round 3 of 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("interleaved in 3 rounds"), std::string::npos) << r.output;
  const nlohmann::json j = read_json(json);
  ASSERT_FALSE(j.is_discarded()) << json;
  EXPECT_EQ(j["rounds"].get<int>(), 3);
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const auto& row : j["rows"]) {
    const auto& sel = row["selector"];
    ASSERT_TRUE(sel.contains("time_vs_fastest")) << row.dump();
    EXPECT_EQ(sel["chose"], row["rdmaflow"]["algo"]) << row.dump();
    EXPECT_TRUE(row.contains(sel["fastest"].get<std::string>())) << row.dump();
    EXPECT_TRUE(sel.contains("forced_same_us")) << row.dump();
    for (const char* col : {"rdmaflow", "ring", "tree", "rd"}) {
      ASSERT_TRUE(row.contains(col)) << col << ": " << row.dump();
      EXPECT_EQ(row[col]["wrong"].get<uint64_t>(), 0u) << col;
      EXPECT_EQ(row[col]["rounds_us"].size(), 3u) << col;
      EXPECT_EQ(row[col]["iters"].get<int>(), 6) << col;  // 2 per round
    }
  }
  // A round count of 0 is refused with the option's name.
  Outcome bad = run_tool(t.path, "--algo all --rounds 0");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--rounds"), std::string::npos) << bad.output;
}

TEST(ToolsCli, PlanReadsSizeSuffixes) {
  const Tool& t = tool("rdmaflow-plan");
  SKIP_IF_NOT_BUILT(t);
  Outcome r = run_tool(t.path, std::string(RDMAFLOW_GRAPH_EXAMPLES) + "/mlp_model_parallel.json " +
                                   "--alignment 4K --dynamic-hint 1M --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"alignment\": 4096"), std::string::npos) << r.output;
}

// rdmaflow_cost_model answers with the library's own terms (ring, one rank
// per host, against the formula of collectives/algorithms/ring.cc); a flat
// ring over hosts x q ranks costs what the one-level ring over as many ranks
// does; pairing the near partners first never costs more than the far first;
// a layout it cannot model is refused.
TEST(ToolsCli, CostModelPredictions) {
  const Tool& t = tool("rdmaflow_cost_model");
  SKIP_IF_NOT_BUILT(t);
  const std::string costs = "--alpha 1e-5 --beta 1e-9 --gamma 1e-10 --sizes 16M --json ";
  auto rows = [&](const std::string& args) {
    Outcome r = run_tool(t.path, costs + args, /*merge_stderr=*/false);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::map<std::string, double> out;
    auto j = nlohmann::json::parse(r.output, nullptr, false);
    if (j.is_discarded()) return out;
    for (const auto& row : j["rows"]) out[row["schedule"]] = row["seconds"].get<double>();
    return out;
  };
  const double m = 16 << 20, n = 8;
  const double pieces = std::ceil(m / n / (512 * 1024));
  const double ring =
      2 * (n - 1) * 1e-5 * pieces + 2 * (n - 1) / n * m * 1e-9 + (n - 1) / n * m * 1e-10;
  auto flat = rows("--hosts 8");
  EXPECT_NEAR(flat["ring"], ring, 1e-12);
  EXPECT_TRUE(flat.count("rabenseifner") && flat.count("tree") && flat.count("direct"));
  auto two = rows("--hosts 4 --per-host 2 --intra-alpha 1e-7 --intra-beta 1e-10");
  EXPECT_NEAR(two["flat ring"], ring, 1e-12);
  EXPECT_LE(two["flat rabenseifner near"], two["flat rabenseifner"]);
  EXPECT_GT(two["hier rabenseifner"], 0);
  // Two levels: every algorithm as the selector costs it, too.
  EXPECT_NEAR(two["ring"], two["flat ring"], 1e-12);
  EXPECT_GT(two["hier"], 0);
  EXPECT_TRUE(two.count("tree") && two.count("dbtree") && two.count("rd"));
  // Out of cache: 16 MiB touches 48 MiB, of which all but the 1 MiB cache
  // reduce at --gamma-cold.
  auto cold = rows("--hosts 8 --gamma-cold 1e-9 --cache 1M");
  const double g = (1.0 * (1 << 20) * 1e-10 + (3 * m - (1 << 20)) * 1e-9) / (3 * m);
  EXPECT_NEAR(cold["ring"], ring + (n - 1) / n * m * (g - 1e-10), 1e-12);
  Outcome bad = run_tool(t.path, costs + "--hosts 4 --per-host 3 --intra-alpha 1 --intra-beta 1");
  EXPECT_EQ(bad.exit_code, rdmaflow::cli::kUsageError) << bad.output;
  EXPECT_NE(bad.output.find("powers of two"), std::string::npos) << bad.output;
  bad = run_tool(t.path, costs + "--hosts 4 --per-host 2");
  EXPECT_EQ(bad.exit_code, rdmaflow::cli::kUsageError) << bad.output;
  EXPECT_NE(bad.output.find("--intra-alpha"), std::string::npos) << bad.output;
}

// --terms: each algorithm's crowded estimate, term by term, adds up to what
// the selector weighs (the JSON's seconds). With the parameters of a 2 hosts x
// 2 ranks sweep (docs/benchmarks.md, "Selector: 2 x 2 below 16 MiB and
// loopback at 1 MiB") the tree and hier send, reduce and copy the same, and
// neither has an excess: the tree's root does less than a CPU's half of the
// sums of 4 ranks on 2 CPUs (CostModel.TheTreesRootIsSharedOutOnlyBeyondACpusShare).
TEST(ToolsCli, CostModelTerms) {
  const Tool& t = tool("rdmaflow_cost_model");
  SKIP_IF_NOT_BUILT(t);
  const std::string args =
      "--hosts 2 --per-host 2 --alpha 1.78e-4 --beta 8.35e-10 --gamma 2.32e-11 "
      "--gamma-cold 1.67e-10 --cache 2M --round 5e-6 --intra-alpha 4.27e-7 "
      "--intra-beta 5.92e-11 --cpus 2 --sizes 16M ";
  Outcome r = run_tool(t.path, args + "--terms", /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // name total = rounds + messages + bytes + memory + excess + chain + path
  std::map<std::string, std::vector<double>> terms;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string name, eq;
    double total = 0;
    if (!(in >> name >> total >> eq) || eq != "=") continue;
    std::vector<double> v{total};
    for (double x = 0; in >> x;) {
      v.push_back(x);
      std::string plus;
      in >> plus;
    }
    terms[name] = v;
  }
  ASSERT_TRUE(terms.count("tree") && terms.count("hier")) << r.output;
  Outcome j = run_tool(t.path, args + "--json", /*merge_stderr=*/false);
  ASSERT_EQ(j.exit_code, 0) << j.output;
  auto json = nlohmann::json::parse(j.output, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << j.output;
  for (const auto& row : json["rows"]) {
    auto it = terms.find(row["schedule"].get<std::string>());
    if (it == terms.end()) continue;
    const std::vector<double>& v = it->second;
    ASSERT_EQ(v.size(), 8u) << it->first;
    double sum = 0;
    for (size_t i = 1; i < v.size(); ++i) sum += v[i];
    EXPECT_NEAR(v[0], sum, 0.5) << it->first;  // us, printed to 0.1
    EXPECT_NEAR(v[0], row["seconds"].get<double>() * 1e6, 0.1) << it->first;
  }
  const std::vector<double>&tree = terms["tree"], &hier = terms["hier"];
  for (size_t i : {2, 3, 4}) EXPECT_NEAR(tree[i], hier[i], 0.5) << "term " << i;
  EXPECT_NEAR(tree[5], 0, 0.05);
  EXPECT_NEAR(hier[5], 0, 0.05);
}

TEST(ToolsCli, ParseSize) {
  using rdmaflow::cli::parse_size;
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("16M"), 16u << 20);
  EXPECT_EQ(parse_size("16m"), 16u << 20);
  EXPECT_EQ(parse_size("64K"), 64u << 10);
  EXPECT_EQ(parse_size("64KiB"), 64u << 10);
  EXPECT_EQ(parse_size("2GB"), uint64_t{2} << 30);
  EXPECT_EQ(parse_size("0"), 0u);
  for (const char* bad :
       {"", "K", "-1", "1.5M", "16Q", "16MM", "1 M", "99999999999999999999", "17179869184G"}) {
    EXPECT_FALSE(parse_size(bad).has_value()) << bad;
  }
  EXPECT_EQ(rdmaflow::cli::size_text(256u << 20), "256M");
  EXPECT_EQ(rdmaflow::cli::size_text(1024), "1K");
  EXPECT_EQ(rdmaflow::cli::size_text(4097), "4097");
}

}  // namespace
