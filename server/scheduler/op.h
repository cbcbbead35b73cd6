// Op: one collective of one job (one sequence number: an all-gather, an
// all-to-all, a reduce-scatter's copies), from the first rank's
// descriptor to the last done flag. Lives in a fixed slot of its job
// (seq % ring slots) and is reused, so steady state allocates nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/engines/copy_engine.h"
#include "server/scheduler/request.h"

namespace dmagather::server::scheduler {

class Job;

class Op : public engines::EngineOp {
 public:
  enum State : int { kFree = 0, kWaiting = 1, kRunning = 2 };

  void OnEngineDone(absl::Status status) override;
  // One of the op's parts ended (the engine's copies; on a multi-node job
  // also the ring). The first error wins; the last part finishes the op.
  void PartDone(const absl::Status& status, int failed_rank) ABSL_LOCKS_EXCLUDED(part_mu);
  // "allgather #12", "reduce_scatter(sum) #13": the op as errors name it
  // (from any rank's items; "op #N" when no rank's are in).
  std::string Label() const {
    for (const RankPart& p : parts) {
      if (!p.items.empty()) return absl::StrCat(OpKindName(p.items[0].kind), " #", seq);
    }
    return absl::StrCat("op #", seq);
  }

  Job* job = nullptr;
  std::atomic<int> state{kFree};
  int arrived = 0;  // Ranks whose every item has been read.
  uint64_t first_arrival_ns = 0;
  uint64_t matched_ns = 0;
  std::vector<RankPart> parts;  // world_size entries (a multi-node job fills its local ranks' only).
  std::atomic<int> open_parts{0};
  absl::Mutex part_mu;
  absl::Status part_status ABSL_GUARDED_BY(part_mu);  // The parts' first error.
  int part_failed_rank ABSL_GUARDED_BY(part_mu) = -1;
};

}  // namespace dmagather::server::scheduler
