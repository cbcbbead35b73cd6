// Pure checks of control-plane requests, before the registry acts on them
// (no lookups, no side effects): the parts of Join and Register that depend
// on the request alone. Separate from registry.cc so that they can be
// fuzzed (tests/fuzz/control_request_fuzz.cc) without a registry.
#pragma once

#include "absl/status/status.h"
#include "dmagather/v1/control.pb.h"

namespace dmagather::server::service {

// job_key 1..128 printable ASCII characters without spaces, world_size
// 1..kMaxRanksV1, 0 <= rank < world_size.
absl::Status CheckJoinRequest(const v1::JoinRequest& req);

// memory_kind set; host memory comes with its fd-channel ticket.
absl::Status CheckRegisterRequest(const v1::RegisterRequest& req);

}  // namespace dmagather::server::service
