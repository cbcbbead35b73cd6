// GpuEngine (gpu_engine.h): the issue path's ordering rules, which keep it
// free of deadlock (docs/CUDA.md, "Locks and waits: why issue cannot
// deadlock"): the device-order locks around copy calls, the lockstep of
// ops across devices, and the bound on ops in flight while a ready wait is
// parked. Called on the ingress, gate and issuing threads as the rest of
// the per-op path (gpu_engine_issue.cc).
#include <sched.h>
#include <unistd.h>

#include <optional>

#include "common/clock.h"
#include "common/cpu_relax.h"
#include "server/engines/gpu/backoff.h"
#include "server/engines/gpu/gpu_engine.h"

namespace dmagather::server::engines::gpu {

// With device waits: any op while fewer than max_waits_ahead are in flight;
// beyond that only an op whose flags are met, and only while no wait is
// parked (nothing it could queue behind). docs/CUDA.md, "Locks and waits".
bool GpuEngine::MayIssue(const EngineOp& op) {
  if (!runtime_->device_waits()) return RanksReady(op);
  return loads_.MayIssue(op.job_id, RanksReady(op), options_.max_waits_ahead);
}

// Ops go out in lockstep across devices: no device enqueues anything of
// op n (its ready waits first) before every device has enqueued all of op
// n - 1, so no device's queue holds an op whose predecessor some other
// device has yet to issue. One thread issuing every device keeps it by
// itself; with an issuer per device each waits here, holding nothing.
void GpuEngine::WaitForEarlierOps(const OpTrack* t) {
  if (t->issue_order <= 1) return;
  const uint64_t t0 = clock_.NowNs();
  while (enqueued_through_.load(std::memory_order_acquire) < t->issue_order - 1 &&
         !abandon_.load(std::memory_order_relaxed)) {
    Backoff(clock_.NowNs() - t0);
  }
}

void GpuEngine::ShareEnqueued(OpTrack* t) {
  if (t->issue_order != 0 && t->unenqueued.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    enqueued_through_.store(t->issue_order, std::memory_order_release);
  }
}

// A copy call under the order locks of every device whose memory it
// touches; one that also destroys graphs over released memory under every
// device's (checked holding the device's own lock: releases are made under
// all of them, so none can come in between).
absl::Status GpuEngine::CopyInOrder(Device& dev, GpuStream stream, const CopyCmd* chunks, size_t n, bool sole) {
  DeviceOrder::DeviceSet touched = DeviceOrder::Of(dev.ordinal);
  for (size_t i = 0; i < n; ++i)
    touched |= DeviceOrder::Of(chunks[i].src_device) | DeviceOrder::Of(chunks[i].dst_device);
  std::optional<DeviceOrder::Hold> hold(std::in_place, *order_, touched);
  if (touched != order_->all() && runtime_->CopyTouchesOthers(dev.ordinal)) {
    hold.reset();
    hold.emplace(*order_, order_->all());
  }
  return runtime_->Copy(dev.ordinal, stream, chunks, n, sole);
}

}  // namespace dmagather::server::engines::gpu
