// Registers the backends compiled into this build. Each backend's file exposes
// one registration function; adding a backend adds a line here.
#include <mutex>

#include "transport/transport.h"

namespace rdmaflow {

void register_tcp_transport();
#ifdef RDMAFLOW_HAVE_VERBS
void register_verbs_transport();
#endif
#ifdef RDMAFLOW_HAVE_UCX
void register_ucx_transport();
#endif

void register_builtin_transports() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_tcp_transport();
#ifdef RDMAFLOW_HAVE_VERBS
    register_verbs_transport();
#endif
#ifdef RDMAFLOW_HAVE_UCX
    register_ucx_transport();
#endif
  });
}

}  // namespace rdmaflow
