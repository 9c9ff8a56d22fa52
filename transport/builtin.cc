// The backends of this source tree: one row each, with the registration
// function when this build compiled the backend in and the media it can be
// pinned to. Adding a backend adds a row here.
#include <mutex>

#include "transport/transport.h"

namespace rdmaflow {

void register_tcp_transport();
void register_verbs_transport();
void register_ucx_transport();

namespace {

using RegisterFn = void (*)();
#ifdef RDMAFLOW_HAVE_VERBS
constexpr RegisterFn kRegisterVerbs = register_verbs_transport;
#else
constexpr RegisterFn kRegisterVerbs = nullptr;
#endif
#ifdef RDMAFLOW_HAVE_UCX
constexpr RegisterFn kRegisterUcx = register_ucx_transport;
#else
constexpr RegisterFn kRegisterUcx = nullptr;
#endif

struct PinnedMedium {
  const char* label;
  std::vector<std::pair<std::string, std::string>> env;
  bool shared_memory;
};

struct BuiltinBackend {
  const char* name;
  RegisterFn register_fn;  // null: not compiled into this build
  bool shared_memory;      // as it is, on one host
  std::vector<PinnedMedium> media;
};

const std::vector<BuiltinBackend>& builtin_backends() {
  static const std::vector<BuiltinBackend> kBackends = {
      {"tcp", register_tcp_transport, false, {}},
      {"verbs", kRegisterVerbs, false, {}},
      {"ucx",
       kRegisterUcx,
       true,
       // Shared memory (AM + rendezvous/CMA data path) and loopback TCP (rkey path).
       {{"ucx_shm", {{"UCX_TLS", "posix,sysv,cma,self"}}, true},
        {"ucx_tcp", {{"UCX_TLS", "tcp,self"}, {"UCX_NET_DEVICES", "lo"}}, false}}},
  };
  return kBackends;
}

void add_rows(std::vector<TransportVariant>& out, const std::string& name, bool built) {
  const BuiltinBackend* known = nullptr;
  for (const auto& b : builtin_backends()) {
    if (name == b.name) known = &b;
  }
  TransportVariant as_is;
  as_is.label = as_is.backend = name;
  as_is.shared_memory = known && known->shared_memory;
  as_is.per_medium = !known || known->media.empty();
  as_is.built = built;
  out.push_back(as_is);
  if (!known) return;
  for (const PinnedMedium& m : known->media) {
    out.push_back({m.label, name, m.env, true, true, m.shared_memory, built});
  }
}

}  // namespace

void register_builtin_transports() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const auto& b : builtin_backends()) {
      if (b.register_fn) b.register_fn();
    }
  });
}

std::vector<TransportVariant> transport_variants() {
  std::vector<TransportVariant> out;
  const std::vector<std::string> registered = transport_backend_names();
  for (const std::string& name : registered) add_rows(out, name, true);
  for (const auto& b : builtin_backends()) {
    if (!b.register_fn) add_rows(out, b.name, false);
  }
  return out;
}

}  // namespace rdmaflow
