// TcpChannel, MSG_ZEROCOPY (RDMAFLOW_TCP_ZEROCOPY=<min bytes>): a batch of
// write frames carrying at least that many payload bytes is sent with
// MSG_ZEROCOPY, so the kernel pins the source pages instead of copying them.
// The kernel reports when it let go of them on the socket's error queue.
//
// A write still completes with its ACK, not with that report: the ACK leaves
// the peer after the last byte is in its memory, and our kernel processes the
// TCP acknowledgement covering those bytes (which frees their buffers, with
// their page references) before the ACK frame reaches us, so the source is no
// longer needed when the callback fires. The reports are drained only so the
// error queue does not fill (its memory counts against the socket). Posted
// writes (NO_ACK, the collectives' pieces) never go zero-copy: they complete
// once sent, when the kernel may still reference the pages. Reads being
// served never go zero-copy: their bytes must leave before revoke_key() returns
// (the grant fence), which a deferred page reference would break; messages own
// their bytes, which die with the operation.
#include <netinet/in.h>
#include <time.h>  // before linux/errqueue.h, which uses timespec
// clang-format off
#include <linux/errqueue.h>
// clang-format on
#include <sys/socket.h>

#include <cerrno>

#include "common/log.h"
#include "transport/tcp/tcp_channel.h"
#include "transport/tcp/tcp_channel_internal.h"

namespace rdmaflow::tcp {

void TcpChannel::enable_zerocopy() {
  if (options_.zerocopy_min == 0) return;
  int one = 1;
  if (::setsockopt(fd_, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one)) != 0) {
    RDMAFLOW_LOG_WARN("tcp: SO_ZEROCOPY refused ({}); sending with copies", errno_text(errno));
    options_.zerocopy_min = 0;
  }
}

bool TcpChannel::drain_zerocopy() {
  if (options_.zerocopy_min == 0) return false;
  if (zc_done_.load(std::memory_order_relaxed) >= zc_sent_.load(std::memory_order_relaxed)) {
    return false;  // nothing outstanding: no system call
  }
  for (;;) {
    alignas(cmsghdr) char control[128];
    msghdr m{};
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    if (::recvmsg(fd_, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) break;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      const bool ip = (c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
                      (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR);
      if (!ip) continue;
      const auto* e = reinterpret_cast<const sock_extended_err*>(CMSG_DATA(c));
      if (e->ee_origin != SO_EE_ORIGIN_ZEROCOPY || e->ee_errno != 0) continue;
      const uint64_t n = static_cast<uint64_t>(e->ee_data - e->ee_info) + 1;  // sends [info, data]
      zc_done_.fetch_add(n, std::memory_order_relaxed);
      if (e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) {
        zc_copied_.fetch_add(n, std::memory_order_relaxed);
      }
    }
  }
  return zc_done_.load(std::memory_order_relaxed) < zc_sent_.load(std::memory_order_relaxed);
}

}  // namespace rdmaflow::tcp
