// rdmaflow._C: the native half of the Python package. Registers nothing by
// itself; rdmaflow/torch.py hands create_process_group to
// torch.distributed.Backend.register_backend.
#include <pybind11/chrono.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "python/src/numpy_api.h"
#include "python/src/process_group.h"

namespace py = pybind11;
using rdmaflow::torch_backend::ProcessGroupRdmaflow;

namespace {

// A codec spec parsed and its parameter checked (by making the codec), or
// ValueError with the reason: bad parameters fail where the hook is made.
rdmaflow::CodecSpec checked_codec(const std::string& text) {
  auto spec = rdmaflow::parse_codec(text);
  if (!spec.is_ok()) throw py::value_error("rdmaflow: " + spec.status().to_string());
  if (spec->id == rdmaflow::CodecId::kNone) {
    throw py::value_error("rdmaflow: codec '" + text + "' sends uncompressed: use all_reduce");
  }
  auto made = rdmaflow::make_codec(*spec);
  if (!made.is_ok()) throw py::value_error("rdmaflow: " + made.status().to_string());
  return *spec;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "rdmaflow's native module: the torch.distributed backend and Communicator";
  // The base class is torch's (torch._C._distributed_c10d.ProcessGroup): import
  // it first so pybind11 knows it.
  py::module::import("torch.distributed");
  py::class_<ProcessGroupRdmaflow, c10::intrusive_ptr<ProcessGroupRdmaflow>, c10d::ProcessGroup>(
      m, "ProcessGroupRdmaflow")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             // Joining the group waits for the other ranks: let Python's
             // other threads run meanwhile.
             py::gil_scoped_release release;
             return c10::make_intrusive<ProcessGroupRdmaflow>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"))
      .def("describe", &ProcessGroupRdmaflow::describe)
      .def(
          "_empty",
          [](ProcessGroupRdmaflow& pg, std::vector<int64_t> sizes, py::object dtype) {
            TORCH_CHECK_TYPE(THPDtype_Check(dtype.ptr()),
                             "rdmaflow.torch.empty: dtype must be a torch.dtype");
            return pg.empty_registered(std::move(sizes),
                                       reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type);
          },
          py::arg("sizes"), py::arg("dtype"))
      .def("stats",
           [](const ProcessGroupRdmaflow& pg) {
             const rdmaflow::FabricStats s = pg.stats();
             py::dict d;
             d["direct_peers"] = s.direct_peers;
             d["direct_pieces"] = s.direct_pieces;
             d["notify_pieces"] = s.notify_pieces;
             d["staged_pieces"] = s.staged_pieces;
             d["registered_source_pieces"] = s.registered_source_pieces;
             d["registered_buffers"] = pg.registered_buffers();
             return d;
           })
      .def(
          "_allreduce_compressed",
          [](ProcessGroupRdmaflow& pg, at::Tensor& tensor, const std::string& codec,
             std::shared_ptr<rdmaflow::CodecState> state, bool average) {
            const rdmaflow::CodecSpec spec = checked_codec(codec);
            py::gil_scoped_release release;  // check_agree waits for the other ranks
            return pg.allreduce_compressed(tensor, spec, std::move(state), average);
          },
          py::arg("tensor"), py::arg("codec"), py::arg("state"), py::arg("average") = true);
  // Error feedback and random state of one tensor (collectives/codecs/codec.h):
  // the caller's, one per tensor, never in two calls at once.
  py::class_<rdmaflow::CodecState, std::shared_ptr<rdmaflow::CodecState>>(m, "CodecState")
      .def(py::init<uint64_t>(), py::arg("seed") = 0x9E3779B97F4A7C15ull)
      .def("reset", &rdmaflow::CodecState::reset)
      .def_property_readonly("residual_elements",
                             [](const rdmaflow::CodecState& s) { return s.residual.size(); })
      .def_readonly("calls", &rdmaflow::CodecState::calls);
  m.def(
      "check_codec",
      [](const std::string& codec) { return rdmaflow::codec_text(checked_codec(codec)); },
      py::arg("codec"),
      "The codec's canonical spelling; ValueError naming the problem when it is not one");
  rdmaflow::torch_backend::bind_numpy_api(m);
}
