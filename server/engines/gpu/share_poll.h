// EndSharesInLaneOrder: one pass of a device's completion thread over the
// shares it holds, in the order they were enqueued. Each share's end is
// queried; those seen done are ended - but a share whose lane has an
// earlier share not seen done in this pass waits for the next pass, even
// if its own end reads done. A lane is one job's streams on the device,
// and every share's end is recorded on the lane's stream 0 after the other
// streams joined it, so a lane's ends complete in order; reading them one
// after the other can still see a later one done and an earlier one not
// (the stream moved between the two reads). Ending them in the order of their lane keeps every job's ops
// ending in order on each device (hence OnEngineDone in order per job,
// docs/CUDA.md "Completion"). It holds back only the lane's own later
// shares - the same job's - never another lane's: a share parked on its
// job's ready flags delays no other job.
//
// S has a `lane` member (any pointer). `query(s)` gives the share's state:
// true (done), false (not yet) or an error, which ends it with that error.
// `end(s, status)` ends it; it is removed from `pending` first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dmagather::server::engines::gpu {

// Returns how many shares it ended. `held` is scratch (the lanes with a
// share not seen done in this pass), kept by the caller to reuse its
// storage.
template <typename S, typename Query, typename End>
size_t EndSharesInLaneOrder(std::vector<S>& pending, std::vector<const void*>& held, const Query& query,
                            const End& end) {
  held.clear();
  size_t ended = 0;
  for (size_t i = 0; i < pending.size();) {
    const S s = pending[i];
    const void* lane = s.lane;
    if (std::find(held.begin(), held.end(), lane) != held.end()) {
      ++i;
      continue;
    }
    absl::StatusOr<bool> done = query(s);
    if (done.ok() && !*done) {
      held.push_back(lane);
      ++i;
      continue;
    }
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    end(s, done.ok() ? absl::OkStatus() : done.status());
    ++ended;
  }
  return ended;
}

}  // namespace dmagather::server::engines::gpu
