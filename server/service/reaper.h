// The reaper's pieces, apart from what they reap:
//  - DeferredFrees: memory retired at an ingress epoch and freed only once
//    the ingress thread has completed a whole poll pass that began after
//    the retirement (so no snapshot it still holds can read it);
//  - HeapTrimmer: hands freed heap back to the kernel (malloc_trim) now
//    and then, not on every pass, timed through the clock seam;
//  - ReaperThread: the thread that runs one reap pass every 20 ms while
//    there is work and once a second when idle (Wake() runs one at once).
// The registry (registry.h) wires them to its core: the core's Sweep
// retires sessions into DeferredFrees; the pass frees what is due.
//
// Threads: DeferredFrees is thread-safe (mu_, a leaf lock: the core's
// Sweep retires under the core's lock). HeapTrimmer belongs to the thread
// that runs reap passes. ReaperThread: Start/Wake/Stop from any thread; the
// pass runs on its own thread with no lock of the ReaperThread held.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace dmagather::server::service {

// Memory the reaper frees (a Session: engine detach, region unmaps, its
// segment). ReleaseMemory runs outside every registry lock.
class Retirable {
 public:
  virtual ~Retirable() = default;
  // Safe to call more than once.
  virtual void ReleaseMemory() = 0;
  virtual bool memory_released() const = 0;
};

class DeferredFrees {
 public:
  // Queues `item`, retired at ingress epoch `epoch`. An item already queued
  // or already released is left as it is.
  void Retire(uint64_t epoch, std::shared_ptr<Retirable> item) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the items due at `epoch`, oldest first: those retired at least two
  // epochs before (a whole pass began and ended since), or every item when
  // `gated` is false (no ingress thread reads them).
  std::vector<std::shared_ptr<Retirable>> TakeDue(uint64_t epoch, bool gated) ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  bool empty() const { return size() == 0; }

 private:
  mutable absl::Mutex mu_;
  std::deque<std::pair<uint64_t, std::shared_ptr<Retirable>>> queue_ ABSL_GUARDED_BY(mu_);
};

class HeapTrimmer {
 public:
  HeapTrimmer(common::Clock* clock, std::function<void()> trim, absl::Duration every = absl::Seconds(1))
      : clock_(clock), trim_(std::move(trim)), every_(every) {}
  // The daemon's: malloc_trim(0), at most once a second.
  explicit HeapTrimmer(common::Clock* clock = &common::RealClock());

  // `freed` items were freed by this pass. Trims when something was freed
  // since the last trim and `every` has passed since it; true if it trimmed.
  bool AfterPass(int freed);

 private:
  common::Clock* const clock_;
  const std::function<void()> trim_;
  const absl::Duration every_;
  int freed_since_trim_ = 0;
  bool trimmed_ = false;
  absl::Time last_trim_;
};

class ReaperThread {
 public:
  // `pass` runs one reap pass and says whether the daemon is idle (no jobs,
  // nothing waiting to be freed): then the next pass waits a second.
  explicit ReaperThread(std::function<bool()> pass) : pass_(std::move(pass)) {}
  ~ReaperThread() { Stop(); }

  void Start();
  // Runs a pass now (a job was created: the 20 ms cadence starts).
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);
  // Joins the thread; a stopped ReaperThread does not start again.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  const std::function<bool()> pass_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // Signalled by Wake and Stop.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // Start and Stop only (not concurrently).
};

}  // namespace dmagather::server::service
