// Op: one AllGather of one job (one sequence number), from the first rank's
// descriptor to the last done flag. Lives in a fixed slot of its job
// (seq % ring slots) and is reused, so steady state allocates nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::scheduler {

class Job;

// What one rank asked for, validated against that rank's own session.
struct RankPart {
  bool arrived = false;
  absl::Status status;  // Validation result of this rank's descriptor.
  uint32_t opcode = 0;
  uint32_t dtype = 0;
  uint64_t count = 0;
  uint64_t submit_ns = 0;
  const char* send = nullptr;
  std::vector<char*> recv;  // 1 (flat) or world_size (list) daemon-side pointers.
};

class Op : public engines::EngineOp {
 public:
  enum State : int { kFree = 0, kWaiting = 1, kRunning = 2 };

  void OnEngineDone(absl::Status status) override;

  Job* job = nullptr;
  std::atomic<int> state{kFree};
  uint32_t seq = 0;
  int arrived = 0;
  uint64_t first_arrival_ns = 0;
  uint64_t matched_ns = 0;
  uint64_t enqueued_ns = 0;
  std::vector<RankPart> parts;  // world_size entries.
};

}  // namespace dmagather::server::scheduler
