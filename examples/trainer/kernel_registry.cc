#include <map>
#include <mutex>

#include "examples/trainer/kernel.h"

namespace rdmaflow::exec {

void register_builtin_kernels();  // examples/trainer/kernels/builtin.cc

namespace {
struct Registry {
  std::mutex mu;
  std::map<std::string, Kernel> kernels;
};
Registry& registry() {
  static Registry r;
  return r;
}
template <typename T>
Result<T> attr_as(const graph::Op& op, const std::string& name, T fallback, const char* type) {
  auto it = op.attrs.find(name);
  if (it == op.attrs.end()) return fallback;
  if (const T* v = std::get_if<T>(&it->second)) return *v;
  if constexpr (std::is_same_v<T, double>) {  // 1 in JSON is an integer; accept it as a double
    if (const int64_t* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  }
  return RDMAFLOW_ERROR(Code::kInvalidArgument, "run " + op.type + " '" + op.name + "'", -1,
                        "attribute '" + name + "' is not a " + type);
}
}  // namespace

Result<bool> KernelContext::attr_bool(const std::string& name, bool fallback) const {
  return attr_as<bool>(op(), name, fallback, "bool");
}
Result<double> KernelContext::attr_double(const std::string& name, double fallback) const {
  return attr_as<double>(op(), name, fallback, "number");
}
Result<int64_t> KernelContext::attr_int(const std::string& name, int64_t fallback) const {
  return attr_as<int64_t>(op(), name, fallback, "integer");
}

Status KernelContext::error(const std::string& reason) const {
  return RDMAFLOW_ERROR(Code::kInvalidArgument, "run " + op().type + " '" + op().name + "'", -1,
                        reason);
}

void register_kernel(const std::string& type, Kernel kernel) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.kernels[type] = std::move(kernel);
}

Result<Kernel> find_kernel(const std::string& type) {
  register_builtin_kernels();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.kernels.find(type);
  if (it != r.kernels.end()) return it->second;
  std::string known;
  for (const auto& [name, k] : r.kernels) known += (known.empty() ? "" : ", ") + name;
  return RDMAFLOW_ERROR(Code::kNotFound, "find kernel", -1,
                        "no kernel for op type '" + type + "' (known: " + known + ")");
}

std::vector<std::string> kernel_types() {
  register_builtin_kernels();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> types;
  for (const auto& [name, k] : r.kernels) types.push_back(name);
  return types;
}

}  // namespace rdmaflow::exec
