// Bootstrap options for one of two processes on this host that meet at
// `rendezvous` (the benches that start their own pair: p2p-session,
// reg_cost_bench --allreduce).
#pragma once

#include <string>
#include <utility>

#include "runtime/rendezvous/bootstrap.h"

namespace rdmaflow::bench {

inline BootstrapOptions local_pair(int rank, const char* source, std::string rendezvous) {
  RankInfo info;
  info.rank = rank;
  info.world_size = 2;
  info.local_rank = rank;
  info.local_size = 2;
  info.single_host = true;
  info.source = source;
  BootstrapOptions bo;
  bo.rank_info = info;
  bo.rendezvous = std::move(rendezvous);
  return bo;
}

}  // namespace rdmaflow::bench
