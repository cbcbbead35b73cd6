// Job: taking a job back from its ranks - after a daemon restart (every
// job of the node) and after a multi-node job's ring lost a node (that job,
// on every node): StartAfter, the captured ops defined again, the expected
// local ranks of a multi-node job coming back, and the hand-back of a job
// whose ring broke.
#include <algorithm>

#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "common/api_names.h"
#include "server/scheduler/completion_writer.h"
#include "server/scheduler/job.h"

namespace dmagather::server::scheduler {

void Job::StartAfter(uint32_t done) {
  absl::MutexLock lock(&completion_mu_);
  if (started_.load(std::memory_order_acquire)) return;
  for (const auto& k : ranks_) {
    if (k == nullptr || k->completion() == nullptr) continue;
    k->next_publish = done + 1;
    // Error records of the ops up to `done` are in place already.
    if (int32_t(abi::LoadAcquire(&k->completion()->done_seq) - done) < 0) PublishDone(k->completion(), done);
  }
  start_after_ = done;
  started_.store(true, std::memory_order_release);
}

void Job::AddCapturedDefinition(int rank, uint32_t seq, RankPart part) {
  absl::MutexLock lock(&mu_);
  std::vector<RankPart>& parts = resumed_defs_[seq];
  parts.resize(world_size_);
  parts[rank] = std::move(part);
}

Job::Rearmed Job::RearmCaptured(uint32_t done, const engines::CopyEngine& engine) {
  std::map<uint32_t, std::vector<RankPart>> defs;
  {
    absl::MutexLock lock(&mu_);
    defs.swap(resumed_defs_);
  }
  Rearmed out;
  for (auto& [seq, parts] : defs) {
    if (int32_t(seq - done) > 0) continue;  // Not done anywhere: its descriptors are read again.
    bool whole = true;
    for (const RankPart& p : parts) whole &= p.graph_slot >= 0 && p.status.ok() && !p.items.empty();
    // A definition some rank no longer holds (its capture failed, or its
    // graph went and the slot was taken again) is dropped; a rank that
    // replays it anyway waits, as for any collective the others stop calling.
    if (!whole) {
      ++out.dropped;
      continue;
    }
    for (RankPart& p : parts) p.arrived = true;  // Every rank's items are here (BuildPlan).
    Op op;
    op.job = this;
    op.seq = seq;
    op.job_id = slots_[0].job_id;
    op.ranks = slots_[0].ranks;
    op.parts = std::move(parts);
    if (!DefinePersistent(&op).ok()) {
      ++out.dropped;
      continue;
    }
    ++out.ops;
    PersistentOp* p = persistent_.back().get();
    if (engine.host_addressable()) {
      // A daemon that came back on the host backend cannot replay graphs.
      p->Release(common::ToApiStatus(absl::FailedPreconditionError("captured ops need a GPU backend")));
      ++out.released;
      continue;
    }
    const PersistentOp::Resumed r = p->TakeBack();
    out.run_again += r == PersistentOp::Resumed::kRunAgain ? 1 : 0;
    out.released += r == PersistentOp::Resumed::kReleased ? 1 : 0;
  }
  return out;
}

absl::Status Job::ExpectLocal(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  if (ranks.empty() || ranks.front() < 0 || ranks.back() >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("job '", key_,
                                                   "': taking a multi-node job back needs its ranks on "
                                                   "this node, each within the world size ",
                                                   world_size_));
  }
  absl::MutexLock lock(&mu_);
  if (!expected_local_.empty() && expected_local_ != ranks) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", key_, "': the ranks coming back disagree on which of them were on this node"));
  }
  expected_local_ = std::move(ranks);
  local_count_.store(int(expected_local_.size()), std::memory_order_release);
  return absl::OkStatus();
}

bool Job::local_joined() const {
  absl::MutexLock lock(&mu_);
  return !expected_local_.empty() && joined_ == int(expected_local_.size());
}

void Job::NoteReconnect(int seconds) {
  // The shortest wait of the job's ranks on this node.
  int cur = min_reconnect_s_.load(std::memory_order_acquire);
  while ((cur < 0 || seconds < cur) && !min_reconnect_s_.compare_exchange_weak(cur, seconds)) {
  }
}

bool Job::HandBack(const absl::Status& why) {
  if (!multi_node_ || min_reconnect_s_.load(std::memory_order_acquire) <= 0 || has_persistent()) return false;
  {
    absl::MutexLock lock(&mu_);
    if (failed_.load() || handing_back_.load()) return false;
    hand_back_why_ = why;
    handing_back_.store(true, std::memory_order_release);
  }
  // The ring's ops in flight end now, and write nothing (FinishOp).
  if (remote_ != nullptr && all_joined_.load()) remote_->Abort(why);
  return true;
}

absl::Status Job::hand_back_why() const {
  absl::MutexLock lock(&mu_);
  return hand_back_why_;
}

void Job::SetResumeReady(uint32_t done) {
  resume_done_.store(done, std::memory_order_release);
  resume_ready_.store(true, std::memory_order_release);
}

}  // namespace dmagather::server::scheduler
