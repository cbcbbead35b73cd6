#include "server/service/request_checks.h"

#include "abi/abi_v1.h"
#include "absl/strings/str_cat.h"
#include "common/memory_kinds.h"

namespace dmagather::server::service {

absl::Status CheckJoinRequest(const v1::JoinRequest& req) {
  if (req.job_key().empty() || req.job_key().size() > 128) {
    return absl::InvalidArgumentError("job_key must be 1..128 characters");
  }
  for (char c : req.job_key()) {
    if (c < 0x21 || c > 0x7e) return absl::InvalidArgumentError("job_key must be printable ASCII without spaces");
  }
  if (req.world_size() < 1 || req.world_size() > static_cast<int>(abi::kMaxRanksV1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", req.world_size(), " is outside 1..", abi::kMaxRanksV1));
  }
  if (req.rank() < 0 || req.rank() >= req.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", req.rank(), " is outside 0..", req.world_size() - 1));
  }
  return absl::OkStatus();
}

absl::Status CheckRegisterRequest(const v1::RegisterRequest& req) {
  if (req.memory_kind().empty()) return absl::InvalidArgumentError("register: memory_kind is empty");
  if (req.ticket().empty() && req.memory_kind() == common::kMemoryHostMemfd) {
    return absl::PermissionDeniedError("register: host memory needs the ticket of its fd-channel hand-over");
  }
  if (req.tickets().empty() && req.memory_kind() == common::kMemoryCudaVmm) {
    return absl::PermissionDeniedError("register: VMM device memory needs the tickets of its fd-channel hand-overs");
  }
  if (!req.tickets().empty() && !req.ticket().empty()) {
    return absl::InvalidArgumentError(
        "register: a buffer is handed over as one memfd ticket or device tickets, not both");
  }
  return absl::OkStatus();
}

}  // namespace dmagather::server::service
