// Ingress: the daemon's single polling thread. It reads every active rank's
// request ring, decodes each descriptor once (decoder.h), validates it
// against that rank's own regions (ids, bounds, dtype, sizes), adds it to
// the job's op for its sequence number, and hands the op to the scheduler
// (Job::Dispatch) when every rank's part is in. It also runs the periodic
// sweep (timeouts, failed jobs). Nothing else: teardown is the reaper's
// (control service), copies are the engine's.
//
// When all rings are idle it spins briefly, polls on (yielding the core)
// until Options::stay_awake_ns has passed since its last work, then sleeps
// on the doorbell futex; a client that sees `sleeping` rings it after
// publishing.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "abi/ring_v1.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/engines/copy_engine.h"
#include "server/ingress/rank_input.h"
#include "server/scheduler/job.h"

namespace dmagather::server::ingress {

// A job and its ranks' inputs (index = rank), as the ingress thread polls them.
struct JobFeed {
  std::shared_ptr<scheduler::Job> job;
  std::vector<std::shared_ptr<RankInput>> inputs;
};

// While a job has armed persistent ops, the idle ingress thread sleeps at
// most this long between polls of their ready flags right after work; the
// sleep grows with the idle time (1/64 of it) up to kPersistentIdlePollNs,
// so an armed but unused graph costs ~1000 wake-ups a second, not 50,000.
inline constexpr uint64_t kPersistentPollNs = 20'000;
inline constexpr uint64_t kPersistentIdlePollNs = 1'000'000;
// The sleep between polls of armed persistent ops, `idle_ns` after the last work.
inline uint64_t PersistentPollNs(uint64_t idle_ns) {
  const uint64_t grown = idle_ns / 64;
  return grown < kPersistentPollNs ? kPersistentPollNs : grown > kPersistentIdlePollNs ? kPersistentIdlePollNs : grown;
}
// Sleep of an idle ingress thread (no job): a doorbell or Kick() ends it.
inline constexpr uint64_t kIdlePollNs = 1'000'000'000;

class Ingress {
 public:
  struct Hooks {
    std::function<uint64_t()> version;  // Changes whenever the set of jobs changes.
    std::function<std::vector<JobFeed>()> snapshot;
  };
  struct Options {
    absl::Duration op_timeout = absl::Seconds(60);
    uint32_t spin_iterations = 2048;
    // After its last work, the thread keeps polling (yielding the core
    // between polls) this long before it may sleep: while a job is active
    // an op finds it awake and the rank rings no doorbell (--stay_awake_us).
    uint64_t stay_awake_ns = 0;
    // Op timeouts, sweeps and the persistent-op poll read time here.
    common::Clock* clock = &common::RealClock();
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

  // Validates one decoded request of rank `rank` (whose regions are
  // `regions`) in a job of `world_size` into `part` (adds an item, or sets
  // part->status). Public for tests.
  // Poll passes completed (the reaper frees a retired rank's segment only
  // once a pass that began after the retirement has ended).
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  // Times the thread slept on the doorbell (each a wake-up: a rank's
  // doorbell, a Kick, or the sweep's timeout).
  uint64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }
  // Wakes the thread for one pass (the reaper waits for an epoch).
  void Kick();

  static void Validate(const scheduler::Request& req, uint32_t expected_seq, int rank, const RegionTable& regions,
                       int world_size, scheduler::RankPart* part);

 private:
  // The buffers of one item of each kind: resolved into *item and
  // part->recv, or why not.
  static absl::Status ValidateAllGather(const scheduler::Request& d, int rank, const RegionTable& regions,
                                        int world_size, scheduler::RankPart* part, scheduler::Item* item);
  static absl::Status ValidateAllToAll(const scheduler::Request& d, int rank, const RegionTable& regions,
                                       int world_size, scheduler::RankPart* part, scheduler::Item* item);
  void Loop();
  // Consumes what it can from the job's rings; returns descriptors consumed.
  int PollJob(const JobFeed& feed, uint64_t now_ns);
  // Reads one descriptor of an op the earlier daemon ended past the ring.
  static void SkipHandedOver(RankInput* in, uint64_t* head);
  bool AnyPending() const;

  const Options options_;
  engines::CopyEngine* const engine_;
  abi::DoorbellV1* const doorbell_;
  Hooks hooks_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<JobFeed> jobs_;  // Ingress thread only.
  std::atomic<uint64_t> epoch_{0};
  std::atomic<uint64_t> sleeps_{0};
  uint64_t version_ = ~uint64_t{0};
};

}  // namespace dmagather::server::ingress
