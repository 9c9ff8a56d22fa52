// TcpStore: the Store every rank of a job shares. Rank 0 runs a TcpStoreServer at
// the rendezvous address (RDMAFLOW_RENDEZVOUS); every rank, rank 0 included,
// talks to it through a TcpStore client. Wire format: runtime/rendezvous/tcp_store_protocol.h.
//
// Thread model: the server runs all its work on one Boost.Asio thread of its own;
// a waiting get/wait is parked there (no thread per waiter) and answered when the
// key is set or its timeout expires. A client serializes its calls (one request in
// flight per connection); each call runs its own I/O with a deadline. A client
// whose server is not up yet retries connecting until the call's deadline.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "runtime/rendezvous/store.h"

namespace rdmaflow {

// "host:port", "1.2.3.4:port" or "[v6addr]:port".
struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const;
};

// Parses `text`; errors name `what` (e.g. "RDMAFLOW_RENDEZVOUS").
Result<HostPort> parse_host_port(std::string_view text, const std::string& what);

class TcpStoreServer {
 public:
  // Listens at `address` (port 0 picks a free port; see address()). `expected_clients`
  // is the number of ranks whose goodbye wait_for_goodbyes() waits for.
  static Result<std::unique_ptr<TcpStoreServer>> start(const HostPort& address,
                                                       int expected_clients);
  ~TcpStoreServer();  // stop()

  // The address clients connect to, with the real port.
  HostPort address() const;

  // Waits until every expected rank said goodbye (kTimeout naming the missing
  // ranks otherwise). Stops accepting new connections first; connections already
  // open keep being served so late readers finish.
  Status wait_for_goodbyes(Millis timeout);

  // Closes every connection and joins the server thread. Idempotent.
  void stop();

  // Requests answered with kError so far (for tests and diagnostics).
  uint64_t rejected_requests() const;

  struct Impl;

 private:
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class TcpStore : public Store {
 public:
  // Connects to the server at `address`, retrying while nobody listens yet, until
  // `connect_timeout`. Calls without their own timeout use `default_timeout`.
  static Result<std::unique_ptr<TcpStore>> connect(const HostPort& address, Millis connect_timeout,
                                                   Millis default_timeout);
  ~TcpStore() override;

  // Tells the server this rank is done with the store (see wait_for_goodbyes).
  Status goodbye(int rank, std::optional<Millis> timeout = std::nullopt);

  std::string describe() const override;

  struct Impl;

 protected:
  Status do_set(const std::string& key, std::span<const uint8_t> value, Millis timeout) override;
  Result<Bytes> do_get(const std::string& key, Millis timeout) override;
  Status do_wait(const std::vector<std::string>& keys, Millis timeout) override;
  Result<int64_t> do_add(const std::string& key, int64_t delta, Millis timeout) override;

 private:
  TcpStore(std::unique_ptr<Impl> impl, Millis default_timeout);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rdmaflow
