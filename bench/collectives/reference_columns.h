// The reference columns of rdmaflow_coll_bench beside rdmaflow's own: Gloo
// (its tcp transport), Open MPI (the transports mpirun gave it), the plain
// TCP ping-pong (--vs socket) and the plain-socket allreduce floor (--vs
// plain). Each runs on the bench's buffers and is timed like rdmaflow's
// column (sweep.h); `Args` is the bench's command line (op, type, redop).
#pragma once

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "bench/collectives/check_data.h"
#include "bench/collectives/plain_allreduce.h"
#include "bench/collectives/references.h"
#include "bench/collectives/socket_reference.h"
#include "bench/collectives/sweep.h"
#include "collectives/types.h"

namespace rdmaflow::bench {

[[noreturn]] inline void reference_failed(const std::string& what) {
  std::fprintf(stderr, "rdmaflow_coll_bench: %s\n", what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

template <typename Args>
Column<Args> gloo_column(std::shared_ptr<gloo::rendezvous::Context> gctx, int world) {
  return {"gloo",
          [](const Args& x, size_t) {
            if (x.op == CollectiveKind::kReduceScatter) return false;
            const bool reduces =
                x.op == CollectiveKind::kAllreduce || x.op == CollectiveKind::kReduce;
            return !reduces || gloo_reduce_fn(x.type, x.redop) != nullptr;
          },
          [gctx, world](const Args& x, size_t count, Bufs& b) {
            const size_t per = count / world;
            switch (x.op) {
              case CollectiveKind::kAllreduce: {
                gloo::AllreduceOptions o(gctx);
                gloo_set(o, x.type, b.in.data(), count, b.out.data(), count);
                o.setReduceFunction(gloo_reduce_fn(x.type, x.redop));
                gloo::allreduce(o);
                break;
              }
              case CollectiveKind::kReduce: {
                gloo::ReduceOptions o(gctx);
                gloo_set(o, x.type, b.in.data(), count, b.out.data(), count);
                o.setRoot(0);
                o.setReduceFunction(gloo_reduce_fn(x.type, x.redop));
                gloo::reduce(o);
                break;
              }
              case CollectiveKind::kBroadcast: {
                gloo::BroadcastOptions o(gctx);
                gloo_set(o, x.type, b.in.data(), count, b.out.data(), count);
                o.setRoot(0);
                gloo::broadcast(o);
                break;
              }
              case CollectiveKind::kAllgather: {
                gloo::AllgatherOptions o(gctx);
                gloo_set(o, x.type, b.in.data(), per, b.out.data(), count);
                gloo::allgather(o);
                break;
              }
              case CollectiveKind::kAlltoall: {
                gloo::AlltoallOptions o(gctx);
                gloo_set(o, x.type, b.in.data(), count, b.out.data(), count);
                gloo::alltoall(o);
                break;
              }
              case CollectiveKind::kBarrier: {
                gloo::BarrierOptions o(gctx);
                gloo::barrier(o);
                break;
              }
              default:
                break;
            }
          },
          [](const Args& x, size_t) {
            return std::string(x.op == CollectiveKind::kAllreduce ? "ring" : "default");
          }};
}

template <typename Args>
Column<Args> mpi_column(int rank, int world) {
  return {
      "mpi",
      [](const Args& x, size_t) {
        const bool reduces = x.op == CollectiveKind::kAllreduce ||
                             x.op == CollectiveKind::kReduce ||
                             x.op == CollectiveKind::kReduceScatter;
        return mpi_type(x.type) != MPI_DATATYPE_NULL &&
               (!reduces || mpi_op(x.redop) != MPI_OP_NULL);
      },
      [rank, world](const Args& x, size_t count, Bufs& b) {
        const int per = static_cast<int>(count / world);
        const int c = static_cast<int>(count);
        MPI_Datatype t = mpi_type(x.type);
        int rc = MPI_SUCCESS;
        switch (x.op) {
          case CollectiveKind::kAllreduce:
            rc = MPI_Allreduce(b.in.data(), b.out.data(), c, t, mpi_op(x.redop), MPI_COMM_WORLD);
            break;
          case CollectiveKind::kReduce:
            rc = MPI_Reduce(b.in.data(), b.out.data(), c, t, mpi_op(x.redop), 0, MPI_COMM_WORLD);
            break;
          case CollectiveKind::kReduceScatter:
            rc = MPI_Reduce_scatter_block(b.in.data(), b.out.data(), per, t, mpi_op(x.redop),
                                          MPI_COMM_WORLD);
            break;
          case CollectiveKind::kBroadcast:
            if (rank == 0) std::memcpy(b.out.data(), b.in.data(), b.in.size());
            rc = MPI_Bcast(b.out.data(), c, t, 0, MPI_COMM_WORLD);
            break;
          case CollectiveKind::kAllgather:
            rc = MPI_Allgather(b.in.data(), per, t, b.out.data(), per, t, MPI_COMM_WORLD);
            break;
          case CollectiveKind::kAlltoall:
            rc = MPI_Alltoall(b.in.data(), per, t, b.out.data(), per, t, MPI_COMM_WORLD);
            break;
          case CollectiveKind::kBarrier:
            rc = MPI_Barrier(MPI_COMM_WORLD);
            break;
          default:
            break;
        }
        if (rc != MPI_SUCCESS) reference_failed("MPI collective failed");
      },
      [](const Args&, size_t) { return std::string("tuned"); }};
}

// A ping-pong of the row's size between ranks 0 and 1; never checked.
template <typename Args>
Column<Args> socket_column(SocketPingPong& sock, size_t element_size) {
  return {"socket", [](const Args&, size_t) { return true; },
          [&sock, element_size](const Args&, size_t count, Bufs&) {
            sock.round_trip(count * element_size);
          },
          [](const Args&, size_t) { return std::string("pingpong"); }};
}

// f32 sum allreduce only; before each size every algorithm is tried and
// the row runs the fastest (its name in the algo field and the row's note).
template <typename Args>
Column<Args> plain_column(PlainAllreduce& plain) {
  Column<Args> c{"plain",
                 [](const Args& x, size_t) {
                   return x.op == CollectiveKind::kAllreduce && x.type == DataType::kF32 &&
                          x.redop == ReduceOp::kSum;
                 },
                 [&plain](const Args&, size_t count, Bufs& b) {
                   plain.run(reinterpret_cast<const float*>(b.in.data()),
                             reinterpret_cast<float*>(b.out.data()), count);
                 },
                 [&plain](const Args&, size_t count) {
                   return std::string(plain_algo_name(plain.trial(count).chosen));
                 }};
  c.prepare = [&plain](const Args&, size_t count, Bufs& b) {
    // A short trial: enough calls for a median, about as long at every size.
    const int calls = static_cast<int>(
        std::clamp<size_t>((size_t{64} << 20) / std::max<size_t>(count * sizeof(float), 1), 3, 15));
    plain.choose(reinterpret_cast<const float*>(b.in.data()),
                 reinterpret_cast<float*>(b.out.data()), count, calls);
  };
  return c;
}

}  // namespace rdmaflow::bench
