// Join and Register as the registry core takes them: plain structs that the
// service edge (registry.cc) fills from the gRPC messages once the request
// checks (request_checks.h) passed, so nothing below the edge reads a
// protobuf and the core is unit-tested without one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/engines/copy_engine.h"

namespace dmagather::server::service {

struct JoinSpec {
  std::string job_key;
  int world_size = 0;
  int rank = 0;
  uint64_t segment_token = 0;   // Also in the segment's header.
  std::string segment_ticket;   // The segment's fd-channel hand-over.
  std::string job_id;           // A multi-node job ("" = one node).
  int join_timeout_ms = 60000;  // Bounds a multi-node job's bootstrap.
  engines::DeviceRef device;
  bool resume = false;           // Taking the job back from an earlier daemon (control.proto).
  int reconnect_s = 0;           // How long the rank waits for a daemon to take the job back.
  std::vector<int> local_ranks;  // resume with a job id: the job's ranks on this node.
};

struct RegisterSpec {
  uint64_t session_id = 0;
  std::string session_secret;
  std::string memory_kind;  // kMemoryHostMemfd, kMemoryCudaIpc, ...
  uint64_t bytes = 0;
  std::string handle;                // Opaque export handle (kMemoryCudaIpc).
  std::string ticket;                // kMemoryHostMemfd: the buffer's hand-over.
  std::vector<std::string> tickets;  // kMemoryCudaVmm: the exported allocations'.
  uint32_t region_id = 0;            // A resumed session's old id for it (0: a new id).
};

}  // namespace dmagather::server::service
