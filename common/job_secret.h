// The job secret: what every rank of one job shares and nobody else has, so each
// connection between them can start with a mutual proof (common/handshake.h).
// Threat model and setup for launchers: docs/security.md.
//
// Where it comes from, first match wins:
//   RDMAFLOW_AUTH=0            no authentication (explicit opt-out, warned once)
//   RDMAFLOW_JOB_SECRET        the secret itself (at least 16 bytes)
//   RDMAFLOW_JOB_SECRET_FILE   a file holding it (owner-only permissions, 16..4096 bytes)
//   (nothing)                  the per-user host secret: a random file created on
//                              first use, readable only by this user. It proves "same
//                              user on this host", so it serves single-host jobs, and a
//                              connection to or from another host is refused with a
//                              message saying how to configure a secret.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace rdmaflow {

enum class SecretSource : uint8_t { kDisabled, kEnv, kFile, kHostDefault };

struct JobSecret {
  SecretSource source = SecretSource::kDisabled;
  std::vector<uint8_t> key;  // empty when disabled
  std::string origin;        // for messages: "RDMAFLOW_JOB_SECRET", a path, ...

  bool host_local() const { return source == SecretSource::kHostDefault; }
};

// Reads the environment (and files) each call, so a process that changes its
// environment gets the new secret; a malformed setting is kInvalidArgument naming
// the variable and what to do.
Result<JobSecret> load_job_secret();

// What a user sees when a host-local secret meets another host.
std::string multi_host_secret_advice();

}  // namespace rdmaflow
