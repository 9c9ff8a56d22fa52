// The Communicator's calls with a layout per peer: alltoallv, and
// point-to-point send and recv (communicator.h).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "collectives/algorithms/parts.h"
#include "collectives/communicator_internal.h"
#include "collectives/executor.h"

namespace rdmaflow {

namespace {

// Pieces of calls whose two sides do not share a total (alltoallv, send and
// recv): a fixed size, the same on every rank, so that the sender and the
// receiver of a message cut it alike.
size_t fixed_piece_bytes(const CommunicatorOptions& o, size_t slot) {
  return o.piece_bytes ? std::min(o.piece_bytes, slot) : slot;
}

bool add_overflows(size_t a, size_t b, size_t* sum) {
  *sum = a + b;
  return *sum < a;
}

}  // namespace

Request Communicator::finished(CollectiveKind kind, Status st) {
  auto s = std::make_shared<detail::OpState>();
  s->kind = kind;
  s->complete(std::move(st));
  return Request(s);
}

// ---------------- alltoallv ----------------

Result<std::shared_ptr<Communicator::Call>> Communicator::prepare_alltoallv(
    const void* in, size_t in_elems, void* out, size_t out_elems, const AlltoallvLayout& layout,
    DataType type, const CallOptions& options) {
  static const std::string what = "alltoallv[pairwise]";
  auto bad = [&](int peer, const std::string& reason) {
    return RDMAFLOW_ERROR(Code::kInvalidArgument, what, peer, reason);
  };
  const size_t n = static_cast<size_t>(world_), es = dtype_size(type);
  const std::vector<size_t>* parts[] = {&layout.send_counts, &layout.send_displs,
                                        &layout.recv_counts, &layout.recv_displs};
  for (const auto* v : parts) {
    if (v->size() != n) {
      return bad(-1, "the layout needs " + std::to_string(n) + " counts and displacements, not " +
                         std::to_string(v->size()));
    }
  }
  if (in_elems > SIZE_MAX / es || out_elems > SIZE_MAX / es) return bad(-1, "count too large");
  if ((in == nullptr && in_elems) || (out == nullptr && out_elems)) return bad(-1, "null buffer");
  for (int p = 0; p < world_; ++p) {
    size_t end = 0;
    if (add_overflows(layout.send_displs[p], layout.send_counts[p], &end) || end > in_elems) {
      return bad(p, "the block for rank " + std::to_string(p) + " ends outside the input of " +
                        std::to_string(in_elems) + " elements");
    }
    if (add_overflows(layout.recv_displs[p], layout.recv_counts[p], &end) || end > out_elems) {
      return bad(p, "the block from rank " + std::to_string(p) + " ends outside the output of " +
                        std::to_string(out_elems) + " elements");
    }
  }
  if (layout.send_counts[rank_] != layout.recv_counts[rank_]) {
    return bad(rank_, "this rank sends itself " + std::to_string(layout.send_counts[rank_]) +
                          " elements but expects " + std::to_string(layout.recv_counts[rank_]));
  }
  // Received blocks must not overlap (they would race), nor the two buffers.
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return layout.recv_displs[a] < layout.recv_displs[b]; });
  size_t covered = 0;
  for (int p : order) {
    if (layout.recv_counts[p] == 0) continue;
    if (layout.recv_displs[p] < covered) {
      return bad(p, "the block from rank " + std::to_string(p) + " overlaps another block");
    }
    covered = layout.recv_displs[p] + layout.recv_counts[p];
  }
  const auto* ib = static_cast<const std::byte*>(in);
  const auto* ob = static_cast<const std::byte*>(out);
  if (in_elems && out_elems && ib < ob + out_elems * es && ob < ib + in_elems * es) {
    return bad(-1, "the input and the output overlap");
  }

  auto call = std::make_shared<Call>();
  CollArgs& a = call->args;
  a.kind = CollectiveKind::kAlltoall;
  a.in = ib;
  a.out = static_cast<std::byte*>(out);
  a.type = type;
  a.rank = rank_;
  a.world = world_;
  call->algo = Algorithm::kPairwise;
  const uint64_t seq = calls_.fetch_add(1);
  call->lane = static_cast<int>(options.tag.value_or(seq) % lanes_.size());
  call->timeout = options.timeout.value_or(*options_.timeout);
  call->what = &what;
  call->piece_elems =
      std::max<size_t>(1, fixed_piece_bytes(options_, fabric_->config().slot_bytes) / es);
  auto blocks = std::make_shared<AlltoallvLayout>(layout);
  call->body = [this, c = call.get(), blocks](Lane& lane) -> Status {
    // Every pair first trades (what I send you, what I expect from you). A
    // pair that disagrees is found on both of its ranks, which then leave
    // that pair's blocks out (the other pairs' still move, so nobody waits
    // for them) and fail alike; the lane's sequence numbers still agree.
    const size_t n = static_cast<size_t>(world_);
    std::vector<int64_t> mine(2 * n), theirs(2 * n);
    Program check(world_, DataType::kI64, ReduceOp::kSum, 2);
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      mine[2 * p] = static_cast<int64_t>(blocks->send_counts[p]);
      mine[2 * p + 1] = static_cast<int64_t>(blocks->recv_counts[p]);
      check.send(p, &mine[2 * p], 2);
      check.recv(p, &theirs[2 * p], 2);
    }
    check.finalize();
    RDMAFLOW_RETURN_IF_ERROR(
        execute_program(check, lane.index, *c->what, Clock::now() + c->timeout));
    AlltoallvLayout agreed = *blocks;
    Status mismatch;
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      const auto sends = static_cast<size_t>(theirs[2 * p]);
      const auto expects = static_cast<size_t>(theirs[2 * p + 1]);
      if (sends == blocks->recv_counts[p] && expects == blocks->send_counts[p]) continue;
      agreed.send_counts[p] = agreed.recv_counts[p] = 0;
      if (mismatch.is_ok()) {
        mismatch = RDMAFLOW_ERROR(
            Code::kInvalidArgument, *c->what, p,
            "rank " + std::to_string(p) + " sends " + std::to_string(sends) +
                " elements to this rank and expects " + std::to_string(expects) +
                ", this rank expects " + std::to_string(blocks->recv_counts[p]) + " and sends " +
                std::to_string(blocks->send_counts[p]) + " (the counts must match pairwise)");
      }
    }
    Program program(world_, c->args.type, ReduceOp::kSum, c->piece_elems);
    const AlltoallvBlocks b{agreed.send_counts.data(), agreed.send_displs.data(),
                            agreed.recv_counts.data(), agreed.recv_displs.data()};
    pairwise_alltoallv(c->args, b, program);
    program.finalize();
    RDMAFLOW_RETURN_IF_ERROR(
        execute_program(program, lane.index, *c->what, Clock::now() + c->timeout));
    return mismatch;
  };
  return call;
}

Status Communicator::alltoallv(const void* in, size_t in_elems, void* out, size_t out_elems,
                               const AlltoallvLayout& layout, DataType type,
                               const CallOptions& options) {
  RDMAFLOW_ASSIGN_OR_RETURN(auto call,
                            prepare_alltoallv(in, in_elems, out, out_elems, layout, type, options));
  return run_prepared(*call);
}

Request Communicator::start_alltoallv(const void* in, size_t in_elems, void* out, size_t out_elems,
                                      const AlltoallvLayout& layout, DataType type,
                                      const CallOptions& options) {
  auto call = prepare_alltoallv(in, in_elems, out, out_elems, layout, type, options);
  if (!call.is_ok()) return finished(CollectiveKind::kAlltoall, call.status());
  return enqueue(std::move(*call));
}

// ---------------- send and recv ----------------

namespace {

// What precedes every message: the receiver checks it before it takes the data.
struct P2pHeader {
  static constexpr uint64_t kMagic = 0x52464C4F57503250ull;  // "RFLOWP2P"
  uint64_t magic = kMagic;
  uint64_t tag = 0;
  uint64_t bytes = 0;
};

}  // namespace

void Communicator::stop_p2p() {
  for (auto& q : p2p_) {
    {
      std::lock_guard<std::mutex> lock(q->mu);
      q->stop = true;
    }
    q->cv.notify_all();
    if (q->worker.joinable()) q->worker.join();
  }
}

Request Communicator::start_p2p(bool sending, void* buf, size_t count, DataType type, int peer,
                                uint64_t tag, const CallOptions& options) {
  const std::string what = std::string(sending ? "send to" : "recv from") + " rank " +
                           std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
  auto refuse = [&](const std::string& reason) {
    return finished(CollectiveKind::kAlltoall,
                    RDMAFLOW_ERROR(Code::kInvalidArgument, what, peer, reason));
  };
  if (p2p_.empty()) {
    return refuse("the communicator was created without CommunicatorOptions::p2p");
  }
  if (peer < 0 || peer >= world_ || peer == rank_) {
    return refuse("peer " + std::to_string(peer) + " is not another rank of a world of " +
                  std::to_string(world_));
  }
  const size_t es = dtype_size(type);
  if (count > SIZE_MAX / es) return refuse("count too large");
  if (buf == nullptr && count) return refuse("null buffer");

  const int lane = fabric_->config().lanes - 1;
  // The call may go this long without progress once it runs (its turn may
  // come after earlier messages of the pair).
  const Millis timeout = options.timeout.value_or(*options_.timeout);
  const size_t piece = fixed_piece_bytes(options_, fabric_->config().slot_bytes);
  const size_t bytes = count * es;
  auto* data = static_cast<std::byte*>(buf);
  P2pQueue::Job job;
  job.state = std::make_shared<detail::OpState>();
  job.state->kind = CollectiveKind::kAlltoall;
  job.what = what;
  job.run = [=, this]() -> Status {
    if (is_broken_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(broken_mu_);
      return RDMAFLOW_ERROR(Code::kCancelled, what, broken_.peer(),
                            "communicator is broken by an earlier failure: " + broken_.to_string());
    }
    P2pHeader header;
    if (sending) {
      header.tag = tag;
      header.bytes = bytes;
      Program p(world_, DataType::kU8, ReduceOp::kSum, piece);
      p.send(peer, &header, sizeof header);
      p.send(peer, data, bytes);
      p.finalize();
      return execute_program(p, lane, what, Clock::now() + timeout);
    }
    Program h(world_, DataType::kU8, ReduceOp::kSum, piece);
    h.recv(peer, &header, sizeof header);
    h.finalize();
    RDMAFLOW_RETURN_IF_ERROR(execute_program(h, lane, what, Clock::now() + timeout));
    if (header.magic != P2pHeader::kMagic) {
      Status st = RDMAFLOW_ERROR(Code::kInternal, what, peer, "message header is corrupt");
      std::lock_guard<std::mutex> lock(broken_mu_);
      if (broken_.is_ok()) broken_ = st;
      is_broken_.store(true, std::memory_order_release);
      return st;
    }
    const bool match = header.bytes == bytes && header.tag == tag;
    // A mismatched message is still taken off the pair's stream (into a
    // bounded sink, a piece at a time), so the next recv finds the next message.
    std::vector<std::byte> sink(match ? 0 : std::min<uint64_t>(header.bytes, piece));
    Program d(world_, DataType::kU8, ReduceOp::kSum, piece);
    if (match) {
      d.recv(peer, data, bytes);
    } else {
      for (uint64_t off = 0; off < header.bytes; off += piece) {
        d.recv(peer, sink.data(), std::min<uint64_t>(piece, header.bytes - off));
      }
    }
    d.finalize();
    RDMAFLOW_RETURN_IF_ERROR(execute_program(d, lane, what, Clock::now() + timeout));
    if (match) return Status::ok();
    return RDMAFLOW_ERROR(Code::kInvalidArgument, what, peer,
                          "the next message from rank " + std::to_string(peer) + " has " +
                              std::to_string(header.bytes) + " bytes with tag " +
                              std::to_string(header.tag) + ", this recv expects " +
                              std::to_string(bytes) + " bytes with tag " + std::to_string(tag) +
                              " (messages of a pair are matched in order)");
  };
  Request request(job.state);
  P2pQueue& q = *p2p_[2 * static_cast<size_t>(peer) + (sending ? 0 : 1)];
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.jobs.push_back(std::move(job));
    if (!q.worker.joinable()) {
      q.worker = std::thread([&q] {
        std::unique_lock<std::mutex> lock(q.mu);
        for (;;) {
          q.cv.wait(lock, [&] { return q.stop || !q.jobs.empty(); });
          if (q.stop) {
            for (auto& j : q.jobs) {
              j.state->complete(RDMAFLOW_ERROR(Code::kCancelled, j.what, -1,
                                               "communicator destroyed before the call ran"));
            }
            q.jobs.clear();
            return;
          }
          P2pQueue::Job j = std::move(q.jobs.front());
          q.jobs.pop_front();
          lock.unlock();
          j.state->complete(j.run());
          lock.lock();
        }
      });
    }
  }
  q.cv.notify_all();
  return request;
}

Status Communicator::send(const void* buf, size_t count, DataType type, int peer, uint64_t tag,
                          const CallOptions& options) {
  return start_send(buf, count, type, peer, tag, options).wait();
}

Status Communicator::recv(void* buf, size_t count, DataType type, int peer, uint64_t tag,
                          const CallOptions& options) {
  return start_recv(buf, count, type, peer, tag, options).wait();
}

Request Communicator::start_send(const void* buf, size_t count, DataType type, int peer,
                                 uint64_t tag, const CallOptions& options) {
  // The buffer is only read (Program::send takes it as const).
  return start_p2p(true, const_cast<void*>(buf), count, type, peer, tag, options);
}

Request Communicator::start_recv(void* buf, size_t count, DataType type, int peer, uint64_t tag,
                                 const CallOptions& options) {
  return start_p2p(false, buf, count, type, peer, tag, options);
}

}  // namespace rdmaflow
