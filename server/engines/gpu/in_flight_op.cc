// InFlightOp: see in_flight_op.h.
#include "server/engines/gpu/in_flight_op.h"

#include <utility>

#include "server/engines/gpu/gpu_rank.h"

namespace dmagather::server::engines::gpu {

void InFlightOp::Begin(EngineOp* op, JobLoads::Load* load, bool waits_ahead, const absl::Status& routed, int devices) {
  op_ = op;
  load_ = load;
  waits_ahead_ = waits_ahead;
  issue_order_ = 0;
  finisher_ = -1;
  {
    absl::MutexLock lock(&mu_);
    status_ = routed;
  }
  open_.store(1, std::memory_order_relaxed);
  unenqueued_.store(0, std::memory_order_relaxed);
  ends_.assign(devices, nullptr);
}

int InFlightOp::ChooseFinisher(const std::vector<char>& involved, bool device_writes, JobLoads& loads) {
  finisher_ = -1;
  if (!op_->gpu_done || !device_writes) return finisher_;
  const int n = static_cast<int>(involved.size());
  int first = 0;
  while (first < n && !involved[first]) ++first;
  bool flags = true;
  for (const EngineRank* r : op_->ranks) flags &= r == nullptr || AsGpu(r)->done_flag() != 0;
  if (!flags || first >= n) return finisher_;
  finisher_ = loads.Finisher(load_, first);
  return finisher_;
}

void InFlightOp::OpenShares(int shares, uint64_t issue_order) {
  open_.fetch_add(shares, std::memory_order_relaxed);
  unenqueued_.store(shares, std::memory_order_relaxed);
  issue_order_ = issue_order;
}

void InFlightOp::ShareFailed(const absl::Status& st) {
  {
    absl::MutexLock lock(&mu_);  // The finisher must see it failed before it counts as enqueued.
    status_.Update(st);
  }
  if (!failed_at_issue_.exchange(true)) JobLoads::FailedAtIssue(load_);
}

bool InFlightOp::failed() {
  absl::MutexLock lock(&mu_);
  return !status_.ok();
}

bool InFlightOp::ShareEnqueued() {
  return issue_order_ != 0 && unenqueued_.fetch_sub(1, std::memory_order_acq_rel) == 1;
}

bool InFlightOp::Close(const absl::Status& st) {
  if (!st.ok()) {
    absl::MutexLock lock(&mu_);
    status_.Update(st);
  }
  return open_.fetch_sub(1, std::memory_order_acq_rel) == 1;
}

InFlightOp::Ending InFlightOp::TakeEnding() {
  Ending e;
  e.op = op_;
  {
    absl::MutexLock lock(&mu_);
    e.status = std::move(status_);
    status_ = absl::OkStatus();
  }
  e.load = load_;
  e.waits_ahead = waits_ahead_;
  e.failed_at_issue = failed_at_issue_.exchange(false);
  load_ = nullptr;
  op_ = nullptr;
  return e;
}

}  // namespace dmagather::server::engines::gpu
