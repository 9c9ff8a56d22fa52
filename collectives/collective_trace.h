// What the collectives put in the timeline trace (common/trace.h): a span per
// call (communicator.cc: operation, algorithm, bytes, peers), per program run
// (executor.cc) and per piece the program moves or reduces (its step, peer and
// bytes), so a trace shows how an algorithm's steps overlap.
#pragma once

#include <string>

#include "collectives/algorithms/registry.h"
#include "collectives/program.h"
#include "collectives/types.h"
#include "common/trace.h"

namespace rdmaflow {

inline const char* item_name(const Item& it) {
  switch (it.kind) {
    case ItemKind::kSend:
      return "send piece";
    case ItemKind::kRecv:
      return it.reduce ? "recv+reduce piece" : "recv piece";
    case ItemKind::kCopy:
      return "copy";
    case ItemKind::kScale:
      return "scale";
    case ItemKind::kReduce:
      return "reduce";
  }
  return "item";
}

inline trace::Args piece_args(const Item& it, size_t elem_size) {
  return {.peer = it.peer, .bytes = static_cast<int64_t>(it.elems * elem_size), .step = it.step};
}

// A call: its buffer's bytes (count x element size), algorithm and ranks.
inline trace::Args call_args(const CollArgs& a, Algorithm algo, int world) {
  return {.bytes = static_cast<int64_t>(a.count * dtype_size(a.type)),
          .label_key = "algorithm",
          .label = algorithm_name(algo),
          .peers = world};
}

inline trace::Args program_args(const Program& program, const std::string& what) {
  return {.label_key = "call", .label = what, .peers = program.world()};
}

}  // namespace rdmaflow
