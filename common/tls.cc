#include "common/tls.h"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/env.h"
#include "common/fd_io.h"
#include "common/handshake.h"
#include "common/job_secret.h"
#include "common/log.h"

namespace rdmaflow::tls {

namespace {

constexpr char kIdentity[] = "rdmaflow-tls-psk-v1";
constexpr char kKdfInfo[] = "rdmaflow tls 1.3 external psk v1";
constexpr size_t kPskBytes = 32;
// Bytes in flight per direction inside the relay: several 16 KiB records per system call.
constexpr size_t kBufferBytes = 256 * 1024;
// TLS_AES_128_GCM_SHA256: the suite the PSK is bound to (RFC 8446, section 4.2.11).
constexpr unsigned char kSuite[] = {0x13, 0x01};

std::string ssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

Result<std::vector<uint8_t>> derive_psk(const std::string& op, int peer_rank) {
  RDMAFLOW_ASSIGN_OR_RETURN(JobSecret secret, load_job_secret());
  if (secret.source != SecretSource::kEnv && secret.source != SecretSource::kFile) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, op, peer_rank,
        std::string("RDMAFLOW_TLS=1 needs a job secret to derive its key from, and ") +
            (secret.source == SecretSource::kDisabled
                 ? "RDMAFLOW_AUTH=0 disables it"
                 : "none is configured (the per-user host secret does not serve TLS)") +
            ": give every rank the same RDMAFLOW_JOB_SECRET_FILE (or RDMAFLOW_JOB_SECRET), or "
            "certificates (RDMAFLOW_TLS_CERT, RDMAFLOW_TLS_KEY, RDMAFLOW_TLS_CA), or unset "
            "RDMAFLOW_TLS (docs/security.md)");
  }
  std::vector<uint8_t> psk(kPskBytes);
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  EVP_KDF_CTX* ctx = kdf != nullptr ? EVP_KDF_CTX_new(kdf) : nullptr;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, secret.key.data(), secret.key.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(kKdfInfo),
                                        sizeof kKdfInfo - 1),
      OSSL_PARAM_construct_end()};
  const bool ok = ctx != nullptr && EVP_KDF_derive(ctx, psk.data(), psk.size(), params) == 1;
  EVP_KDF_CTX_free(ctx);
  EVP_KDF_free(kdf);
  if (!ok) {
    return RDMAFLOW_ERROR(Code::kInternal, op, peer_rank, "HKDF failed: " + ssl_errors());
  }
  return psk;
}

// What authenticates a connection: certificates (RDMAFLOW_TLS_CERT, _KEY, _CA),
// else the PSK derived from the job secret.
struct Keys {
  std::vector<uint8_t> psk;
  std::string cert, key, ca;
  bool certificates() const { return !cert.empty(); }
};

Result<Keys> load_keys(const std::string& op, int peer_rank) {
  Keys k;
  k.cert = env_string("RDMAFLOW_TLS_CERT").value_or("");
  k.key = env_string("RDMAFLOW_TLS_KEY").value_or("");
  k.ca = env_string("RDMAFLOW_TLS_CA").value_or("");
  const int set = int{!k.cert.empty()} + int{!k.key.empty()} + int{!k.ca.empty()};
  if (set == 3) return k;
  if (set > 0) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, peer_rank,
                          "RDMAFLOW_TLS_CERT, RDMAFLOW_TLS_KEY and RDMAFLOW_TLS_CA go together: "
                          "set all three, or none for the key derived from the job secret");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(k.psk, derive_psk(op, peer_rank));
  return k;
}

SSL_SESSION* psk_session(SSL* ssl) {
  const auto* psk = static_cast<const std::vector<uint8_t>*>(SSL_get_app_data(ssl));
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kSuite);
  SSL_SESSION* s = cipher != nullptr ? SSL_SESSION_new() : nullptr;
  if (s == nullptr || !SSL_SESSION_set1_master_key(s, psk->data(), psk->size()) ||
      !SSL_SESSION_set_cipher(s, cipher) || !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

int use_session(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* id_len,
                SSL_SESSION** sess) {
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kSuite);
  if (md != nullptr && (cipher == nullptr || SSL_CIPHER_get_handshake_digest(cipher) != md)) {
    *sess = nullptr;  // a HelloRetryRequest chose another hash: no PSK
    return 1;
  }
  *sess = psk_session(ssl);
  *id = reinterpret_cast<const unsigned char*>(kIdentity);
  *id_len = sizeof kIdentity - 1;
  return *sess != nullptr ? 1 : 0;
}

int find_session(SSL* ssl, const unsigned char* id, size_t id_len, SSL_SESSION** sess) {
  *sess = nullptr;
  if (id_len != sizeof kIdentity - 1 || std::memcmp(id, kIdentity, id_len) != 0) return 1;
  *sess = psk_session(ssl);
  return *sess != nullptr ? 1 : 0;
}

// Sets `ctx` up for `keys` (the SSL's app data must point at keys.psk); a file that
// does not load is kInvalidArgument naming its variable.
Status configure(SSL_CTX* ctx, const Keys& keys, Role role, const std::string& op, int peer_rank) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  // Only the suite the PSK is bound to: a server that picked a SHA-384 suite would
  // drop the PSK and ask for a certificate it does not have.
  SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256");
  SSL_CTX_set_num_tickets(ctx, 0);  // no post-handshake messages: nothing to resume
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (!keys.certificates()) {
    if (role == Role::kConnect) {
      SSL_CTX_set_psk_use_session_callback(ctx, &use_session);
    } else {
      SSL_CTX_set_psk_find_session_callback(ctx, &find_session);
    }
    return Status::ok();
  }
  auto bad = [&](const char* knob, const std::string& file) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, peer_rank,
                          std::string(knob) + "=" + file + " does not load: " + ssl_errors());
  };
  if (SSL_CTX_use_certificate_chain_file(ctx, keys.cert.c_str()) != 1) {
    return bad("RDMAFLOW_TLS_CERT", keys.cert);
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, keys.key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return bad("RDMAFLOW_TLS_KEY", keys.key);
  }
  if (SSL_CTX_load_verify_locations(ctx, keys.ca.c_str(), nullptr) != 1) {
    return bad("RDMAFLOW_TLS_CA", keys.ca);
  }
  // Both ends show a certificate signed by the job's CA (mutual TLS). Ranks are
  // addressed by IP, so no host name is checked: the CA is what admits a peer.
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return Status::ok();
}

// Local ends of live relays (by inode, which no other socket shares while it
// lives) -> their network sockets.
struct Registered {
  int net_fd;
  std::string peer;  // its address, kept after the connection closed
};
std::mutex registry_mu;
std::map<ino_t, Registered> registry;

ino_t inode_of(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}

}  // namespace

bool enabled() {
  auto v = env_int("RDMAFLOW_TLS", 0);
  if (!v.is_ok()) {
    RDMAFLOW_LOG_WARN("RDMAFLOW_TLS is not 0 or 1; TLS stays off");
    return false;
  }
  return *v == 1;
}

Status check_config(const std::string& op) {
  RDMAFLOW_ASSIGN_OR_RETURN(Keys keys, load_keys(op, -1));
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return RDMAFLOW_ERROR(Code::kInternal, op, -1, "SSL_CTX_new failed");
  Status st = configure(ctx, keys, Role::kAccept, op, -1);
  SSL_CTX_free(ctx);
  return st;
}

int network_fd(int local_fd) {
  const ino_t ino = inode_of(local_fd);
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = registry.find(ino);
  return ino != 0 && it != registry.end() ? it->second.net_fd : -1;
}

std::optional<std::string> peer_address(int local_fd) {
  const ino_t ino = inode_of(local_fd);
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = registry.find(ino);
  if (ino == 0 || it == registry.end()) return std::nullopt;
  return it->second.peer;
}

class Relay {
 public:
  Relay(int net_fd, Role role, std::string op, int peer_rank, Clock::time_point deadline)
      : net_(net_fd), role_(role), op_(std::move(op)), peer_rank_(peer_rank), deadline_(deadline) {
    peer_ = auth::peer_address(net_fd);
  }

  ~Relay() {
    if (thread_.joinable()) {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t r = ::write(stop_, &one, sizeof one);
      thread_.join();
    }
    if (registered_ino_ != 0) {
      std::lock_guard<std::mutex> lock(registry_mu);
      registry.erase(registered_ino_);
    }
    SSL_free(ssl_);
    SSL_CTX_free(ctx_);
    for (int fd : {net_, mine_, local_, stop_}) {
      if (fd >= 0) ::close(fd);
    }
  }

  Status init(Keys keys) {
    keys_ = std::move(keys);
    int pair[2];
    stop_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (stop_ < 0 || ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
      return fail_local(std::string("socketpair: ") + std::strerror(errno));
    }
    local_ = pair[0];
    mine_ = pair[1];
    // The caller's end behaves like the socket it replaces.
    const int flags = ::fcntl(net_, F_GETFL);
    if (flags >= 0 && (flags & O_NONBLOCK)) ::fcntl(local_, F_SETFL, O_NONBLOCK);
    ::fcntl(net_, F_SETFL, ::fcntl(net_, F_GETFL) | O_NONBLOCK);
    ::fcntl(mine_, F_SETFL, O_NONBLOCK);
    int size = static_cast<int>(kBufferBytes * 4);
    for (int fd : {local_, mine_}) ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);

    ctx_ = SSL_CTX_new(role_ == Role::kConnect ? TLS_client_method() : TLS_server_method());
    if (ctx_ == nullptr) return fail_local("SSL_CTX_new: " + ssl_errors());
    RDMAFLOW_RETURN_IF_ERROR(configure(ctx_, keys_, role_, op_, peer_rank_));
    ssl_ = SSL_new(ctx_);
    if (ssl_ == nullptr || SSL_set_fd(ssl_, net_) != 1)
      return fail_local("SSL_new: " + ssl_errors());
    SSL_set_app_data(ssl_, &keys_.psk);
    SSL_set_read_ahead(ssl_, 1);
    registered_ino_ = inode_of(local_);
    {
      std::lock_guard<std::mutex> lock(registry_mu);
      registry[registered_ino_] = Registered{net_, peer_};
    }
    thread_ = std::thread([this] { run(); });
    return Status::ok();
  }

  int take_local() { return std::exchange(local_, -1); }
  bool finished() const { return finished_.load(); }

  Status wait_handshake(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return handshake_.has_value(); })) {
      return RDMAFLOW_ERROR(Code::kTimeout, op_, peer_rank_,
                            "no TLS handshake with " + peer_ + " before the deadline");
    }
    return *handshake_;
  }

 private:
  Status fail_local(const std::string& why) {
    return RDMAFLOW_ERROR(Code::kInternal, op_, peer_rank_, "TLS with " + peer_ + ": " + why);
  }

  Status refused(const std::string& why) {
    return RDMAFLOW_ERROR(Code::kUnauthenticated, op_, peer_rank_,
                          "TLS with " + peer_ + " failed: " + why);
  }

  // Waits for `events` on the network socket, or the stop signal (false).
  bool wait_net(short events, int timeout_ms) {
    pollfd p[2] = {{net_, events, 0}, {stop_, POLLIN, 0}};
    int r = ::poll(p, 2, timeout_ms);
    return !(r > 0 && (p[1].revents & POLLIN));
  }

  // A peer that speaks the plain job handshake to a TLS port gets a challenge that
  // says so (its error then names the setting), instead of a dropped connection.
  Status refuse_plain_peer() {
    auth::Hello hello;
    int err = 0;
    if (recv_all(net_, hello.data(), hello.size(), deadline_, err)) {
      const auth::Challenge c = auth::tls_mismatch_challenge();
      send_all(net_, c.data(), c.size(), deadline_, err);
    }
    return refused(
        "it sent the plain rdmaflow handshake: this rank runs with RDMAFLOW_TLS=1 and the peer "
        "does not; set it the same on every rank");
  }

  Status handshake() {
    if (role_ == Role::kAccept) {
      int r = wait_fd(net_, POLLIN, deadline_);
      uint8_t head[4] = {};
      if (r == 1 && ::recv(net_, head, sizeof head, MSG_PEEK) == 4 &&
          std::memcmp(head, "RFA1", 4) == 0) {
        return refuse_plain_peer();
      }
    }
    for (;;) {
      ERR_clear_error();
      const int r = role_ == Role::kConnect ? SSL_connect(ssl_) : SSL_accept(ssl_);
      if (r == 1) return Status::ok();
      const int e = SSL_get_error(ssl_, r);
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
      if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) && left.count() > 0) {
        if (!wait_net(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                      static_cast<int>(left.count()))) {
          return RDMAFLOW_ERROR(Code::kCancelled, op_, peer_rank_, "TLS handshake stopped");
        }
        continue;
      }
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        return RDMAFLOW_ERROR(Code::kTimeout, op_, peer_rank_,
                              "no TLS handshake from " + peer_ +
                                  " before the deadline (does it "
                                  "run with RDMAFLOW_TLS=1 too?)");
      }
      const int saved = errno;
      std::string detail = ssl_errors();
      if (detail.empty()) {
        detail = e == SSL_ERROR_SYSCALL && saved != 0 ? std::strerror(saved)
                                                      : "the peer closed the connection";
      }
      if (detail.find("certificate") != std::string::npos ||
          detail.find("unknown ca") != std::string::npos) {
        return refused(detail +
                       ": one rank's certificate is not signed by the other's "
                       "RDMAFLOW_TLS_CA (every rank needs a certificate of the job's CA; "
                       "docs/security.md)");
      }
      if (detail.find("binder") != std::string::npos ||
          detail.find("decrypt") != std::string::npos) {
        return refused(detail +
                       ": the peer's key differs, so its job secret differs from this "
                       "rank's; every rank needs the same job secret (docs/security.md)");
      }
      return refused(detail +
                     " (every rank needs RDMAFLOW_TLS=1 and the same job secret; "
                     "a peer without TLS or with another secret fails here: see its log)");
    }
  }

  void publish(Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    handshake_ = std::move(st);
    cv_.notify_all();
  }

  void run() {
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGPIPE);  // a write to a closed peer fails with EPIPE, quietly
    pthread_sigmask(SIG_BLOCK, &block, nullptr);
    Status st = handshake();
    const bool ok = st.is_ok();
    if (!ok && role_ == Role::kAccept && st.code() != Code::kCancelled) {
      RDMAFLOW_LOG_WARN("{}: refused the connection from {}: {}", op_, peer_, st.reason());
    }
    publish(std::move(st));
    if (ok) pump();
    // The caller's end reads EOF once everything relayed was read; the peer sees ours.
    ::shutdown(mine_, SHUT_RDWR);
    ::shutdown(net_, SHUT_RDWR);
    finished_ = true;
  }

  // One direction's bytes in flight: read into the tail, written from the head.
  struct Pending {
    std::vector<uint8_t> bytes = std::vector<uint8_t>(kBufferBytes);
    size_t beg = 0, end = 0;
    bool empty() const { return beg == end; }
    bool has_room() const { return end < bytes.size(); }
    uint8_t* tail() { return bytes.data() + end; }
    int room() const { return static_cast<int>(bytes.size() - end); }
    const uint8_t* head() const { return bytes.data() + beg; }
    int size() const { return static_cast<int>(end - beg); }
    void drained(size_t n) {
      beg += n;
      if (beg == end) beg = end = 0;
    }
  };

  enum class Io { kMoved, kWait, kEnded };
  // What an SSL_read / SSL_write that returned `r` means; `e` is its error.
  Io classify(int r, int& e, bool& want_net_write) {
    if (r > 0) return Io::kMoved;
    e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_WRITE) want_net_write = true;
    return e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ ? Io::kWait : Io::kEnded;
  }

  // Moves bytes both ways until either side closes or fails.
  void pump() {
    Pending out, in;  // local -> network, network -> local
    bool local_eof = false, net_eof = false, want_net_write = false;
    int e = 0;
    for (;;) {
      for (bool progress = true; progress;) {
        progress = false;
        if (!local_eof && out.has_room()) {
          ssize_t n = ::recv(mine_, out.tail(), static_cast<size_t>(out.room()), MSG_DONTWAIT);
          if (n > 0) {
            out.end += static_cast<size_t>(n);
            progress = true;
          } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            local_eof = true;
          }
        }
        if (!out.empty()) {
          ERR_clear_error();
          const int r = SSL_write(ssl_, out.head(), out.size());
          const Io io = classify(r, e, want_net_write);
          if (io == Io::kEnded) return log_end("sending", e);
          if (io == Io::kMoved) {
            out.drained(static_cast<size_t>(r));
            want_net_write = false;
            progress = true;
          }
        }
        if (!net_eof && in.has_room()) {
          ERR_clear_error();
          const int r = SSL_read(ssl_, in.tail(), in.room());
          const Io io = classify(r, e, want_net_write);
          if (io == Io::kMoved) {
            in.end += static_cast<size_t>(r);
            progress = true;
          } else if (io == Io::kEnded) {
            if (e != SSL_ERROR_ZERO_RETURN) log_end("receiving", e);
            net_eof = true;
          }
        }
        if (!in.empty()) {
          ssize_t n =
              ::send(mine_, in.head(), static_cast<size_t>(in.size()), MSG_DONTWAIT | MSG_NOSIGNAL);
          if (n > 0) {
            in.drained(static_cast<size_t>(n));
            progress = true;
          } else if (errno != EAGAIN && errno != EINTR) {
            return;  // the caller closed its end
          }
        }
      }
      if (local_eof && out.empty()) {
        SSL_shutdown(ssl_);  // close_notify, best effort: the socket closes anyway
        return;
      }
      if (net_eof && in.empty()) return;
      const short local_events = static_cast<short>((!local_eof && out.has_room() ? POLLIN : 0) |
                                                    (!in.empty() ? POLLOUT : 0));
      const short net_events = static_cast<short>((!net_eof && in.has_room() ? POLLIN : 0) |
                                                  (want_net_write ? POLLOUT : 0));
      pollfd p[3] = {{mine_, local_events, 0}, {net_, net_events, 0}, {stop_, POLLIN, 0}};
      if (::poll(p, 3, -1) < 0 && errno != EINTR) return;
      if (p[2].revents & POLLIN) return;
    }
  }

  void log_end(const char* stage, int e) {
    const int saved = errno;
    std::string detail = ssl_errors();
    if (detail.empty() && e == SSL_ERROR_SYSCALL && saved != 0) detail = std::strerror(saved);
    if (!detail.empty()) {
      RDMAFLOW_LOG_DEBUG("{}: TLS with {} ended while {}: {}", op_, peer_, stage, detail);
    }
  }

  int net_ = -1;
  int mine_ = -1;   // the relay's end of the socketpair
  int local_ = -1;  // the caller's end, until taken
  int stop_ = -1;
  Role role_;
  std::string op_;
  int peer_rank_;
  Clock::time_point deadline_;
  std::string peer_;
  Keys keys_;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  ino_t registered_ino_ = 0;
  std::thread thread_;
  std::atomic<bool> finished_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Status> handshake_;
};

Connection::Connection(std::shared_ptr<Relay> relay) : relay_(std::move(relay)) {}
Connection::~Connection() = default;

int Connection::take_local_fd() {
  return relay_->take_local();
}

Status Connection::wait_handshake(Clock::time_point deadline) {
  return relay_->wait_handshake(deadline);
}

bool Connection::finished() const {
  return relay_->finished();
}

Result<std::unique_ptr<Connection>> start(int fd, Role role, const std::string& op, int peer_rank,
                                          Clock::time_point deadline) {
  auto relay = std::make_shared<Relay>(fd, role, op, peer_rank, deadline);
  auto keys = load_keys(op, peer_rank);
  if (!keys.is_ok()) return keys.status();  // the relay closes fd
  RDMAFLOW_RETURN_IF_ERROR(relay->init(std::move(*keys)));
  return std::unique_ptr<Connection>(new Connection(std::move(relay)));
}

}  // namespace rdmaflow::tls
