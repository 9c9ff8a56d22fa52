// The backend rows of the process tests. They come from the transport registry
// (transport_variants(): what this source tree has, whether this build has it
// compiled in, the media it can be pinned to); this adds only what tests need.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/process.h"
#include "transport/transport.h"

namespace rdmaflow::testing {

// A row of the registry's list with what only tests need.
struct BackendRow : TransportVariant {
  int max_world = 8;  // the largest world the full collectives matrix runs
};
inline std::ostream& operator<<(std::ostream& os, const BackendRow& b) {
  return os << b.label;
}

// A row per medium: every backend pinned to each medium it names, or as it is
// when it names none (the channel contract: tcp, ucx_shm, ucx_tcp, verbs).
std::vector<BackendRow> medium_rows();
// A row per backend, as it is (the collectives: tcp, ucx, verbs).
std::vector<BackendRow> backend_rows();
// The row labelled `label` (a medium or a backend); a row that is not built
// when nothing has that label.
BackendRow backend_row(const std::string& label);

// Sets the row's environment and creates its transport. A backend that is not
// built into this binary or not viable here skips the rank with the reason.
Result<std::unique_ptr<Transport>> make_row_transport(const BackendRow& row,
                                                      const TransportConfig& config, Exchange& ex);

// A channel to every other rank (none to itself): each rank connects to the
// higher ranks, then accepts the lower ones.
Result<std::vector<std::shared_ptr<Channel>>> connect_mesh(Transport& transport, int rank,
                                                           int world, Exchange& ex,
                                                           Millis timeout = Millis(20000));

}  // namespace rdmaflow::testing
