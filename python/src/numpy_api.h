// rdmaflow.Communicator for NumPy arrays (numpy_api.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace rdmaflow::torch_backend {

void bind_numpy_api(pybind11::module_& m);

}  // namespace rdmaflow::torch_backend
