#include "runtime/rendezvous/tcp_store.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <charconv>
#include <condition_variable>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/handshake_asio.h"
#include "common/log.h"
#include "common/tls.h"
#include "runtime/rendezvous/tcp_store_protocol.h"

namespace rdmaflow {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;
namespace wire = store_wire;

namespace {

std::string quoted(const std::string& key) {
  return "'" + key + "'";
}
std::string ms(Millis t) {
  return std::to_string(t.count()) + " ms";
}

uint32_t clamp_ms(Millis t) {
  return static_cast<uint32_t>(std::clamp<int64_t>(t.count(), 0, UINT32_MAX));
}

Millis remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  return std::max(left, Millis(0));
}

// Resolves host:port to endpoints; numeric addresses never touch DNS.
Result<std::vector<tcp::endpoint>> resolve(const HostPort& hp, const std::string& op) {
  error_code ec;
  auto ip = asio::ip::make_address(hp.host, ec);
  if (!ec) return std::vector<tcp::endpoint>{tcp::endpoint(ip, hp.port)};
  asio::io_context ioc;
  tcp::resolver resolver(ioc);
  auto results = resolver.resolve(hp.host, std::to_string(hp.port), ec);
  if (ec || results.empty()) {
    return RDMAFLOW_ERROR(Code::kConnectionFailed, op, -1,
                          "cannot resolve host '" + hp.host + "' of " + hp.to_string() + ": " +
                              (ec ? ec.message() : "no addresses"));
  }
  std::vector<tcp::endpoint> eps;
  for (const auto& r : results) eps.push_back(r.endpoint());
  return eps;
}

}  // namespace

// ---- host:port ----

std::string HostPort::to_string() const {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<HostPort> parse_host_port(std::string_view text, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "parse address", -1,
                          what + "='" + std::string(text) + "' " + why +
                              " (expected host:port, a.b.c.d:port or [v6addr]:port)");
  };
  HostPort hp;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) return bad("has no closing ']'");
    hp.host = std::string(text.substr(1, close - 1));
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("has no :port after ']'");
    port_text = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("has no :port");
    hp.host = std::string(text.substr(0, colon));
    if (hp.host.find(':') != std::string::npos) return bad("is an IPv6 address without [ ]");
    port_text = text.substr(colon + 1);
  }
  if (hp.host.empty()) return bad("has an empty host");
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || ptr != port_text.data() + port_text.size() ||
      port > 65535) {
    return bad("has a port that is not a number in 0..65535");
  }
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

// ---- server ----

namespace {
class Session;
}

struct TcpStoreServer::Impl {
  // Declared first so it is destroyed last: sockets and timers live on it.
  asio::io_context ioc;
  asio::executor_work_guard<asio::io_context::executor_type> work{ioc.get_executor()};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer accept_retry{ioc};
  std::thread thread;
  HostPort address;
  int expected_clients = 0;
  wire::Limits limits = wire::limits_from_env();

  // Touched only on the server thread.
  std::unordered_map<std::string, Bytes> data;
  std::vector<std::shared_ptr<Session>> waiting;
  std::vector<std::weak_ptr<Session>> sessions;
  int pending_auth = 0;  // sessions still in the handshake
  const int max_pending_auth = auth::max_pending_handshakes();

  // Shared with other threads.
  std::mutex mu;
  std::condition_variable cv;
  std::set<int> goodbyes;
  std::atomic<uint64_t> rejected{0};
  bool stopped = false;

  void accept_next();
  void wake_waiters();
  void close_all();
};

namespace {

// One client connection. Requests are served one at a time: the next request is
// read only after the reply to the current one is written.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(TcpStoreServer::Impl& server, tcp::socket socket,
          std::unique_ptr<tls::Connection> tls = nullptr)
      : server_(server), sock_(std::move(socket)), timer_(server.ioc), tls_(std::move(tls)) {}

  // Serves requests once the client proved the job secret (common/handshake.h):
  // before that nothing it sends is parsed, and it is dropped after
  // RDMAFLOW_AUTH_TIMEOUT_MS, so an idle stray connection holds nothing for long.
  void start() {
    ++server_.pending_auth;
    timer_.expires_after(auth::handshake_timeout());
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->authenticated_) return;
      self->timed_out_ = true;
      error_code ignored;
      self->sock_.close(ignored);
    });
    const std::string peer = peer_name();
    auth::async_accept_handshake(sock_, shared_from_this(), "store",
                                 [self = shared_from_this(), peer](Status st) {
                                   --self->server_.pending_auth;
                                   if (!st.is_ok()) {
                                     RDMAFLOW_LOG_WARN("rendezvous server: refused {}: {}", peer,
                                                       self->timed_out_ ? "no handshake within "
                                                                          "RDMAFLOW_AUTH_TIMEOUT_MS"
                                                                        : st.reason());
                                     return self->close();
                                   }
                                   self->authenticated_ = true;
                                   self->timer_.cancel();
                                   self->read_header();
                                 });
  }

  void close() {
    error_code ignored;
    waiting_ = false;
    timer_.cancel();
    sock_.close(ignored);
  }

  // Replies to a parked get/wait if its keys are now present.
  bool try_complete() {
    if (!waiting_) return true;
    if (!keys_present()) return false;
    waiting_ = false;
    timer_.cancel();
    if (is_get_) {
      reply(wire::Reply::kOk, server_.data[keys_[0]]);
    } else {
      reply(wire::Reply::kOk, {});
    }
    return true;
  }

 private:
  void read_header() {
    asio::async_read(sock_, asio::buffer(header_, 4),
                     [self = shared_from_this()](error_code ec, size_t) {
                       if (ec) return;  // peer closed or server stopping
                       self->on_header();
                     });
  }

  void on_header() {
    uint32_t len = 0;
    std::memcpy(&len, header_, 4);
    if (std::string why = wire::check_frame_length(len, server_.limits); !why.empty()) {
      // We cannot find the next frame boundary without reading it all: refuse and close.
      reject(why, /*close_after=*/true);
      return;
    }
    body_.clear();
    body_left_ = len;
    read_body();
  }

  // Grows the body only as bytes actually arrive, so a frame that merely claims to
  // be large costs nothing until it is sent.
  void read_body() {
    if (body_left_ == 0) return handle();
    const size_t n = std::min<size_t>(body_left_, kBodyChunk);
    const size_t old = body_.size();
    body_.resize(old + n);
    asio::async_read(sock_, asio::buffer(body_.data() + old, n),
                     [self = shared_from_this(), n](error_code ec, size_t) {
                       if (ec) return;
                       self->body_left_ -= n;
                       self->read_body();
                     });
  }

  void handle() {
    auto parsed = wire::parse_request(body_, server_.limits);
    if (!parsed) return reject(parsed.status().reason());
    wire::Request& q = *parsed;
    switch (q.op) {
      case wire::Op::kSet:
        server_.data[q.keys[0]] = std::move(q.value);
        reply(wire::Reply::kOk, {});
        server_.wake_waiters();
        return;
      case wire::Op::kGet:
        park(/*is_get=*/true, std::move(q.keys), Millis(q.timeout_ms));
        return;
      case wire::Op::kWait:
        park(/*is_get=*/false, std::move(q.keys), Millis(q.timeout_ms));
        return;
      case wire::Op::kAdd: {
        const std::string& key = q.keys[0];
        auto it = server_.data.find(key);
        Bytes updated;
        auto sum = apply_counter_delta(key, it == server_.data.end() ? nullptr : &it->second,
                                       q.delta, &updated);
        if (!sum.is_ok()) return reject(sum.status().reason());
        server_.data[key] = std::move(updated);
        ByteWriter w;
        w.i64(*sum);
        reply(wire::Reply::kOk, w.body());
        server_.wake_waiters();
        return;
      }
      case wire::Op::kBye: {
        if (q.rank < 0 || q.rank >= server_.expected_clients) {
          return reject("goodbye from rank " + std::to_string(q.rank) + " outside world of " +
                        std::to_string(server_.expected_clients));
        }
        {
          std::lock_guard<std::mutex> lock(server_.mu);
          server_.goodbyes.insert(q.rank);
        }
        server_.cv.notify_all();
        reply(wire::Reply::kOk, {});
        return;
      }
    }
  }

  bool keys_present() const {
    for (const auto& k : keys_) {
      if (server_.data.count(k) == 0) return false;
    }
    return true;
  }

  // Answers now if the keys are present, else parks until they are or `timeout`.
  void park(bool is_get, std::vector<std::string> keys, Millis timeout) {
    is_get_ = is_get;
    keys_ = std::move(keys);
    waiting_ = true;
    if (try_complete()) return;
    const uint64_t id = ++wait_id_;
    server_.waiting.push_back(shared_from_this());
    timer_.expires_after(timeout);
    timer_.async_wait([self = shared_from_this(), id, timeout](error_code) {
      if (!self->waiting_ || self->wait_id_ != id) return;  // answered meanwhile
      self->waiting_ = false;
      auto& w = self->server_.waiting;
      w.erase(std::remove(w.begin(), w.end(), self), w.end());
      std::string msg;
      if (self->is_get_) {
        msg = "the key did not appear within " + ms(timeout);
      } else {
        std::vector<std::string> missing;
        for (const auto& k : self->keys_) {
          if (self->server_.data.count(k) == 0) missing.push_back(k);
        }
        msg = "keys did not appear within " + ms(timeout) + ": " +
              describe_missing_keys(missing, self->keys_.size());
      }
      self->reply(wire::Reply::kTimeout, to_bytes(msg));
    });
  }

  void reject(const std::string& why, bool close_after = false) {
    server_.rejected.fetch_add(1);
    RDMAFLOW_LOG_WARN("rendezvous server: refused a request from {}: {}", peer_name(), why);
    reply(wire::Reply::kError, to_bytes(why), close_after);
  }

  void reply(wire::Reply status, std::span<const uint8_t> payload, bool close_after = false) {
    ByteWriter w;
    w.u8(static_cast<uint8_t>(status));
    w.raw(payload.data(), payload.size());
    out_ = w.frame();
    asio::async_write(sock_, asio::buffer(out_),
                      [self = shared_from_this(), close_after](error_code ec, size_t) {
                        if (ec || close_after) {
                          self->close();
                          return;
                        }
                        self->read_header();
                      });
  }

  std::string peer_name() {  // native_handle() is not const
    if (!sock_.is_open()) return "a closed connection";
    return auth::peer_address(sock_.native_handle());  // behind a TLS relay too
  }

  TcpStoreServer::Impl& server_;
  tcp::socket sock_;
  asio::steady_timer timer_;
  std::unique_ptr<tls::Connection> tls_;  // RDMAFLOW_TLS: sock_ is its local end
  uint8_t header_[4] = {};
  static constexpr size_t kBodyChunk = 256 << 10;
  Bytes body_;
  size_t body_left_ = 0;
  Bytes out_;
  bool authenticated_ = false;
  bool timed_out_ = false;
  bool is_get_ = false;
  bool waiting_ = false;
  uint64_t wait_id_ = 0;
  std::vector<std::string> keys_;
};

}  // namespace

void TcpStoreServer::Impl::accept_next() {
  acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (!acceptor.is_open()) return;
    if (ec) {
      RDMAFLOW_LOG_WARN("rendezvous server: accept failed: {}; retrying", ec.message());
      accept_retry.expires_after(Millis(10));
      accept_retry.async_wait([this](error_code e) {
        if (!e) accept_next();
      });
      return;
    }
    error_code ignored;
    if (pending_auth >= max_pending_auth) {
      error_code e;
      auto ep = socket.remote_endpoint(e);
      RDMAFLOW_LOG_WARN(
          "rendezvous server: refused {}: {} connections are already in the handshake "
          "(RDMAFLOW_AUTH_PENDING_MAX)",
          e ? std::string("a connection")
            : ep.address().to_string() + ":" + std::to_string(ep.port()),
          pending_auth);
      socket.close(ignored);
      accept_next();
      return;
    }
    socket.set_option(tcp::no_delay(true), ignored);
    std::unique_ptr<tls::Connection> relay;
    if (tls::enabled()) {
      // The client speaks TLS: the session reads and writes the relay's local end.
      auto started = tls::start(socket.release(ignored), tls::Role::kAccept, "rendezvous server",
                                -1, Clock::now() + auth::handshake_timeout());
      if (!started.is_ok()) {
        RDMAFLOW_LOG_WARN("rendezvous server: {}", started.status().to_string());
        accept_next();
        return;
      }
      relay = std::move(*started);
      socket = tcp::socket(ioc);
      socket.assign(tcp::v4(), relay->take_local_fd(), ignored);
    }
    auto session = std::make_shared<Session>(*this, std::move(socket), std::move(relay));
    std::erase_if(sessions, [](const auto& w) { return w.expired(); });
    sessions.push_back(session);
    session->start();
    accept_next();
  });
}

void TcpStoreServer::Impl::wake_waiters() {
  auto parked = std::move(waiting);
  waiting.clear();
  for (auto& s : parked) {
    if (!s->try_complete()) waiting.push_back(std::move(s));
  }
}

void TcpStoreServer::Impl::close_all() {
  error_code ignored;
  acceptor.close(ignored);
  accept_retry.cancel();
  for (auto& w : sessions) {
    if (auto s = w.lock()) s->close();
  }
  sessions.clear();
  waiting.clear();
}

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const HostPort& address,
                                                              int expected_clients) {
  const std::string op = "serve rendezvous at " + address.to_string();
  if (tls::enabled()) RDMAFLOW_RETURN_IF_ERROR(tls::check_config(op));
  RDMAFLOW_ASSIGN_OR_RETURN(auto endpoints, resolve(address, op));
  auto impl = std::make_unique<Impl>();
  impl->expected_clients = expected_clients;
  error_code ec;
  for (const auto& ep : endpoints) {
    impl->acceptor.close(ec);
    impl->acceptor.open(ep.protocol(), ec);
    if (ec) continue;
    impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    impl->acceptor.bind(ep, ec);
    if (ec) continue;
    impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) break;
  }
  if (ec) {
    std::string hint;
    if (ec == asio::error::address_in_use) {
      hint = "; another process uses this port: pick another port in RDMAFLOW_RENDEZVOUS";
    } else if (ec == boost::system::errc::address_not_available) {
      hint = "; rank 0 must run on the host named in RDMAFLOW_RENDEZVOUS";
    }
    return RDMAFLOW_ERROR(Code::kConnectionFailed, op, 0, ec.message() + hint);
  }
  impl->address = HostPort{address.host, impl->acceptor.local_endpoint().port()};
  impl->accept_next();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    for (;;) {
      try {
        raw->ioc.run();
        return;
      } catch (const std::exception& e) {
        RDMAFLOW_LOG_ERROR("rendezvous server: unexpected exception: {}; continuing", e.what());
      }
    }
  });
  RDMAFLOW_LOG_INFO("rendezvous server listening at {} for {} ranks", impl->address.to_string(),
                    expected_clients);
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStoreServer::~TcpStoreServer() {
  stop();
}

HostPort TcpStoreServer::address() const {
  return impl_->address;
}

uint64_t TcpStoreServer::rejected_requests() const {
  return impl_->rejected.load();
}

Status TcpStoreServer::wait_for_goodbyes(Millis timeout) {
  Impl* impl = impl_.get();
  asio::post(impl->ioc, [impl] {
    error_code ignored;
    impl->acceptor.close(ignored);
  });
  std::unique_lock<std::mutex> lock(impl->mu);
  const auto expected = static_cast<size_t>(impl->expected_clients);
  if (impl->cv.wait_for(lock, timeout, [&] { return impl->goodbyes.size() >= expected; })) {
    return Status::ok();
  }
  std::string missing;
  int shown = 0;
  for (int r = 0; r < impl->expected_clients && shown < 16; ++r) {
    if (impl->goodbyes.count(r) == 0) missing += (shown++ ? ", " : "") + std::to_string(r);
  }
  return RDMAFLOW_ERROR(Code::kTimeout, "shut down rendezvous at " + impl->address.to_string(), -1,
                        "ranks " + missing + " did not say goodbye within " + ms(timeout) +
                            "; stopping the server anyway");
}

void TcpStoreServer::stop() {
  Impl* impl = impl_.get();
  {
    std::lock_guard<std::mutex> lock(impl->mu);
    if (impl->stopped) return;
    impl->stopped = true;
  }
  asio::post(impl->ioc, [impl] {
    impl->close_all();
    impl->ioc.stop();
  });
  if (impl->thread.joinable()) impl->thread.join();
}

// ---- client ----

struct TcpStore::Impl {
  HostPort address;
  std::string where;  // "rendezvous host:port"
  wire::Limits limits = wire::limits_from_env();
  std::vector<tcp::endpoint> endpoints;
  std::mutex mu;  // one request in flight
  asio::io_context ioc;
  tcp::socket sock{ioc};
  std::unique_ptr<tls::Connection> tls;  // RDMAFLOW_TLS: sock is its local end
  bool connected = false;

  // Runs the io_context until `done` or `deadline`; on deadline closes the socket.
  bool run_until(Clock::time_point deadline, const bool& done) {
    ioc.restart();
    while (!done) {
      if (ioc.run_one_until(deadline) == 0) break;
    }
    if (done) return true;
    drop();
    return false;
  }

  void drop() {
    error_code ignored;
    sock.close(ignored);
    ioc.restart();
    ioc.run();  // let the cancelled handlers finish
    tls.reset();
    connected = false;
  }

  // With RDMAFLOW_TLS=1: TLS on the connected `sock`, which then is the relay's local end.
  Status start_tls(Clock::time_point deadline, const std::string& op) {
    error_code ignored;
    RDMAFLOW_ASSIGN_OR_RETURN(
        tls, tls::start(sock.release(ignored), tls::Role::kConnect, op, 0, deadline));
    Status st = tls->wait_handshake(deadline);
    if (!st.is_ok()) {
      tls.reset();
      return st;
    }
    sock.assign(tcp::v4(), tls->take_local_fd(), ignored);
    return Status::ok();
  }

  Status connect_until(Clock::time_point deadline, const std::string& op, Millis budget) {
    Millis backoff(2);
    std::string last_error = "nobody answered";
    for (;;) {
      for (const auto& ep : endpoints) {
        error_code ignored, ec;
        sock.close(ignored);
        tls.reset();
        bool done = false;
        sock.async_connect(ep, [&](error_code e) {
          ec = e;
          done = true;
        });
        if (!run_until(deadline, done)) break;
        if (!ec) {
          sock.set_option(tcp::no_delay(true), ignored);
          if (tls::enabled()) RDMAFLOW_RETURN_IF_ERROR(start_tls(deadline, op));
          int err = 0;
          Status st =
              auth::authenticate_connect(sock.native_handle(), "store", op, 0, deadline, &err);
          if (st.is_ok()) {
            connected = true;
            return Status::ok();
          }
          if (err == 0) {  // refused: not this job's store, or not our secret
            sock.close(ignored);
            return st;
          }
          last_error = st.reason();
          continue;
        }
        last_error = ec.message();
      }
      const Millis left = remaining(deadline);
      if (left <= Millis(0)) break;
      std::this_thread::sleep_for(std::min(backoff, left));
      backoff = std::min(backoff * 2, Millis(100));
    }
    error_code ignored;
    sock.close(ignored);
    return RDMAFLOW_ERROR(Code::kConnectionFailed, op, 0,
                          "could not connect to the " + where + " within " + ms(budget) +
                              " (last error: " + last_error +
                              "); is rank 0 running, and RDMAFLOW_RENDEZVOUS the same everywhere?");
  }

  // Sends one request frame and returns the reply body.
  Result<Bytes> roundtrip(const Bytes& frame, Clock::time_point connect_deadline,
                          Clock::time_point reply_deadline, const std::string& op, Millis budget) {
    if (!connected) RDMAFLOW_RETURN_IF_ERROR(connect_until(connect_deadline, op, budget));
    auto io_failed = [&](const char* stage, const error_code& ec) {
      drop();
      return RDMAFLOW_ERROR(Code::kPeerFailed, op, 0,
                            std::string("lost the connection to the ") + where + " while " + stage +
                                ": " + ec.message());
    };
    auto timed_out = [&] {
      return RDMAFLOW_ERROR(Code::kTimeout, op, 0,
                            "no reply from the " + where + " within " + ms(budget));
    };
    error_code ec;
    bool done = false;
    asio::async_write(sock, asio::buffer(frame), [&](error_code e, size_t) {
      ec = e;
      done = true;
    });
    if (!run_until(reply_deadline, done)) return timed_out();
    if (ec) return io_failed("sending", ec);

    uint8_t header[4];
    done = false;
    asio::async_read(sock, asio::buffer(header, 4), [&](error_code e, size_t) {
      ec = e;
      done = true;
    });
    if (!run_until(reply_deadline, done)) return timed_out();
    if (ec) return io_failed("waiting for the reply", ec);
    uint32_t len = 0;
    std::memcpy(&len, header, 4);
    if (len == 0 || !wire::check_frame_length(len, limits).empty()) {
      drop();
      return RDMAFLOW_ERROR(
          Code::kProtocolError, op, 0,
          "malformed reply frame of " + std::to_string(len) + " bytes from the " + where);
    }
    Bytes body(len);
    done = false;
    asio::async_read(sock, asio::buffer(body), [&](error_code e, size_t) {
      ec = e;
      done = true;
    });
    if (!run_until(reply_deadline, done)) return timed_out();
    if (ec) return io_failed("reading the reply", ec);
    return body;
  }

  // A full call: frame out, reply status checked; returns the kOk payload.
  Result<Bytes> call(const wire::Request& request, const std::string& op, Millis timeout,
                     bool server_waits) {
    std::lock_guard<std::mutex> lock(mu);
    const auto start = Clock::now();
    const auto deadline = start + timeout;
    // A waiting request is answered by the server at its own deadline; leave the
    // reply a moment to travel before giving up on the server.
    const auto reply_deadline = server_waits ? deadline + Millis(1000) : deadline;
    ByteWriter w;
    w.out() = wire::encode_request(request);
    Bytes frame = w.frame();
    if (server_waits) {
      // The timeout field follows the op byte; send the time left after connecting.
      if (!connected) RDMAFLOW_RETURN_IF_ERROR(connect_until(deadline, op, timeout));
      uint32_t left = clamp_ms(remaining(deadline));
      std::memcpy(frame.data() + 4 + wire::kTimeoutOffset, &left, 4);
    }
    RDMAFLOW_ASSIGN_OR_RETURN(Bytes body, roundtrip(frame, deadline, reply_deadline, op, timeout));
    ByteReader r(body);
    auto status = r.u8();
    auto payload = r.rest();
    std::string text(payload.begin(), payload.end());
    switch (static_cast<wire::Reply>(status.value_or(255))) {
      case wire::Reply::kOk:
        return Bytes(payload.begin(), payload.end());
      case wire::Reply::kTimeout:
        return RDMAFLOW_ERROR(Code::kTimeout, op, -1, text + " (" + where + ")");
      case wire::Reply::kError:
        return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                              "refused by the " + where + ": " + text);
    }
    drop();
    return RDMAFLOW_ERROR(Code::kProtocolError, op, 0,
                          "unknown reply status " + std::to_string(*status) + " from the " + where);
  }
};

Result<std::unique_ptr<TcpStore>> TcpStore::connect(const HostPort& address, Millis connect_timeout,
                                                    Millis default_timeout) {
  auto impl = std::make_unique<Impl>();
  impl->address = address;
  impl->where = "rendezvous " + address.to_string();
  const std::string op = "connect to rendezvous";
  RDMAFLOW_ASSIGN_OR_RETURN(impl->endpoints, resolve(address, op));
  {
    std::lock_guard<std::mutex> lock(impl->mu);
    auto start = Clock::now();
    RDMAFLOW_RETURN_IF_ERROR(impl->connect_until(start + connect_timeout, op, connect_timeout));
    RDMAFLOW_LOG_DEBUG("connected to the {} after {} ms", impl->where,
                       std::chrono::duration_cast<Millis>(Clock::now() - start).count());
  }
  return std::unique_ptr<TcpStore>(new TcpStore(std::move(impl), default_timeout));
}

TcpStore::TcpStore(std::unique_ptr<Impl> impl, Millis default_timeout)
    : Store(default_timeout), impl_(std::move(impl)) {}

TcpStore::~TcpStore() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  error_code ignored;
  impl_->sock.close(ignored);
}

std::string TcpStore::describe() const {
  return impl_->where;
}

namespace {
Status check_key(const std::string& key, const std::string& op, const wire::Limits& limits) {
  const uint32_t limit = limits.max_key;
  if (key.size() > limit) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, op, -1,
        "key of " + std::to_string(key.size()) +
            " bytes exceeds RDMAFLOW_STORE_MAX_KEY_BYTES=" + std::to_string(limit));
  }
  return Status::ok();
}

wire::Request request(wire::Op op, std::vector<std::string> keys) {
  wire::Request q;
  q.op = op;
  q.keys = std::move(keys);
  return q;
}
}  // namespace

Status TcpStore::do_set(const std::string& key, std::span<const uint8_t> value, Millis timeout) {
  const std::string op = "store set " + quoted(key);
  RDMAFLOW_RETURN_IF_ERROR(check_key(key, op, impl_->limits));
  const uint32_t limit = impl_->limits.max_frame;
  if (value.size() + key.size() + 16 > limit) {
    return RDMAFLOW_ERROR(
        Code::kInvalidArgument, op, -1,
        "value of " + std::to_string(value.size()) +
            " bytes does not fit RDMAFLOW_STORE_MAX_FRAME_BYTES=" + std::to_string(limit));
  }
  wire::Request q = request(wire::Op::kSet, {key});
  q.value.assign(value.begin(), value.end());
  return impl_->call(q, op, timeout, false).status();
}

Result<Bytes> TcpStore::do_get(const std::string& key, Millis timeout) {
  const std::string op = "store get " + quoted(key);
  RDMAFLOW_RETURN_IF_ERROR(check_key(key, op, impl_->limits));
  return impl_->call(request(wire::Op::kGet, {key}), op, timeout, true);
}

Status TcpStore::do_wait(const std::vector<std::string>& keys, Millis timeout) {
  const std::string op = "store wait";
  if (keys.size() > wire::kMaxWaitKeys) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, op, -1,
                          std::to_string(keys.size()) + " keys exceed the limit of " +
                              std::to_string(wire::kMaxWaitKeys));
  }
  for (const auto& k : keys) RDMAFLOW_RETURN_IF_ERROR(check_key(k, op, impl_->limits));
  return impl_->call(request(wire::Op::kWait, keys), op, timeout, true).status();
}

Result<int64_t> TcpStore::do_add(const std::string& key, int64_t delta, Millis timeout) {
  const std::string op = "store add " + quoted(key);
  RDMAFLOW_RETURN_IF_ERROR(check_key(key, op, impl_->limits));
  wire::Request q = request(wire::Op::kAdd, {key});
  q.delta = delta;
  RDMAFLOW_ASSIGN_OR_RETURN(Bytes payload, impl_->call(q, op, timeout, false));
  ByteReader r(payload);
  auto v = r.i64();
  if (!v || r.left() != 0) {
    return RDMAFLOW_ERROR(Code::kProtocolError, op, 0,
                          "malformed add reply from the " + impl_->where);
  }
  return *v;
}

Status TcpStore::goodbye(int rank, std::optional<Millis> timeout) {
  wire::Request q = request(wire::Op::kBye, {});
  q.rank = rank;
  return impl_->call(q, "store goodbye", timeout.value_or(default_timeout()), false).status();
}

}  // namespace rdmaflow
