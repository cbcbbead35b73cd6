#include "client/done_flag.h"

#include "abi/abi_v1.h"
#include "absl/strings/str_cat.h"
#include "client/graph_slots.h"
#include "common/api_names.h"
#include "common/futex.h"

namespace dmagather::client {

void DoneFlag::MarkGone(const std::string& reason, int code) {
  {
    absl::MutexLock lock(&mu_);
    reason_ = reason;
    code_ = code;
  }
  released_done_ = abi::LoadAcquire(&completion_->done_seq);
  gone_.store(true, std::memory_order_release);
  if (stream_waits_) {
    // No daemon will ever publish done again: release the rank's streams
    // (their done waits pass); the calls report UNAVAILABLE.
    abi::StoreSeqCst(&completion_->done_seq, released_done_ + (1u << 30));
    // Captured ops: no replay waits forever.
    GraphSlots::ReleaseForever(completion_);
  }
  common::FutexWakeAll(&completion_->done_seq);
}

absl::Status DoneFlag::GoneStatus() const {
  absl::MutexLock lock(&mu_);
  return common::FromApiStatus(code_, absl::StrCat("rank ", rank_, ": ", reason_));
}

absl::Status DoneFlag::Wait(uint32_t seq) {
  abi::CompletionV1* c = completion_;
  common::Backoff backoff(spins_, yields_);
  for (;;) {
    if (stream_waits_ && gone()) {
      // done_seq was moved ahead to release the streams; only ops finished
      // before the daemon went away really are done.
      return abi::SeqGeq(released_done_, seq) ? absl::OkStatus() : GoneStatus();
    }
    uint32_t done = abi::LoadAcquire(&c->done_seq);
    if (abi::SeqGeq(done, seq)) return absl::OkStatus();
    if (gone()) return GoneStatus();
    if (!backoff.Pause()) continue;
    abi::FetchAdd(&c->done_waiters, 1u);
    done = abi::LoadSeqCst(&c->done_seq);
    if (!abi::SeqGeq(done, seq) && !gone_.load()) common::FutexWait(&c->done_seq, done, 50'000'000);
    abi::FetchAdd(&c->done_waiters, ~0u);
  }
}

DoneFlag::Poll DoneFlag::Test(uint32_t seq) const {
  if (stream_waits_ && gone()) return abi::SeqGeq(released_done_, seq) ? Poll::kDone : Poll::kGone;
  if (abi::SeqGeq(abi::LoadAcquire(&completion_->done_seq), seq)) return Poll::kDone;
  return gone() ? Poll::kGone : Poll::kPending;
}

}  // namespace dmagather::client
