#include "server/service/fd_request.h"

#include <sys/socket.h>

#include <cstring>

#include "abi/device_memory_v1.h"
#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dmagather::server::service {

absl::StatusOr<abi::FdRequestV1> ParseFdRequest(const void* data, size_t n, int msg_flags, size_t num_fds) {
  abi::FdRequestV1 req{};
  if ((msg_flags & MSG_TRUNC) != 0 || n != sizeof(req)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd channel: a request is exactly ", sizeof(req), " bytes (FdRequestV1)"));
  }
  if ((msg_flags & MSG_CTRUNC) != 0) {
    return absl::InvalidArgumentError("fd channel: too many descriptors (one per request)");
  }
  std::memcpy(&req, data, sizeof(req));
  if (req.stamp != abi::kFdRequestStampV1 || req.magic != abi::kMagic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fd channel: not an FdRequestV1 (stamp 0x%08x, expected 0x%08x): client and daemon versions differ", req.stamp,
        abi::kFdRequestStampV1));
  }
  if (req.kind == abi::kFdPing) {
    if (num_fds != 0) return absl::InvalidArgumentError("fd channel: a ping carries no descriptor");
    return req;
  }
  if (req.kind == abi::kFdTelemetry) {
    if (num_fds != 0) return absl::InvalidArgumentError("fd channel: a telemetry request carries no descriptor");
    return req;
  }
  if (req.kind == abi::kFdDeviceMemory) {
    if (num_fds < 1 || num_fds > abi::kMaxFdsPerRequestV1) {
      return absl::InvalidArgumentError(absl::StrCat("fd channel: a device-memory hand-over carries 1..",
                                                     abi::kMaxFdsPerRequestV1, " descriptors, this one had ", num_fds));
    }
    if (req.bytes == 0) return absl::InvalidArgumentError("fd channel: a device-memory hand-over of 0 bytes");
    return req;
  }
  if (req.kind != abi::kFdSegment && req.kind != abi::kFdBuffer) {
    return absl::InvalidArgumentError(absl::StrCat("fd channel: unknown request kind ", req.kind));
  }
  if (num_fds != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd channel: a hand-over carries exactly one descriptor, this one had ", num_fds));
  }
  if (req.kind == abi::kFdSegment && req.bytes != abi::SegmentLayoutV1::kBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd channel: a rank segment is ", abi::SegmentLayoutV1::kBytes, " bytes, not ", req.bytes));
  }
  return req;
}

}  // namespace dmagather::server::service
