// Ingress: the daemon's single polling thread. It reads every active rank's
// request ring, validates each descriptor against that rank's own session
// (region ids, bounds, dtype, sizes), hands it to the job's matcher, and
// dispatches matched ops: agreement check -> plan -> engine. It also runs the
// periodic sweeps (timeouts, failed jobs) and the reaper.
//
// When all rings are idle it spins briefly, then sleeps on the doorbell
// futex; a client that sees `sleeping` rings it after publishing.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "abi/ring_v1.h"
#include "server/engines/copy_engine.h"
#include "server/scheduler/job.h"

namespace dmagather::server::ingress {

class Ingress {
 public:
  struct Hooks {
    std::function<uint64_t()> version;  // Changes whenever the set of jobs changes.
    std::function<std::vector<std::shared_ptr<scheduler::Job>>()> snapshot;
    std::function<void()> reap;  // Frees ended sessions and idle jobs.
  };
  struct Options {
    absl::Duration op_timeout = absl::Seconds(60);
    uint32_t spin_iterations = 2048;
  };

  Ingress(const Options& options, engines::CopyEngine* engine, abi::DoorbellV1* doorbell, Hooks hooks);
  ~Ingress();

  void Start();
  // Stops the thread (after Daemon has failed every job and drained).
  void Stop();

  // One pass of the loop: refresh the job snapshot, drain every ring, and
  // (if `sweep`) fail timed-out ops and the pending ops of failed jobs.
  // Returns descriptors consumed. Called by the thread; tests call it
  // directly instead of Start().
  int PollOnce(uint64_t now_ns, bool sweep);

  // Validates one descriptor of `session` (rank `rank` of a job of
  // `world_size`) into `part`. Public for tests.
  static void Validate(const abi::DescriptorV1& d, uint32_t expected_seq, const Session& session,
                       int world_size, scheduler::RankPart* part);

 private:
  void Loop();
  // Consumes what it can from the job's rings; returns descriptors consumed.
  int PollJob(scheduler::Job* job, uint64_t now_ns);
  void Dispatch(scheduler::Job* job, scheduler::Op* op);
  bool AnyPending() const;

  const Options options_;
  engines::CopyEngine* const engine_;
  abi::DoorbellV1* const doorbell_;
  Hooks hooks_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<std::shared_ptr<scheduler::Job>> jobs_;  // Ingress thread only.
  uint64_t version_ = ~uint64_t{0};
};

}  // namespace dmagather::server::ingress
