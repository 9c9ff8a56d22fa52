#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

#include "common/env.h"
#include "transport/grpc/grpc_common.h"
#include "transport/grpc/grpc_tensor.h"

namespace rdmaflow {

std::string to_string(const TensorKey& key) {
  return "transfer " + std::to_string(key.transfer_id) + " step " + std::to_string(key.step);
}

namespace grpc_common {

Status from_grpc(const grpc::Status& s, const char* op, int peer, const std::string& context,
                 std::source_location where) {
  struct Mapping {
    grpc::StatusCode grpc_code;
    Code code;
    const char* name;
  };
  static constexpr Mapping kMappings[] = {
      {grpc::StatusCode::CANCELLED, Code::kCancelled, "CANCELLED"},
      {grpc::StatusCode::UNKNOWN, Code::kInternal, "UNKNOWN"},
      {grpc::StatusCode::INVALID_ARGUMENT, Code::kInvalidArgument, "INVALID_ARGUMENT"},
      {grpc::StatusCode::DEADLINE_EXCEEDED, Code::kTimeout, "DEADLINE_EXCEEDED"},
      {grpc::StatusCode::NOT_FOUND, Code::kNotFound, "NOT_FOUND"},
      {grpc::StatusCode::ALREADY_EXISTS, Code::kInvalidArgument, "ALREADY_EXISTS"},
      {grpc::StatusCode::PERMISSION_DENIED, Code::kConnectionFailed, "PERMISSION_DENIED"},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, Code::kResourceExhausted, "RESOURCE_EXHAUSTED"},
      {grpc::StatusCode::FAILED_PRECONDITION, Code::kInvalidArgument, "FAILED_PRECONDITION"},
      {grpc::StatusCode::ABORTED, Code::kPeerFailed, "ABORTED"},
      {grpc::StatusCode::OUT_OF_RANGE, Code::kOutOfRange, "OUT_OF_RANGE"},
      {grpc::StatusCode::UNIMPLEMENTED, Code::kProtocolError, "UNIMPLEMENTED"},
      {grpc::StatusCode::INTERNAL, Code::kInternal, "INTERNAL"},
      {grpc::StatusCode::UNAVAILABLE, Code::kPeerFailed, "UNAVAILABLE"},
      {grpc::StatusCode::DATA_LOSS, Code::kProtocolError, "DATA_LOSS"},
      {grpc::StatusCode::UNAUTHENTICATED, Code::kConnectionFailed, "UNAUTHENTICATED"},
  };
  if (s.ok()) return Status::ok();
  Code code = Code::kInternal;
  std::string name = "code " + std::to_string(static_cast<int>(s.error_code()));
  for (const Mapping& m : kMappings) {
    if (m.grpc_code == s.error_code()) {
      code = m.code;
      name = m.name;
      break;
    }
  }
  return Status(code, op, peer, context + ": gRPC " + name + ": " + s.error_message(), where);
}

Result<std::string> listen_host(const std::string& ifname, const std::string& reach_address) {
  std::string name = ifname;
  if (name.empty()) name = env_string("RDMAFLOW_SOCKET_IFNAME").value_or("");
  if (name.empty()) name = reach_address;
  if (name.empty()) return std::string("127.0.0.1");

  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, name.c_str(), &v4) == 1) return name;
  if (inet_pton(AF_INET6, name.c_str(), &v6) == 1) return "[" + name + "]";

  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return RDMAFLOW_ERROR(Code::kInternal, "grpc listen", -1,
                          std::string("getifaddrs: ") + std::strerror(errno));
  }
  std::string found4, found6;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || name != it->ifa_name) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (it->ifa_addr->sa_family == AF_INET && found4.empty()) {
      auto* sin = reinterpret_cast<sockaddr_in*>(it->ifa_addr);
      if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf)) found4 = buf;
    } else if (it->ifa_addr->sa_family == AF_INET6 && found6.empty()) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(it->ifa_addr);
      // A link-local address needs a scope id, which gRPC's target syntax lacks.
      if (!IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr) &&
          inet_ntop(AF_INET6, &sin6->sin6_addr, buf, sizeof buf)) {
        found6 = buf;
      }
    }
  }
  freeifaddrs(list);
  if (!found4.empty()) return found4;
  if (!found6.empty()) return "[" + found6 + "]";
  return RDMAFLOW_ERROR(Code::kInvalidArgument, "grpc listen", -1,
                        "interface '" + name +
                            "' (GrpcServerOptions::ifname / RDMAFLOW_SOCKET_IFNAME) is neither an "
                            "address nor an interface with a usable IPv4/IPv6 address");
}

grpc::ChannelArguments channel_arguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

}  // namespace grpc_common
}  // namespace rdmaflow
