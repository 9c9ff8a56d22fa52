// What the rendezvous store's server (tcp_store_server.cc) and client
// (tcp_store.cc) share besides the wire protocol (tcp_store_protocol.h).
#pragma once

#include <boost/asio.hpp>
#include <string>
#include <vector>

#include "runtime/rendezvous/tcp_store.h"

namespace rdmaflow::store_detail {

inline std::string ms(Millis t) {
  return std::to_string(t.count()) + " ms";
}

// Resolves host:port to endpoints; numeric addresses never touch DNS.
Result<std::vector<boost::asio::ip::tcp::endpoint>> resolve(const HostPort& hp,
                                                            const std::string& op);

}  // namespace rdmaflow::store_detail
