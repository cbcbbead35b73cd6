// ReadyGate: see ready_gate.h.
#include "server/engines/gpu/ready_gate.h"

#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <vector>

#include "server/engines/gpu/backoff.h"

namespace dmagather::server::engines::gpu {

ReadyGate::ReadyGate(common::Clock& clock, uint64_t awake_ns, size_t slots, OpIssuer& issuer)
    : clock_(clock), awake_ns_(awake_ns), slots_(slots), issuer_(issuer) {}

ReadyGate::~ReadyGate() { Stop(); }

void ReadyGate::Start() {
  thread_ = std::thread([this] { Loop(); });
}

bool ReadyGate::Submit(EngineOp* op) {
  {
    absl::MutexLock lock(&mu_);
    if (!per_job_.contains(op->job_id) && !abandon_.load() && issuer_.MayIssue(*op)) {
      issuer_.Issue(op);
      return false;
    }
    while (ops_.size() >= slots_) changed_.Wait(&mu_);  // Back-pressure.
    Push(op);
  }
  changed_.SignalAll();
  return true;
}

bool ReadyGate::Empty() {
  absl::MutexLock lock(&mu_);
  return ops_.empty();
}

void ReadyGate::Stop() {
  stopping_.store(true);
  { absl::MutexLock lock(&mu_); }  // The thread is in Wait or sees stopping_.
  changed_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void ReadyGate::Push(EngineOp* op) {
  ops_.push_back(op);
  ++per_job_[op->job_id];
  size_.store(ops_.size(), std::memory_order_release);
}

EngineOp* ReadyGate::Remove(size_t index) {
  EngineOp* op = ops_[index];
  ops_.erase(ops_.begin() + static_cast<std::ptrdiff_t>(index));
  auto it = per_job_.find(op->job_id);
  if (--it->second == 0) per_job_.erase(it);
  size_.store(ops_.size(), std::memory_order_release);
  return op;
}

void ReadyGate::Loop() {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  pthread_setname_np(pthread_self(), "dmag-gate");
  absl::MutexLock lock(&mu_);
  uint64_t t0 = 0;
  uint64_t last_work = clock_.NowNs();
  std::vector<uint64_t> held;  // Jobs whose first gated op may not go yet.
  for (;;) {
    bool slept = false;
    while (ops_.empty() && !stopping_.load()) {
      if (clock_.NowNs() - last_work < awake_ns_) {  // A job is active: poll, unlocked.
        mu_.Unlock();
        while (size_.load(std::memory_order_acquire) == 0 && !stopping_.load() &&
               clock_.NowNs() - last_work < awake_ns_) {
          sched_yield();
        }
        mu_.Lock();
        continue;
      }
      slept = true;
      sleeping_ = true;
      changed_.Wait(&mu_);
      sleeping_ = false;
    }
    if (slept && !ops_.empty()) wakeups_.fetch_add(1, std::memory_order_relaxed);
    if (ops_.empty()) return;  // Stopping and drained.
    if (abandon_.load()) {
      EngineOp* op = Remove(0);
      changed_.SignalAll();
      mu_.Unlock();
      issuer_.Fail(op, absl::UnavailableError("dmagatherd stopped while the op waited for its ranks' ready flags"));
      mu_.Lock();
      continue;
    }
    // The first op of each job, in gate order: the first that may go, goes.
    held.clear();
    size_t i = 0;
    for (; i < ops_.size(); ++i) {
      const uint64_t job = ops_[i]->job_id;
      if (std::find(held.begin(), held.end(), job) != held.end()) continue;
      if (issuer_.MayIssue(*ops_[i])) break;
      held.push_back(job);
    }
    if (i < ops_.size()) {
      EngineOp* op = Remove(i);
      changed_.SignalAll();
      issuer_.Issue(op);
      t0 = 0;
      last_work = clock_.NowNs();
      continue;
    }
    if (t0 == 0) t0 = clock_.NowNs();
    mu_.Unlock();
    Backoff(clock_.NowNs() - t0);
    mu_.Lock();
  }
}

}  // namespace dmagather::server::engines::gpu
