// What Abseil's deadlock detector costs the daemon's locks. Debian builds
// Abseil with it on (its debug mode): every absl::Mutex lock takes one
// process-wide spin lock, and a lock taken while another is held adds to a
// graph of lock order. dmagatherd turns it off (server/main.cc); this
// measures why, in the patterns the daemon locks in: one lock, eight nested
// (DeviceOrder: an 8-GPU copy call holds every device it touches), and two
// threads each with a mutex pair of its own (they share nothing but the
// detector's spin lock). Rounds alternate on / off; prints CSV:
//   pattern,detector,round,ns_per_lock_set
//
//   mutex_detector [--rounds=3] [--iters=1000000]
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"

ABSL_FLAG(int, rounds, 3, "Rounds; each times every pattern with the detector on, then off.");
ABSL_FLAG(int, iters, 1000000, "Lock sets per pattern and round.");

namespace {

using Clock = std::chrono::steady_clock;

// The patterns lock in loops over arrays, which clang's thread-safety
// analysis cannot follow: it is off for them (they guard no state).
double NsPer(Clock::time_point a, Clock::time_point b, long n) {
  return std::chrono::duration<double, std::nano>(b - a).count() / static_cast<double>(n);
}

double One(long n) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  absl::Mutex m;
  const auto t0 = Clock::now();
  for (long i = 0; i < n; ++i) {
    m.Lock();
    m.Unlock();
  }
  return NsPer(t0, Clock::now(), n);
}

double EightNested(long n) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  absl::Mutex m[8];
  const auto t0 = Clock::now();
  for (long i = 0; i < n; ++i) {
    for (auto& x : m) x.Lock();
    for (int d = 7; d >= 0; --d) m[d].Unlock();
  }
  return NsPer(t0, Clock::now(), n);
}

double TwoThreadsOwnPairs(long n) {
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([n]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      absl::Mutex a, b;
      for (long i = 0; i < n; ++i) {
        a.Lock();
        b.Lock();
        b.Unlock();
        a.Unlock();
      }
    });
  }
  for (auto& t : threads) t.join();
  return NsPer(t0, Clock::now(), n);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const long n = absl::GetFlag(FLAGS_iters);
  std::printf("pattern,detector,round,ns_per_lock_set\n");
  for (int r = 1; r <= absl::GetFlag(FLAGS_rounds); ++r) {
    for (bool on : {true, false}) {
      absl::SetMutexDeadlockDetectionMode(on ? absl::OnDeadlockCycle::kAbort : absl::OnDeadlockCycle::kIgnore);
      const char* d = on ? "on" : "off";
      std::printf("one,%s,%d,%.1f\n", d, r, One(n));
      std::printf("eight_nested,%s,%d,%.1f\n", d, r, EightNested(n / 8));
      std::printf("two_threads_own_pairs,%s,%d,%.1f\n", d, r, TwoThreadsOwnPairs(n));
    }
  }
  return 0;
}
