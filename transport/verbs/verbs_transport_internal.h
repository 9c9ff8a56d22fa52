// Declarations the two files of VerbsTransport share (verbs_transport.cc and
// verbs_progress.cc); not part of the backend's interface.
#pragma once

#include <rdma/rdma_cma.h>

#include <string>

namespace rdmaflow::verbs {

// The job handshake's label for verbs connections (common/handshake.h).
inline constexpr const char* kAuthLabel = "verbs";

// Sets the local ACK timeout of `id`'s connection (both sides, see kAckTimeout).
void set_ack_timeout(rdma_cm_id* id);

// rdma_cm's name for an event type.
std::string event_name(rdma_cm_event_type e);

}  // namespace rdmaflow::verbs
