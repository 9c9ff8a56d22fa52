#include "graph/training.h"

#include <map>
#include <utility>

#include "graph/cost.h"
#include "graph/topo_order.h"
#include "graph/validate.h"

namespace rdmaflow::graph {

namespace {

constexpr const char* kTraining = "training graph";

bool is_float(DataType t) {
  return t == DataType::kF32 || t == DataType::kF64 || t == DataType::kF16 || t == DataType::kBF16;
}

class Builder {
 public:
  Builder(const Graph& f, const Placement& p) : f_(f), p_(p) {}

  Result<TrainingGraph> run(uint64_t dynamic_hint) {
    RDMAFLOW_ASSIGN_OR_RETURN(std::vector<OpId> order, topological_order(f_));
    cost_ = estimate_costs(f_, dynamic_hint);
    out_.graph = f_;
    out_.placement = p_;
    out_.graph.name = f_.name.empty() ? "training" : f_.name + "/training";

    needs_.assign(f_.num_tensors(), false);
    for (OpId op : order) {
      const Op& o = f_.op(op);
      bool any = o.type == "Variable";
      for (TensorId t : o.inputs) any = any || needs_[static_cast<size_t>(t)];
      for (TensorId t : o.outputs) {
        needs_[static_cast<size_t>(t)] = any && is_float(f_.tensor(t).dtype);
      }
    }
    partials_.assign(f_.num_tensors(), {});
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      RDMAFLOW_RETURN_IF_ERROR(backward_of(*it));
    }
    return std::move(out_);
  }

 private:
  int rank_of(OpId op) const { return p_.rank_of(op); }
  const std::string& device_of(OpId op) const { return p_.device[static_cast<size_t>(op)]; }

  Result<TensorId> new_tensor(const std::string& name, const Tensor& like) {
    auto id = out_.graph.add_tensor(name, like.dtype, like.shape, like.size_hint);
    if (!id) return id.status().with_op(kTraining);
    ++out_.gradient_tensors;
    return *id;
  }

  Status new_op(std::string name, std::string type, std::vector<TensorId> in,
                std::vector<TensorId> out, Attributes attrs, int rank, const std::string& dev) {
    auto id = out_.graph.add_op_ids(std::move(name), std::move(type), std::move(in), std::move(out),
                                    std::move(attrs));
    if (!id) return id.status().with_op(kTraining);
    out_.placement.rank.push_back(rank);
    out_.placement.device.push_back(dev);
    return Status::ok();
  }

  // The total gradient of forward tensor t on its producer's rank: the
  // partials summed per reading rank, then across ranks. Returns -1 when
  // nothing reads t (a graph output gets a LossGrad seed instead).
  Result<TensorId> total_gradient(TensorId t) {
    const Tensor& tensor = f_.tensor(t);
    const OpId producer = tensor.producer;
    auto& parts = partials_[static_cast<size_t>(t)];
    if (parts.empty()) {
      if (!tensor.consumers.empty()) return TensorId{-1};  // read, but no reader passes one back
      RDMAFLOW_ASSIGN_OR_RETURN(TensorId seed, new_tensor(gradient_name(tensor.name), tensor));
      RDMAFLOW_RETURN_IF_ERROR(new_op("loss/" + tensor.name, "LossGrad", {t}, {seed}, {},
                                      rank_of(producer), device_of(producer)));
      return seed;
    }
    std::map<int, std::vector<std::pair<TensorId, OpId>>> by_rank;
    for (const auto& part : parts) by_rank[rank_of(part.second)].push_back(part);
    std::vector<TensorId> per_rank;
    for (const auto& [rank, list] : by_rank) {
      if (list.size() == 1) {
        per_rank.push_back(list[0].first);
        continue;
      }
      const std::string name = gradient_name(tensor.name) + "@" + std::to_string(rank);
      RDMAFLOW_ASSIGN_OR_RETURN(TensorId sum, new_tensor(name, tensor));
      std::vector<TensorId> in;
      for (const auto& part : list) in.push_back(part.first);
      RDMAFLOW_RETURN_IF_ERROR(
          new_op(name, "AddN", std::move(in), {sum}, {}, rank, device_of(list[0].second)));
      per_rank.push_back(sum);
    }
    if (per_rank.size() == 1 && by_rank.begin()->first == rank_of(producer)) return per_rank[0];
    RDMAFLOW_ASSIGN_OR_RETURN(TensorId total, new_tensor(gradient_name(tensor.name), tensor));
    RDMAFLOW_RETURN_IF_ERROR(new_op(gradient_name(tensor.name), "AddN", std::move(per_rank),
                                    {total}, {}, rank_of(producer), device_of(producer)));
    return total;
  }

  Status backward_of(OpId op) {
    const Op& f = f_.op(op);
    std::vector<TensorId> in;
    for (TensorId t : f.outputs) {
      if (!needs_[static_cast<size_t>(t)]) continue;
      RDMAFLOW_ASSIGN_OR_RETURN(TensorId g, total_gradient(t));
      if (g >= 0) in.push_back(g);
    }
    if (in.empty() || f.inputs.empty()) return Status::ok();  // Variable: its gradient is final
    in.insert(in.end(), f.inputs.begin(), f.inputs.end());    // the saved activations
    std::vector<TensorId> out;
    std::vector<TensorId> wrt;
    for (TensorId t : f.inputs) {
      if (!needs_[static_cast<size_t>(t)]) continue;
      bool seen = false;
      for (TensorId w : wrt) seen = seen || w == t;
      if (seen) continue;  // Add(x, x): one partial
      wrt.push_back(t);
      const Tensor& x = f_.tensor(t);
      RDMAFLOW_ASSIGN_OR_RETURN(TensorId part, new_tensor(gradient_name(x.name) + "/" + f.name, x));
      out.push_back(part);
      partials_[static_cast<size_t>(t)].emplace_back(part, op);
    }
    Attributes attrs{{"cost", 2 * cost_[static_cast<size_t>(op)]}};
    return new_op(f.name + "/grad", f.type + "Grad", std::move(in), std::move(out),
                  std::move(attrs), rank_of(op), device_of(op));
  }

  const Graph& f_;
  const Placement& p_;
  std::vector<double> cost_;
  std::vector<bool> needs_;
  // Per forward tensor: (partial gradient, the forward op whose backward wrote it).
  std::vector<std::vector<std::pair<TensorId, OpId>>> partials_;
  TrainingGraph out_;
};

}  // namespace

std::string gradient_name(const std::string& tensor) {
  return "grad/" + tensor;
}

Result<TrainingGraph> add_backward(const Graph& forward, const Placement& placement,
                                   uint64_t dynamic_hint) {
  int ranks = 1;
  for (int r : placement.rank) ranks = std::max(ranks, r + 1);
  RDMAFLOW_RETURN_IF_ERROR(validate_placement(forward, placement, ranks));
  return Builder(forward, placement).run(dynamic_hint);
}

}  // namespace rdmaflow::graph
