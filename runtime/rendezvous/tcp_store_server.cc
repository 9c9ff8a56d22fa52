// The rendezvous store's server: one asio thread serving every client
// (the client is tcp_store.cc).
#include "runtime/rendezvous/tcp_store.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <condition_variable>
#include <set>
#include <thread>
#include <unordered_map>

#include "common/handshake_asio.h"
#include "common/log.h"
#include "common/tls.h"
#include "runtime/rendezvous/tcp_store_internal.h"
#include "runtime/rendezvous/tcp_store_protocol.h"

namespace rdmaflow {

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

}  // namespace rdmaflow
