// VerbsTransport: the native ibverbs backend ("verbs", priority 30).
//
// Connections: librdmacm on RC queue pairs. listen() binds an rdma_cm id to the
// IP address of the RDMA netdev and returns "verbs://<ip>:<port>"; connect()
// resolves address and route, creates the QP and sends its Hello (verbs_wire.h)
// as connect private data; the listener answers with its own Hello in the
// accept.
//
// Thread model: one progress thread per transport (verbs_progress.cc) polls
// (poll(2)) the completion channel (every CQ), the rdma_cm event channel
// (listener and established connections), the device's async-event fd and an
// eventfd for hand-offs. It drains completions, handles connection events, runs
// deferred callbacks and checks operation deadlines (every 10 ms). connect()
// runs its handshake on the caller's thread with a private event channel, then
// migrates the cm id to the progress thread's.
#pragma once

#include <rdma/rdma_cma.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/transport.h"
#include "transport/verbs/verbs_channel.h"
#include "transport/verbs/verbs_core.h"

namespace rdmaflow::verbs {

class VerbsTransport final : public Transport {
 public:
  // kNotViable (with the reason) when there is no usable RDMA device / port.
  static Result<std::unique_ptr<Transport>> create(const TransportConfig& config);
  ~VerbsTransport() override;

  std::string name() const override { return "verbs"; }
  std::string registrar_name() const override { return "verbs"; }
  // device: the port summary; fabric: "ib <subnet prefix>" or "roce".
  TransportCapabilities capabilities() const override;

  Result<std::string> listen() override;
  Result<std::shared_ptr<Channel>> connect(int peer_rank, const std::string& address,
                                           Millis timeout) override;
  Result<std::shared_ptr<Channel>> accept(int peer_rank, Millis timeout) override;

  Result<RegionId> register_memory(void* addr, size_t len) override;
  Status deregister_memory(RegionId region) override;
  Result<RemoteKey> export_key(const void* addr, size_t len) override;
  Status revoke_key(const RemoteKey& key) override;

  void shutdown() override;

 private:
  explicit VerbsTransport(const TransportConfig& config) : config_(config) {}
  Status start();
  void log_path(const std::shared_ptr<VerbsChannel>& ch, int peer);

  // The progress thread (verbs_progress.cc).
  void progress_loop();
  void drain_cq_events();
  void poll_recv_cq();
  void drain_cm_events();
  void drain_async_events();
  void on_connect_request(rdma_cm_event* ev);
  void on_established(rdma_cm_id* id);
  // Hands an accepted channel to accept() once it is both authenticated and ESTABLISHED.
  void promote_if_ready(rdma_cm_id* id);
  void drop_pending(rdma_cm_id* id, const Status& why);
  void check_deadlines();

  TransportConfig config_;
  VerbsConfig vconfig_;
  std::string bind_ip_;
  ibv_context** devices_ = nullptr;  // rdma_get_devices(); the core uses one of them
  std::shared_ptr<VerbsCore> core_;
  rdma_event_channel* ec_ = nullptr;
  int wake_fd_ = -1;
  std::thread progress_;
  std::atomic<bool> stop_{false};
  std::vector<ibv_wc> recv_batch_;  // poll_recv_cq's, on the progress thread

  std::mutex mu_;
  std::condition_variable cv_;
  bool shut_ = false;
  rdma_cm_id* listen_id_ = nullptr;
  std::string listen_address_;
  struct Pending {
    std::shared_ptr<VerbsChannel> channel;
    std::chrono::steady_clock::time_point deadline;
  };
  std::map<rdma_cm_id*, Pending> pending_;  // accepted, not yet ESTABLISHED
  std::map<int, std::deque<std::shared_ptr<VerbsChannel>>> accepted_;
};

}  // namespace rdmaflow::verbs
