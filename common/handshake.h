// The job handshake: the first bytes of every rdmaflow connection (the rendezvous
// store, tcp channels, ucx channels, verbs connection setup). Both sides prove they
// hold the job secret (common/job_secret.h) without revealing it, with HMAC-SHA256
// over fresh nonces from both sides:
//
//   connector -> acceptor   hello     (48 bytes): magic, version, flags, label, nonce_c
//   acceptor  -> connector  challenge (72 bytes): magic, version, flags, nonce_s,
//                                                 HMAC(secret, "A" | label | nonce_c | nonce_s)
//   connector -> acceptor   proof     (32 bytes): HMAC(secret, "C" | label | nonce_c | nonce_s)
//
// The acceptor proves itself first, to a connector that chose a fresh nonce, so the
// connector never talks to an impostor; the connector's proof answers the
// acceptor's fresh nonce, so a recorded handshake cannot be replayed. The role
// letter keeps one side's proof from serving as the other's (reflection) and the
// label (which protocol follows: "store", "tcp", ...) one entry point's proof from
// serving on another. A side that fails closes the connection before reading
// anything else from it: nothing an unauthenticated peer sends reaches past the
// handshake. The handshake authenticates; it does not encrypt (docs/security.md).
//
// The messages are fixed-size, so a driver reads exactly kHelloBytes, then
// kChallengeBytes, then kProofBytes: the blocking drivers below for sockets a
// thread may wait on, handshake_asio.h for event loops, and the message-level
// classes for connections that are not byte streams (ucx's active messages).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/job_secret.h"
#include "common/status.h"

namespace rdmaflow::auth {

using Clock = std::chrono::steady_clock;

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr size_t kLabelBytes = 8;
constexpr size_t kHelloBytes = 48;
constexpr size_t kChallengeBytes = 72;
constexpr size_t kProofBytes = kMacBytes;

using Hello = std::array<uint8_t, kHelloBytes>;
using Challenge = std::array<uint8_t, kChallengeBytes>;
using Proof = std::array<uint8_t, kProofBytes>;

// The connector's side. `peer` names the other end in errors ("rank 2 at host:port").
class Connector {
 public:
  Connector(JobSecret secret, std::string_view label);
  Result<Hello> hello();
  // Checks the acceptor's proof in `challenge`; returns ours to send.
  Result<Proof> answer(std::span<const uint8_t> challenge, const std::string& peer) const;

 private:
  JobSecret secret_;
  std::array<uint8_t, kLabelBytes> label_{};
  std::array<uint8_t, kNonceBytes> nonce_{};
};

// The acceptor's side.
class Acceptor {
 public:
  Acceptor(JobSecret secret, std::string_view label);
  Result<Challenge> challenge(std::span<const uint8_t> hello, const std::string& peer);
  Status verify(std::span<const uint8_t> proof, const std::string& peer) const;

 private:
  JobSecret secret_;
  std::array<uint8_t, kLabelBytes> label_{};
  std::array<uint8_t, kNonceBytes> nonce_c_{};
  std::array<uint8_t, kNonceBytes> nonce_s_{};
  uint8_t peer_flags_ = 0;
};

// What an acceptor running TLS (common/tls.h) answers a connector that spoke the
// plain handshake to it: a challenge whose flags say "TLS", so the connector's
// error names the setting that differs.
Challenge tls_mismatch_challenge();

// "address:port" of the other end of socket `fd`, or "an unknown address".
std::string peer_address(int fd);

// kUnauthenticated when `secret` is the per-user host secret and the other end of
// `fd` is not on this host (multi_host_secret_advice() says what to do).
Status check_peer_host(const JobSecret& secret, int fd, const std::string& op, int peer_rank);

// Blocking drivers on a connected socket (blocking or not: they poll), loading the
// job secret themselves. Errors are kUnauthenticated (refused), kConnectionFailed
// (the connection broke) or kTimeout, with
// `op`, `peer_rank` (-1: unknown) and the peer's address. `io_errno`, if given, is
// set to the errno of a failed send or receive (0 when the peer was refused): a
// connector may retry an acceptor that dropped it, never one that failed its proof.
Status authenticate_connect(int fd, std::string_view label, const std::string& op, int peer_rank,
                            Clock::time_point deadline, int* io_errno = nullptr);
Status authenticate_accept(int fd, std::string_view label, const std::string& op,
                           Clock::time_point deadline);

// RDMAFLOW_AUTH_TIMEOUT_MS (default 10000): how long an acceptor waits for a
// connection to finish the handshake before dropping it.
std::chrono::milliseconds handshake_timeout();
// RDMAFLOW_AUTH_PENDING_MAX (default 64): connections an acceptor lets wait in the
// handshake at once; more are closed at once (a flood cannot pin descriptors).
int max_pending_handshakes();

}  // namespace rdmaflow::auth
