// The acceptor's side of the job handshake (common/handshake.h) on a Boost.Asio
// socket, for servers that run on one event loop (the rendezvous store, the tcp
// transport's acceptor): reading a hello must never block the loop, or one idle
// stray connection would stall every other client.
//
// The caller bounds the time (a timer that closes the socket) and the number of
// connections in the handshake at once (auth::max_pending_handshakes()).
#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/handshake.h"

namespace rdmaflow::auth {

// Runs the handshake on `socket` and calls done(Status) once, on the socket's
// executor. `owner` keeps the socket alive until then.
template <typename Socket, typename Done>
void async_accept_handshake(Socket& socket, std::shared_ptr<void> owner, std::string_view label,
                            Done done) {
  struct State {
    Hello hello{};
    Challenge challenge{};
    Proof proof{};
    std::unique_ptr<Acceptor> acceptor;
    std::string peer;
  };
  auto st = std::make_shared<State>();
  st->peer = peer_address(socket.native_handle());
  auto secret = load_job_secret();
  Status local = secret.status();
  if (local.is_ok()) local = check_peer_host(*secret, socket.native_handle(), "accept", -1);
  if (!local.is_ok()) {
    done(std::move(local));
    return;
  }
  st->acceptor = std::make_unique<Acceptor>(std::move(*secret), label);
  auto io_error = [st](const char* stage, const boost::system::error_code& ec) {
    return RDMAFLOW_ERROR(
        Code::kConnectionFailed, "accept", -1,
        "handshake with " + st->peer + " failed while " + stage + ": " + ec.message());
  };
  boost::asio::async_read(
      socket, boost::asio::buffer(st->hello),
      [&socket, owner, st, done, io_error](const boost::system::error_code& ec, size_t) mutable {
        if (ec) return done(io_error("waiting for the hello", ec));
        auto challenge = st->acceptor->challenge(st->hello, st->peer);
        if (!challenge.is_ok()) return done(challenge.status());
        st->challenge = *challenge;
        boost::asio::async_write(
            socket, boost::asio::buffer(st->challenge),
            [&socket, owner, st, done, io_error](const boost::system::error_code& ec,
                                                 size_t) mutable {
              if (ec) return done(io_error("sending the challenge", ec));
              boost::asio::async_read(
                  socket, boost::asio::buffer(st->proof),
                  [owner, st, done, io_error](const boost::system::error_code& ec, size_t) mutable {
                    if (ec) return done(io_error("waiting for the proof", ec));
                    done(st->acceptor->verify(st->proof, st->peer));
                  });
            });
      });
}

}  // namespace rdmaflow::auth
