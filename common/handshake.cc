#include "common/handshake.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/bytes.h"
#include "common/env.h"
#include "common/fd_io.h"
#include "common/log.h"
#include "common/tls.h"

namespace rdmaflow::auth {

namespace {

constexpr uint32_t kMagic = 0x31414652;  // "RFA1"
constexpr uint16_t kVersion = 1;
constexpr char kDomain[] = "rdmaflow-auth-v1";

// Flags each side announces, only to explain a failure (they are not trusted).
constexpr uint8_t kFlagHostLocal = 1;  // the sender's secret is its per-user host secret
constexpr uint8_t kFlagDisabled = 2;   // the sender runs with RDMAFLOW_AUTH=0
constexpr uint8_t kFlagTls = 4;        // the sender runs with RDMAFLOW_TLS=1

uint8_t flags_of(const JobSecret& s) {
  const uint8_t tls = tls::enabled() ? kFlagTls : 0;
  if (s.source == SecretSource::kDisabled) return kFlagDisabled | tls;
  return (s.host_local() ? kFlagHostLocal : 0) | tls;
}

std::array<uint8_t, kLabelBytes> make_label(std::string_view label) {
  std::array<uint8_t, kLabelBytes> out{};
  std::memcpy(out.data(), label.data(), std::min(label.size(), out.size()));
  return out;
}

Status fill_random(uint8_t* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (errno != EINTR) {
      return RDMAFLOW_ERROR(Code::kInternal, "authenticate", -1,
                            std::string("getrandom failed: ") + std::strerror(errno));
    }
  }
  return Status::ok();
}

// HMAC-SHA256(secret, domain | role | label | nonce_c | nonce_s).
std::array<uint8_t, kMacBytes> mac(const JobSecret& secret, char role,
                                   const std::array<uint8_t, kLabelBytes>& label,
                                   const uint8_t* nonce_c, const uint8_t* nonce_s) {
  ByteWriter w(sizeof kDomain + 1 + kLabelBytes + 2 * kNonceBytes);
  w.raw(kDomain, sizeof kDomain).u8(static_cast<uint8_t>(role)).raw(label.data(), label.size());
  w.raw(nonce_c, kNonceBytes).raw(nonce_s, kNonceBytes);
  static const uint8_t kNoKey = 0;  // RDMAFLOW_AUTH=0: everyone computes the same MAC
  const uint8_t* key = secret.key.empty() ? &kNoKey : secret.key.data();
  std::array<uint8_t, kMacBytes> out{};
  unsigned int len = 0;
  ::HMAC(EVP_sha256(), key, static_cast<int>(secret.key.size()), w.body().data(), w.body().size(),
         out.data(), &len);
  return out;
}

// Why two sides' proofs differ, from what each announced.
std::string mismatch_hint(const JobSecret& mine, uint8_t peer_flags) {
  const uint8_t my_flags = flags_of(mine);
  if ((my_flags ^ peer_flags) & kFlagTls) {
    return std::string(my_flags & kFlagTls ? "this rank" : "the peer") +
           " runs with RDMAFLOW_TLS=1 and the other does not; set it the same on every rank";
  }
  if ((my_flags | peer_flags) & kFlagDisabled) {
    return std::string(my_flags & kFlagDisabled ? "this rank" : "the peer") +
           " runs with RDMAFLOW_AUTH=0 and the other does not; set it the same on every rank";
  }
  if ((my_flags | peer_flags) & kFlagHostLocal) return multi_host_secret_advice();
  return "the peer's job secret differs from this rank's (" + mine.origin +
         "): every rank needs the same one (docs/security.md)";
}

Status refused(const std::string& peer, const std::string& why) {
  return RDMAFLOW_ERROR(Code::kUnauthenticated, "authenticate", -1, "refused " + peer + ": " + why);
}

// The head both messages start with (magic, version, flags, a reserved byte); the
// reader is left after it. `garbage` says what a message without the magic is.
Status read_head(ByteReader& r, size_t size, size_t expected, uint8_t& flags,
                 const std::string& peer, const char* garbage) {
  uint32_t magic = 0;
  uint16_t version = 0;
  uint8_t reserved = 0;
  if (size != expected || !r.get(magic) || !r.get(version) || !r.get(flags) || !r.get(reserved) ||
      magic != kMagic) {
    return refused(peer, garbage);
  }
  if (version != kVersion) {
    return refused(peer, "handshake version " + std::to_string(version) + ", this rank speaks " +
                             std::to_string(kVersion));
  }
  return Status::ok();
}

}  // namespace

Connector::Connector(JobSecret secret, std::string_view label)
    : secret_(std::move(secret)), label_(make_label(label)) {}

Result<Hello> Connector::hello() {
  RDMAFLOW_RETURN_IF_ERROR(fill_random(nonce_.data(), nonce_.size()));
  ByteWriter w(kHelloBytes);
  w.u32(kMagic).u16(kVersion).u8(flags_of(secret_)).u8(0);
  w.raw(label_.data(), label_.size()).raw(nonce_.data(), nonce_.size());
  Hello out;
  std::memcpy(out.data(), w.body().data(), out.size());
  return out;
}

Result<Proof> Connector::answer(std::span<const uint8_t> challenge, const std::string& peer) const {
  ByteReader r(challenge);
  uint8_t flags = 0;
  RDMAFLOW_RETURN_IF_ERROR(read_head(r, challenge.size(), kChallengeBytes, flags, peer,
                                     "it does not speak the rdmaflow handshake (not an rdmaflow "
                                     "endpoint, or an older version)"));
  std::span<const uint8_t> nonce_s, their_mac;
  r.view(kNonceBytes, nonce_s);  // the size was checked
  r.view(kMacBytes, their_mac);
  const auto expected = mac(secret_, 'A', label_, nonce_.data(), nonce_s.data());
  if (CRYPTO_memcmp(expected.data(), their_mac.data(), kMacBytes) != 0) {
    return refused(peer, "it did not prove the job secret: " + mismatch_hint(secret_, flags));
  }
  return mac(secret_, 'C', label_, nonce_.data(), nonce_s.data());
}

Acceptor::Acceptor(JobSecret secret, std::string_view label)
    : secret_(std::move(secret)), label_(make_label(label)) {}

Result<Challenge> Acceptor::challenge(std::span<const uint8_t> hello, const std::string& peer) {
  ByteReader r(hello);
  if (hello.size() >= 2 && hello[0] == 0x16 && hello[1] == 0x03) {  // a TLS record: ClientHello
    return refused(peer,
                   "it speaks TLS: the peer runs with RDMAFLOW_TLS=1 and this rank does not; set "
                   "it the same on every rank");
  }
  RDMAFLOW_RETURN_IF_ERROR(read_head(r, hello.size(), kHelloBytes, peer_flags_, peer,
                                     "it did not start with the rdmaflow handshake (a stray "
                                     "connection, a port scan, or an rdmaflow older than this "
                                     "one)"));
  std::span<const uint8_t> label, nonce_c;
  r.view(kLabelBytes, label);  // the size was checked
  r.view(kNonceBytes, nonce_c);
  if (!std::equal(label.begin(), label.end(), label_.begin())) {
    std::string theirs(reinterpret_cast<const char*>(label.data()), label.size());
    theirs.erase(std::find(theirs.begin(), theirs.end(), '\0'), theirs.end());
    std::string mine(reinterpret_cast<const char*>(label_.data()), label_.size());
    mine.erase(std::find(mine.begin(), mine.end(), '\0'), mine.end());
    return refused(peer, "it wants the '" + theirs + "' protocol; this port serves '" + mine + "'");
  }
  std::copy(nonce_c.begin(), nonce_c.end(), nonce_c_.begin());
  RDMAFLOW_RETURN_IF_ERROR(fill_random(nonce_s_.data(), nonce_s_.size()));
  const auto proof = mac(secret_, 'A', label_, nonce_c_.data(), nonce_s_.data());
  ByteWriter w(kChallengeBytes);
  w.u32(kMagic).u16(kVersion).u8(flags_of(secret_)).u8(0);
  w.raw(nonce_s_.data(), nonce_s_.size()).raw(proof.data(), proof.size());
  Challenge out;
  std::memcpy(out.data(), w.body().data(), out.size());
  return out;
}

Status Acceptor::verify(std::span<const uint8_t> proof, const std::string& peer) const {
  const auto expected = mac(secret_, 'C', label_, nonce_c_.data(), nonce_s_.data());
  if (proof.size() != kProofBytes ||
      CRYPTO_memcmp(expected.data(), proof.data(), kProofBytes) != 0) {
    return refused(peer, "it did not prove the job secret: " + mismatch_hint(secret_, peer_flags_));
  }
  return Status::ok();
}

Challenge tls_mismatch_challenge() {
  ByteWriter w(kChallengeBytes);
  w.u32(kMagic).u16(kVersion).u8(kFlagTls).u8(0);
  Challenge out{};  // no nonce, no proof: it fails the connector's check, with the hint
  std::memcpy(out.data(), w.body().data(), w.body().size());
  return out;
}

namespace {

bool address_of(const sockaddr_storage& ss, std::string& host, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  host = buf;
  return true;
}

// The socket that reaches the peer: behind a TLS relay's local end, the relay's.
int peer_socket(int fd) {
  const int net = tls::network_fd(fd);
  return net >= 0 ? net : fd;
}

// Is the other end of `fd` on this host: a loopback address or one of this host's own?
bool peer_is_local(int fd) {
  fd = peer_socket(fd);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  if (ss.ss_family == AF_UNIX) return true;
  std::string host;
  int port = 0;
  if (!address_of(ss, host, port)) return false;
  if (host.starts_with("127.") || host == "::1" || host.starts_with("::ffff:127.")) return true;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool local = false;
  for (ifaddrs* i = list; i != nullptr && !local; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    sockaddr_storage mine{};
    const size_t n =
        i->ifa_addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) continue;
    std::memcpy(&mine, i->ifa_addr, n);
    std::string addr;
    int ignored = 0;
    local = address_of(mine, addr, ignored) &&
            (addr == host || (host.starts_with("::ffff:") && host.substr(7) == addr));
  }
  ::freeifaddrs(list);
  return local;
}

std::string io_error(int err) {
  return err == ETIMEDOUT ? "no answer before the deadline" : std::strerror(err);
}

Status io_failed(int err, const std::string& op, int peer_rank, const std::string& peer,
                 const char* stage) {
  return RDMAFLOW_ERROR(err == ETIMEDOUT ? Code::kTimeout : Code::kConnectionFailed, op, peer_rank,
                        "handshake with " + peer + " failed while " + stage + ": " + io_error(err));
}

Status named(Status st, const std::string& op, int peer_rank) {
  if (st.is_ok()) return st;
  return Status(st.code(), op, peer_rank, st.reason());
}

}  // namespace

std::string peer_address(int fd) {
  if (auto behind_tls = tls::peer_address(fd)) return *behind_tls;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  std::string host;
  int port = 0;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      !address_of(ss, host, port)) {
    return "an unknown address";
  }
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

Status check_peer_host(const JobSecret& secret, int fd, const std::string& op, int peer_rank) {
  if (!secret.host_local() || peer_is_local(fd)) return Status::ok();
  return RDMAFLOW_ERROR(Code::kUnauthenticated, op, peer_rank,
                        peer_address(fd) + " is on another host: " + multi_host_secret_advice());
}

Status authenticate_connect(int fd, std::string_view label, const std::string& op, int peer_rank,
                            Clock::time_point deadline, int* io_errno) {
  int ignored = 0;
  int& err = io_errno != nullptr ? *io_errno : ignored;
  err = 0;
  RDMAFLOW_ASSIGN_OR_RETURN(JobSecret secret, load_job_secret());
  RDMAFLOW_RETURN_IF_ERROR(check_peer_host(secret, fd, op, peer_rank));
  const std::string peer = peer_address(fd);
  Connector c(std::move(secret), label);
  RDMAFLOW_ASSIGN_OR_RETURN(Hello hello, c.hello());
  Challenge challenge;
  if (!send_all(fd, hello.data(), hello.size(), deadline, err)) {
    return io_failed(err, op, peer_rank, peer, "sending the hello");
  }
  if (!recv_all(fd, challenge.data(), challenge.size(), deadline, err)) {
    return io_failed(err, op, peer_rank, peer, "waiting for the challenge");
  }
  auto proof = c.answer(challenge, peer);
  if (!proof.is_ok()) return named(proof.status(), op, peer_rank);  // err stays 0: refused
  if (!send_all(fd, proof->data(), proof->size(), deadline, err)) {
    return io_failed(err, op, peer_rank, peer, "sending the proof");
  }
  return Status::ok();
}

Status authenticate_accept(int fd, std::string_view label, const std::string& op,
                           Clock::time_point deadline) {
  RDMAFLOW_ASSIGN_OR_RETURN(JobSecret secret, load_job_secret());
  RDMAFLOW_RETURN_IF_ERROR(check_peer_host(secret, fd, op, -1));
  const std::string peer = peer_address(fd);
  Acceptor a(std::move(secret), label);
  Hello hello;
  Proof proof;
  int err = 0;
  if (!recv_all(fd, hello.data(), hello.size(), deadline, err)) {
    return io_failed(err, op, -1, peer, "waiting for the hello");
  }
  auto challenge = a.challenge(hello, peer);
  if (!challenge.is_ok()) return named(challenge.status(), op, -1);
  if (!send_all(fd, challenge->data(), challenge->size(), deadline, err)) {
    return io_failed(err, op, -1, peer, "sending the challenge");
  }
  if (!recv_all(fd, proof.data(), proof.size(), deadline, err)) {
    return io_failed(err, op, -1, peer, "waiting for the proof");
  }
  return named(a.verify(proof, peer), op, -1);
}

std::chrono::milliseconds handshake_timeout() {
  auto v = env_int("RDMAFLOW_AUTH_TIMEOUT_MS", 10000);
  if (!v.is_ok() || *v <= 0) {
    RDMAFLOW_LOG_WARN("RDMAFLOW_AUTH_TIMEOUT_MS is not a positive integer; using 10000");
    return std::chrono::milliseconds(10000);
  }
  return std::chrono::milliseconds(*v);
}

int max_pending_handshakes() {
  auto v = env_int("RDMAFLOW_AUTH_PENDING_MAX", 64);
  if (!v.is_ok() || *v <= 0 || *v > (1 << 20)) {
    RDMAFLOW_LOG_WARN("RDMAFLOW_AUTH_PENDING_MAX is not an integer in 1..1048576; using 64");
    return 64;
  }
  return static_cast<int>(*v);
}

}  // namespace rdmaflow::auth
