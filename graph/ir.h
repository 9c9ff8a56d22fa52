// The graph IR: ops and the tensors that flow between them.
//
// A Graph is plain data. Ops and tensors are kept in the order they were added
// and are referred to by index (OpId, TensorId); names are unique within each
// kind. Every tensor has at most one producer; `consumers` lists each consuming
// op once, in the order the ops were added. The builder refuses what would make
// the structure ambiguous (duplicate names, an input naming no tensor, a second
// producer); everything else a graph can get wrong (cycles, consumed tensors
// that nothing produces, sizes that overflow) is reported by validate().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace rdmaflow::graph {

using OpId = int32_t;
using TensorId = int32_t;
inline constexpr OpId kNoOp = -1;

// A dimension that is only known at run time.
inline constexpr int64_t kUnknownDim = -1;

// Dimensions of a tensor; any of them may be kUnknownDim. Scalars have no dims.
using Shape = std::vector<int64_t>;

// True when every dimension is known.
bool is_static(const Shape& shape);

// Bytes of a tensor with this element type and a static shape; nullopt when a
// dimension is unknown or the product overflows 2^63.
std::optional<uint64_t> static_bytes(DataType dtype, const Shape& shape);

// "[64,1024]", "[?,256]", "[]".
std::string shape_to_string(const Shape& shape);

// Op attributes: a small closed set of value types (what JSON can say plainly).
using AttrValue = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>,
                               std::vector<double>, std::vector<std::string>>;
using Attributes = std::map<std::string, AttrValue>;

struct Tensor {
  std::string name;
  DataType dtype = DataType::kF32;
  Shape shape;
  // For tensors with unknown dimensions: the expected size in bytes (0 = none
  // given). The planner reserves this much so the common case needs no read.
  uint64_t size_hint = 0;
  OpId producer = kNoOp;
  std::vector<OpId> consumers;

  bool operator==(const Tensor&) const = default;
};

struct Op {
  std::string name;
  std::string type;
  Attributes attrs;
  std::vector<TensorId> inputs;   // may repeat a tensor (Add(x, x))
  std::vector<TensorId> outputs;  // distinct

  bool operator==(const Op&) const = default;
};

class Graph {
 public:
  std::string name;

  // Declares a tensor. Fails when the name is empty or already taken.
  Result<TensorId> add_tensor(std::string name, DataType dtype, Shape shape,
                              uint64_t size_hint = 0);

  // Adds an op reading and writing declared tensors (by name). Fails when the op
  // name is empty or taken, an input or output names no declared tensor, an
  // output is listed twice or already has a producer.
  Result<OpId> add_op(std::string name, std::string type, const std::vector<std::string>& inputs,
                      const std::vector<std::string>& outputs, Attributes attrs = {});

  // Same, by tensor id (used by the partitioner, which knows its ids are valid).
  Result<OpId> add_op_ids(std::string name, std::string type, std::vector<TensorId> inputs,
                          std::vector<TensorId> outputs, Attributes attrs = {});

  // Capacity hint for graphs built in bulk.
  void reserve(size_t ops, size_t tensors);

  const std::vector<Op>& ops() const { return ops_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const Op& op(OpId id) const { return ops_[static_cast<size_t>(id)]; }
  const Tensor& tensor(TensorId id) const { return tensors_[static_cast<size_t>(id)]; }
  size_t num_ops() const { return ops_.size(); }
  size_t num_tensors() const { return tensors_.size(); }

  std::optional<OpId> find_op(std::string_view name) const;
  std::optional<TensorId> find_tensor(std::string_view name) const;

  // Same name, ops and tensors in the same order.
  bool operator==(const Graph& other) const {
    return name == other.name && ops_ == other.ops_ && tensors_ == other.tensors_;
  }

 private:
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using NameIndex = std::unordered_map<std::string, int32_t, NameHash, std::equal_to<>>;

  std::vector<Op> ops_;
  std::vector<Tensor> tensors_;
  NameIndex op_index_;
  NameIndex tensor_index_;
};

}  // namespace rdmaflow::graph
