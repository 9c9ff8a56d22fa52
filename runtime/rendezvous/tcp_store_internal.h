// What the rendezvous store's server (tcp_store_server.cc) and client
// (tcp_store.cc) share besides the wire protocol (tcp_store_protocol.h).
#pragma once

#include <boost/asio.hpp>
#include <string>
#include <vector>

#include "runtime/rendezvous/tcp_store.h"
#include "runtime/rendezvous/tcp_store_protocol.h"

namespace rdmaflow::store_detail {

inline std::string ms(Millis t) {
  return std::to_string(t.count()) + " ms";
}

// Resolves host:port to endpoints; numeric addresses never touch DNS.
Result<std::vector<boost::asio::ip::tcp::endpoint>> resolve(const HostPort& hp,
                                                            const std::string& op);

}  // namespace rdmaflow::store_detail

// The names both halves use (this header is included by those two files only).
namespace rdmaflow {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;
namespace wire = store_wire;

using store_detail::ms;
using store_detail::resolve;

}  // namespace rdmaflow
