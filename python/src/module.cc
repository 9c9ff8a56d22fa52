// rdmaflow._C: the native half of the Python package. Registers nothing by
// itself; rdmaflow/torch.py hands create_process_group to
// torch.distributed.Backend.register_backend.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "python/src/numpy_api.h"
#include "python/src/process_group.h"

namespace py = pybind11;
using rdmaflow::torch_backend::ProcessGroupRdmaflow;

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
      .def("describe", &ProcessGroupRdmaflow::describe);
  rdmaflow::torch_backend::bind_numpy_api(m);
}
