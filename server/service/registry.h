// Registry: the daemon's jobs and sessions. The control service joins,
// registers and ends sessions through it; the ingress thread takes
// snapshots of the jobs and calls Reap(); telemetry reads counters.
//
// Threads: all public methods are thread-safe (mu_ guards the maps; the
// per-op path never takes it).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dmagather/v1/control.pb.h"
#include "dmagather/v1/telemetry.pb.h"
#include "server/engines/copy_engine.h"
#include "server/ingress/session.h"
#include "server/scheduler/job.h"

namespace dmagather::server::service {

struct Joined {
  std::shared_ptr<scheduler::Job> job;
  std::shared_ptr<ingress::Session> session;
};

class Registry {
 public:
  explicit Registry(engines::CopyEngine* engine) : engine_(engine) {}

  // Opens the rank's segment and adds it to its job (created if new).
  absl::StatusOr<Joined> Join(const v1::JoinRequest& req);
  // The Join stream ended: clean (Leave was called, or the join never
  // completed) or not (the rank died). Fails the job's later ops if it was
  // running.
  void EndSession(const Joined& j);
  absl::Status Leave(uint64_t session_id);

  absl::StatusOr<uint32_t> Register(const v1::RegisterRequest& req);
  absl::Status Deregister(uint64_t session_id, uint32_t region_id);

  // Shutdown: every running job fails its pending and later ops with `why`.
  void FailAll(const absl::Status& why);
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  int total_ops_in_flight() const;

  // Ingress hooks.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  std::vector<std::shared_ptr<scheduler::Job>> Snapshot() const;
  void Reap();

  // Telemetry.
  void FillStats(const std::string& job_key, v1::StatsReply* out) const;
  int num_jobs() const;
  int num_sessions() const;

 private:
  std::shared_ptr<ingress::Session> FindSession(uint64_t id) const;
  // Unregisters the completion block from the engine, then unmaps.
  void ReleaseSessionMemory(ingress::Session* s);
  // A rank went away: lets engine streams waiting on its ready flag go on.
  void ReleaseGpuWaits(ingress::Session* s);

  engines::CopyEngine* const engine_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<scheduler::Job>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<ingress::Session>> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t jobs_completed_ ABSL_GUARDED_BY(mu_) = 0;
  // Counters of jobs already reaped, so node totals never go backwards.
  uint64_t retired_ops_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t retired_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<uint64_t, ingress::kNumApiStatus> retired_errors_ ABSL_GUARDED_BY(mu_){};
  // Telemetry of the last jobs that ended, newest first.
  static constexpr size_t kRecentJobs = 16;
  std::deque<v1::JobStats> recent_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint32_t> next_region_id_{1};
  std::atomic<uint64_t> version_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace dmagather::server::service
