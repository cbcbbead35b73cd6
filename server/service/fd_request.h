// The fd channel's check of one received message (abi/fd_channel_v1.h),
// apart from the socket: what arrived (bytes, recvmsg flags, how many
// descriptors came with it) either is a request the channel serves, or gets
// refused with a sentence. Pure (no I/O), so it is fuzzed on its own
// (tests/fuzz/fd_request_fuzz.cc); the descriptor's own check (a sealed
// memfd) stays in FdChannel::Serve.
#pragma once

#include <cstddef>

#include "abi/fd_channel_v1.h"
#include "absl/status/statusor.h"

namespace dmagather::server::service {

// `data`/`n`: what recvmsg returned (n > 0); `msg_flags`: its msg_flags
// (MSG_TRUNC, MSG_CTRUNC); `num_fds`: descriptors that came in SCM_RIGHTS.
// OK: a ping or a telemetry-ticket request without descriptors, or a
// segment/buffer hand-over with exactly one descriptor (a segment of
// SegmentLayoutV1::kBytes).
absl::StatusOr<abi::FdRequestV1> ParseFdRequest(const void* data, size_t n, int msg_flags, size_t num_fds);

}  // namespace dmagather::server::service
