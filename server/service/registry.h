// Registry: the daemon's jobs and sessions. The control service joins,
// registers and ends sessions through it; the ingress thread takes
// snapshots of the jobs (JobFeed); telemetry reads counters; the reaper
// thread frees what ended.
//
// Teardown runs on the reaper thread, never on the data path: a session
// whose rank is gone and whose job has nothing in flight is retired into a
// deferred-free queue, and its memory (engine detach, region unmaps, the
// segment) is released outside the registry lock once the ingress thread
// has finished a poll pass that began after the retirement (so no snapshot
// it still holds can read the segment).
//
// Isolation: jobs are keyed by (uid, job key), the uid being the kernel's
// (SO_PEERCRED of the segment's fd-channel hand-over), so each uid has its
// own job-key namespace and no user can squat another's keys. Per-uid
// limits (Limits) bound what one uid can hold: jobs, sessions, registered
// regions and mapped host bytes; a request over a limit is refused with
// RESOURCE_EXHAUSTED naming the limit and its flag, and touches nothing of
// any other uid.
//
// Threads: all public methods are thread-safe (mu_ guards the maps; the
// per-op path never takes it; no system call that maps, unmaps or
// registers memory runs under it).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <sys/types.h>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dmagather/v1/control.pb.h"
#include "dmagather/v1/telemetry.pb.h"
#include "server/engines/copy_engine.h"
#include "server/ingress/ingress.h"
#include "server/scheduler/job.h"
#include "server/service/peer_cred.h"
#include "server/service/region_ledger.h"
#include "server/service/session.h"
#include "server/service/ticket_table.h"

namespace dmagather::server::cluster {
class PeerService;
}

namespace dmagather::server::service {

struct Joined {
  std::shared_ptr<scheduler::Job> job;
  std::shared_ptr<Session> session;
};

// Per-uid limits (0 = unlimited). Defaults: main.cc's flags.
struct Limits {
  int max_jobs_per_uid = 64;
  int max_sessions_per_uid = 1024;
  int max_regions_per_uid = 16384;
  uint64_t max_mapped_bytes_per_uid = 0;
};

// Who asks for telemetry: a uid (from a telemetry ticket) or nobody known.
struct Viewer {
  bool operator_view = false;  // Sees every job.
  bool known = false;          // uid is the kernel's; sees its own jobs.
  uid_t uid = 0;
  static Viewer Everything() { return Viewer{true, true, 0}; }
};

class Registry {
 public:
  // `tickets`: the fd channel's hand-overs, claimed by Join and Register.
  Registry(engines::CopyEngine* engine, TicketTable* tickets, Limits limits = Limits{})
      : engine_(engine),
        tickets_(tickets),
        limits_(limits),
        ledger_(RegionLedger::Create({limits.max_regions_per_uid, limits.max_mapped_bytes_per_uid})) {}
  // The daemon's doorbell memfd (st_dev, st_ino): never registrable as a buffer.
  void SetDoorbellIdentity(dev_t dev, ino_t ino) {
    doorbell_dev_ = dev;
    doorbell_ino_ = ino;
  }
  ~Registry();

  // Multi-node jobs (Join with a job id) go through `peers` (null: this
  // daemon runs without --peer_listen and refuses them).
  void SetPeers(cluster::PeerService* peers) { peers_ = peers; }
  cluster::PeerService* peers() const { return peers_; }

  // Starts the reaper thread; `ingress_epoch` reports the ingress thread's
  // completed poll passes (nullptr: no ingress thread, free at once).
  // `kick` (may be empty) wakes the ingress thread for a pass while frees wait.
  void StartReaper(std::function<uint64_t()> ingress_epoch, std::function<void()> kick = nullptr);
  void StopReaper();

  // Claims the segment ticket, maps the segment and adds the rank to its
  // job (created if new). The rank's uid and pid are the kernel's: `caller`
  // is who sent the Join (the control socket's SO_PEERCRED), and it must be
  // the process that handed the segment over (the ticket's SO_PEERCRED), so
  // a ticket seen by another user or process is worth nothing.
  absl::StatusOr<Joined> Join(const v1::JoinRequest& req, const PeerCred& caller);
  // The Join stream ended: clean (Leave was called, or the join never
  // completed) or not (the rank died). Fails the job's later ops if it was
  // running.
  void EndSession(const Joined& j);
  // Leave/Register/Deregister act only for the holder of the session's
  // secret (from the Join reply); anything else is "no session".
  absl::Status Leave(uint64_t session_id, const std::string& secret);
  absl::StatusOr<uint32_t> Register(const v1::RegisterRequest& req);
  absl::Status Deregister(uint64_t session_id, const std::string& secret, uint32_t region_id);

  // Shutdown: every running job fails its pending and later ops with `why`.
  void FailAll(const absl::Status& why);
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  int total_ops_in_flight() const;

  // Ingress hooks.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  std::vector<ingress::JobFeed> Snapshot() const;
  // One reaper pass (the thread calls it every 20 ms; tests call it).
  void Reap();

  // Telemetry. Node totals always; per-job entries only for jobs `viewer`
  // may see (its own uid's, or all for an operator).
  void FillStats(const std::string& job_key, const Viewer& viewer, v1::StatsReply* out) const;
  // Everything (for in-daemon callers that serve operators only).
  void FillStats(const std::string& job_key, v1::StatsReply* out) const {
    FillStats(job_key, Viewer::Everything(), out);
  }
  int num_jobs() const;
  int num_sessions() const;

 private:
  struct JobEntry {
    std::shared_ptr<scheduler::Job> job;
    std::vector<std::shared_ptr<Session>> sessions;  // By rank; null until joined.
  };
  // What one uid holds, for the limits.
  struct Usage {
    int jobs = 0;
    int sessions = 0;  // Joined or joining, until the Join stream ends.
  };
  using JobId = std::pair<uid_t, std::string>;
  std::shared_ptr<Session> FindSession(uint64_t id, const std::string& secret) const;
  void ReaperLoop();
  void WakeReaper();
  void DropUsageLocked(uid_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  engines::CopyEngine* const engine_;
  TicketTable* const tickets_;
  const Limits limits_;
  const std::shared_ptr<RegionLedger> ledger_;
  cluster::PeerService* peers_ = nullptr;
  dev_t doorbell_dev_ = 0;
  ino_t doorbell_ino_ = 0;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<JobId, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, Usage> usage_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t jobs_completed_ ABSL_GUARDED_BY(mu_) = 0;
  // Counters of jobs already reaped, so node totals never go backwards.
  uint64_t retired_ops_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t retired_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t retired_fallback_ops_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<uint64_t, common::kNumApiStatus> retired_errors_ ABSL_GUARDED_BY(mu_){};
  // Telemetry of the last jobs that ended, newest first.
  static constexpr size_t kRecentJobs = 16;
  std::deque<v1::JobStats> recent_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint32_t> next_region_id_{1};
  std::atomic<uint64_t> version_{0};
  std::atomic<bool> stopping_{false};

  // Reaper thread and its deferred-free queue: (ingress epoch at
  // retirement, session).
  std::function<uint64_t()> ingress_epoch_;
  std::function<void()> kick_;
  std::deque<std::pair<uint64_t, std::shared_ptr<Session>>> retired_ ABSL_GUARDED_BY(mu_);
  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;
  bool reaper_stop_ = false;
  bool reaper_wake_ = false;
  // Reaper thread only: when it last gave freed heap back (malloc_trim).
  int freed_since_trim_ = 0;
  absl::Time last_trim_ = absl::InfinitePast();
  std::thread reaper_;
};

}  // namespace dmagather::server::service
