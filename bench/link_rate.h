// The link rate a run measures between two hosts: what plain TCP sockets move
// from one process to the other, over one connection and over several at once
// (iperf's measurement, without iperf). The benchmarks print it beside their
// bandwidths and bound their step times by it: on the simulated cluster
// (scripts/cluster) it is what the tbf-limited links and the machine's cores
// deliver together, which the nominal --rate alone does not say.
//
// The receiver listens, accepts the sender's connections and times the bytes
// from the first that arrives to the last (so bytes still in flight when the
// sender stops are not counted as moved); the sender writes 1 MiB chunks for
// `seconds` on every connection, then closes them.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace rdmaflow::bench {

struct LinkRate {
  double single_MBps = 0;  // one connection (MB = 1e6 bytes)
  double multi_MBps = 0;   // `streams` connections at once
  int streams = 0;
  double seconds = 0;    // each of the two measurements
  std::string from, to;  // the sender's and the receiver's host names

  double best_MBps() const { return single_MBps > multi_MBps ? single_MBps : multi_MBps; }
  nlohmann::json to_json() const;
  static LinkRate from_json(const nlohmann::json& j);
  // "h0 -> h1, plain TCP sockets: 1 stream 1180 MB/s, 4 streams 1190 MB/s"
  std::string describe() const;
};

// Sends this side's text to the peer and returns the peer's; both sides call it
// the same number of times, in the same order.
using Exchange = std::function<Result<std::string>(const std::string& mine)>;

// One side of the measurement; both sides call it. The receiver listens on
// `listen_address` (an IPv4 address the sender reaches). Both sides return the
// rate the receiver measured.
Result<LinkRate> measure_link_rate(bool sender, const std::string& listen_address,
                                   const Exchange& exchange, double seconds, int streams = 4);

}  // namespace rdmaflow::bench
