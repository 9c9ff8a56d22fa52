// What a registration cache would cost on verbs, against the staging copy that
// rdmaflow does instead (docs/pytorch.md, "Other tensors"). Per size, in
// interleaved rounds on the same device:
//   - a cache miss: ibv_reg_mr + ibv_dereg_mr of a fresh buffer (its pages
//     already touched, as a tensor's are), what a cache pays once per buffer;
//   - staging: a memcpy of the same bytes into a buffer that stays registered,
//     what rdmaflow pays per send of an unregistered tensor;
// and the break-even: how many sends of one buffer repay one registration.
// With --allreduce, also a 2-rank allreduce (fork; over verbs unless
// RDMAFLOW_TRANSPORT says otherwise) of a registered source (a cache hit,
// Communicator::allocate_registered) against a plain source (staged), p50 each.
// Without an RDMA device it measures the copy alone (the staging side needs no
// device), prints SKIP and the reason for the rest, and exits 0.
//
//   reg_cost_bench [--sizes 64K,1M,16M,64M] [--rounds 9] [--allreduce] [--json FILE]
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/local_pair.h"
#include "collectives/communicator.h"
#include "runtime/rendezvous/bootstrap.h"
#include "runtime/selection/transport_select.h"
#include "tools/free_port.h"

namespace {

using Clock = std::chrono::steady_clock;
using rdmaflow::Communicator;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Options {
  std::vector<size_t> sizes{64 << 10, 1 << 20, 16 << 20, 64 << 20};
  int rounds = 9;
  bool allreduce = false;
  std::string json;
};

size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  const std::string unit = end ? end : "";
  if (unit == "K" || unit == "k") v *= 1 << 10;
  if (unit == "M" || unit == "m") v *= 1 << 20;
  if (unit == "G" || unit == "g") v *= 1 << 30;
  if (v <= 0 || (unit != "" && unit != "K" && unit != "k" && unit != "M" && unit != "m" &&
                 unit != "G" && unit != "g")) {
    std::fprintf(stderr, "reg_cost_bench: bad size '%s' (e.g. 64K, 16M)\n", s.c_str());
    std::exit(2);
  }
  return static_cast<size_t>(v);
}

const char* kUsage =
    "usage: reg_cost_bench [--sizes 64K,1M,16M,64M] [--rounds N] [--allreduce] [--json FILE]\n"
    "  Per size: ibv_reg_mr + ibv_dereg_mr of a fresh buffer (a registration cache's\n"
    "  miss) against a memcpy of the same bytes (rdmaflow's staging copy per send),\n"
    "  interleaved rounds, medians and their ratio (the sends that repay a registration).\n"
    "  --allreduce  also a 2-rank allreduce (RDMAFLOW_TRANSPORT, default verbs) of a\n"
    "               registered source against a staged one.\n"
    "  Device: RDMAFLOW_IB_DEVICE, else the first. Without one: prints SKIP, exits 0.\n";

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "reg_cost_bench: %s needs a value\n%s", a.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--sizes") {
      o.sizes.clear();
      const std::string list = value();
      for (size_t at = 0; at <= list.size();) {
        size_t comma = std::min(list.find(',', at), list.size());
        o.sizes.push_back(parse_size(list.substr(at, comma - at)));
        at = comma + 1;
      }
    } else if (a == "--rounds") {
      o.rounds = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--allreduce") {
      o.allreduce = true;
    } else if (a == "--json") {
      o.json = value();
    } else {
      std::fprintf(stderr, "reg_cost_bench: unknown argument %s\n%s", a.c_str(), kUsage);
      std::exit(2);
    }
  }
  return o;
}

// The device rdmaflow would use, opened; null with the reason in `why`.
ibv_context* open_device(std::string* why) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) {
    *why = list == nullptr ? std::string("ibv_get_device_list failed: ") + std::strerror(errno)
                           : "no RDMA device";
    if (list) ibv_free_device_list(list);
    return nullptr;
  }
  const char* want = std::getenv("RDMAFLOW_IB_DEVICE");
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n && ctx == nullptr; ++i) {
    if (want && *want && std::strcmp(ibv_get_device_name(list[i]), want) != 0) continue;
    ctx = ibv_open_device(list[i]);
  }
  ibv_free_device_list(list);
  if (ctx == nullptr) *why = want ? std::string("cannot open ") + want : "cannot open a device";
  return ctx;
}

struct RegRow {
  size_t bytes;
  double reg_us, dereg_us, memcpy_us;
};

// One size: `rounds` rounds of (fresh buffer registered and deregistered;
// memcpy of the same bytes into the staging buffer), interleaved. Without a
// protection domain (no device), the copy alone.
RegRow measure_registration(ibv_pd* pd, size_t bytes, int rounds) {
  std::vector<double> reg, dereg, copy;
  void* stage = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  std::memset(stage, 1, bytes);
  // Round -1 warms up (the process's first registration and copy cost more) and
  // is not recorded.
  for (int r = -1; r < rounds; ++r) {
    // A fresh mapping each round: new pages, as a newly allocated tensor has.
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    std::memset(p, static_cast<int>(r), bytes);  // touched, not timed
    auto t0 = Clock::now();
    if (pd != nullptr) {
      constexpr int kAccess =
          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
      ibv_mr* mr = ibv_reg_mr(pd, p, bytes, kAccess);
      if (r >= 0) reg.push_back(us_since(t0));
      if (mr == nullptr) {
        std::fprintf(stderr, "ibv_reg_mr(%zu bytes) failed: %s (ulimit -l?)\n", bytes,
                     std::strerror(errno));
        std::exit(1);
      }
      t0 = Clock::now();
      ibv_dereg_mr(mr);
      if (r >= 0) dereg.push_back(us_since(t0));
    }
    t0 = Clock::now();
    std::memcpy(stage, p, bytes);
    if (r >= 0) copy.push_back(us_since(t0));
    ::munmap(p, bytes);
  }
  std::free(stage);
  return RegRow{bytes, median(reg), median(dereg), median(copy)};
}

struct ReduceRow {
  size_t bytes;
  double registered_us, staged_us;
  uint64_t staged_pieces, registered_pieces;
};

// Rank `rank` of the 2-rank allreduce comparison; rank 0 returns the rows.
std::vector<ReduceRow> allreduce_rank(int rank, const Options& o, const std::string& rendezvous) {
  using namespace rdmaflow;
  const BootstrapOptions bo = bench::local_pair(rank, "reg_cost_bench", rendezvous);
  auto fail = [&](const char* step, const Status& st) {
    std::fprintf(stderr, "rank %d: %s: %s\n", rank, step, st.to_string().c_str());
    std::exit(1);
  };
  auto boot = Bootstrap::create(bo);
  if (!boot.is_ok()) fail("joining", boot.status());
  const char* env = std::getenv("RDMAFLOW_TRANSPORT");
  auto mesh = connect_selected_mesh(**boot, requested_transport(env && *env ? "" : "verbs"));
  if (!mesh.is_ok()) fail("connecting", mesh.status());
  CommunicatorSetup setup;
  setup.rank = rank;
  setup.world = 2;
  setup.channels = mesh->channels;
  setup.transports = mesh->selection->per_peer();
  CommunicatorOptions co;
  co.direct = false;  // through the channels (verbs), not the same-host path
  auto comm = Communicator::create(setup, co);
  if (!comm.is_ok()) fail("creating the communicator", comm.status());
  if (rank == 0) std::printf("allreduce over: %s\n", mesh->selection->summary().c_str());
  std::vector<ReduceRow> rows;
  for (size_t bytes : o.sizes) {
    const size_t n = bytes / sizeof(float);
    auto reg = (*comm)->allocate_registered(bytes);
    if (!reg.is_ok()) fail("allocate_registered", reg.status());
    std::vector<float> plain(n, 1.0f), out(n);
    std::fill_n(static_cast<float*>((*reg)->data()), n, 1.0f);
    std::vector<double> t_reg, t_plain;
    auto one = [&](const void* in, std::vector<double>* t) {
      auto t0 = Clock::now();
      Status st = (*comm)->allreduce(in, out.data(), n, DataType::kF32, ReduceOp::kSum);
      if (!st.is_ok()) fail("allreduce", st);
      t->push_back(us_since(t0));
    };
    one((*reg)->data(), &t_reg);  // warm-up
    one(plain.data(), &t_plain);
    const FabricStats before = (*comm)->stats();
    for (int r = 0; r < o.rounds; ++r) {
      one((*reg)->data(), &t_reg);
      one(plain.data(), &t_plain);
    }
    const FabricStats after = (*comm)->stats();
    t_reg.erase(t_reg.begin());
    t_plain.erase(t_plain.begin());
    rows.push_back({bytes, median(t_reg), median(t_plain),
                    after.staged_pieces - before.staged_pieces,
                    after.registered_source_pieces - before.registered_source_pieces});
  }
  return rows;
}

std::string human(size_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  std::string why;
  ibv_context* ctx = open_device(&why);
  ibv_pd* pd = nullptr;
  nlohmann::json j;
  j["rounds"] = o.rounds;
  if (ctx == nullptr) {
    std::printf(
        "SKIP registration%s: %s; only the copy is measured here (in the soft-RoCE "
        "guest: scripts/softroce-vm -- build/bench/reg_cost_bench)\n",
        o.allreduce ? " and allreduce" : "", why.c_str());
    j["skip"] = why;
  } else {
    std::printf("device %s\n", ibv_get_device_name(ctx->device));
    j["device"] = ibv_get_device_name(ctx->device);
    pd = ibv_alloc_pd(ctx);
    if (pd == nullptr) {
      std::fprintf(stderr, "ibv_alloc_pd failed: %s\n", std::strerror(errno));
      return 1;
    }
  }
  std::printf("%10s %12s %12s %12s %12s %8s %14s\n", "size", "reg_mr us", "dereg_mr us",
              "reg+dereg us", "memcpy us", "ratio", "repaid by send");
  for (size_t bytes : o.sizes) {
    RegRow r = measure_registration(pd, bytes, o.rounds);
    if (pd == nullptr) {
      std::printf("%10s %12s %12s %12s %12.1f\n", human(bytes).c_str(), "-", "-", "-", r.memcpy_us);
      j["registration"].push_back({{"bytes", bytes}, {"memcpy_us", r.memcpy_us}});
      continue;
    }
    const double miss = r.reg_us + r.dereg_us;
    const double ratio = r.memcpy_us > 0 ? miss / r.memcpy_us : 0;
    std::printf("%10s %12.1f %12.1f %12.1f %12.1f %7.2fx %14.0f\n", human(bytes).c_str(), r.reg_us,
                r.dereg_us, miss, r.memcpy_us, ratio, std::ceil(ratio));
    j["registration"].push_back({{"bytes", bytes},
                                 {"reg_mr_us", r.reg_us},
                                 {"dereg_mr_us", r.dereg_us},
                                 {"memcpy_us", r.memcpy_us},
                                 {"miss_over_copy", ratio}});
  }
  if (ctx == nullptr) {
    if (!o.json.empty()) std::ofstream(o.json) << j.dump(2) << "\n";
    return 0;
  }
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  std::printf(
      "ratio = (reg_mr + dereg_mr) / memcpy: a cached registration costs that many staging "
      "copies, so it is repaid by the send in the last column (medians of %d rounds)\n",
      o.rounds);

  if (o.allreduce) {
    const std::string rendezvous = "127.0.0.1:" + std::to_string(rdmaflow::dev::free_port());
    std::fflush(stdout);
    pid_t child = ::fork();
    if (child == 0) {
      allreduce_rank(1, o, rendezvous);
      std::_Exit(0);
    }
    auto rows = allreduce_rank(0, o, rendezvous);
    int status = 0;
    ::waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "rank 1 failed\n");
      return 1;
    }
    std::printf("%10s %16s %14s %8s %22s\n", "size", "registered us", "staged us", "ratio",
                "pieces staged/registered");
    for (const auto& r : rows) {
      std::printf("%10s %16.1f %14.1f %7.2fx %12llu/%llu\n", human(r.bytes).c_str(),
                  r.registered_us, r.staged_us,
                  r.registered_us > 0 ? r.staged_us / r.registered_us : 0,
                  static_cast<unsigned long long>(r.staged_pieces),
                  static_cast<unsigned long long>(r.registered_pieces));
      j["allreduce"].push_back(
          {{"bytes", r.bytes}, {"registered_us", r.registered_us}, {"staged_us", r.staged_us}});
    }
    std::printf("ratio = staged / registered source, p50 of %d rounds each, interleaved\n",
                o.rounds);
  }
  if (!o.json.empty()) std::ofstream(o.json) << j.dump(2) << "\n";
  return 0;
}
