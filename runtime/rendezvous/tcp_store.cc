#include "runtime/rendezvous/tcp_store.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <charconv>

#include "common/handshake_asio.h"
#include "common/log.h"
#include "common/tls.h"
#include "runtime/rendezvous/tcp_store_internal.h"
#include "runtime/rendezvous/tcp_store_protocol.h"

namespace rdmaflow {

namespace {

std::string quoted(const std::string& key) {
  return "'" + key + "'";
}

uint32_t clamp_ms(Millis t) {
  return static_cast<uint32_t>(std::clamp<int64_t>(t.count(), 0, UINT32_MAX));
}

Millis remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  return std::max(left, Millis(0));
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

Result<std::vector<tcp::endpoint>> store_detail::resolve(const HostPort& hp,
                                                         const std::string& op) {
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
