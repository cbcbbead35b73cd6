#include "server/scheduler/persistent_op.h"

#include "abi/ring_v1.h"
#include "common/api_names.h"
#include "server/scheduler/job.h"
#include "server/scheduler/rank.h"

namespace dmagather::server::scheduler {
namespace {

uint32_t* DoneLow(abi::GraphFlagsV1* f, int slot) { return &f->done[slot].lo; }
uint32_t* DoneHigh(abi::GraphFlagsV1* f, int slot) { return &f->done[slot].hi; }

}  // namespace

PersistentOp::PersistentOp(Job* job, std::vector<Rank*> ranks, std::vector<int> slots)
    : job_(job), ranks_(std::move(ranks)), slots_(std::move(slots)) {
  ready_observed = true;
  seq = 0;
}

abi::GraphFlagsV1* PersistentOp::Flags(size_t r) const {
  Rank* k = ranks_[r];
  if (k->released() || k->completion() == nullptr) return nullptr;
  return abi::GraphFlagsOf(k->completion());
}

PersistentOp::Polled PersistentOp::Poll(engines::CopyEngine* engine, bool failed, int32_t failed_code) {
  if (state_.load(std::memory_order_acquire) != kArmed) return Polled::kIdle;
  if (failed) {
    Release(failed_code);
    return Polled::kReleased;
  }
  bool all_ready = true;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    abi::GraphFlagsV1* f = Flags(r);
    if (f == nullptr || ranks_[r]->state() != Rank::State::kActive) return Polled::kIdle;
    const uint32_t v = abi::LoadAcquire(&f->ready[slots_[r]]);
    if (v == abi::kGraphSlotReleasedV1) {
      // That rank's graph is gone, and its slot may be reused at once: the
      // op is retired without writing any rank's done word (a rank that went
      // on replaying its graph would wait, as for any collective a rank stops
      // calling; nothing may land in a slot its owner already reuses).
      abi::StoreRelease(&f->ready[slots_[r]], 0u);
      Retire();
      return Polled::kRetired;
    }
    all_ready &= v == 1;
  }
  if (!all_ready) return Polled::kIdle;
  // Every rank's inputs are ready, and every rank has finished reading its
  // output of the previous replay (its consumer ran before its ready write).
  // No rank writes ready again before its done, which comes after the copies.
  // Taken before the ready flags go: a daemon that takes the job back then
  // finds the replay either still asked for or marked taken (TakeBack).
  SetPhase(abi::kPhaseTaken);
  for (size_t r = 0; r < ranks_.size(); ++r) abi::StoreRelease(&Flags(r)->ready[slots_[r]], 0u);
  state_.store(kRunning, std::memory_order_release);
  job_->PersistentStarted();
  engine->Execute(this);
  return Polled::kStarted;
}

void PersistentOp::OnEngineDone(absl::Status status) {
  int32_t code = common::ToApiStatus(status);
  if (status.ok() && job_->failed()) code = common::ToApiStatus(job_->failure());
  SetPhase(abi::kPhaseEnding);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    abi::GraphFlagsV1* f = Flags(r);
    if (f == nullptr) continue;
    abi::StoreRelease(reinterpret_cast<uint32_t*>(&f->status[slots_[r]]), static_cast<uint32_t>(code));
    if (code != 0) abi::StoreRelease(DoneHigh(f, slots_[r]), 1u);
    abi::StoreRelease(DoneLow(f, slots_[r]), 1u);
  }
  SetPhase(abi::kPhaseIdle);
  if (code == 0) replays_.fetch_add(1, std::memory_order_relaxed);
  state_.store(code == 0 ? kArmed : kReleased, std::memory_order_release);
  job_->PersistentFinished(code == 0 ? plan.bytes : 0, code);
}

void PersistentOp::Release(int32_t code) {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    abi::GraphFlagsV1* f = Flags(r);
    if (f == nullptr) continue;
    abi::StoreRelease(reinterpret_cast<uint32_t*>(&f->status[slots_[r]]), static_cast<uint32_t>(code));
    abi::StoreRelease(DoneHigh(f, slots_[r]), 1u);
    abi::StoreRelease(DoneLow(f, slots_[r]), 1u);
  }
  state_.store(kReleased, std::memory_order_release);
}

void PersistentOp::SetPhase(uint32_t phase) {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (abi::GraphFlagsV1* f = Flags(r); f != nullptr) abi::StoreRelease(&f->phase[slots_[r]], phase);
  }
}

PersistentOp::Resumed PersistentOp::TakeBack() {
  bool taken = false, all_ending = true, any_ending = false, all_done_unread = true;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    abi::GraphFlagsV1* f = Flags(r);
    if (f == nullptr) return Resumed::kIdle;  // A rank already gone: the job ends anyway.
    const uint32_t phase = abi::LoadAcquire(&f->phase[slots_[r]]);
    taken |= phase == abi::kPhaseTaken;
    any_ending |= phase == abi::kPhaseEnding;
    all_ending &= phase == abi::kPhaseEnding;
    all_done_unread &= abi::LoadAcquire(DoneLow(f, slots_[r])) == 1;
  }
  if (taken) {
    // No done flag was written (they come after every rank is marked
    // ending): every rank still waits for this replay, its inputs as they
    // were. Asked for again, it runs again from the start.
    // (A rank whose graph was destroyed meanwhile keeps its release mark.)
    SetPhase(abi::kPhaseIdle);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      uint32_t expected = 0;
      __atomic_compare_exchange_n(&Flags(r)->ready[slots_[r]], &expected, 1u, false, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE);
    }
    return Resumed::kRunAgain;
  }
  if (all_ending && !all_done_unread) {
    // Cut while writing the done flags: a rank whose low word is 0 either
    // never got it or already took it and went on (its graph resets it).
    // Neither copying again nor writing done is safe for both.
    Release(common::ToApiStatus(absl::UnavailableError("the daemon stopped while ending a captured op")));
    return Resumed::kReleased;
  }
  SetPhase(abi::kPhaseIdle);
  return any_ending ? Resumed::kEnded : Resumed::kIdle;
}

}  // namespace dmagather::server::scheduler
