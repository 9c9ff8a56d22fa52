// RDMAFLOW_MAX_PEER_QUEUED on the ucx backend, between real processes over UCX's
// tcp transport. A UCX receiver delivers in sequence-number order and holds a
// message that arrives ahead of its turn until the ones before it come; a peer
// that never sends one number would make that list grow without bound. The
// sender here leaves one number out (skip_sequence_numbers_for_testing, the
// smallest way to play such a peer through real UCX endpoints) and then sends
// many more messages than the cap: the receiver must fail the channel with an
// error naming the knob and the peer once the cap is reached, holding no more.
// (tcp's side of the knob: TcpConformance.PeerLimitsFromTheEnvironmentAreEnforced.)
#include <gtest/gtest.h>

#include <string>

#include "tests/transport/conformance_util.h"
#include "transport/ucx/ucx_channel.h"

namespace rdmaflow::testing {
namespace {

constexpr int kCap = 16;
constexpr int kSent = 4 * kCap;

TEST(UcxPeerLimits, MessagesHeldForAMissingSequenceNumberAreCapped) {
  BackendRow b = backend_row("ucx_tcp");
  b.env.emplace_back("RDMAFLOW_MAX_PEER_QUEUED", std::to_string(kCap));
  RunOptions o;
  o.timeout = Millis(60000);
  auto r = run_ranks(
      2,
      [&](int rank, int world, Exchange& ex) {
        Node node;
        RF_ASSERT_OK(node.connect_all(b, rank, world, ex));
        // Rank 0 must be done connecting before the flood: otherwise its own
        // connect fails on the cap (seen under ASan, where rank 1 is quicker).
        RF_ASSERT_OK(ex.barrier());
        Channel& ch = *node.peers[static_cast<size_t>(1 - rank)];
        if (rank == 1) {
          RF_ASSERT(ucx::skip_sequence_numbers_for_testing(ch, 1));
          CompletionGroup sent;
          for (int i = 0; i < kSent; ++i) {
            const std::string m = "m" + std::to_string(i);
            ch.send_message(std::vector<uint8_t>(m.begin(), m.end()), sent.add(), Millis(5000));
          }
          // Whether these complete depends on how far they got before rank 0 hung up:
          // only rank 0's verdict matters.
          (void)sent.wait(Millis(10000), "sends");
          RF_ASSERT_OK(ex.barrier());
          return 0;
        }
        auto msg = ch.inbox().recv_message(Millis(20000));
        RF_ASSERT(!msg.is_ok());
        const std::string e = msg.status().to_string();
        std::printf("rank 0: %s\n", e.c_str());
        RF_ASSERT(e.find("RDMAFLOW_MAX_PEER_QUEUED=" + std::to_string(kCap)) != std::string::npos);
        RF_ASSERT(e.find("peer rank 1") != std::string::npos);
        // Exactly the cap was held when the next one came: the list stopped growing there.
        RF_ASSERT(e.find(" while " + std::to_string(kCap) + " messages wait for number") !=
                  std::string::npos);
        RF_ASSERT(!ch.error().is_ok());  // the channel failed, sticky
        RF_ASSERT_OK(ex.barrier());
        return 0;
      },
      o);
  RF_EXPECT_RUN_OK(r);
}

}  // namespace
}  // namespace rdmaflow::testing
