#include "transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/counters.h"
#include "common/env.h"
#include "common/fd_io.h"
#include "common/handshake_asio.h"
#include "common/log.h"
#include "transport/tcp/tcp_address.h"

namespace rdmaflow {

namespace tcp {

namespace asio = boost::asio;
using asio::ip::tcp;

struct TcpTransport::Incoming {
  explicit Incoming(asio::io_context& io, tcp::socket s) : socket(std::move(s)), timer(io) {}
  tcp::socket socket;
  asio::steady_timer timer;
  Hello hello;
  bool done = false;
};

namespace {

int64_t env_or(const char* name, int64_t fallback) {
  auto v = env_int(name, fallback);
  if (!v.is_ok()) {
    RDMAFLOW_LOG_WARN("{}; using {}", v.status().to_string(), fallback);
    return fallback;
  }
  return *v;
}

}  // namespace

Result<std::unique_ptr<Transport>> TcpTransport::create(const TransportConfig& config) {
  TcpTransportOptions o;
  o.sockbuf = static_cast<int>(
      std::clamp<int64_t>(env_or("RDMAFLOW_TCP_SOCKBUF", o.sockbuf), 0, int64_t{1} << 30));
  o.channel.chunk_bytes = static_cast<uint64_t>(
      std::clamp<int64_t>(env_or("RDMAFLOW_TCP_CHUNK", static_cast<int64_t>(o.channel.chunk_bytes)),
                          4096, static_cast<int64_t>(kMaxChunkPayload)));
  o.channel.limits = frame_limits_from_env();
  // Never send a chunk this rank would refuse (the limit is meant to be job-wide).
  o.channel.chunk_bytes = std::min(o.channel.chunk_bytes, o.channel.limits.max_frame);
  o.channel.max_peer_queued = static_cast<uint64_t>(std::clamp<int64_t>(
      env_or("RDMAFLOW_MAX_PEER_QUEUED", static_cast<int64_t>(o.channel.max_peer_queued)), 1,
      int64_t{1} << 30));
  o.busy_poll_us = std::max<int64_t>(0, env_or("RDMAFLOW_TCP_BUSY_POLL", 0));
  o.channel.drive_us = std::max<int64_t>(0, env_or("RDMAFLOW_TCP_WAIT_POLL", 2000));
  o.streams =
      static_cast<int>(std::clamp<int64_t>(env_or("RDMAFLOW_TCP_STREAMS", o.streams), 1, 16));
  o.channel.stripe_min = static_cast<uint64_t>(std::clamp<int64_t>(
      env_or("RDMAFLOW_TCP_STRIPE_MIN", static_cast<int64_t>(o.channel.stripe_min)), 4096,
      int64_t{1} << 40));
  o.channel.zerocopy_min = static_cast<uint64_t>(
      std::clamp<int64_t>(env_or("RDMAFLOW_TCP_ZEROCOPY", 0), 0, int64_t{1} << 40));
  o.channel.quickack_segments = static_cast<uint64_t>(std::clamp<int64_t>(
      env_or("RDMAFLOW_TCP_QUICKACK", static_cast<int64_t>(o.channel.quickack_segments)), 0,
      int64_t{1} << 20));
  if (auto cc = env_string("RDMAFLOW_TCP_CONGESTION"); cc && !cc->empty()) {
    // A name as the kernel spells one (TCP_CA_NAME_MAX is 16, with its NUL).
    const bool name = cc->size() < 16 && std::all_of(cc->begin(), cc->end(), [](char c) {
                        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                      });
    if (name) {
      o.congestion = *cc;
    } else {
      RDMAFLOW_LOG_WARN(
          "RDMAFLOW_TCP_CONGESTION='{}' is not a congestion control's name; "
          "using the system's",
          *cc);
    }
  }
  int64_t port = env_or("RDMAFLOW_TCP_PORT", 0);
  if (port < 0 || port > 65535) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, "create tcp transport", -1,
                          "RDMAFLOW_TCP_PORT=" + std::to_string(port) + " is not a port");
  }
  o.port = static_cast<int>(port);
  o.tls = tls::enabled();
  if (o.tls) {
    RDMAFLOW_RETURN_IF_ERROR(tls::check_config("create tcp transport"));
    // MSG_ZEROCOPY has no meaning on the relay's local socket: the relay
    // copies. (TCP_QUICKACK finds no MSS there and stays off by itself.)
    o.channel.zerocopy_min = 0;
  }
  return std::unique_ptr<Transport>(new TcpTransport(config, o));
}

TcpTransport::TcpTransport(const TransportConfig& config, TcpTransportOptions options)
    : config_(config),
      options_(options),
      loop_(std::make_shared<IoLoop>(options.busy_poll_us)),
      grants_(std::make_shared<GrantTable>("tcp")),
      landings_(std::make_shared<LandingTable>()),
      max_pending_(auth::max_pending_handshakes()) {
  loop_->set_ticker(Millis(1), [this](Clock::time_point now) { return sweep(now); });
  loop_->start();
}

TcpTransport::~TcpTransport() {
  shutdown();
}

Result<RegionId> TcpTransport::register_memory(void* addr, size_t len) {
  return grants_->add_region(addr, len);
}

Status TcpTransport::deregister_memory(RegionId region) {
  return grants_->remove_region(region).status();
}

Result<RemoteKey> TcpTransport::export_key(const void* addr, size_t len) {
  return grants_->grant(addr, len);
}

Status TcpTransport::revoke_key(const RemoteKey& key) {
  return grants_->revoke(key);
}

void TcpTransport::apply_socket_options(int fd, bool tcp) const {
  if (tcp) apply_tcp_options(fd);
  if (options_.sockbuf > 0) {
    int size = options_.sockbuf;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  }
}

void TcpTransport::apply_tcp_options(int fd) const {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (!options_.congestion.empty() &&
      ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, options_.congestion.data(),
                   static_cast<socklen_t>(options_.congestion.size())) != 0 &&
      !congestion_warned_.exchange(true)) {
    RDMAFLOW_LOG_WARN(
        "RDMAFLOW_TCP_CONGESTION={}: the kernel refused it ({}): not built or not loaded, or "
        "(without CAP_NET_ADMIN) not in /proc/sys/net/ipv4/tcp_allowed_congestion_control; "
        "the sockets keep the system's",
        options_.congestion, std::strerror(errno));
  }
}

Result<std::string> TcpTransport::listen() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) {
    return RDMAFLOW_ERROR(Code::kCancelled, "listen", -1, "transport is shut down");
  }
  if (acceptor_) return address_;
  RDMAFLOW_ASSIGN_OR_RETURN(asio::ip::address host,
                            resolve_listen_address(config_.ifname, config_.reach_address));
  tcp::endpoint endpoint(host, static_cast<uint16_t>(options_.port));
  tcp::acceptor acceptor(loop_->io());
  boost::system::error_code ec;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) {
    // Buffer sizes must be set before listen() to take effect on the window scale;
    // accepted sockets inherit them.
    apply_socket_options(acceptor.native_handle());
    acceptor.bind(endpoint, ec);
  }
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return RDMAFLOW_ERROR(Code::kConnectionFailed, "listen", -1,
                          "cannot listen on " + format_address(endpoint) + ": " + ec.message());
  }
  address_ = format_address(acceptor.local_endpoint());
  acceptor_.emplace(std::move(acceptor));
  loop_->post([this] { start_accept(); });
  RDMAFLOW_LOG_DEBUG("tcp transport of rank {} listening at {}", config_.rank, address_);
  return address_;
}

void TcpTransport::start_accept() {
  if (!acceptor_ || !acceptor_->is_open()) return;
  acceptor_->async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors and the like: try again shortly rather than give up.
      RDMAFLOW_LOG_WARN("tcp accept failed: {}", ec.message());
      auto timer = std::make_shared<asio::steady_timer>(loop_->io(), Millis(50));
      timer->async_wait([this, timer](const boost::system::error_code& e) {
        if (!e) start_accept();
      });
      return;
    }
    apply_socket_options(socket.native_handle());
    auto in = std::make_shared<Incoming>(loop_->io(), std::move(socket));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<int>(incoming_.size()) >= max_pending_) {
        // A flood of connections that never authenticate must not pin descriptors
        // and memory: beyond the cap, new ones are closed at once.
        RDMAFLOW_LOG_WARN(
            "tcp: refused a connection from {}: {} connections are already in the handshake "
            "(RDMAFLOW_AUTH_PENDING_MAX)",
            auth::peer_address(in->socket.native_handle()), incoming_.size());
        boost::system::error_code ignored;
        in->socket.close(ignored);
        start_accept();
        return;
      }
      incoming_.push_back(in);
    }
    if (options_.tls) {
      // The peer speaks TLS; everything above (handshake, hello, frames) runs on the
      // relay's local end as it would on the socket.
      boost::system::error_code ec;
      const int net = in->socket.release(ec);
      auto relay = tls::start(net, tls::Role::kAccept,
                              "tcp transport of rank " + std::to_string(config_.rank), -1,
                              Clock::now() + auth::handshake_timeout());
      if (!relay.is_ok()) {
        RDMAFLOW_LOG_WARN("{}", relay.status().to_string());
        std::lock_guard<std::mutex> lock(mu_);
        std::erase(incoming_, in);
        start_accept();
        return;
      }
      const int local = (*relay)->take_local_fd();
      apply_socket_options(local, /*tcp=*/false);
      in->socket.assign(tcp::v4(), local, ec);
      keep_tls(std::move(*relay));
    }
    in->timer.expires_after(auth::handshake_timeout());
    in->timer.async_wait([this, in](const boost::system::error_code& e) {
      if (e || in->done) return;
      drop_incoming(in, "did not finish the handshake and hello within RDMAFLOW_AUTH_TIMEOUT_MS");
    });
    // Nothing is read from the socket but the handshake until the peer proved the
    // job secret; then the hello says which rank and stream it is.
    auth::async_accept_handshake(in->socket, in, "tcp", [this, in](Status st) {
      if (in->done) return;
      if (!st.is_ok()) return drop_incoming(in, st.reason());
      asio::async_read(in->socket, asio::buffer(&in->hello, sizeof(Hello)),
                       [this, in](const boost::system::error_code& e, size_t) {
                         if (in->done) return;
                         if (e) return drop_incoming(in, "no hello: " + e.message());
                         on_hello(in);
                       });
    });
    start_accept();
  });
}

void TcpTransport::on_hello(std::shared_ptr<Incoming> in) {
  const uint32_t streams = std::max<uint32_t>(1, in->hello.streams);
  if (streams != static_cast<uint32_t>(options_.streams) && in->hello.magic == kHelloMagic) {
    RDMAFLOW_LOG_WARN(
        "tcp: refused a connection from rank {} with {} streams per channel; this rank uses {} "
        "(RDMAFLOW_TCP_STREAMS must be the same on every rank)",
        in->hello.rank, streams, options_.streams);
  }
  if (in->hello.magic != kHelloMagic || in->hello.version != kProtocolVersion ||
      in->hello.rank < 0 || streams != static_cast<uint32_t>(options_.streams) ||
      in->hello.stream >= streams) {
    drop_incoming(in, "bad hello (magic " + std::to_string(in->hello.magic) + ", version " +
                          std::to_string(in->hello.version) + ")");
    return;
  }
  auto reply = std::make_shared<Hello>();
  reply->rank = config_.rank;
  asio::async_write(in->socket, asio::buffer(reply.get(), sizeof(Hello)),
                    [this, in, reply](const boost::system::error_code& e, size_t) {
                      if (in->done) return;
                      if (e) return drop_incoming(in, "hello reply failed: " + e.message());
                      in->done = true;
                      in->timer.cancel();
                      std::lock_guard<std::mutex> lock(mu_);
                      std::erase(incoming_, in);
                      if (shut_down_) return;
                      // From here on the socket is not Asio's: channels watch it themselves.
                      boost::system::error_code ec;
                      int fd = in->socket.release(ec);
                      if (ec) return;
                      accepted_[in->hello.rank].push_back({in->hello.stream, fd});
                      cv_.notify_all();
                    });
}

void TcpTransport::drop_incoming(const std::shared_ptr<Incoming>& in, const std::string& why) {
  RDMAFLOW_LOG_WARN("tcp transport of rank {}: refused the connection from {}: {}", config_.rank,
                    auth::peer_address(in->socket.native_handle()), why);
  in->done = true;
  in->timer.cancel();
  boost::system::error_code ignored;
  in->socket.close(ignored);
  std::lock_guard<std::mutex> lock(mu_);
  std::erase(incoming_, in);
}

std::shared_ptr<TcpChannel> TcpTransport::adopt(int fd, int peer_rank) {
  auto ch = std::make_shared<TcpChannel>(loop_, grants_, landings_, fd, config_.rank, peer_rank,
                                         options_.channel);
  ch->start();
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(channels_, [](const auto& c) { return c->finished(); });
    channels_.push_back(ch);
  }
  return ch;
}

std::shared_ptr<Channel> TcpTransport::hand_out(std::vector<int> fds, int peer_rank) {
  auto ch = adopt(fds[0], peer_rank);
  if (fds.size() > 1) {
    std::vector<std::shared_ptr<TcpChannel>> stripes;
    std::vector<std::shared_ptr<Channel>> handles;
    for (size_t i = 1; i < fds.size(); ++i) {
      auto s = adopt(fds[i], peer_rank);
      stripes.push_back(s);
      handles.push_back(std::shared_ptr<Channel>(s.get(), [s](Channel*) { s->close(); }));
    }
    ch->set_stripes(std::move(stripes), std::move(handles));
  }
  // The user's handle closes the channel (and its stripes) when its last copy goes away.
  return std::shared_ptr<Channel>(ch.get(), [ch](Channel*) { ch->close(); });
}

Result<std::shared_ptr<Channel>> TcpTransport::connect(int peer_rank, const std::string& address,
                                                       Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<int> fds;
  for (int stream = 0; stream < options_.streams; ++stream) {
    auto fd = connect_stream(peer_rank, address, stream, deadline, timeout);
    if (!fd.is_ok()) {
      for (int f : fds) ::close(f);
      return fd.status();
    }
    fds.push_back(*fd);
  }
  return hand_out(std::move(fds), peer_rank);
}

Result<int> TcpTransport::connect_stream(int peer_rank, const std::string& address, int stream,
                                         Clock::time_point deadline, Millis timeout) {
  const std::string op = "connect to " + address;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_)
      return RDMAFLOW_ERROR(Code::kCancelled, op, peer_rank, "transport is shut down");
  }
  RDMAFLOW_ASSIGN_OR_RETURN(tcp::endpoint endpoint, parse_address(address));
  Millis backoff(5);
  std::string last_error = "no attempt made";
  for (int attempt = 1;; ++attempt) {
    int fd = ::socket(endpoint.protocol().family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      return RDMAFLOW_ERROR(Code::kConnectionFailed, op, peer_rank,
                            std::string("socket(): ") + std::strerror(errno));
    }
    apply_socket_options(fd);
    int err = 0;
    if (::connect(fd, endpoint.data(), static_cast<socklen_t>(endpoint.size())) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        int r = wait_fd(fd, POLLOUT, deadline);
        if (r == 1) {
          socklen_t len = sizeof(err);
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = r == 0 ? ETIMEDOUT : errno;
        }
      }
    }
    std::unique_ptr<tls::Connection> relay;
    if (err == 0 && options_.tls) {
      RDMAFLOW_ASSIGN_OR_RETURN(relay,
                                tls::start(fd, tls::Role::kConnect, op, peer_rank, deadline));
      RDMAFLOW_RETURN_IF_ERROR(relay->wait_handshake(deadline));  // refused, or no TLS there
      fd = relay->take_local_fd();
      apply_socket_options(fd, /*tcp=*/false);
    }
    if (err == 0) {
      Status auth = auth::authenticate_connect(fd, "tcp", op, peer_rank, deadline, &err);
      if (!auth.is_ok() && err == 0) {
        ::close(fd);  // refused (or refusing): the peer is not of this job; retrying cannot help
        return auth;
      }
    }
    if (err == 0) {
      Hello hello;
      hello.rank = config_.rank;
      hello.stream = static_cast<uint16_t>(stream);
      hello.streams = static_cast<uint32_t>(options_.streams);
      Hello reply;
      if (send_all(fd, &hello, sizeof(hello), deadline, err) &&
          recv_all(fd, &reply, sizeof(reply), deadline, err)) {
        if (reply.magic != kHelloMagic || reply.version != kProtocolVersion) {
          ::close(fd);
          return RDMAFLOW_ERROR(Code::kConnectionFailed, op, peer_rank,
                                "the listener at " + address +
                                    " does not speak the rdmaflow tcp protocol (version " +
                                    std::to_string(kProtocolVersion) + ")");
        }
        if (reply.rank != peer_rank) {
          ::close(fd);
          return RDMAFLOW_ERROR(Code::kConnectionFailed, op, peer_rank,
                                address + " belongs to rank " + std::to_string(reply.rank) +
                                    ", not rank " + std::to_string(peer_rank));
        }
        if (relay) keep_tls(std::move(relay));
        return fd;
      }
      if (err == 0) err = ECONNRESET;  // closed without a reply: e.g. a streams mismatch
    }
    ::close(fd);
    last_error = std::strerror(err);
    const bool retry = err == ECONNREFUSED || err == ECONNRESET || err == EAGAIN;
    if (!retry || Clock::now() + backoff >= deadline) {
      Code code = err == ETIMEDOUT ? Code::kTimeout : Code::kConnectionFailed;
      return RDMAFLOW_ERROR(
          code, op, peer_rank,
          "could not reach rank " + std::to_string(peer_rank) + " at " + address + " within " +
              std::to_string(timeout.count()) + " ms (" + std::to_string(attempt) +
              " attempts; last: " + last_error +
              (options_.streams > 1 ? "; RDMAFLOW_TCP_STREAMS=" + std::to_string(options_.streams) +
                                          " must be the same on every rank"
                                    : std::string()) +
              ")");
    }
    // Nobody listening yet: the peer may still be starting; retry until the deadline.
    stats::counters("tcp", peer_rank).add_retry();
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, Millis(100));
  }
}

Result<std::shared_ptr<Channel>> TcpTransport::accept(int peer_rank, Millis timeout) {
  RDMAFLOW_RETURN_IF_ERROR(listen().status());
  std::unique_lock<std::mutex> lock(mu_);
  // Every stream of one channel: the first connection announced as stream k, for each k.
  auto find = [&](std::vector<Accepted>& queue, int stream) {
    return std::find_if(queue.begin(), queue.end(),
                        [stream](const Accepted& a) { return a.stream == stream; });
  };
  auto ready = [&] {
    if (shut_down_) return true;
    auto it = accepted_.find(peer_rank);
    if (it == accepted_.end()) return false;
    for (int k = 0; k < options_.streams; ++k) {
      if (find(it->second, k) == it->second.end()) return false;
    }
    return true;
  };
  if (!cv_.wait_for(lock, timeout, ready)) {
    return RDMAFLOW_ERROR(Code::kTimeout, "accept", peer_rank,
                          "rank " + std::to_string(peer_rank) + " did not connect to " + address_ +
                              " within " + std::to_string(timeout.count()) + " ms");
  }
  if (shut_down_)
    return RDMAFLOW_ERROR(Code::kCancelled, "accept", peer_rank, "transport is shut down");
  auto& queue = accepted_[peer_rank];
  std::vector<int> fds;
  for (int k = 0; k < options_.streams; ++k) {
    auto it = find(queue, k);
    fds.push_back(it->fd);
    queue.erase(it);
  }
  lock.unlock();
  return hand_out(std::move(fds), peer_rank);
}

void TcpTransport::keep_tls(std::unique_ptr<tls::Connection> connection) {
  std::vector<std::unique_ptr<tls::Connection>> ended;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : tls_) {
    if (c->finished()) ended.push_back(std::move(c));
  }
  std::erase(tls_, nullptr);
  tls_.push_back(std::move(connection));
}

bool TcpTransport::sweep(Clock::time_point now) {
  std::vector<std::shared_ptr<TcpChannel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    channels = channels_;
  }
  // Every tick (1 ms): ACKs held back for an answer that did not come. Every
  // tenth: operation deadlines. Pending means a later tick has work: the
  // loop stops ticking after IoLoop::kIdleTicks ticks without (an idle
  // transport does not wake its thread 1000 times a second). Operations
  // still pending count on every tick, not only on the tenth: the loop's
  // last look before it stops (IoLoop::arm_tick) is any tick, and an
  // operation submitted while the loop still looked busy (its request_ticks()
  // did nothing) must keep it going. Without that, a posted write sent just
  // then on a channel nothing answers on was never completed: a ring on
  // 2 x 2 stopped in 4 of 9 runs, every rank asleep and every socket empty.
  bool full = ++ticks_ % 10 == 0;
  bool pending = false;
  for (auto& ch : channels) {
    pending = ch->has_user_ops() || pending;
    pending = ch->flush_deferred(now, Millis(1)) || pending;
    pending = ch->flush_held(now, Millis(1)) || pending;
    pending = ch->release_lease(now, Millis(1)) || pending;
    pending = ch->drain_zerocopy() || pending;
    if (full) pending = ch->sweep(now) || pending;
  }
  return pending;
}

void TcpTransport::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    cv_.notify_all();
  }
  // On the progress thread: stop accepting, fail every channel with kCancelled
  // (their callbacks fire there), then stop the loop.
  loop_->stop([this] {
    boost::system::error_code ignored;
    if (acceptor_) acceptor_->close(ignored);
    std::vector<std::shared_ptr<Incoming>> incoming;
    std::vector<std::shared_ptr<TcpChannel>> channels;
    {
      std::lock_guard<std::mutex> lock(mu_);
      incoming.swap(incoming_);
      channels = channels_;
    }
    for (auto& in : incoming) {
      in->done = true;
      in->timer.cancel();
      in->socket.close(ignored);
    }
    for (auto& ch : channels) {
      ch->fail(RDMAFLOW_ERROR(Code::kCancelled, "channel", ch->peer_rank(), "transport shut down"));
    }
  });
  std::vector<std::shared_ptr<TcpChannel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    channels.swap(channels_);
    for (auto& [rank, queue] : accepted_) {
      for (const Accepted& a : queue) ::close(a.fd);
    }
    accepted_.clear();
    acceptor_.reset();
  }
  for (auto& ch : channels) ch->release_socket();
  std::vector<std::unique_ptr<tls::Connection>> relays;
  {
    std::lock_guard<std::mutex> lock(mu_);
    relays.swap(tls_);
  }
  relays.clear();  // stops and joins each relay
  // Drop handlers still queued (aborted waits); they hold channel references.
  loop_->io().restart();
  loop_->io().poll();
}

}  // namespace tcp

void register_tcp_transport() {
  // Reaches every peer with an IP route; the socket path when nothing better does.
  register_transport_backend(TransportBackendInfo{
      "tcp", 10, [](const TransportConfig& config) { return tcp::TcpTransport::create(config); },
      [](const Endpoint&, const Endpoint&, bool) {
        return Reach{Medium::kSocket, ""};
      }});
}

}  // namespace rdmaflow
