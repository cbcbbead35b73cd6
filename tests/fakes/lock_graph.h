// LockGraph: the deadlock checker of the fake GPU runtime's driver model
// (fake_gpu_runtime.h). It holds the model's locks - one per device
// context, "ctx0".."ctxN", taken by the fake's driver calls as the real
// driver may take them - and sees the engine's own ordering locks (told
// through GpuRuntime::OnEngineLock, never blocking here). It checks two
// things:
//  - lock order, as lockdep does: every acquisition made while the thread
//    holds other locks records an edge held -> taken (the thread, the call,
//    and the locks held around it). A cycle of edges that two or more
//    threads recorded and that no common held lock serialises is a
//    possible deadlock even if this run never hit it: it is reported
//    (cycles()) with the threads, the locks and the calls of each edge.
//    A cycle in which two edges were always made under one common lock
//    (the engine's device-order locks) is not: those two can never be in
//    progress at once, and a deadlock needs every edge in progress;
//  - waits: what each thread holds and waits for now (a lock, or space on
//    a stream's queue), for the runtime's wait-for report when a test's
//    watchdog finds no progress (Dump()).
// Locks block for real (a deadlock of the model is a real hang of the
// test), so Abort() exists: it wakes every waiter, and every later
// Acquire fails, so that the engine unwinds and the test ends with a
// failure instead of hanging.
//
// Threads: any; every method is thread-safe. Threads are named in reports
// by SetRole (the fake names them by the first call they make: "issuing
// thread of device 1"), else by their pthread name, with a number.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dmagather::server::engines::gpu::testing {

class LockGraph {
 public:
  // Takes `lock` (blocking while another thread holds it) for the call
  // `what`; false once Abort() was called (the lock is not taken).
  bool Acquire(const std::string& lock, const std::string& what);
  void Release(const std::string& lock);
  // A lock the caller's own code took (the engine's ordering locks):
  // recorded as held, with its edges, but never blocks here.
  void Held(const std::string& lock, const std::string& what);
  // The calling thread waits for `on` (space on a stream) while holding its
  // locks; Unblocked() when it goes on.
  void Blocking(const std::string& on);
  void Unblocked();
  // Names the calling thread in reports, if it has no role yet.
  void SetRole(const std::string& role);
  std::string ThreadName();  // The calling thread's.

  // Lock-order cycles found so far: one report each.
  std::vector<std::string> cycles() const;
  // Every thread that holds or waits for something: what, and since when.
  std::string Dump() const;
  // Threads waiting now: (thread name, what it waits for, the locks it
  // holds, the holder of the lock it waits for or "").
  struct Waiter {
    std::string thread, waits_for, holder;
    std::vector<std::string> holds;
  };
  std::vector<Waiter> waiters() const;

  void Abort();
  bool aborted() const;

 private:
  struct ThreadState {
    std::string name;
    std::vector<std::string> held;  // In acquisition order.
    std::string waits_for;          // "" when running.
    std::string call;               // The call that waits.
  };
  struct Edge {
    std::map<uint64_t, std::string> by_thread;  // Thread -> the call that made the edge.
    std::set<std::string> gates;                // Locks held at every recording (beside `from`).
    bool gates_set = false;
  };
  ThreadState& Self();                                                              // mu_ held.
  void AddEdges(ThreadState& t, const std::string& lock, const std::string& what);  // mu_ held.
  void CheckCycles(const std::string& from, const std::string& to);                 // mu_ held.

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Threads by a number of their own (thread ids are reused once a
  // thread ends; these are not).
  static uint64_t Me();
  std::map<uint64_t, ThreadState> threads_;
  std::map<std::string, uint64_t> holder_;
  std::map<std::pair<std::string, std::string>, Edge> edges_;
  std::set<std::string> reported_;  // Canonical cycles already reported.
  std::vector<std::string> cycles_;
  bool aborted_ = false;
  int next_thread_ = 0;
};

}  // namespace dmagather::server::engines::gpu::testing
