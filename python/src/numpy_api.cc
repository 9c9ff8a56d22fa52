// rdmaflow.Communicator: the Communicator's collectives on NumPy arrays (and
// on anything with the buffer protocol: torch CPU tensors through .numpy()),
// for users who are not on torch.distributed. The job starts as every
// rdmaflow job does: rank and world from the launcher (mpirun, srun,
// RDMAFLOW_RANK/RDMAFLOW_WORLD_SIZE), the rendezvous from
// RDMAFLOW_RENDEZVOUS, a transport per pair from RDMAFLOW_TRANSPORT.
#include "python/src/numpy_api.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "python/src/job.h"

namespace py = pybind11;

namespace rdmaflow::torch_backend {
namespace {

[[noreturn]] void raise(const Status& st) {
  throw std::runtime_error(st.to_string());
}

DataType dtype_of(const py::array& a) {
  const py::dtype d = a.dtype();
  const char kind = d.kind();
  const auto size = d.itemsize();
  if (kind == 'f' && size == 4) return DataType::kF32;
  if (kind == 'f' && size == 8) return DataType::kF64;
  if (kind == 'f' && size == 2) return DataType::kF16;
  if (kind == 'i' && size == 4) return DataType::kI32;
  if (kind == 'i' && size == 8) return DataType::kI64;
  if (kind == 'i' && size == 1) return DataType::kI8;
  if (kind == 'u' && size == 1) return DataType::kU8;
  if (kind == 'b') return DataType::kBool;
  throw py::type_error("rdmaflow: arrays of dtype " +
                       py::str(static_cast<const py::handle&>(d)).cast<std::string>() +
                       " are not supported (float16/32/64, int8/32/64, uint8, bool are)");
}

ReduceOp op_of(const std::string& name) {
  auto op = parse_reduce_op(name);
  if (!op)
    throw py::value_error("rdmaflow: unknown reduction '" + name + "' (sum, prod, min, max, avg)");
  return *op;
}

// A C-contiguous array this call may write.
py::array writable(py::array a, const char* what) {
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(std::string("rdmaflow ") + what + ": the array must be C-contiguous");
  }
  if (!a.writeable()) {
    throw py::value_error(std::string("rdmaflow ") + what + ": the array is read-only");
  }
  return a;
}

class PyCommunicator {
 public:
  PyCommunicator() {
    CommunicatorOptions options;
    options.p2p = true;  // send and recv
    auto job = Job::create({}, options);
    if (auto* failed = std::get_if<Job::Failure>(&job)) {
      throw std::runtime_error(std::string("rdmaflow: ") + failed->step +
                               " failed: " + failed->status.to_string());
    }
    job_ = std::move(std::get<std::unique_ptr<Job>>(job));
    comm_ = &job_->comm();
  }

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->world_size(); }

  void run(CollectiveKind kind, const py::array& in, py::array& out, size_t count, ReduceOp op,
           int root, const char* what) {
    const DataType type = dtype_of(out);
    if (in.dtype().not_equal(out.dtype())) {
      throw py::type_error(std::string("rdmaflow ") + what + ": input and output dtypes differ");
    }
    Status st;
    {
      py::gil_scoped_release release;
      st = comm_->run(kind, in.data(), out.mutable_data(), count, type, op, root);
    }
    if (!st.is_ok()) raise(st);
  }

  py::array allreduce(py::array a, const std::string& op) {
    writable(a, "allreduce");
    run(CollectiveKind::kAllreduce, a, a, static_cast<size_t>(a.size()), op_of(op), 0, "allreduce");
    return a;
  }
  py::array broadcast(py::array a, int root) {
    writable(a, "broadcast");
    run(CollectiveKind::kBroadcast, a, a, static_cast<size_t>(a.size()), ReduceOp::kSum, root,
        "broadcast");
    return a;
  }
  py::array allgather(const py::array& a) {
    py::array in = py::array::ensure(a, py::array::c_style);
    std::vector<py::ssize_t> shape{size()};
    for (py::ssize_t i = 0; i < in.ndim(); ++i) shape.push_back(in.shape(i));
    py::array out(in.dtype(), shape);
    run(CollectiveKind::kAllgather, in, out, static_cast<size_t>(in.size()), ReduceOp::kSum, 0,
        "allgather");
    return out;
  }
  py::array reduce_scatter(const py::array& a, const std::string& op) {
    py::array in = py::array::ensure(a, py::array::c_style);
    if (in.ndim() < 1 || in.shape(0) != size()) {
      throw py::value_error(
          "rdmaflow reduce_scatter: the input's first dimension must be the "
          "world size " +
          std::to_string(size()));
    }
    std::vector<py::ssize_t> shape;
    for (py::ssize_t i = 1; i < in.ndim(); ++i) shape.push_back(in.shape(i));
    py::array out(in.dtype(), shape);
    run(CollectiveKind::kReduceScatter, in, out, static_cast<size_t>(out.size()), op_of(op), 0,
        "reduce_scatter");
    return out;
  }
  py::array alltoall(const py::array& a) {
    py::array in = py::array::ensure(a, py::array::c_style);
    if (in.ndim() < 1 || in.shape(0) != size()) {
      throw py::value_error(
          "rdmaflow alltoall: the input's first dimension must be the world size " +
          std::to_string(size()));
    }
    py::array out(in.dtype(), std::vector<py::ssize_t>(in.shape(), in.shape() + in.ndim()));
    run(CollectiveKind::kAlltoall, in, out, static_cast<size_t>(in.size() / size()), ReduceOp::kSum,
        0, "alltoall");
    return out;
  }

  // Uneven alltoall over the flattened array: block p (send_counts[p]
  // elements, in rank order) goes to rank p; returns the blocks received, in
  // rank order. recv_counts default: traded first (an alltoall of the counts).
  py::array alltoallv(const py::array& a, const std::vector<int64_t>& send_counts,
                      std::optional<std::vector<int64_t>> recv_counts) {
    py::array in = py::array::ensure(a, py::array::c_style);
    const DataType type = dtype_of(in);
    auto check = [&](const std::vector<int64_t>& counts, const char* name) {
      if (counts.size() != static_cast<size_t>(size())) {
        throw py::value_error(std::string("rdmaflow alltoallv: ") + name + " has " +
                              std::to_string(counts.size()) + " entries, the world " +
                              std::to_string(size()));
      }
      for (int64_t c : counts) {
        if (c < 0) throw py::value_error(std::string("rdmaflow alltoallv: negative ") + name);
      }
    };
    check(send_counts, "send_counts");
    if (!recv_counts) {
      std::vector<int64_t> theirs(send_counts.size());
      Status st;
      {
        py::gil_scoped_release release;
        st = comm_->alltoall(send_counts.data(), theirs.data(), 1, DataType::kI64);
      }
      if (!st.is_ok()) raise(st);
      recv_counts = std::move(theirs);
    }
    check(*recv_counts, "recv_counts");
    AlltoallvLayout layout;
    size_t sent = 0, received = 0;
    for (int p = 0; p < size(); ++p) {
      layout.send_counts.push_back(static_cast<size_t>(send_counts[p]));
      layout.send_displs.push_back(sent);
      sent += static_cast<size_t>(send_counts[p]);
      layout.recv_counts.push_back(static_cast<size_t>((*recv_counts)[p]));
      layout.recv_displs.push_back(received);
      received += static_cast<size_t>((*recv_counts)[p]);
    }
    if (sent > static_cast<size_t>(in.size())) {
      throw py::value_error("rdmaflow alltoallv: send_counts add up to " + std::to_string(sent) +
                            " elements, the array has " + std::to_string(in.size()));
    }
    py::array out(in.dtype(), std::vector<py::ssize_t>{static_cast<py::ssize_t>(received)});
    Status st;
    {
      py::gil_scoped_release release;
      st = comm_->alltoallv(in.data(), static_cast<size_t>(in.size()), out.mutable_data(), received,
                            layout, type);
    }
    if (!st.is_ok()) raise(st);
    return out;
  }

  void send(const py::array& a, int dst, uint64_t tag) {
    py::array in = py::array::ensure(a, py::array::c_style);
    p2p(true, in, dst, tag);
  }
  py::array recv(py::array a, int src, uint64_t tag) {
    writable(a, "recv");
    p2p(false, a, src, tag);
    return a;
  }

  void barrier() {
    Status st;
    {
      py::gil_scoped_release release;
      st = comm_->barrier();
    }
    if (!st.is_ok()) raise(st);
  }
  std::string describe() const { return job_->describe(); }

 private:
  void p2p(bool sending, py::array& a, int peer, uint64_t tag) {
    const char* what = sending ? "send" : "recv";
    if (peer < 0 || peer >= size() || peer == rank()) {
      throw py::value_error(std::string("rdmaflow ") + what + ": peer " + std::to_string(peer) +
                            " is not another rank of a world of " + std::to_string(size()));
    }
    const DataType type = dtype_of(a);
    const auto n = static_cast<size_t>(a.size());
    Status st;
    {
      py::gil_scoped_release release;
      st = sending ? comm_->send(a.data(), n, type, peer, tag)
                   : comm_->recv(a.mutable_data(), n, type, peer, tag);
    }
    if (!st.is_ok()) raise(st);
  }

  std::unique_ptr<Job> job_;
  Communicator* comm_ = nullptr;  // job_'s
};

}  // namespace

void bind_numpy_api(py::module_& m) {
  py::class_<PyCommunicator>(m, "Communicator", R"(rdmaflow's collectives on NumPy arrays.

Every rank of the job creates one (a collective call: it meets the others
through RDMAFLOW_RENDEZVOUS or the launcher's variables). Calls block; the
in-place ones (allreduce, broadcast) take C-contiguous writable arrays.)")
      .def(py::init([] {
        py::gil_scoped_release release;
        return std::make_unique<PyCommunicator>();
      }))
      .def_property_readonly("rank", &PyCommunicator::rank)
      .def_property_readonly("size", &PyCommunicator::size)
      .def("allreduce", &PyCommunicator::allreduce, py::arg("array"), py::arg("op") = "sum",
           "Reduces `array` over every rank, in place; returns it.")
      .def("broadcast", &PyCommunicator::broadcast, py::arg("array"), py::arg("root") = 0,
           "Copies root's `array` into every rank's, in place; returns it.")
      .def("allgather", &PyCommunicator::allgather, py::arg("array"),
           "A new array of shape (size, *array.shape) holding every rank's `array`.")
      .def("reduce_scatter", &PyCommunicator::reduce_scatter, py::arg("array"),
           py::arg("op") = "sum",
           "`array` of shape (size, ...): this rank's row of the reduction over every rank.")
      .def("alltoall", &PyCommunicator::alltoall, py::arg("array"),
           "`array` of shape (size, ...): row p goes to rank p; returns the rows received, "
           "in rank order.")
      .def("alltoallv", &PyCommunicator::alltoallv, py::arg("array"), py::arg("send_counts"),
           py::arg("recv_counts") = py::none(),
           "Uneven alltoall over the flattened `array`: its first send_counts[0] elements go "
           "to rank 0, the next send_counts[1] to rank 1, ...; returns a 1-D array of the "
           "blocks received in rank order. Without recv_counts the ranks trade their counts "
           "first; with them, counts that do not match the sender's raise on both ranks.")
      .def("send", &PyCommunicator::send, py::arg("array"), py::arg("dst"), py::arg("tag") = 0,
           "Sends `array` to rank dst (messages of a pair match in the order posted).")
      .def("recv", &PyCommunicator::recv, py::arg("array"), py::arg("src"), py::arg("tag") = 0,
           "Receives the next message from rank src into `array` (C-contiguous, writable; "
           "its size and tag must be the message's, else RuntimeError); returns it.")
      .def("barrier", &PyCommunicator::barrier)
      .def("describe", &PyCommunicator::describe);
}

}  // namespace rdmaflow::torch_backend
