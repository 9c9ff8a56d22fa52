// Optional TLS on rdmaflow's sockets (RDMAFLOW_TLS=1): the rendezvous store and
// the tcp transport's channels. docs/security.md has the threat model.
//
// Keys: TLS 1.3 with an external pre-shared key derived from the job secret
// (HKDF-SHA256 with a label of its own, so the key never equals the secret the
// job handshake MACs with), with (EC)DHE on top (forward secrecy). A job without a
// configured secret (RDMAFLOW_JOB_SECRET / _FILE) cannot use TLS: the per-user
// host secret would make a key every process of the user on every host could
// derive, and RDMAFLOW_AUTH=0 none at all.
// Or certificates: RDMAFLOW_TLS_CERT (this rank's chain), RDMAFLOW_TLS_KEY (its
// private key), RDMAFLOW_TLS_CA (the CA that admits peers), all three, PEM; then
// both ends must show a certificate that CA signed (mutual TLS), and no job
// secret is needed for TLS.
//
// Shape: a relay. The data path of a tcp channel reads straight into registered
// memory with recvmsg, sends with a combining sendmsg sender and lets waiting
// threads drive the socket, all on a byte-stream descriptor; an OpenSSL SSL object
// cannot be shared by a reader and a writer thread like that. So a TLS connection
// is a thread that pumps bytes between the network socket (through SSL) and one
// end of a local socketpair, and the caller gets the other end: every protocol
// above (the job handshake, hellos, frames) runs on it unchanged, and with TLS off
// nothing of it exists. The cost (two more copies and a thread hop per direction,
// plus the cipher) is measured in docs/benchmarks.md. Kernel TLS (kTLS) would
// avoid both but needs the kernel's tls module, which not every host has.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"

namespace rdmaflow::tls {

using Clock = std::chrono::steady_clock;

// RDMAFLOW_TLS=1 (read each call, like the job secret).
bool enabled();

enum class Role { kConnect, kAccept };

class Relay;

// One TLS connection: owns the network socket and the relay thread. Destroying it
// stops the relay (the network socket closes) and joins the thread.
class Connection {
 public:
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // The caller's end of the relay: a connected AF_UNIX stream socket, which the
  // caller owns and closes. Call once.
  int take_local_fd();
  // Waits for the TLS handshake (kConnect: callers wait for it before they speak).
  Status wait_handshake(Clock::time_point deadline);
  // The relay ended (either side closed or failed).
  bool finished() const;

 private:
  friend Result<std::unique_ptr<Connection>> start(int, Role, const std::string&, int,
                                                   Clock::time_point);
  explicit Connection(std::shared_ptr<Relay> relay);
  std::shared_ptr<Relay> relay_;
};

// Starts TLS on the connected socket `fd` (taken over: closed with the Connection)
// as `role`. The handshake runs on the relay's thread and must finish by
// `deadline`; an acceptor's failure is logged with the peer's address, and its
// local end then reads EOF. `op` and `peer_rank` (-1: unknown) name it in errors.
// Fails at once (fd closed) when TLS cannot be configured: no job secret.
Result<std::unique_ptr<Connection>> start(int fd, Role role, const std::string& op, int peer_rank,
                                          Clock::time_point deadline);

// Whether TLS can be configured here (a job secret to derive the key from); the
// error says what to set. Transports check it when they are created.
Status check_config(const std::string& op);

// The network socket behind `local_fd` when it is a relay's local end (so errors
// name the real peer, and the host check sees it), else -1.
int network_fd(int local_fd);
// The peer's "address:port" when `local_fd` is a relay's local end (while its
// Connection lives, even after the connection closed).
std::optional<std::string> peer_address(int local_fd);

}  // namespace rdmaflow::tls
