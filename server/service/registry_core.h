// RegistryCore: the daemon's jobs and sessions, without protocol: Join,
// EndSession, Leave, Register, Deregister on plain requests (requests.h);
// the ingress thread's snapshots (JobFeed); the reaper's sweep. The service
// edge (registry.h) converts the gRPC messages into these requests, runs
// the reaper thread and fills the telemetry protos from View().
//
// Isolation: jobs are keyed by (uid, job key), the uid being the kernel's
// (SO_PEERCRED of the segment's fd-channel hand-over), so each uid has its
// own job-key namespace and no user can squat another's keys. Per-uid
// limits bound what one uid can hold: jobs and sessions (UidQuota
// reservations, held by the job and session entries), registered regions
// and mapped host bytes (RegionLedger charges, held by the regions). A
// request over a limit is refused with RESOURCE_EXHAUSTED naming the limit
// and its flag, and touches nothing of any other uid.
//
// Teardown: a session whose rank is gone and whose job has nothing in
// flight is retired by Sweep into DeferredFrees; its memory is released
// outside the registry lock once the ingress thread cannot be reading it.
//
// Threads: every public method is thread-safe. mu_ guards the maps; the
// per-op path never takes it; no system call that maps, unmaps or
// registers memory runs under it (Session::Open, Import and ReleaseMemory
// run outside). Lock order: a session's register_mu, then mu_, then the
// leaf locks of UidQuota, DeferredFrees and the hooks' callees.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/api_names.h"
#include "common/latency_histogram.h"
#include "server/engines/copy_engine.h"
#include "server/ingress/ingress.h"
#include "server/scheduler/job.h"
#include "server/service/captured_defs.h"
#include "server/service/peer_cred.h"
#include "server/service/reaper.h"
#include "server/service/region_claim.h"
#include "server/service/region_ledger.h"
#include "server/service/requests.h"
#include "server/service/session.h"
#include "server/service/ticket_table.h"
#include "server/service/uid_quota.h"

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

// How a multi-node job reaches the other nodes' daemons
// (cluster::PeerService in the daemon; a fake in tests).
class PeerJoiner {
 public:
  virtual ~PeerJoiner() = default;
  // Whether `job_id` is well-formed (before any ticket is claimed).
  virtual absl::Status CheckJobId(const std::string& job_id) = 0;
  // A rank of `job` joined here; the bootstrap is bounded by `timeout_ms`.
  virtual absl::Status AddRank(const std::shared_ptr<scheduler::Job>& job, const std::string& job_id,
                               int timeout_ms) = 0;
};

// A job and its sessions (by rank; null where not joined here).
struct JobView {
  std::shared_ptr<scheduler::Job> job;
  std::vector<std::shared_ptr<Session>> sessions;
};

// Counters of the jobs already swept, so node totals never go backwards.
struct RetiredTotals {
  uint64_t jobs_completed = 0;
  uint64_t ops = 0;
  uint64_t bytes = 0;
  uint64_t fallback_ops = 0;
  std::array<uint64_t, common::kNumApiStatus> errors{};
};

// Daemon restarts survived (Resume), node totals since start.
struct HandoverCounters {
  std::atomic<uint64_t> jobs_taken_over{0};
  std::atomic<uint64_t> ranks_resumed{0};
  std::atomic<uint64_t> ops_handed_over{0};  // Submitted and not seen done when the earlier daemon went.
  common::LatencyHistogram gap;              // A rank's time without a daemon: loss seen -> Resume.
};

class RegistryCore {
 public:
  // `tickets`: the fd channel's hand-overs, claimed by Join and Register.
  RegistryCore(engines::CopyEngine* engine, TicketTable* tickets, const Limits& limits);

  // Setup, before the first Join.
  void SetDoorbellIdentity(dev_t dev, ino_t ino) { doorbell_ = DoorbellIdentity{dev, ino}; }
  // Multi-node jobs go through `peers` (null: refused).
  void SetPeerJoiner(PeerJoiner* peers) { peers_ = peers; }
  // Called (under mu_) when Join creates a job: the reaper's cadence starts.
  void SetJobCreatedHook(std::function<void()> hook) { job_created_ = std::move(hook); }

  // Claims the segment ticket, maps the segment and adds the rank to its
  // job (created if new). The rank's uid and pid are the kernel's: `caller`
  // is who sent the Join, and it must be the process that handed the
  // segment over, so a ticket seen by another user or process is worth
  // nothing.
  absl::StatusOr<Joined> Join(const JoinSpec& req, const PeerCred& caller) ABSL_LOCKS_EXCLUDED(mu_);
  // The Join stream ended: clean (Leave was called, or the join never
  // completed) or not (the rank died). Fails the job's later ops if it was
  // running. The session's quota goes back.
  void EndSession(const Joined& j) ABSL_LOCKS_EXCLUDED(mu_);
  // Leave/Register/Deregister act only for the holder of the session's
  // secret (from the Join reply); anything else is "no session".
  absl::Status Leave(uint64_t session_id, const std::string& secret) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckSession(uint64_t session_id, const std::string& secret) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<uint32_t> Register(const RegisterSpec& req) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Deregister(uint64_t session_id, const std::string& secret, uint32_t region_id) ABSL_LOCKS_EXCLUDED(mu_);

  // A resumed session (Join with resume, its regions registered again
  // under their old ids) is back: once every local rank of its job is, the
  // job starts after the newest op any rank saw done (Job::StartAfter).
  // `gap_ns` and `ops_pending` are the rank's own account, for telemetry;
  // `captured`: its ops captured into live CUDA graphs, armed again
  // (one-node jobs: Job::RearmCaptured).
  absl::Status Resume(uint64_t session_id, const std::string& secret, uint64_t gap_ns, uint32_t ops_pending,
                      const std::vector<CapturedDefinition>& captured = {}) ABSL_LOCKS_EXCLUDED(mu_);
  const HandoverCounters& handover() const { return handover_; }

  // Shutdown for a successor (every stop: SIGTERM, restart, upgrade): no new
  // Join; a session's end no longer touches its job or its segment (no
  // error record, no done or ready flag), so the ranks' ops wait, intact,
  // for the next daemon to take the jobs back. The caller stops the ingress
  // thread and lets the running ops finish.
  void FreezeForHandover() ABSL_LOCKS_EXCLUDED(mu_);
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }
  int total_ops_in_flight() const ABSL_LOCKS_EXCLUDED(mu_);
  int total_ops_running() const ABSL_LOCKS_EXCLUDED(mu_);  // On the engine now.

  // Ingress hooks: the snapshot changes when version() does.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  std::vector<ingress::JobFeed> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

  // One sweep (reaper thread): retires into `frees`, at ingress epoch
  // `epoch`, every session no op can touch any more; drops the jobs that
  // ended (their quota goes back) and returns those whose ranks had all
  // joined, for telemetry.
  std::vector<JobView> Sweep(uint64_t epoch, DeferredFrees* frees) ABSL_LOCKS_EXCLUDED(mu_);

  // Telemetry: the live jobs and what the swept ones counted, at one instant.
  struct View {
    std::vector<JobView> jobs;
    RetiredTotals retired;
  };
  View view() const ABSL_LOCKS_EXCLUDED(mu_);
  RegionLedger::Held held_regions() const { return ledger_->total(); }
  int num_jobs() const ABSL_LOCKS_EXCLUDED(mu_);
  int num_sessions() const ABSL_LOCKS_EXCLUDED(mu_);
  const UidQuota& quota() const { return *quota_; }
  const RegionLedger& ledger() const { return *ledger_; }

 private:
  struct JobEntry {
    std::shared_ptr<scheduler::Job> job;
    std::vector<std::shared_ptr<Session>> sessions;  // By rank; null until joined.
    UidQuota::Reservation quota;                     // The job's count for its uid.
    bool hand_back_seen = false;                     // Job::HandBack seen by a sweep, at ingress epoch:
    uint64_t hand_back_epoch = 0;
  };
  struct SessionEntry {
    std::shared_ptr<Session> session;
    UidQuota::Reservation quota;  // The session's count for its uid.
  };
  using JobId = std::pair<uid_t, std::string>;

  // Join's steps: the request's routing and segment hand-over; then, under
  // mu_, the job (found or created) and the rank's place in it.
  absl::StatusOr<Handover> ClaimSegment(const JoinSpec& req, const PeerCred& caller) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<JobEntry*> FindOrCreateJobLocked(const JoinSpec& req, uid_t uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Joined> AddToJobLocked(const JoinSpec& req, const std::shared_ptr<Session>& session,
                                        UidQuota::Reservation* quota) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<Session> FindSession(uint64_t id, const std::string& secret) const ABSL_LOCKS_EXCLUDED(mu_);
  // Starts a job taken back after the newest op any of its ranks saw
  // done (returned), and feeds it to the ingress thread.
  uint32_t StartTakenBack(scheduler::Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  static uint32_t NewestDone(const scheduler::Job& job);
  // A job leaving the map: its counters go into the node's totals.
  void CountRetiredLocked(const scheduler::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Jobs handed back to their ranks (Job::HandBack) leave the map once
  // nothing of theirs runs; their sessions are retired once all ended.
  void SweepHandedBackLocked(uint64_t epoch, DeferredFrees* frees,
                             std::vector<std::shared_ptr<scheduler::Job>>* released) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sweeps one job; true when it ended (and may be dropped).
  bool SweepJobLocked(const JobEntry& entry, uint64_t epoch, DeferredFrees* frees) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  engines::CopyEngine* const engine_;
  TicketTable* const tickets_;
  const std::shared_ptr<UidQuota> quota_;
  const std::shared_ptr<RegionLedger> ledger_;
  // Set before the first Join, read-only after.
  PeerJoiner* peers_ = nullptr;
  DoorbellIdentity doorbell_;
  std::function<void()> job_created_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<JobId, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, SessionEntry> sessions_ ABSL_GUARDED_BY(mu_);
  RetiredTotals retired_ ABSL_GUARDED_BY(mu_);
  std::vector<JobEntry> handed_back_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> next_session_id_{1};
  std::atomic<uint32_t> next_region_id_{1};
  std::atomic<uint64_t> version_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> frozen_{false};
  HandoverCounters handover_;
};

}  // namespace dmagather::server::service
