// --vs plain: an allreduce of f32 sums over plain TCP sockets, written the
// simplest good way, on the same hosts and cores as rdmaflow, in the same run.
// It is the floor a row's target is held against: if Open MPI already runs
// near it at a size, 1.2x Open MPI there is beyond what TCP allows on these
// hosts; if it is far faster than rdmaflow, that is how much is left.
//
// A full mesh of TCP sockets (TCP_NODELAY, the kernel's own buffers), set up
// through the launcher like the other socket references
// (socket_reference.h), and the algorithms a careful MPI uses:
//   rd    recursive doubling, with the fold for a world that is not a power
//         of two (the extra ranks hand their data to a partner first and get
//         the result back last); latency-optimal: log2(n) exchanges.
//   rabenseifner  reduce-scatter by recursive halving, allgather by
//         recursive doubling (the same fold): the ring's bytes in 2 log2(n)
//         steps, for the sizes between.
//   ring  reduce-scatter then allgather around the ring, pipelined: every
//         byte is reduced as it arrives and sent on as soon as it is, so the
//         next step's send overlaps this step's receive and reduction;
//         bandwidth-optimal: 2(n-1)/n of the buffer per link.
// All are timed at each size in a short interleaved trial before the row
// (choose()) and the row runs the fastest. No library, no framing, no copies
// beyond the reduction's. A peer that closes its socket or makes no progress
// for kPlainTimeoutMs fails the job with its rank and the step, never a hang.
// In a small pass a wait polls the sockets for up to 50 us (yielding the
// core in between) before it sleeps in poll(), as MPI progress loops spin.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace rdmaflow::bench {

// In the order of kPlainAlgos (Trial::us is indexed by it).
enum class PlainAlgo { kRecursiveDoubling, kRabenseifner, kRing };
constexpr PlainAlgo kPlainAlgos[] = {PlainAlgo::kRecursiveDoubling, PlainAlgo::kRabenseifner,
                                     PlainAlgo::kRing};

// "rd", "rabenseifner" or "ring".
const char* plain_algo_name(PlainAlgo a);

// How long a socket may make no progress before the peer counts as dead.
constexpr int kPlainTimeoutMs = 60'000;

class PlainAllreduce {
 public:
  // What the trial of one size measured: the slowest rank's median per call.
  struct Trial {
    PlainAlgo chosen = PlainAlgo::kRecursiveDoubling;
    std::array<double, std::size(kPlainAlgos)> us{};  // by kPlainAlgos
    int calls = 0;                                    // timed calls of each algorithm
  };

  // Collective over MPI_COMM_WORLD: every rank listens on `address` (one the
  // other ranks' hosts reach) and connects to every lower rank.
  PlainAllreduce(int rank, int world, const std::string& address);
  ~PlainAllreduce();
  PlainAllreduce(const PlainAllreduce&) = delete;
  PlainAllreduce& operator=(const PlainAllreduce&) = delete;

  // Sums `count` floats of every rank's `in` into every rank's `out` (`in`
  // is left as it was). Collective.
  void run(PlainAlgo algo, const float* in, float* out, size_t count);

  // Collective: times every algorithm at `count`, `calls` times each (at
  // least 3), interleaved in 3 blocks, after one untimed call each whose
  // results must agree, and keeps the fastest (by the slowest rank's median)
  // for run(in, out, count).
  Trial choose(const float* in, float* out, size_t count, int calls);
  void run(const float* in, float* out, size_t count);
  // The trial of `count` (choose() must have run).
  const Trial& trial(size_t count) const;

 private:
  struct Leg;
  // Moves `tx` and `rx` at once over nonblocking sends and receives, waiting
  // in poll() when neither can move. `ready` (if set) bounds how far `tx`
  // may go (what the receive side has produced so far); `arrived` sees each
  // received run of bytes (position in the stream, length) as it lands.
  void pass(Leg& tx, Leg& rx, const std::function<size_t()>& ready = {},
            const std::function<void(size_t, size_t)>& arrived = {});
  // A leg over `n` flat bytes at `data`.
  static Leg leg(int fd, int peer, const void* data, size_t n);
  void send_to(int peer, const void* data, size_t n);
  void recv_from(int peer, void* data, size_t n);
  void exchange(int peer, const void* send, size_t send_n, void* recv, size_t recv_n);
  std::pair<int, int> fold_in(float* out, size_t count);
  void fold_out(float* out, size_t count, int p);
  int rank_at(int place, int p) const;
  void recursive_doubling(float* out, size_t count);
  void rabenseifner(float* out, size_t count);
  void ring(float* out, size_t count);

  const int rank_, world_;
  std::vector<int> fds_;  // by peer rank; -1 for this rank
  std::vector<float> tmp_;
  std::map<size_t, Trial> trials_;
};

}  // namespace rdmaflow::bench
