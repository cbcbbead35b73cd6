// The id of a multi-node job, made by one rank (rank 0) through
// dmagather_job_id_create and passed to every rank by the job's own
// launcher (torch store, MPI, environment): "dmagather1/<secret>/<address>",
// where <address> is the peer address of rank 0's daemon (the job's
// coordinator) and <secret> 32 hex digits of a random 128-bit secret.
//
// The secret authenticates daemons to each other for this job (HMAC-SHA256
// challenge-response, so it never travels); the tag derived from it names
// the job between daemons.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace dmagather::server::cluster {

struct JobId {
  std::string secret;   // 16 raw bytes.
  std::string address;  // Coordinator's peer address, host:port.
  std::string tag;      // 16 bytes: HMAC(secret, "tag").
};

absl::StatusOr<JobId> ParseJobId(const std::string& text);
// A new id naming `coordinator_address`, with a fresh secret.
absl::StatusOr<std::string> MakeJobId(const std::string& coordinator_address);

// HMAC-SHA256(key, label | a | b).
std::string Proof(const std::string& key, const char* label, const std::string& a, const std::string& b);
// Constant-time compare.
bool ProofEqual(const std::string& x, const std::string& y);

}  // namespace dmagather::server::cluster
