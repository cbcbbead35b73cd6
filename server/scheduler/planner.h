// Planner: checks that the ranks of an op agree, then turns their validated
// parts into a copy plan (for every item, every rank's send into every
// rank's output; the in-place self shard skipped).
//
// Threads: the ingress thread, once per matched op. No allocation once the
// op slot's vectors have grown to the job's largest op.
#pragma once

#include "absl/status/status.h"
#include "server/scheduler/op.h"

namespace dmagather::server::scheduler {

// OK, or InvalidArgument naming the ranks that disagree (items, op, count,
// dtype).
absl::Status CheckAgreement(const Op& op);

// Fills op->plan (cleared first). Requires CheckAgreement(op).ok().
void BuildPlan(Op* op);

}  // namespace dmagather::server::scheduler
