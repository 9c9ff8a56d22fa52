// TcpTransport: the TCP backend (Boost.Asio). One io_context and one progress
// thread per transport; one TcpChannel (one socket) per peer, plus its stripes
// (one more socket each) with RDMAFLOW_TCP_STREAMS > 1.
//
// Knobs (docs/tcp_transport.md): RDMAFLOW_SOCKET_IFNAME, RDMAFLOW_TCP_PORT,
// RDMAFLOW_TCP_SOCKBUF, RDMAFLOW_TCP_CHUNK, RDMAFLOW_TCP_BUSY_POLL,
// RDMAFLOW_TCP_WAIT_POLL, RDMAFLOW_TCP_STREAMS, RDMAFLOW_TCP_STRIPE_MIN.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/tls.h"
#include "transport/common/grant_table.h"
#include "transport/tcp/tcp_channel.h"
#include "transport/tcp/tcp_progress.h"
#include "transport/transport.h"

namespace rdmaflow::tcp {

struct TcpTransportOptions {
  TcpOptions channel;
  int sockbuf = 4 << 20;  // SO_SNDBUF / SO_RCVBUF; 0 leaves kernel autotuning on
  int64_t busy_poll_us = 0;
  int port = 0;      // 0 = any free port
  int streams = 1;   // RDMAFLOW_TCP_STREAMS: connections per channel
  bool tls = false;  // RDMAFLOW_TLS: every connection through a TLS relay (common/tls.h)
  // RDMAFLOW_TCP_CONGESTION: every socket's TCP_CONGESTION; empty: the system's.
  std::string congestion;
};

class TcpTransport final : public Transport {
 public:
  static Result<std::unique_ptr<Transport>> create(const TransportConfig& config);

  TcpTransport(const TransportConfig& config, TcpTransportOptions options);
  ~TcpTransport() override;

  std::string name() const override { return "tcp"; }
  std::string registrar_name() const override { return "tcp"; }
  Result<RegionId> register_memory(void* addr, size_t len) override;
  Status deregister_memory(RegionId region) override;

  Result<std::string> listen() override;
  Result<std::shared_ptr<Channel>> connect(int peer_rank, const std::string& address,
                                           Millis timeout) override;
  Result<std::shared_ptr<Channel>> accept(int peer_rank, Millis timeout) override;
  Result<RemoteKey> export_key(const void* addr, size_t len) override;
  Status revoke_key(const RemoteKey& key) override;
  void shutdown() override;

 private:
  struct Incoming;  // an accepted connection whose hello is being read

  void start_accept();                          // progress thread
  void on_hello(std::shared_ptr<Incoming> in);  // progress thread
  // Closes an accepted connection that failed the handshake or its hello, logging
  // its address and why (progress thread).
  void drop_incoming(const std::shared_ptr<Incoming>& in, const std::string& why);
  // Buffer sizes on every socket; TCP_NODELAY and the congestion control on
  // TCP ones (not on a TLS relay's local end: the relay's TCP socket had them).
  void apply_socket_options(int fd, bool tcp = true) const;
  void apply_tcp_options(int fd) const;
  mutable std::atomic<bool> congestion_warned_{false};
  std::shared_ptr<TcpChannel> adopt(int fd, int peer_rank);
  // The user's handle of `streams` adopted connections (stream 0 first).
  std::shared_ptr<Channel> hand_out(std::vector<int> fds, int peer_rank);
  Result<int> connect_stream(int peer_rank, const std::string& address, int stream,
                             Clock::time_point deadline, Millis timeout);
  bool sweep(Clock::time_point now);
  // With TLS: the relay of a connection lives as long as the transport, or until it ends.
  void keep_tls(std::unique_ptr<tls::Connection> connection);

  TransportConfig config_;
  TcpTransportOptions options_;
  std::shared_ptr<IoLoop> loop_;
  std::shared_ptr<GrantTable> grants_;
  std::shared_ptr<LandingTable> landings_;  // Channel::post_landing, every channel's
  const int max_pending_;  // RDMAFLOW_AUTH_PENDING_MAX: accepted connections not yet through

  std::mutex mu_;
  std::condition_variable cv_;
  bool shut_down_ = false;
  std::optional<boost::asio::ip::tcp::acceptor> acceptor_;
  std::string address_;
  struct Accepted {
    int stream = 0;
    int fd = -1;
  };
  std::map<int, std::vector<Accepted>> accepted_;  // sockets by rank, hello done
  std::vector<std::shared_ptr<Incoming>> incoming_;
  std::vector<std::shared_ptr<TcpChannel>> channels_;
  std::vector<std::unique_ptr<tls::Connection>> tls_;
  uint64_t ticks_ = 0;  // progress thread
};

}  // namespace rdmaflow::tcp
