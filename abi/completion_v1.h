// Completion block of a rank, v1: ready/done sequence flags and error
// records. The client (or its CUDA stream) writes ready_seq; the daemon writes
// done_seq once every op up to it has finished, successfully or not. Errors
// are recorded *before* done_seq moves past their op, so a rank never hangs
// and always finds the reason.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "abi/abi_v1.h"

namespace dmagather::abi {

struct ErrorRecordV1 {
  uint32_t stamp;                      // Stamp(sizeof(ErrorRecordV1), 1)
  uint32_t seq;                        // Op that failed.
  int32_t status;                      // dmagather_status_t
  int32_t failed_rank;                 // Rank at fault, -1 when none in particular.
  char message[kErrorMessageBytesV1];  // NUL-terminated sentence.
};

struct CompletionV1 {
  uint32_t stamp;  // Stamp(sizeof(CompletionV1), 1)
  uint32_t pad0[15];
  uint32_t ready_seq;  // Client side: inputs of ops <= ready_seq are ready.
  uint32_t pad1[15];
  uint32_t done_seq;      // Daemon side: ops <= done_seq are finished.
  uint32_t done_waiters;  // Client threads asleep on done_seq (futex).
  uint32_t pad2[14];
  uint32_t error_count;   // Error records written so far (slot = n % kErrorSlotsV1).
  uint32_t daemon_state;  // DaemonStateV1
  uint32_t pad3[14];
  ErrorRecordV1 errors[kErrorSlotsV1];
};

enum DaemonStateV1 : uint32_t {
  kDaemonServing = 0,
  kDaemonStopping = 1,  // SIGTERM: in-flight ops finish, new ones fail UNAVAILABLE.
};

static_assert(sizeof(ErrorRecordV1) == 256, "ErrorRecordV1 layout");
static_assert(offsetof(CompletionV1, ready_seq) == 64, "CompletionV1 layout");
static_assert(offsetof(CompletionV1, done_seq) == 128, "CompletionV1 layout");
static_assert(offsetof(CompletionV1, error_count) == 192, "CompletionV1 layout");
static_assert(offsetof(CompletionV1, errors) == 256, "CompletionV1 layout");

constexpr uint32_t kCompletionStampV1 = Stamp(sizeof(CompletionV1), 1);
constexpr uint32_t kErrorRecordStampV1 = Stamp(sizeof(ErrorRecordV1), 1);

}  // namespace dmagather::abi
