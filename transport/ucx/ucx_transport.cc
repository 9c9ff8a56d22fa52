// The UCX (UCP) backend behind the Transport interface: one UCP context and
// worker per transport, one endpoint per channel. See docs/ucx.md.
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/strings.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_channel.h"
#include "transport/ucx/ucx_core.h"

namespace rdmaflow {
namespace ucx {
namespace {

// UCX 1.13 has no query for a context's transports; read its description, whose
// resource lines look like "#      resource 3  :  md 2  dev 3  flags -- sysv/memory".
std::vector<std::string> context_transports(ucp_context_h context) {
  std::vector<std::string> tls;
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = ::open_memstream(&buf, &size);
  if (f == nullptr) return tls;
  ucp_context_print_info(context, f);
  std::fclose(f);
  std::string info(buf, size);
  std::free(buf);
  size_t pos = 0;
  while ((pos = info.find("resource ", pos)) != std::string::npos) {
    const size_t eol = std::min(info.find('\n', pos), info.size());
    const size_t dashes = info.find("-- ", pos);
    pos = eol;
    if (dashes == std::string::npos || dashes > eol) continue;
    const size_t start = dashes + 3;
    const size_t slash = info.find('/', start);
    if (slash == std::string::npos || slash > eol) continue;
    std::string tl = info.substr(start, slash - start);
    if (!tl.empty() && std::find(tls.begin(), tls.end(), tl) == tls.end()) tls.push_back(tl);
  }
  return tls;
}

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<UcxCore> core)
      : core_(std::move(core)), tls_(context_transports(core_->context())) {}
  ~UcxTransport() override { shutdown(); }

  std::string name() const override { return "ucx"; }
  std::string registrar_name() const override { return "ucx"; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities c;
    c.components = tls_;
    return c;
  }

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
  std::vector<std::string> tls_;  // the context's transports, read once
};

}  // namespace
}  // namespace ucx

namespace {

// UCX transports that reach another process through memory on the same host.
bool is_shared_memory(const std::string& tl) {
  return tl == "posix" || tl == "sysv" || tl == "cma" || tl == "xpmem" || tl == "knem";
}

// UCX transports that move data over an RDMA device (rc_verbs, ud_mlx5, dc_mlx5, ...).
bool is_rdma(const std::string& tl) {
  for (const char* p : {"rc", "ud", "dc"}) {
    const std::string prefix = p;
    if (tl == prefix || tl.rfind(prefix + "_", 0) == 0) return true;
  }
  return false;
}

std::vector<std::string> filter(const std::vector<std::string>& tls,
                                bool (*keep)(const std::string&)) {
  std::vector<std::string> out;
  for (const auto& t : tls) {
    if (keep(t)) out.push_back(t);
  }
  return out;
}

std::vector<std::string> common(const std::vector<std::string>& a,
                                const std::vector<std::string>& b) {
  std::vector<std::string> out;
  for (const auto& x : a) {
    if (std::find(b.begin(), b.end(), x) != b.end()) out.push_back(x);
  }
  return out;
}

// Shared memory on one host when both contexts have a shared-memory transport
// in common; else RDMA when both have an RDMA transport. UCX over TCP is not
// offered: rdmaflow's tcp backend is the socket path.
Reach ucx_reaches(const Endpoint& a, const Endpoint& b, bool same_host) {
  const auto& ca = a.caps->components;
  const auto& cb = b.caps->components;
  const auto shm_a = filter(ca, is_shared_memory);
  const auto shm_b = filter(cb, is_shared_memory);
  const auto shm = common(shm_a, shm_b);
  if (same_host && !shm.empty()) {
    return {Medium::kSharedMemory,
            "same host '" + a.hostname + "'; UCX shared memory: " + join(shm)};
  }
  const auto rdma_a = filter(ca, is_rdma);
  const auto rdma_b = filter(cb, is_rdma);
  if (!rdma_a.empty() && !rdma_b.empty()) {
    const auto both = common(rdma_a, rdma_b);
    std::string reason =
        "UCX RDMA transports: " + (both.empty() ? rank_text(a.rank) + " " + join(rdma_a) + ", " +
                                                      rank_text(b.rank) + " " + join(rdma_b)
                                                : join(both));
    if (same_host) reason += " (same host '" + a.hostname + "', no common UCX shared memory)";
    return {Medium::kRdma, reason};
  }
  auto list = [](const std::vector<std::string>& c) {
    return c.empty() ? std::string("none") : join(c);
  };
  if (same_host) {
    std::string who;
    if (shm_a.empty()) who = rank_text(a.rank) + " (UCX transports: " + list(ca) + ")";
    if (shm_b.empty()) {
      who +=
          (who.empty() ? "" : " and ") + rank_text(b.rank) + " (UCX transports: " + list(cb) + ")";
    }
    return {Medium::kNone, who.empty() ? "no UCX shared-memory transport common to both ranks"
                                       : "no UCX shared memory on " + who};
  }
  return {Medium::kNone, "different hosts ('" + a.hostname + "', '" + b.hostname +
                             "') and no UCX RDMA transport on " +
                             (rdma_a.empty() && rdma_b.empty() ? std::string("either rank")
                              : rdma_a.empty()                 ? rank_text(a.rank)
                                                               : rank_text(b.rank))};
}

}  // namespace

void register_ucx_transport() {
  register_transport_backend(
      {"ucx", 20,
       [](const TransportConfig& config) -> Result<std::unique_ptr<Transport>> {
         RDMAFLOW_ASSIGN_OR_RETURN(auto core, ucx::UcxCore::create(config));
         return std::unique_ptr<Transport>(std::make_unique<ucx::UcxTransport>(std::move(core)));
       },
       ucx_reaches});
}

}  // namespace rdmaflow
