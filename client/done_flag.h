// DoneFlag: the rank's done flag (done_seq in its completion block) as the
// client waits on it, and what happens to it when the daemon goes away.
// Waiting spins, yields, then sleeps on the futex (counted in done_waiters
// so the daemon knows to wake it). When the Join stream ends, MarkGone
// records why and the done_seq reached; on backends whose streams wait on
// the flag (cuda, hip) it then moves done_seq far ahead and releases every
// graph slot for good, so no stream or replay waits forever: from then on
// only ops finished before the daemon went away count as done.
//
// Threads: MarkGone on the watcher thread (once); everything else on the
// communicator's user thread. gone_ is the handover: reason_ (under mu_) and
// released_done_ are written before it (release) and read after it (acquire).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "abi/completion_v1.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace dmagather::client {

class DoneFlag {
 public:
  // `rank` only names the rank in messages.
  explicit DoneFlag(int rank) : rank_(rank) {}

  // The rank's completion block, and whether the backend's streams wait on
  // the flag (set once, at Join, before the watcher starts).
  void Attach(abi::CompletionV1* completion, bool stream_waits) {
    completion_ = completion;
    stream_waits_ = stream_waits;
  }
  // Pause iterations before sleeping, then sched_yield()s.
  void SetSpin(uint32_t spins, uint32_t yields) {
    spins_ = spins;
    yields_ = yields;
  }

  // The watcher thread: the Join stream ended (`reason`); `code` is the
  // dmagather_status_t the calls report from now on (UNAVAILABLE, or
  // PEER_FAILED where the daemon said a node of the job is lost).
  void MarkGone(const std::string& reason, int code = kUnavailable) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr int kUnavailable = 3;
  bool gone() const { return gone_.load(std::memory_order_acquire); }
  const std::atomic<bool>& gone_flag() const { return gone_; }
  // UNAVAILABLE (or MarkGone's code): "rank N: <why the daemon went>".
  absl::Status GoneStatus() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until op `seq` is done (cyclic compare) or the daemon is gone.
  absl::Status Wait(uint32_t seq);
  enum class Poll { kPending, kDone, kGone };
  // Whether op `seq` is done, without waiting.
  Poll Test(uint32_t seq) const;

 private:
  const int rank_;
  abi::CompletionV1* completion_ = nullptr;
  bool stream_waits_ = false;
  uint32_t spins_ = 256;
  uint32_t yields_ = 0;
  std::atomic<bool> gone_{false};
  mutable absl::Mutex mu_;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  int code_ ABSL_GUARDED_BY(mu_) = kUnavailable;
  uint32_t released_done_ = 0;  // done_seq when the daemon went away.
};

}  // namespace dmagather::client
