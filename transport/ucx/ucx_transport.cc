// The UCX (UCP) backend behind the Transport interface: one UCP context and
// worker per transport, one endpoint per channel. See docs/ucx.md.
#include <memory>

#include "transport/transport.h"
#include "transport/ucx/ucx_channel.h"
#include "transport/ucx/ucx_core.h"

namespace rdmaflow {
namespace ucx {
namespace {

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<UcxCore> core) : core_(std::move(core)) {}
  ~UcxTransport() override { shutdown(); }

  std::string name() const override { return "ucx"; }
  std::string registrar_name() const override { return "ucx"; }

  Result<std::string> listen() override {
    if (core_->stopped()) {
      return RDMAFLOW_ERROR(Code::kCancelled, "listen", -1, "transport is shut down");
    }
    return core_->address();  // the worker is always reachable; nothing to start
  }
  Result<std::shared_ptr<Channel>> connect(int peer_rank, const std::string& address,
                                           Millis timeout) override {
    return core_->connect(peer_rank, address, timeout);
  }
  Result<std::shared_ptr<Channel>> accept(int peer_rank, Millis timeout) override {
    return core_->accept(peer_rank, timeout);
  }
  Result<RegionId> register_memory(void* addr, size_t len) override {
    return core_->register_memory(addr, len);
  }
  Status deregister_memory(RegionId region) override { return core_->deregister_memory(region); }
  Result<RemoteKey> export_key(const void* addr, size_t len) override {
    return core_->export_key(addr, len);
  }
  Status revoke_key(const RemoteKey& key) override { return core_->revoke_key(key); }
  void shutdown() override { core_->shutdown(); }

 private:
  std::shared_ptr<UcxCore> core_;
};

}  // namespace
}  // namespace ucx

void register_ucx_transport() {
  register_transport_backend(
      {"ucx", 20, [](const TransportConfig& config) -> Result<std::unique_ptr<Transport>> {
         RDMAFLOW_ASSIGN_OR_RETURN(auto core, ucx::UcxCore::create(config));
         return std::unique_ptr<Transport>(std::make_unique<ucx::UcxTransport>(std::move(core)));
       }});
}

}  // namespace rdmaflow
