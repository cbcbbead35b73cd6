// The fd channel, v1: how a client hands file descriptors to dmagatherd.
//
// A SOCK_SEQPACKET Unix socket next to the gRPC one (`<socket>.fd`, same
// mode). One connection carries one exchange: the client sends one
// FdRequestV1 (exactly sizeof bytes) with the descriptor in SCM_RIGHTS
// (none for kFdPing), the daemon answers one FdReplyV1 and closes. The
// daemon takes the caller's uid, gid and pid from the kernel (SO_PEERCRED),
// checks the descriptor (a memfd sealed at least against shrinking, at least
// `bytes` long) and answers a ticket: 128 random bits, single use, valid for
// a few seconds, bound to (uid, pid, kind, descriptor, bytes). The client
// then presents the ticket in gRPC Join (kFdSegment) or Register
// (kFdBuffer); the daemon maps what that ticket holds and nothing else.
// A kFdSegment reply carries the daemon's doorbell page (a sealed memfd) in
// SCM_RIGHTS.
#pragma once

#include <stdint.h>

#include "abi/abi_v1.h"

namespace dmagather::abi {

enum FdKindV1 : uint32_t {
  kFdSegment = 1,    // A rank segment (SegmentLayoutV1::kBytes); the reply brings the doorbell.
  kFdBuffer = 2,     // A host buffer to register.
  kFdPing = 3,       // No descriptor; health self-check.
  kFdTelemetry = 4,  // No descriptor; a ticket that proves the caller's uid/groups to Telemetry.Stats/Metrics.
  // Added with the cuda_vmm memory kind: 1..kMaxFdsPerRequestV1 (abi/device_memory_v1.h) exported
  // device-memory handles (not memfds; the engine validates them by
  // importing), one ticket for all; `bytes` is the sum of their chunks.
  kFdDeviceMemory = 5,
};

struct FdRequestV1 {
  uint32_t stamp;  // kFdRequestStampV1
  uint32_t magic;  // kMagic
  uint32_t kind;   // FdKindV1
  uint32_t reserved;
  uint64_t bytes;  // Bytes that will be mapped (from offset 0).
  uint64_t pad[5];
};

constexpr uint32_t kFdTicketBytesV1 = 16;
constexpr uint32_t kFdMessageBytesV1 = 240;

struct FdReplyV1 {
  uint32_t stamp;  // kFdReplyStampV1
  uint32_t magic;  // kMagic
  int32_t status;  // absl::StatusCode (0 = OK)
  uint32_t reserved;
  uint8_t ticket[kFdTicketBytesV1];  // When status == 0 (kFdPing: zero).
  char message[kFdMessageBytesV1];   // NUL-terminated sentence when status != 0.
};

static_assert(sizeof(FdRequestV1) == 64, "FdRequestV1 layout");
static_assert(sizeof(FdReplyV1) == 272, "FdReplyV1 layout");

constexpr uint32_t kFdRequestStampV1 = Stamp(sizeof(FdRequestV1), 1);
constexpr uint32_t kFdReplyStampV1 = Stamp(sizeof(FdReplyV1), 1);

}  // namespace dmagather::abi
