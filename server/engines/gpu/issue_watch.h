// IssueWatch: the GPU engine's watchdog over its own driver calls. Each
// issuing thread marks the call it is in (the op, the step); a thread of
// the watch checks every 200 ms and, when one call has lasted over a second,
// logs once per call what every device's issuer is doing and every rank's
// ready and done words of the op it is stuck in - the report a hang on the
// real driver needs (docs/CUDA.md, "Locks and waits"; tools/nvidia/
// first_contact.sh, the stall A/B).
//
// Threads: Begin/End on the device's issuing thread (one writer per
// device); Check on one thread at a time (the watch thread, or a test),
// which holds one slot's mutex at a time (never two locks at once). A slot's mutex is held by
// Begin/End and by Check while it reads the op: the op a device is in (and
// its ranks) stays alive while its issuer is inside the call (its share is
// open), so Check reads it only between that device's Begin and End.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::engines::gpu {

class IssueWatch {
 public:
  // `words(rank)`: the rank's ready and done words (host addresses; null
  // where unknown), for the report.
  struct Words {
    const uint32_t* ready = nullptr;
    const uint32_t* done = nullptr;
  };
  using WordsOf = Words (*)(const EngineRank* rank);

  IssueWatch(int devices, common::Clock& clock, WordsOf words, uint64_t limit_ns = 1'000'000'000ull);
  ~IssueWatch();

  // The watch thread (Check every 200 ms of real time) until destruction.
  void StartThread();

  // Device `device`'s issuer enters a driver call of `op` (`what`: a
  // string literal) / leaves it.
  void Begin(int device, const EngineOp* op, const char* what) {
    Slot& s = slots_[device];
    const uint64_t now = clock_.NowNs();
    absl::MutexLock lock(&s.mu);
    s.op = op;
    s.what = what;
    s.since_ns = now;
  }
  void End(int device) {
    Slot& s = slots_[device];
    absl::MutexLock lock(&s.mu);
    s.since_ns = 0;
    s.op = nullptr;
  }

  // One pass: the report of a call over the limit (each call reported
  // once), or "" when none is.
  std::string Check();
  uint64_t reports() const { return reports_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    absl::Mutex mu;
    uint64_t since_ns ABSL_GUARDED_BY(mu) = 0;  // 0: not in a call.
    const EngineOp* op ABSL_GUARDED_BY(mu) = nullptr;
    const char* what ABSL_GUARDED_BY(mu) = "";
    uint64_t reported_since ABSL_GUARDED_BY(mu) = 0;  // The call Check last reported.
  };
  common::Clock& clock_;
  const WordsOf words_;
  const uint64_t limit_ns_;
  std::unique_ptr<Slot[]> slots_;
  const int devices_;
  std::atomic<uint64_t> reports_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dmagather::server::engines::gpu
