// rdmaflow_coll_bench's inputs and its #wrong check: every rank fills its
// buffers with small integers (exact in every type, f16 and bf16 included),
// and the result of a sum is checked element by element against what the
// operation must produce. The same buffers go to rdmaflow, Open MPI and Gloo.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/types.h"
#include "common/dtype.h"

namespace rdmaflow::bench {

// What the check needs of a run's arguments.
struct DataSpec {
  CollectiveKind op = CollectiveKind::kAllreduce;
  DataType type = DataType::kF32;
  ReduceOp redop = ReduceOp::kSum;
};

inline double in_value(int rank, size_t i) {
  return static_cast<double>((rank * 3 + i) % 7);
}

inline void store(DataType t, void* b, size_t i, double v) {
  switch (t) {
    case DataType::kF32:
      static_cast<float*>(b)[i] = static_cast<float>(v);
      break;
    case DataType::kF64:
      static_cast<double*>(b)[i] = v;
      break;
    case DataType::kI32:
      static_cast<int32_t*>(b)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kI64:
      static_cast<int64_t*>(b)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kU8:
      static_cast<uint8_t*>(b)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::kF16:
    case DataType::kBF16: {
      // Small integers: exact in both; build the bits through float.
      float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      uint16_t h;
      if (t == DataType::kBF16) {
        h = static_cast<uint16_t>(u >> 16);
      } else if (f == 0) {
        h = 0;
      } else {
        int e = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
        h = static_cast<uint16_t>((e << 10) | ((u >> 13) & 0x3ff));
      }
      static_cast<uint16_t*>(b)[i] = h;
      break;
    }
    default:
      break;
  }
}

inline double load(DataType t, const void* b, size_t i) {
  switch (t) {
    case DataType::kF32:
      return static_cast<const float*>(b)[i];
    case DataType::kF64:
      return static_cast<const double*>(b)[i];
    case DataType::kI32:
      return static_cast<const int32_t*>(b)[i];
    case DataType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(b)[i]);
    case DataType::kU8:
      return static_cast<const uint8_t*>(b)[i];
    case DataType::kBF16: {
      uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(b)[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case DataType::kF16: {
      uint16_t h = static_cast<const uint16_t*>(b)[i];
      if ((h & 0x7fff) == 0) return 0;
      uint32_t u = (static_cast<uint32_t>(((h >> 10) & 0x1f) - 15 + 127) << 23) |
                   (static_cast<uint32_t>(h & 0x3ff) << 13);
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    default:
      return 0;
  }
}

struct Bufs {
  std::vector<std::byte> in, out;
};

inline void fill(const DataSpec& a, int rank, int world, size_t count, Bufs& b) {
  const size_t es = dtype_size(a.type);
  const size_t in_elems = a.op == CollectiveKind::kAllgather ? count / world : count;
  b.in.assign(in_elems * es, std::byte{0});
  b.out.assign(count * es, std::byte{0});
  for (size_t i = 0; i < in_elems; ++i) {
    size_t g = i;
    if (a.op == CollectiveKind::kAlltoall) g = i % (count / world);
    store(a.type, b.in.data(), i, in_value(rank, g));
  }
  (void)world;
}

// Wrong elements of this rank's output (sum only; other reductions report 0).
inline size_t wrong(const DataSpec& a, int rank, int world, size_t count, const Bufs& b) {
  if (a.redop != ReduceOp::kSum) return 0;
  size_t bad = 0;
  const size_t per = count / world;
  auto reduced = [&](size_t i) {
    double s = 0;
    for (int r = 0; r < world; ++r) s += in_value(r, i);
    return s;
  };
  switch (a.op) {
    case CollectiveKind::kAllreduce:
      for (size_t i = 0; i < count; ++i) bad += load(a.type, b.out.data(), i) != reduced(i);
      break;
    case CollectiveKind::kReduce:
      if (rank == 0) {
        for (size_t i = 0; i < count; ++i) bad += load(a.type, b.out.data(), i) != reduced(i);
      }
      break;
    case CollectiveKind::kReduceScatter:
      for (size_t i = 0; i < per; ++i) {
        bad += load(a.type, b.out.data(), i) != reduced(rank * per + i);
      }
      break;
    case CollectiveKind::kBroadcast:
      for (size_t i = 0; i < count; ++i) bad += load(a.type, b.out.data(), i) != in_value(0, i);
      break;
    case CollectiveKind::kAllgather:
      for (size_t i = 0; i < per * world; ++i) {
        bad += load(a.type, b.out.data(), i) != in_value(static_cast<int>(i / per), i % per);
      }
      break;
    case CollectiveKind::kAlltoall:
      for (size_t i = 0; i < per * world; ++i) {
        bad += load(a.type, b.out.data(), i) != in_value(static_cast<int>(i / per), i % per);
      }
      break;
    default:
      break;
  }
  return bad;
}

}  // namespace rdmaflow::bench
