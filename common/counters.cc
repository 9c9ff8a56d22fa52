#include "common/counters.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "common/env.h"
#include "common/log.h"

namespace rdmaflow::stats {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::pair<std::string, int>, std::unique_ptr<PeerCounters>, std::less<>> by_pair;
};

// Never destroyed: channels and the exit report may use counters while static
// objects are being torn down.
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

std::atomic<int> g_rank{-1};

uint64_t load(const std::atomic<uint64_t>& v) {
  return v.load(std::memory_order_relaxed);
}

ExitReport& exit_report() {
  static auto* r = new ExitReport;
  return *r;
}

void report_at_exit() {
  const ExitReport& want = exit_report();
  const Snapshot s = snapshot();
  if (want.table) std::fprintf(stderr, "%s", to_table(s).c_str());
  if (!want.prometheus_path.empty()) {
    std::string path = want.prometheus_path;
    for (size_t at = path.find("%r"); at != std::string::npos; at = path.find("%r", at)) {
      path.replace(at, 2, std::to_string(s.rank));
    }
    Status st = write_file(path, to_prometheus(s));
    if (!st.is_ok()) std::fprintf(stderr, "RDMAFLOW_STATS: %s\n", st.to_string().c_str());
  }
}

// Reads RDMAFLOW_STATS once and, when it asks for a report, arranges for it at exit.
void arm_exit_report() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto text = env_string("RDMAFLOW_STATS");
    if (!text || text->empty() || *text == "0") return;
    auto parsed = parse_exit_report(*text);
    if (!parsed.is_ok()) {
      RDMAFLOW_LOG_WARN("{} (no counters reported)", parsed.status().to_string());
      return;
    }
    exit_report() = *parsed;
    std::atexit(report_at_exit);
  });
}

std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.insert(0, width - s.size(), ' ');
  return s;
}

}  // namespace

PeerCounters& counters(std::string_view transport, int peer) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_pair.find(std::make_pair(std::string(transport), peer));
  if (it == r.by_pair.end()) {
    it =
        r.by_pair
            .emplace(std::make_pair(std::string(transport), peer), std::make_unique<PeerCounters>())
            .first;
  }
  return *it->second;
}

PeerCounters& unbound() {
  static auto* c = new PeerCounters;
  return *c;
}

void set_rank(int rank) {
  g_rank.store(rank, std::memory_order_relaxed);
  arm_exit_report();
}

int rank() {
  return g_rank.load(std::memory_order_relaxed);
}

Snapshot snapshot() {
  Snapshot s;
  s.rank = rank();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& [key, c] : r.by_pair) {
    PeerStats p;
    p.transport = key.first;
    p.peer = key.second;
    p.bytes_sent = load(c->bytes_sent);
    p.bytes_received = load(c->bytes_received);
    p.writes = load(c->writes);
    p.reads = load(c->reads);
    p.messages_sent = load(c->messages_sent);
    p.messages_received = load(c->messages_received);
    p.errors = load(c->errors);
    p.retries = load(c->retries);
    p.credit_stalls = load(c->credit_stalls);
    p.wait_ns = load(c->wait_ns);
    s.peers.push_back(std::move(p));
  }
  return s;
}

std::string to_table(const Snapshot& s) {
  static const char* const kHeads[] = {"transport", "peer",    "sent(B)", "recv(B)",
                                       "writes",    "reads",   "msg_out", "msg_in",
                                       "errors",    "retries", "stalls",  "wait(ms)"};
  constexpr size_t kColumns = std::size(kHeads);
  auto cells = [](const PeerStats& p, std::string peer) {
    char wait[32];
    std::snprintf(wait, sizeof(wait), "%.1f", static_cast<double>(p.wait_ns) / 1e6);
    return std::vector<std::string>{p.transport,
                                    std::move(peer),
                                    std::to_string(p.bytes_sent),
                                    std::to_string(p.bytes_received),
                                    std::to_string(p.writes),
                                    std::to_string(p.reads),
                                    std::to_string(p.messages_sent),
                                    std::to_string(p.messages_received),
                                    std::to_string(p.errors),
                                    std::to_string(p.retries),
                                    std::to_string(p.credit_stalls),
                                    wait};
  };
  std::vector<std::vector<std::string>> rows;
  PeerStats total;
  total.transport = "total";
  for (const PeerStats& p : s.peers) {
    rows.push_back(cells(p, std::to_string(p.peer)));
    total.bytes_sent += p.bytes_sent;
    total.bytes_received += p.bytes_received;
    total.writes += p.writes;
    total.reads += p.reads;
    total.messages_sent += p.messages_sent;
    total.messages_received += p.messages_received;
    total.errors += p.errors;
    total.retries += p.retries;
    total.credit_stalls += p.credit_stalls;
    total.wait_ns += p.wait_ns;
  }
  if (s.peers.size() > 1) rows.push_back(cells(total, "*"));
  std::vector<size_t> width(kColumns);
  for (size_t c = 0; c < kColumns; ++c) width[c] = std::string_view(kHeads[c]).size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < kColumns; ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out = "rdmaflow stats: rank " + std::to_string(s.rank) + ", pid " +
                    std::to_string(::getpid()) + "\n";
  auto line = [&](const auto& cells) {
    for (size_t c = 0; c < kColumns; ++c) {
      if (c != 0) out += "  ";
      out += c == 0 ? std::string(cells[c]) +
                          std::string(width[c] - std::string_view(cells[c]).size(), ' ')
                    : pad(cells[c], width[c]);
    }
    out += "\n";
  };
  line(kHeads);
  for (const auto& row : rows) line(row);
  if (rows.empty()) out += "(no channel was used)\n";
  return out;
}

std::string to_prometheus(const Snapshot& s) {
  struct Metric {
    const char* name;
    const char* type;
    const char* help;
    uint64_t PeerStats::*field;
  };
  // Operations are one metric with an `op` label, as Prometheus' naming
  // guidelines want for parts of one whole.
  static const Metric kMetrics[] = {
      {"rdmaflow_sent_bytes_total", "counter",
       "Payload bytes this rank wrote into the peer's memory or sent it as messages.",
       &PeerStats::bytes_sent},
      {"rdmaflow_received_bytes_total", "counter",
       "Payload bytes this rank read from the peer's memory or received from it as messages.",
       &PeerStats::bytes_received},
      {"rdmaflow_errors_total", "counter",
       "Operations on the peer that completed with an error, and failed connections to it.",
       &PeerStats::errors},
      {"rdmaflow_retries_total", "counter",
       "Connection attempts to the peer repeated because it was not listening yet.",
       &PeerStats::retries},
      {"rdmaflow_credit_stalls_total", "counter",
       "Session sends that waited for the peer's credit (a free receive slot).",
       &PeerStats::credit_stalls},
  };
  auto labels = [&](const PeerStats& p) {
    return "rank=\"" + std::to_string(s.rank) + "\",peer=\"" + std::to_string(p.peer) +
           "\",transport=\"" + p.transport + "\"";
  };
  std::string out;
  for (const Metric& m : kMetrics) {
    out += std::string("# HELP ") + m.name + " " + m.help + "\n";
    out += std::string("# TYPE ") + m.name + " " + m.type + "\n";
    for (const PeerStats& p : s.peers) {
      out += std::string(m.name) + "{" + labels(p) + "} " + std::to_string(p.*m.field) + "\n";
    }
  }
  out +=
      "# HELP rdmaflow_operations_total Operations on the peer by kind: one-sided writes and "
      "reads this rank issued, messages sent and received.\n"
      "# TYPE rdmaflow_operations_total counter\n";
  static const std::pair<const char*, uint64_t PeerStats::*> kOps[] = {
      {"write", &PeerStats::writes},
      {"read", &PeerStats::reads},
      {"message_sent", &PeerStats::messages_sent},
      {"message_received", &PeerStats::messages_received}};
  for (const PeerStats& p : s.peers) {
    for (const auto& [op, field] : kOps) {
      out += "rdmaflow_operations_total{" + labels(p) + ",op=\"" + op + "\"} " +
             std::to_string(p.*field) + "\n";
    }
  }
  out +=
      "# HELP rdmaflow_wait_seconds_total Time this rank's threads spent blocked waiting on "
      "the peer.\n"
      "# TYPE rdmaflow_wait_seconds_total counter\n";
  for (const PeerStats& p : s.peers) {
    char value[32];
    std::snprintf(value, sizeof(value), "%.9f", static_cast<double>(p.wait_ns) / 1e9);
    out += "rdmaflow_wait_seconds_total{" + labels(p) + "} " + value + "\n";
  }
  return out;
}

Result<ExitReport> parse_exit_report(std::string_view text) {
  ExitReport r;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    constexpr std::string_view kProm = "prometheus:";
    if (item == "1" || item == "table") {
      r.table = true;
    } else if (item.substr(0, kProm.size()) == kProm && item.size() > kProm.size()) {
      r.prometheus_path = std::string(item.substr(kProm.size()));
    } else {
      return RDMAFLOW_ERROR(
          Code::kInvalidArgument, "RDMAFLOW_STATS", -1,
          "'" + std::string(item) + "' is not one of 1, table, prometheus:PATH (comma-separated)");
    }
    start = comma + 1;
  }
  return r;
}

Status write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.flush();
    if (!f) {
      return RDMAFLOW_ERROR(Code::kInvalidArgument, "write counters", -1, "cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "write counters", -1,
                          "cannot rename " + tmp + " to " + path);
  }
  return Status::ok();
}

}  // namespace rdmaflow::stats
