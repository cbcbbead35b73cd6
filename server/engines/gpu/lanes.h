// Lanes: one device's streams, per job. A job's ops on a device go out on
// the job's own lane (`streams` streams, a gate event recorded on stream 0
// after the ready waits, a join event per stream), so a ready wait parked
// for one job never has another job's commands queued behind it: ranks may
// order two jobs' ops either way round (docs/CUDA.md, "Locks and waits",
// rule 4).
//
// A job takes its lane at its first share on the device: its own, else an
// idle one (no share open on it: everything enqueued there has ended), else
// a new one; idle lanes beyond `kept` are destroyed when a new one is made.
//
// Threads: Take and the destructor on the thread that issues the device's
// shares (one at a time); Lane::open is also decremented by the device's
// completion thread once a share's end is seen (its last touch of the lane).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu {

class LaneSet {
 public:
  struct Lane {
    uint64_t job = 0;
    std::vector<GpuStream> streams;
    GpuEvent gate = nullptr;      // Recorded on streams[0] after the ready waits.
    std::vector<GpuEvent> joins;  // Per stream: its copies, joined into streams[0].
    std::atomic<int> open{0};     // Shares enqueued on it whose end has not been seen.
  };

  LaneSet(GpuRuntime* runtime, int device, int streams, size_t kept)
      : runtime_(runtime), device_(device), streams_(streams), kept_(kept) {}
  ~LaneSet();
  LaneSet(const LaneSet&) = delete;
  LaneSet& operator=(const LaneSet&) = delete;

  // The job's lane (made or handed over as above); the same until the next Take.
  absl::StatusOr<Lane*> Take(uint64_t job);
  size_t size() const { return lanes_.size(); }

 private:
  void Destroy(Lane& lane);

  GpuRuntime* const runtime_;
  const int device_;
  const int streams_;
  const size_t kept_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  Lane* last_ = nullptr;  // The lane the last Take returned.
};

}  // namespace dmagather::server::engines::gpu
