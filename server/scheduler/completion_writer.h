// The completion stage's writes (Job::FinishOp is the stage: it decides, per
// rank and in sequence order, what to publish): error records and done flags
// into a rank's completion block, and the wake of a client asleep on it. An
// error record is always written before done_seq moves past its op.
//
// Threads: called by Job::FinishOp (under the job's completion lock) from an
// engine thread or the ingress thread.
#pragma once

#include <cstdint>

#include "abi/completion_v1.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dmagather::server::scheduler {

void RecordError(abi::CompletionV1* c, uint32_t seq, int32_t api_status, int32_t failed_rank,
                 absl::string_view message);

// Moves done_seq to `seq` unless it is there or beyond already (a device
// wrote it: EngineOp::gpu_done); false then. Never moves it backwards.
bool PublishDone(abi::CompletionV1* c, uint32_t seq);

}  // namespace dmagather::server::scheduler
