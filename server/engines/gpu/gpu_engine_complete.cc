// GpuEngine (gpu_engine.h): the completion threads - each device's FIFO of
// shares, polled share by share (a share parked on its job's flags delays no
// other) and ended in their lane's order (share_poll.h), and the end of an
// op once its last share has ended.
#include <glog/logging.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>

#include <string>
#include <vector>

#include "common/clock.h"
#include "server/engines/gpu/backoff.h"
#include "server/engines/gpu/gpu_engine.h"
#include "server/engines/gpu/share_poll.h"

namespace dmagather::server::engines::gpu {

GpuEngine::OpTrack* GpuEngine::TakeTrack() {
  absl::MutexLock lock(&tracks_mu_);
  while (free_tracks_.empty()) tracks_cv_.Wait(&tracks_mu_);
  OpTrack* t = free_tracks_.back();
  free_tracks_.pop_back();
  return t;
}

void GpuEngine::CloseShare(OpTrack* t, const absl::Status& st) {
  if (!st.ok()) {
    absl::MutexLock lock(&t->mu);
    t->status.Update(st);
  }
  if (t->open.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  EngineOp* op = t->op;
  absl::Status status;
  {
    absl::MutexLock lock(&t->mu);
    status = std::move(t->status);
    t->status = absl::OkStatus();
  }
  JobLoad* load = t->load;
  const bool waits_ahead = t->waits_ahead;
  const bool issue_failed = t->issue_failed.exchange(false);
  t->load = nullptr;
  {
    absl::MutexLock lock(&tracks_mu_);
    free_tracks_.push_back(t);
  }
  tracks_cv_.Signal();
  const uint64_t t_seen = clock_.NowNs();
  op->OnEngineDone(status);
  complete_ns_.Record(clock_.NowNs() - t_seen);
  // After OnEngineDone: an op that failed at issue has its error record
  // written now. The gate polls the load.
  JobLoads::End(load, waits_ahead, issue_failed);
}

void GpuEngine::CompletionLoop(int device) {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // 1 us: short sleeps stay short.
  pthread_setname_np(pthread_self(), ("dmag-done-" + std::to_string(device)).c_str());  // In stacks of a hang.
  runtime_->BindThread(device);
  Handoff<Share>& q = completions_[device]->shares;
  // The shares taken in hand and not seen ended yet, polled each on its
  // own (a share parked on its job's ready flags must not hold up another
  // job's), ended in the order of their lane (share_poll.h; docs/CUDA.md,
  // "Locks and waits" and "Completion").
  std::vector<Share> pending;
  pending.reserve(64);
  std::vector<const void*> held;
  const auto query = [this](const Share& sh) -> absl::StatusOr<bool> {
    absl::StatusOr<bool> done = runtime_->QueryEvent(sh.end);
    if (done.ok() && !*done && abandon_.load(std::memory_order_relaxed)) {
      return absl::UnavailableError("dmagatherd stopped while the op's copies were still queued");
    }
    return done;
  };
  const auto end = [&](const Share& sh, const absl::Status& st) {
    {
      absl::MutexLock lock(&pool_mu_);
      free_end_[device].push_back(sh.end);
    }
    sh.lane->open.fetch_sub(1, std::memory_order_acq_rel);  // The last touch of the lane.
    CloseShare(sh.track, st);
    q.Done();
  };
  uint64_t t0 = 0;
  for (;;) {
    // Ops come in bursts: with nothing in hand, wait (a while polling, so
    // that the issuer need not wake this thread, then asleep).
    if (pending.empty() && !q.Wait()) return;  // Stopped with nothing left.
    q.Take(&pending, kShareSlots);
    const bool progress = EndSharesInLaneOrder(pending, held, query, end) > 0;
    if (pending.empty() || progress) {
      t0 = 0;
    } else {
      if (t0 == 0) t0 = clock_.NowNs();
      Backoff(clock_.NowNs() - t0);
    }
  }
}

}  // namespace dmagather::server::engines::gpu
