// An outside project using an installed rdmaflow.
#include <cstdio>

#include "common/status.h"
#include "runtime/version.h"
#include "transport/transport.h"

int main() {
  auto names = rdmaflow::transport_backend_names();
  std::printf("rdmaflow %s, transports:", rdmaflow::version());
  for (const auto& n : names) std::printf(" %s", n.c_str());
  std::printf("\n");
  rdmaflow::Status s = rdmaflow::make_transport("no-such-backend", {}).status();
  if (s.is_ok() || s.code() != rdmaflow::Code::kNotFound) {
    std::printf("expected kNotFound for an unknown backend, got %s\n", s.to_string().c_str());
    return 1;
  }
  return 0;
}
