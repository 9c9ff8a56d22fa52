// VerbsChannel, receiver side: completions of the shared receive queue for this
// channel's queue pair (notifies, messages, credits) and the control messages
// (key checks, verdicts, revocations).
#include <arpa/inet.h>

#include <algorithm>

#include "transport/verbs/verbs_channel.h"
#include "transport/verbs/verbs_channel_internal.h"

namespace rdmaflow::verbs {

// ---------------------------------------------------------------- receiving

void VerbsChannel::handle_recv(const ibv_wc& wc) {
  Tasks out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bool live = error_.ok() && qp_ != nullptr;
    const uint8_t* buf = core_->recv_buffer(wc.wr_id);
    if (wc.status != IBV_WC_SUCCESS) {
      if (live && wc.status != IBV_WC_WR_FLUSH_ERR) {
        fail_locked(RDMAFLOW_ERROR(Code::kPeerFailed, "receive", peer_rank_, wc_error(wc)), out);
      }
    } else if (live && buf != nullptr) {
      Status bad;
      if (acceptor_ != nullptr) {
        bad = on_proof_locked(
            wc,
            std::span<const uint8_t>(buf, std::min<size_t>(wc.byte_len, core_->recv_buffer_size())),
            out);
      } else if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        auto dec = decode_imm(ntohl(wc.imm_data), local_credits_, peer_rank_);
        if (!dec.is_ok()) {
          bad = dec.status();
        } else {
          uint64_t value = dec->value;
          if (dec->ring_slot) value = reinterpret_cast<volatile uint64_t*>(ring_)[*dec->ring_slot];
          out.push_back([self = shared_from_this(), value] { self->inbox_.push_notify(value); });
        }
      } else if (wc.opcode == IBV_WC_RECV) {
        std::span<const uint8_t> bytes(buf,
                                       std::min<size_t>(wc.byte_len, core_->recv_buffer_size()));
        auto h = MsgHeader::decode(bytes, peer_rank_);
        if (!h.is_ok()) {
          bad = h.status();
        } else if (!credits_.grant(h->credits)) {
          bad =
              RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer_rank_,
                             "peer returned " + std::to_string(h->credits) + " credits but only " +
                                 std::to_string(credits_.peer_window() - credits_.available()) +
                                 " are outstanding");
        } else if (h->type == MsgType::kData) {
          auto msg = reassembler_.add(bytes.subspan(kMsgHeaderSize), h->last, peer_rank_);
          if (!msg.is_ok()) {
            bad = msg.status();
          } else if (msg->has_value()) {
            out.push_back([self = shared_from_this(), m = std::move(**msg)]() mutable {
              self->inbox_.push_message(std::move(m));
            });
          }
        } else if (h->type != MsgType::kCredit) {
          on_control_locked(*h, bytes.subspan(kMsgHeaderSize), out);
        }
      } else {
        bad = RDMAFLOW_ERROR(Code::kProtocolError, "receive", peer_rank_,
                             "unexpected receive opcode " + std::to_string(wc.opcode));
      }
      if (!bad.is_ok()) fail_locked(bad, out);
    }
    if (Status st = core_->repost_recv(wc.wr_id); !st.is_ok()) {
      fail_locked(st, out);
    } else if (live && error_.ok()) {
      credits_.on_buffer_reposted();
    }
    pump_locked(out);
  }
  run_tasks(out);
}

void VerbsChannel::apply_revocation(const ibv_wc& wc) {
  // Every receive passes here: only a KeyRevoked takes the lock. The buffer
  // is ours until handle_recv reposts it.
  if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) return;
  const uint8_t* buf = core_->recv_buffer(wc.wr_id);
  if (buf == nullptr) return;
  std::span<const uint8_t> bytes(buf, std::min<size_t>(wc.byte_len, core_->recv_buffer_size()));
  auto h = MsgHeader::decode(bytes, -1);
  if (!h.is_ok() || h->type != MsgType::kKeyRevoked) return;
  auto r = KeyRevoked::decode(bytes.subspan(kMsgHeaderSize), -1);
  if (!r.is_ok()) return;  // handle_recv fails the channel with the reason
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok() && acceptor_ == nullptr) drop_verdicts_locked(r->key_id);
}

Status VerbsChannel::on_proof_locked(const ibv_wc& wc, std::span<const uint8_t> bytes, Tasks& out) {
  auto refused = [&](const std::string& why) {
    return RDMAFLOW_ERROR(Code::kUnauthenticated, "accept", -1, "refused " + who_ + ": " + why);
  };
  if (wc.opcode != IBV_WC_RECV) return refused("it wrote before proving the job secret");
  auto h = MsgHeader::decode(bytes, -1);
  if (!h.is_ok() || h->type != MsgType::kAuth) {
    return refused(
        "its first message is not the job handshake's proof (not an rdmaflow verbs transport, or "
        "an older one)");
  }
  auto proof = AuthProof::decode(bytes.subspan(kMsgHeaderSize), -1);
  if (!proof.is_ok()) return refused(proof.status().reason());
  RDMAFLOW_RETURN_IF_ERROR(acceptor_->verify(proof->proof, who_).with_op("accept"));
  RDMAFLOW_RETURN_IF_ERROR(set_peer_locked(proof->hello));
  // Only now may the peer's RDMA writes and reads reach memory.
  RDMAFLOW_RETURN_IF_ERROR(set_remote_access_locked(true));
  acceptor_.reset();
  connected_ = true;
  if (on_authenticated_) out.push_back(std::move(on_authenticated_));
  return Status::ok();
}

void VerbsChannel::drop_verdicts_locked(uint64_t key_id) {
  std::erase_if(keys_, [&](const auto& e) { return e.first.key_id == key_id && e.second.valid; });
}

void VerbsChannel::on_control_locked(const MsgHeader& h, std::span<const uint8_t> payload,
                                     Tasks& out) {
  switch (h.type) {
    case MsgType::kKeyCheck: {
      auto check = KeyCheck::decode(payload, peer_rank_);
      if (!check.is_ok()) return fail_locked(check.status(), out);
      Status verdict = core_->check_claim(check->claim, peer_rank_);
      if (verdict.code() == Code::kUnauthenticated) {
        // A forged secret: no verdict to test guesses against, the channel fails.
        return fail_locked(forged_secret_failure("verbs", verdict, peer_rank_), out);
      }
      KeyVerdict v{check->request, verdict.code(), 0, verdict.reason()};
      if (verdict.is_ok() && core_->grant_windows()) {
        auto rkey = window_for_locked(check->claim);  // its bind goes out first
        if (rkey.is_ok()) {
          v.rkey = *rkey;
        } else {
          v.code = rkey.status().code();
          v.reason = rkey.status().reason();
        }
      }
      control_out_.push_back({MsgType::kKeyVerdict, v.encode()});
      return;
    }
    case MsgType::kKeyVerdict: {
      auto v = KeyVerdict::decode(payload, peer_rank_);
      if (!v.is_ok()) return fail_locked(v.status(), out);
      auto req = key_requests_.find(v->request);
      if (req == key_requests_.end()) {
        return fail_locked(
            RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer_rank_,
                           "verdict for unknown key check " + std::to_string(v->request)),
            out);
      }
      KeyClaim claim = req->second;
      key_requests_.erase(req);
      auto state = keys_.find(claim);
      if (v->code == Code::kOk) {
        if (state != keys_.end() && state->second.request == v->request) {
          state->second.valid = true;
          state->second.rkey = v->rkey;
        }
        return;
      }
      if (state != keys_.end() && state->second.request == v->request) keys_.erase(state);
      auto refused = window_.remove_if([&](const WorkItem& it) {
        return it.key && *it.key == claim && it.op->parts_posted == 0;
      });
      for (auto& it : refused) {
        finish_op_locked(it.op.get(),
                         Status(v->code, it.op->name(), peer_rank_,
                                "peer rank " + std::to_string(peer_rank_) +
                                    " refused the remote key: " + v->reason),
                         out);
      }
      return;
    }
    case MsgType::kKeyRevoked: {
      auto r = KeyRevoked::decode(payload, peer_rank_);
      if (!r.is_ok()) return fail_locked(r.status(), out);
      drop_verdicts_locked(r->key_id);
      return;
    }
    case MsgType::kAuth:
      return fail_locked(RDMAFLOW_ERROR(Code::kProtocolError, "receive message", peer_rank_,
                                        "a handshake proof after the handshake"),
                         out);
    default:
      return;
  }
}

}  // namespace rdmaflow::verbs
