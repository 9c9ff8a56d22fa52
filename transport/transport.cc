#include "transport/transport.h"

#include <algorithm>
#include <mutex>

namespace rdmaflow {

namespace {
struct Registry {
  std::mutex mu;
  std::vector<TransportBackendInfo> backends;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

void register_builtin_transports();  // transport/builtin.cc

void register_transport_backend(TransportBackendInfo info) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = std::find_if(r.backends.begin(), r.backends.end(),
                         [&](const auto& b) { return b.name == info.name; });
  if (it != r.backends.end()) {
    *it = std::move(info);
  } else {
    r.backends.push_back(std::move(info));
  }
  std::stable_sort(r.backends.begin(), r.backends.end(),
                   [](const auto& a, const auto& b) { return a.priority > b.priority; });
}

std::vector<std::string> transport_backend_names() {
  register_builtin_transports();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& b : r.backends) names.push_back(b.name);
  return names;
}

const char* medium_name(Medium medium) {
  switch (medium) {
    case Medium::kSharedMemory:
      return "shared memory";
    case Medium::kRdma:
      return "RDMA";
    case Medium::kSocket:
      return "socket";
    case Medium::kNone:
      break;
  }
  return "none";
}

Reach transport_reach(const std::string& name, const Endpoint& a, const Endpoint& b,
                      bool same_host) {
  register_builtin_transports();
  ReachFunction reaches;
  bool known = false;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& info : r.backends) {
      if (info.name != name) continue;
      known = true;
      reaches = info.reaches;
    }
  }
  if (!known) return {Medium::kNone, "backend '" + name + "' is not built"};
  if (!reaches) return {Medium::kSocket, ""};
  return reaches(a, b, same_host);
}

Result<std::unique_ptr<Transport>> make_transport(const std::string& name,
                                                  const TransportConfig& config) {
  register_builtin_transports();
  TransportFactory factory;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& b : r.backends) {
      if (b.name == name) factory = b.factory;
    }
  }
  if (!factory) {
    std::string known;
    for (const auto& n : transport_backend_names()) known += (known.empty() ? "" : ", ") + n;
    return RDMAFLOW_ERROR(Code::kNotFound, "create transport", -1,
                          "unknown transport '" + name + "' (built: " + known + ")");
  }
  stats::set_rank(config.rank);  // the rank the counters report under (common/counters.h)
  return factory(config);
}

}  // namespace rdmaflow
