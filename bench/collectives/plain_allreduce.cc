// The plain-socket allreduce of --vs plain (plain_allreduce.h).
#include "bench/collectives/plain_allreduce.h"

#include <mpi.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>

#include "bench/collectives/socket_reference.h"

namespace rdmaflow::bench {
namespace {

constexpr const char* kOption = "--vs plain";
// How long a wait polls the sockets before it sleeps in poll(), in a pass
// of at most kSpinBytes (both directions).
constexpr int kSpinUs = 50;
constexpr size_t kSpinBytes = 128 << 10;
// The ring's smallest send of a step's bytes before the step is complete.
constexpr size_t kPiece = 64 << 10;

[[noreturn]] void fail(const std::string& what) {
  plain_socket::fail(kOption, what);
}

std::string rank_name(int peer) {
  return peer < 0 ? std::string("a connecting rank") : "rank " + std::to_string(peer);
}

// The sum of the reduction: a plain loop the compiler vectorizes.
void add_into(float* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

std::byte* bytes(float* p) {
  return reinterpret_cast<std::byte*>(p);
}

}  // namespace

const char* plain_algo_name(PlainAlgo a) {
  switch (a) {
    case PlainAlgo::kRecursiveDoubling:
      return "rd";
    case PlainAlgo::kRabenseifner:
      return "rabenseifner";
    case PlainAlgo::kRing:
      return "ring";
  }
  return "?";
}

// One direction of a pass: `total` bytes to or from `peer` over `fd`; `at`
// gives the contiguous bytes from a position of the stream (to send, or to
// fill), at most to the end of the piece that position is in.
struct PlainAllreduce::Leg {
  int fd = -1;
  int peer = -1;
  size_t total = 0;
  size_t done = 0;
  std::function<std::pair<std::byte*, size_t>(size_t pos)> at;
};

PlainAllreduce::PlainAllreduce(int rank, int world, const std::string& address)
    : rank_(rank), world_(world), fds_(static_cast<size_t>(world), -1) {
  int port = 0;
  const int lfd = plain_socket::listen_any(address, port, kOption, world);
  const std::vector<plain_socket::Endpoint> peers = plain_socket::exchange_endpoints(address, port);
  // Lower ranks first: a connect completes in the listener's backlog, so no
  // rank waits for another to reach its accept.
  for (int p = 0; p < rank; ++p) {
    fds_[p] = plain_socket::connect_to(peers[p].address, peers[p].port, kOption);
    const int32_t me = rank;
    send_to(p, &me, sizeof(me));
  }
  for (int n = rank + 1; n < world; ++n) {
    pollfd pfd{lfd, POLLIN, 0};
    if (::poll(&pfd, 1, kPlainTimeoutMs) != 1) {
      fail("accept (" + std::to_string(world - n) + " higher rank(s) did not connect to " +
           address + ":" + std::to_string(port) + " within " +
           std::to_string(kPlainTimeoutMs / 1000) + " s)");
    }
    const int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) fail("accept on " + address + ":" + std::to_string(port));
    // The connecting rank's number, through the same timed path as every other byte.
    int32_t who = -1;
    Leg none;
    Leg hello = leg(fd, -1, &who, sizeof(who));
    pass(none, hello);
    if (who <= rank || who >= world || fds_[who] >= 0) {
      ::close(fd);
      fail("accept (a connection announced itself as rank " + std::to_string(who) +
           ", not one of the higher ranks still expected)");
    }
    fds_[who] = fd;
  }
  ::close(lfd);
  for (int fd : fds_) {
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
}

PlainAllreduce::~PlainAllreduce() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

void PlainAllreduce::pass(Leg& tx, Leg& rx, const std::function<size_t()>& ready,
                          const std::function<void(size_t, size_t)>& arrived) {
  auto broke = [](const char* verb, const Leg& l, const std::string& why) {
    fail(std::string(verb) + " " + rank_name(l.peer) + " at byte " + std::to_string(l.done) +
         " of " + std::to_string(l.total) + " (" + why + ")");
  };
  auto again = [] { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; };
  using Clock = std::chrono::steady_clock;
  Clock::time_point idle_since{};
  bool idle = false;
  while (tx.done < tx.total || rx.done < rx.total) {
    const size_t limit = ready ? std::min(tx.total, ready()) : tx.total;
    bool moved = false;
    if (tx.done < limit) {
      const auto [p, len] = tx.at(tx.done);
      const ssize_t n =
          ::send(tx.fd, p, std::min(len, limit - tx.done), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        tx.done += static_cast<size_t>(n);
        moved = true;
      } else if (n < 0 && !again()) {
        broke("send to", tx, std::strerror(errno));
      }
    }
    if (rx.done < rx.total) {
      const auto [p, len] = rx.at(rx.done);
      const ssize_t n = ::recv(rx.fd, p, std::min(len, rx.total - rx.done), MSG_DONTWAIT);
      if (n > 0) {
        if (arrived) arrived(rx.done, static_cast<size_t>(n));
        rx.done += static_cast<size_t>(n);
        moved = true;
      } else if (n == 0) {
        broke("recv from", rx, "it closed the connection (ended or died)");
      } else if (!again()) {
        broke("recv from", rx, std::strerror(errno));
      }
    }
    if (moved) {
      idle = false;
      continue;
    }
    // A small pass polls the sockets for a short while before sleeping in the
    // kernel, as MPI's progress loops do: its answer is often a few
    // microseconds away, and a wake-up from poll() costs more than that.
    // Yielding in between leaves the core to a rank that shares it. A large
    // pass sleeps at once: its wake-ups are few beside its bytes, and the
    // cores it would spin on are the ones the hosts' kernels move them with.
    const Clock::time_point now = Clock::now();
    if (!idle) {
      idle = true;
      idle_since = now;
    }
    if (tx.total + rx.total <= kSpinBytes &&
        now - idle_since < std::chrono::microseconds(kSpinUs)) {
      ::sched_yield();
      continue;
    }
    pollfd fds[2];
    nfds_t k = 0;
    if (tx.done < limit) fds[k++] = {tx.fd, POLLOUT, 0};
    if (rx.done < rx.total) fds[k++] = {rx.fd, POLLIN, 0};
    if (k == 0) broke("send to", tx, "nothing left to receive but the send is held back");
    const int r = ::poll(fds, k, kPlainTimeoutMs);
    if (r == 0) {
      const std::string why =
          "no progress in " + std::to_string(kPlainTimeoutMs / 1000) + " s: peer dead or stuck";
      if (rx.done < rx.total) broke("recv from", rx, why);
      broke("send to", tx, why);
    }
    if (r < 0 && errno != EINTR) broke("poll for", rx, std::strerror(errno));
  }
}

PlainAllreduce::Leg PlainAllreduce::leg(int fd, int peer, const void* data, size_t n) {
  std::byte* base = static_cast<std::byte*>(const_cast<void*>(data));
  return Leg{fd, peer, n, 0, [base, n](size_t pos) { return std::pair{base + pos, n - pos}; }};
}

void PlainAllreduce::send_to(int peer, const void* data, size_t n) {
  Leg tx = leg(fds_[peer], peer, data, n), none;
  pass(tx, none);
}

void PlainAllreduce::recv_from(int peer, void* data, size_t n) {
  Leg none, rx = leg(fds_[peer], peer, data, n);
  pass(none, rx);
}

void PlainAllreduce::exchange(int peer, const void* send, size_t send_n, void* recv,
                              size_t recv_n) {
  Leg tx = leg(fds_[peer], peer, send, send_n), rx = leg(fds_[peer], peer, recv, recv_n);
  pass(tx, rx);
}

// The fold for a world of n ranks that is not a power of two: over the
// largest power of two p <= n, the first 2(n - p) ranks pair up first; the
// even one sends its data to the odd one and waits, the odd one takes part
// for both and sends it the result last. Returns this rank's place among
// the p (-1 while folded out) and p.
std::pair<int, int> PlainAllreduce::fold_in(float* out, size_t count) {
  int p = 1;
  while (p * 2 <= world_) p *= 2;
  const int extra = world_ - p;
  tmp_.resize(std::max(tmp_.size(), count));
  if (rank_ >= 2 * extra) return {rank_ - extra, p};
  if (rank_ % 2 == 0) {
    send_to(rank_ + 1, out, count * sizeof(float));
    return {-1, p};
  }
  recv_from(rank_ - 1, tmp_.data(), count * sizeof(float));
  add_into(out, tmp_.data(), count);
  return {rank_ / 2, p};
}

void PlainAllreduce::fold_out(float* out, size_t count, int p) {
  const int extra = world_ - p;
  if (rank_ >= 2 * extra) return;
  if (rank_ % 2 == 0) {
    recv_from(rank_ + 1, out, count * sizeof(float));
  } else {
    send_to(rank_ - 1, out, count * sizeof(float));
  }
}

// The rank at place `place` among the p that take part.
int PlainAllreduce::rank_at(int place, int p) const {
  const int extra = world_ - p;
  return place < extra ? place * 2 + 1 : place + extra;
}

// Recursive doubling: log2(p) exchanges of the whole buffer.
void PlainAllreduce::recursive_doubling(float* out, size_t count) {
  const auto [me, p] = fold_in(out, count);
  if (me >= 0) {
    for (int mask = 1; mask < p; mask <<= 1) {
      exchange(rank_at(me ^ mask, p), out, count * sizeof(float), tmp_.data(),
               count * sizeof(float));
      add_into(out, tmp_.data(), count);
    }
  }
  fold_out(out, count, p);
}

// Rabenseifner: a reduce-scatter by recursive halving (each exchange hands
// the partner the half of the current range it keeps, and adds the
// partner's copy of this rank's half), then an allgather by recursive
// doubling back up the same ranges: the ring's bytes in 2 log2(p) steps.
void PlainAllreduce::rabenseifner(float* out, size_t count) {
  const auto [me, p] = fold_in(out, count);
  if (me >= 0) {
    struct Range {
      size_t lo, hi;
    };
    struct Halving {
      Range whole;  // the range before it
      bool lower;   // whether this rank kept its lower half
    };
    std::vector<Halving> halvings;  // for the way back up
    Range r{0, count};
    for (int mask = p / 2; mask >= 1; mask /= 2) {
      const size_t mid = r.lo + (r.hi - r.lo) / 2;
      const bool lower = (me & mask) == 0;
      const Range keep = lower ? Range{r.lo, mid} : Range{mid, r.hi};
      const Range give = lower ? Range{mid, r.hi} : Range{r.lo, mid};
      exchange(rank_at(me ^ mask, p), out + give.lo, (give.hi - give.lo) * sizeof(float),
               tmp_.data(), (keep.hi - keep.lo) * sizeof(float));
      add_into(out + keep.lo, tmp_.data(), keep.hi - keep.lo);
      halvings.push_back({r, lower});
      r = keep;
    }
    for (int mask = 1; mask < p; mask <<= 1) {
      const auto [whole, lower] = halvings.back();
      halvings.pop_back();
      // The partner holds the other part of `whole`, reduced.
      const Range theirs = lower ? Range{r.hi, whole.hi} : Range{whole.lo, r.lo};
      exchange(rank_at(me ^ mask, p), out + r.lo, (r.hi - r.lo) * sizeof(float), out + theirs.lo,
               (theirs.hi - theirs.lo) * sizeof(float));
      r = whole;
    }
  }
  fold_out(out, count, p);
}

// The ring as one send stream and one receive stream of 2(n - 1) steps each.
// Chunk c is elements [off[c], off[c + 1]). Step t < n - 1 (reduce-scatter)
// sends chunk r - t and receives chunk r - t - 1, added into `out` as it
// lands; step n - 1 + s (allgather) sends chunk r + 1 - s and receives chunk
// r - s straight into `out`. What step t + 1 sends is what step t received,
// so the send stream may run up to its first step plus what the receive
// stream has produced: a chunk goes on while the rest of it still arrives.
void PlainAllreduce::ring(float* out, size_t count) {
  const int n = world_;
  const size_t es = sizeof(float);
  std::vector<size_t> off(static_cast<size_t>(n) + 1);
  for (int c = 0; c <= n; ++c) off[c] = count * static_cast<size_t>(c) / static_cast<size_t>(n);
  auto chunk_of = [&](int c) { return ((c % n) + n) % n; };
  const int steps = 2 * (n - 1);
  std::vector<int> tx_chunk(steps), rx_chunk(steps);
  for (int t = 0; t < steps; ++t) {
    const int s = t - (n - 1);
    tx_chunk[t] = chunk_of(t < n - 1 ? rank_ - t : rank_ + 1 - s);
    rx_chunk[t] = chunk_of(t < n - 1 ? rank_ - t - 1 : rank_ - s);
  }
  // Where each step starts in its stream (a last entry: the total).
  auto starts = [&](const std::vector<int>& chunks) {
    std::vector<size_t> st(steps + 1, 0);
    for (int t = 0; t < steps; ++t) st[t + 1] = st[t] + (off[chunks[t] + 1] - off[chunks[t]]) * es;
    return st;
  };
  const std::vector<size_t> tx_start = starts(tx_chunk), rx_start = starts(rx_chunk);
  size_t max_chunk = 0;
  for (int c = 0; c < n; ++c) max_chunk = std::max(max_chunk, off[c + 1] - off[c]);
  tmp_.resize(std::max(tmp_.size(), max_chunk));

  // The step a position is in; positions only grow, so a cursor per stream.
  auto step_at = [&](const std::vector<size_t>& st, int& cur, size_t pos) {
    while (st[cur + 1] <= pos) ++cur;
    return cur;
  };
  int tx_cur = 0, rx_cur = 0, red_cur = 0;
  size_t produced = 0;  // receive-stream bytes that are final for sending on
  size_t added = 0;     // bytes of the current reduce-scatter step added into `out`
  Leg tx{fds_[(rank_ + 1) % n], (rank_ + 1) % n, tx_start[steps], 0, [&](size_t pos) {
           const int t = step_at(tx_start, tx_cur, pos);
           return std::pair{bytes(out) + off[tx_chunk[t]] * es + (pos - tx_start[t]),
                            tx_start[t + 1] - pos};
         }};
  Leg rx{fds_[(rank_ + n - 1) % n], (rank_ + n - 1) % n, rx_start[steps], 0, [&](size_t pos) {
           const int t = step_at(rx_start, rx_cur, pos);
           std::byte* base = t < n - 1 ? bytes(tmp_.data()) : bytes(out) + off[rx_chunk[t]] * es;
           return std::pair{base + (pos - rx_start[t]), rx_start[t + 1] - pos};
         }};
  auto arrived = [&](size_t pos, size_t len) {
    const int prev = red_cur;
    const int t = step_at(rx_start, red_cur, pos);
    if (t != prev) added = 0;
    if (t >= n - 1) {
      produced = pos + len;
      return;
    }
    // Add the whole elements that have landed; a split one waits for the rest.
    const size_t landed = (pos + len - rx_start[t]) / es * es;
    float* dst = out + off[rx_chunk[t]];
    add_into(dst + added / es, tmp_.data() + added / es, (landed - added) / es);
    added = landed;
    produced = rx_start[t] + landed;
  };
  // Send on in pieces of at least kPiece bytes, or up to the end of a step:
  // a send of every few bytes that land would cost a syscall and a segment
  // each. A step's end always goes, so no rank holds back what another waits
  // for (step 0 is this rank's own data).
  const size_t first = tx_start[1];
  auto ready = [&] {
    const size_t limit = std::min(tx.total, first + produced);
    const bool step_end = std::binary_search(tx_start.begin(), tx_start.end(), limit);
    return limit - tx.done >= kPiece || step_end ? limit : tx.done;
  };
  pass(tx, rx, ready, arrived);
}

void PlainAllreduce::run(PlainAlgo algo, const float* in, float* out, size_t count) {
  if (out != in) std::memcpy(out, in, count * sizeof(float));
  if (world_ == 1) return;
  switch (algo) {
    case PlainAlgo::kRecursiveDoubling:
      recursive_doubling(out, count);
      break;
    case PlainAlgo::kRabenseifner:
      rabenseifner(out, count);
      break;
    case PlainAlgo::kRing:
      ring(out, count);
      break;
  }
}

PlainAllreduce::Trial PlainAllreduce::choose(const float* in, float* out, size_t count, int calls) {
  using Clock = std::chrono::steady_clock;
  constexpr size_t kN = std::size(kPlainAlgos);
  // One untimed call each, whose results must agree: the bench's inputs are
  // small integers (check_data.h), exact in every order of summation, and
  // the row checks only the algorithm it runs.
  std::vector<float> first;
  for (PlainAlgo a : kPlainAlgos) {
    run(a, in, out, count);
    if (first.empty()) {
      first.assign(out, out + count);
      continue;
    }
    size_t differ = 0;
    for (size_t i = 0; i < count; ++i) differ += out[i] != first[i];
    if (differ != 0) {
      fail(std::string("the trial (") + plain_algo_name(a) + " differs from " +
           plain_algo_name(kPlainAlgos[0]) + " at " + std::to_string(differ) + " of " +
           std::to_string(count) + " elements)");
    }
  }
  // In blocks, alternating: each block starts together and times its calls
  // back to back, as the rows are timed (a barrier before every call would
  // time the barrier's wake-ups too).
  constexpr int kBlocks = 3;
  calls = std::max(calls, kBlocks);
  std::vector<double> mine[kN], slowest[kN];
  for (int block = 0; block < kBlocks; ++block) {
    for (size_t k = 0; k < kN; ++k) {
      MPI_Barrier(MPI_COMM_WORLD);
      for (int i = block; i < calls; i += kBlocks) {
        const auto t0 = Clock::now();
        run(kPlainAlgos[k], in, out, count);
        mine[k].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    }
  }
  Trial t;
  t.calls = calls;
  for (size_t k = 0; k < kN; ++k) {
    slowest[k].resize(mine[k].size());
    MPI_Allreduce(mine[k].data(), slowest[k].data(), calls, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    std::sort(slowest[k].begin(), slowest[k].end());
    t.us[k] = slowest[k][slowest[k].size() / 2];
    if (t.us[k] < t.us[static_cast<size_t>(t.chosen)]) t.chosen = kPlainAlgos[k];
  }
  trials_[count] = t;
  return t;
}

void PlainAllreduce::run(const float* in, float* out, size_t count) {
  run(trial(count).chosen, in, out, count);
}

const PlainAllreduce::Trial& PlainAllreduce::trial(size_t count) const {
  const auto it = trials_.find(count);
  if (it == trials_.end()) {
    fail("choosing an algorithm (no trial ran at " + std::to_string(count) + " elements)");
  }
  return it->second;
}

}  // namespace rdmaflow::bench
