// Session: one rank of one job, from Join to the end of its Join stream.
// Owns the mapping of the rank's shm segment (request ring + completion
// block) and the regions the rank registered.
//
// Threads: created and ended by gRPC threads (Join/Leave/Register); the
// ring and next_seq are read only by the ingress thread; completion fields
// only under the owning job's completion lock.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "abi/ring_v1.h"
#include "common/api_names.h"
#include "common/latency_histogram.h"
#include "common/shm.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::ingress {

using common::kNumApiStatus;

struct RankCounters {
  std::atomic<uint64_t> ops{0};
  std::atomic<uint64_t> bytes{0};
  std::array<std::atomic<uint64_t>, common::kNumApiStatus> errors{};
  common::LatencyHistogram latency;  // Descriptor submitted -> done flag written.
};

class Session {
 public:
  enum class State : int { kJoining = 0, kActive = 1, kLeft = 2, kGone = 3 };

  // Maps the segment `name`, checks its header and token.
  static absl::StatusOr<std::shared_ptr<Session>> Open(uint64_t id, int rank, int pid,
                                                       const std::string& name, uint64_t token);

  uint64_t id() const { return id_; }
  int rank() const { return rank_; }
  int pid() const { return pid_; }
  uid_t uid() const { return uid_; }
  const abi::SegmentViewV1& view() const { return view_; }

  State state() const { return static_cast<State>(state_.load(std::memory_order_acquire)); }
  void set_state(State s) { state_.store(static_cast<int>(s), std::memory_order_release); }
  const char* state_name() const;

  // Regions (gRPC threads add/remove; the ingress thread resolves).
  absl::Status AddRegion(uint32_t region_id, std::shared_ptr<engines::ImportedRegion> region);
  absl::Status RemoveRegion(uint32_t region_id);
  // Daemon-side address of [offset, offset+bytes) of a region, checked.
  // The ingress thread counts the op in `inflight` before resolving, and
  // RemoveRegion refuses while inflight != 0, so a region never goes away
  // under an op.
  absl::StatusOr<char*> Resolve(uint32_t region_id, uint64_t offset, uint64_t bytes,
                                const char* what) const;
  uint64_t registered_bytes() const;
  int num_regions() const;

  // Ops consumed from the ring and not yet published done.
  std::atomic<uint32_t> inflight{0};

  // Unmaps the segment and the regions (after the rank is gone and nothing
  // is in flight). Safe to call more than once.
  void ReleaseMemory();
  bool memory_released() const { return released_.load(std::memory_order_acquire); }

  // Set once at Join, before the session is added to its job.
  int cuda_device = -1;            // The rank's CUDA device (-1: none).
  uint64_t ready_flag_device = 0;  // Engine-visible address of ready_seq (0: not used).
  bool flags_attached = false;     // The engine has the completion block registered.
  // The page-aligned completion block (what the engine registers).
  void* flag_pages() const { return view_.completion; }
  static constexpr uint64_t kFlagPagesBytes = abi::SegmentLayoutV1::kRingOffset - abi::SegmentLayoutV1::kCompletionOffset;

  // Ingress thread only: the next sequence number and the ring's consumer
  // index (mirrored to the shared `head` for the client, never read back).
  uint32_t next_seq = 1;
  uint64_t ring_head = 0;

  // Under the job's completion lock: in-order publishing of done flags.
  uint32_t next_publish = 1;
  std::vector<uint32_t> finished;  // finished[seq % slots] == seq once done.

  RankCounters counters;

 private:
  Session(uint64_t id, int rank, int pid, common::ShmMapping segment);

  const uint64_t id_;
  const int rank_;
  const int pid_;
  uid_t uid_;
  common::ShmMapping segment_;
  abi::SegmentViewV1 view_;
  std::atomic<int> state_{0};
  std::atomic<bool> released_{false};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, std::shared_ptr<engines::ImportedRegion>> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t registered_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dmagather::server::ingress
