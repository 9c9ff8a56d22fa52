// Pieces shared by the gRPC baseline's server and client. Internal to transport/grpc.
#pragma once

#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/status.h>

#include <source_location>
#include <string>

#include "common/status.h"

namespace rdmaflow::grpc_common {

// gRPC's status as ours: UNAVAILABLE -> kPeerFailed, DEADLINE_EXCEEDED ->
// kTimeout, CANCELLED -> kCancelled, ...; the reason keeps gRPC's code and
// message after `context`.
Status from_grpc(const grpc::Status& s, const char* op, int peer, const std::string& context,
                 std::source_location where = std::source_location::current());

// The host part to listen on: `ifname` (an interface name, resolved with
// getifaddrs, IPv4 preferred, or a literal address), else
// RDMAFLOW_SOCKET_IFNAME, else `reach_address` (the bootstrap's address toward
// the rendezvous when ranks span hosts, as the tcp backend listens), else
// 127.0.0.1. IPv6 comes back in brackets.
Result<std::string> listen_host(const std::string& ifname, const std::string& reach_address = {});

// Arguments of every channel the baseline opens: unlimited message sizes, no
// HTTP proxy from the environment, quick reconnects (as TensorFlow sets them).
grpc::ChannelArguments channel_arguments();

}  // namespace rdmaflow::grpc_common
