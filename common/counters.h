// Counters: what this process moved to and from each peer, per transport, and
// what went wrong (docs/observability.md, "Counters"). Cheap enough to stay on:
// the data path adds to relaxed atomics of counters the channel found once,
// when it was set up (the only lock is taken there); reading them is a
// snapshot() at any time. RDMAFLOW_STATS prints a table at process exit and/or
// writes the Prometheus text exposition format.
//
// One-sided writes are counted by the rank that issues them: on RDMA the
// target's CPU never sees them arrive. So `bytes_sent` is what this rank wrote
// into the peer's memory and sent as messages; `bytes_received` what it read
// from the peer's memory and the messages the peer sent it. The sum of every
// rank's `bytes_sent` to a peer is what that peer received in total.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace rdmaflow::stats {

// One peer over one transport, in this process. Lives as long as the process
// (channels keep a plain pointer to it).
struct PeerCounters {
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> writes{0};
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> messages_sent{0};
  std::atomic<uint64_t> messages_received{0};
  // Operations this rank issued that completed with an error (refused, timed
  // out, failed with the channel), and connections to the peer that failed.
  std::atomic<uint64_t> errors{0};
  // Connection attempts repeated because the peer was not listening yet.
  std::atomic<uint64_t> retries{0};
  // Session sends that had to wait for the peer's credit (a free slot).
  std::atomic<uint64_t> credit_stalls{0};
  // Time threads of this rank spent blocked waiting on the peer: inbox waits
  // (notifies, messages), Session receives and credit waits.
  std::atomic<uint64_t> wait_ns{0};

  void add_write(size_t bytes) {
    writes.fetch_add(1, std::memory_order_relaxed);
    bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
  }
  void add_read(size_t bytes) {
    reads.fetch_add(1, std::memory_order_relaxed);
    bytes_received.fetch_add(bytes, std::memory_order_relaxed);
  }
  void add_message_sent(size_t bytes) {
    messages_sent.fetch_add(1, std::memory_order_relaxed);
    bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
  }
  void add_message_received(size_t bytes) {
    messages_received.fetch_add(1, std::memory_order_relaxed);
    bytes_received.fetch_add(bytes, std::memory_order_relaxed);
  }
  // Counts `status` when it is an error; OK is free.
  void add_result(const Status& status) {
    if (!status.is_ok()) errors.fetch_add(1, std::memory_order_relaxed);
  }
  void add_error() { errors.fetch_add(1, std::memory_order_relaxed); }
  void add_retry() { retries.fetch_add(1, std::memory_order_relaxed); }
  void add_wait_ns(uint64_t ns) { wait_ns.fetch_add(ns, std::memory_order_relaxed); }
  void add_credit_stall(uint64_t ns) {
    credit_stalls.fetch_add(1, std::memory_order_relaxed);
    add_wait_ns(ns);
  }
};

// The counters of `peer` over `transport` ("tcp", "ucx", "verbs", ...): the
// same object for every call with the same pair, for the life of the process.
// Takes a lock: call it at setup, keep the reference.
PeerCounters& counters(std::string_view transport, int peer);

// Where a channel counts until its backend knows the peer; never reported.
PeerCounters& unbound();

// This process's rank, for the reports' `rank` label; the transports set it
// when they are created. -1 until then.
void set_rank(int rank);
int rank();

// A copy of one PeerCounters, with its labels.
struct PeerStats {
  std::string transport;
  int peer = -1;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t writes = 0;
  uint64_t reads = 0;
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t errors = 0;
  uint64_t retries = 0;
  uint64_t credit_stalls = 0;
  uint64_t wait_ns = 0;
};

struct Snapshot {
  int rank = -1;
  std::vector<PeerStats> peers;  // by transport, then peer
};

// Every pair counted so far. Each value is read atomically, the set of them
// not (a snapshot taken while data moves may be off by the operations then
// under way).
Snapshot snapshot();

// A table for people: a line per transport and peer, and a total.
std::string to_table(const Snapshot& s);

// The Prometheus text exposition format (version 0.0.4): every metric with its
// HELP and TYPE lines, samples labelled rank, peer and transport
// (rdmaflow_operations_total also `op`).
std::string to_prometheus(const Snapshot& s);

// What RDMAFLOW_STATS asks for, parsed: "1" or "table" prints the table to
// stderr at exit; "prometheus:PATH" writes the exposition to PATH at exit
// ("%r" in PATH becomes the rank); both may be given, comma-separated.
struct ExitReport {
  bool table = false;
  std::string prometheus_path;
};
Result<ExitReport> parse_exit_report(std::string_view text);

// Writes `text` to `path` (through a temporary file renamed into place, so a
// scraper never reads half a file).
Status write_file(const std::string& path, const std::string& text);

}  // namespace rdmaflow::stats
