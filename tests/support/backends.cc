#include "tests/support/backends.h"

#include <cstdlib>

namespace rdmaflow::testing {

namespace {

// Only tests care: verbs is skipped without an RDMA device, and scripts/softroce-vm
// runs it on rxe in an emulated guest, where 4 ranks take 5 minutes of the full matrix.
int max_world_of(const std::string& backend) {
  return backend == "verbs" ? 4 : 8;
}

std::vector<BackendRow> all_rows() {
  std::vector<BackendRow> rows;
  for (const TransportVariant& v : transport_variants()) {
    BackendRow row;
    static_cast<TransportVariant&>(row) = v;
    row.max_world = max_world_of(v.backend);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

std::vector<BackendRow> medium_rows() {
  std::vector<BackendRow> out;
  for (const auto& r : all_rows()) {
    if (r.per_medium) out.push_back(r);
  }
  return out;
}

std::vector<BackendRow> backend_rows() {
  std::vector<BackendRow> out;
  for (const auto& r : all_rows()) {
    if (!r.pinned) out.push_back(r);
  }
  return out;
}

BackendRow backend_row(const std::string& label) {
  for (const auto& r : all_rows()) {
    if (r.label == label) return r;
  }
  BackendRow unknown;
  unknown.label = unknown.backend = label;
  unknown.built = false;
  return unknown;
}

Result<std::unique_ptr<Transport>> make_row_transport(const BackendRow& row,
                                                      const TransportConfig& config, Exchange& ex) {
  if (!row.built) ex.skip("backend '" + row.backend + "' is not built into this binary");
  for (const auto& [k, v] : row.env) ::setenv(k.c_str(), v.c_str(), 1);
  auto t = make_transport(row.backend, config);
  if (!t.is_ok() && t.status().code() == Code::kNotViable) {
    ex.skip(row.label + " is not viable here: " + t.status().to_string());
  }
  return t;
}

Result<std::vector<std::shared_ptr<Channel>>> connect_mesh(Transport& transport, int rank,
                                                           int world, Exchange& ex,
                                                           Millis timeout) {
  RDMAFLOW_ASSIGN_OR_RETURN(std::string address, transport.listen());
  RDMAFLOW_ASSIGN_OR_RETURN(auto addresses, ex.allgather(address));
  std::vector<std::shared_ptr<Channel>> peers(static_cast<size_t>(world));
  for (int p = rank + 1; p < world; ++p) {
    RDMAFLOW_ASSIGN_OR_RETURN(peers[static_cast<size_t>(p)],
                              transport.connect(p, addresses[static_cast<size_t>(p)], timeout));
  }
  for (int p = 0; p < rank; ++p) {
    RDMAFLOW_ASSIGN_OR_RETURN(peers[static_cast<size_t>(p)], transport.accept(p, timeout));
  }
  return peers;
}

}  // namespace rdmaflow::testing
