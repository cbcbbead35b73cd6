// HsaCopyQueue: an in-order queue of SDMA copies issued through HSA
// (hsa_amd_memory_async_copy_on_engine where the runtime has it, ROCm >=
// 5.7, on the engine SdmaEnginePlan chose for the link; else
// hsa_amd_memory_async_copy, ROCr's choice), with completions through HSA
// signals: each copy depends on the previous one's signal, so the queue
// keeps stream order; a mark (Mark) is complete when the signal of the
// last copy before it reaches 0. It counts bytes per engine (index 0..15;
// ROCr's choice counted apart).
//
// The HSA functions come in as a table (HsaCopyApi), resolved from
// libhsa-runtime64 by the hip runtime or filled by a test's fake, so the
// queue's logic (which engine each copy took, fallbacks, completion order,
// signal reuse) is unit-tested without ROCm (tests/server/engines/gpu).
// Not yet used by the hip runtime: its copies are hipMemcpyAsync
// (docs/AMD.md).
//
// Threads: one issuing thread (Copy, Mark) and one completion thread
// (Complete, Retire) per queue, as the engine's streams; counters are
// read from any thread.
#pragma once

#include <hsa/hsa.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dmagather::server::engines::gpu::hip {

// The HSA calls the queue makes. copy_on_engine is null where the runtime
// lacks it (ROCm < 5.7); its engine argument is an hsa_amd_sdma_engine_id_t
// bit (not declared by older headers).
struct HsaCopyApi {
  hsa_status_t (*signal_create)(hsa_signal_value_t, uint32_t, const hsa_agent_t*, hsa_signal_t*) = nullptr;
  hsa_status_t (*signal_destroy)(hsa_signal_t) = nullptr;
  void (*signal_store_relaxed)(hsa_signal_t, hsa_signal_value_t) = nullptr;
  hsa_signal_value_t (*signal_load_scacquire)(hsa_signal_t) = nullptr;
  hsa_status_t (*async_copy)(void*, hsa_agent_t, const void*, hsa_agent_t, size_t, uint32_t, const hsa_signal_t*,
                             hsa_signal_t) = nullptr;
  hsa_status_t (*copy_on_engine)(void*, hsa_agent_t, const void*, hsa_agent_t, size_t, uint32_t, const hsa_signal_t*,
                                 hsa_signal_t, uint32_t engine, bool force_copy_on_sdma) = nullptr;
};

class HsaCopyQueue {
 public:
  static constexpr int kEngines = 16;

  explicit HsaCopyQueue(const HsaCopyApi* api) : api_(api) {}
  ~HsaCopyQueue();
  HsaCopyQueue(const HsaCopyQueue&) = delete;
  HsaCopyQueue& operator=(const HsaCopyQueue&) = delete;

  // Enqueues dst <- src after every earlier copy of this queue. engine_bit:
  // one hsa_amd_sdma_engine_id_t bit, or 0 for ROCr's choice (also taken
  // when the runtime has no copy_on_engine). force_sdma: ROCr's
  // force_copy_on_sdma, for a copy within one GPU, which ROCr would
  // otherwise do with a blit kernel.
  absl::Status Copy(void* dst, hsa_agent_t dst_agent, const void* src, hsa_agent_t src_agent, size_t bytes,
                    uint32_t engine_bit, bool force_sdma = false) ABSL_LOCKS_EXCLUDED(mu_);
  // A mark after everything enqueued so far (0: nothing enqueued yet).
  uint64_t Mark() const { return issued_; }
  // True when every copy up to `mark` has completed (checked in issue
  // order); signals no copy depends on any more are kept for reuse. An
  // error when a signal reports one (< 0).
  absl::StatusOr<bool> Complete(uint64_t mark) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t bytes_on_engine(int index) const { return bytes_[index].load(std::memory_order_relaxed); }
  uint64_t bytes_rocr_choice() const { return bytes_rocr_.load(std::memory_order_relaxed); }
  size_t signals_created() const { return created_; }

 private:
  struct Pending {
    uint64_t seq;
    hsa_signal_t signal;
    bool done;
  };
  absl::StatusOr<hsa_signal_t> TakeSignal() ABSL_LOCKS_EXCLUDED(mu_);

  const HsaCopyApi* const api_;
  absl::Mutex mu_;                                    // Issuing vs completion thread.
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);  // Issue order.
  std::vector<hsa_signal_t> free_ ABSL_GUARDED_BY(mu_);
  uint64_t issued_ = 0;    // Written by the issuing thread under mu_.
  size_t created_ = 0;     // Issuing thread.
  bool has_last_ = false;  // Issuing thread (written under mu_).
  hsa_signal_t last_{};    // The newest copy's signal: the next copy's dependency.
  std::array<std::atomic<uint64_t>, kEngines> bytes_{};
  std::atomic<uint64_t> bytes_rocr_{0};
};

}  // namespace dmagather::server::engines::gpu::hip
