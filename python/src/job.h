// A job's communicator as the Python package builds it, for both the torch
// backend and rdmaflow.Communicator: meet (Bootstrap), pick a transport per
// pair and connect (connect_selected_mesh), build the Communicator over the
// channels; torn down in the reverse order.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "collectives/communicator.h"
#include "runtime/rendezvous/bootstrap.h"
#include "runtime/selection/transport_select.h"

namespace rdmaflow::torch_backend {

class Job {
 public:
  // On failure, the step that failed ("joining the group", "connecting the
  // ranks", "creating the communicator") and its Status.
  struct Failure {
    const char* step;
    Status status;
  };
  static std::variant<std::unique_ptr<Job>, Failure> create(BootstrapOptions boot_options,
                                                            CommunicatorOptions comm_options) {
    std::unique_ptr<Job> job(new Job());
    auto boot = Bootstrap::create(std::move(boot_options));
    if (!boot.is_ok()) return Failure{"joining the group", boot.status()};
    job->boot_ = std::move(*boot);
    auto mesh = connect_selected_mesh(*job->boot_, requested_transport());
    if (!mesh.is_ok()) return Failure{"connecting the ranks", mesh.status()};
    job->mesh_ = std::move(*mesh);
    CommunicatorSetup setup;
    setup.rank = job->boot_->rank();
    setup.world = job->boot_->world_size();
    setup.channels = job->mesh_.channels;
    setup.transports = job->mesh_.selection->per_peer();
    auto comm = Communicator::create(setup, comm_options);
    if (!comm.is_ok()) return Failure{"creating the communicator", comm.status()};
    job->comm_ = std::move(*comm);
    return job;
  }

  ~Job() {
    comm_.reset();
    mesh_ = {};
    if (boot_) (void)boot_->finalize();
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  Communicator& comm() { return *comm_; }
  const Communicator& comm() const { return *comm_; }
  // What each pair runs over and the host groups, for logs.
  std::string describe() const {
    return mesh_.selection->summary() + "; host groups " + comm_->host_groups().describe();
  }

 private:
  Job() = default;
  std::unique_ptr<Bootstrap> boot_;
  SelectedMesh mesh_;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace rdmaflow::torch_backend
