// Registry: the service edge of the daemon's jobs and sessions. The control
// service joins, registers and ends sessions through it; the ingress thread
// takes snapshots of the jobs (JobFeed); telemetry reads it as protos; the
// reaper thread frees what ended. It converts the gRPC messages into the
// core's plain requests (after the request checks), the core's views into
// telemetry protos, and wires the pieces together:
//   RegistryCore (registry_core.h)  jobs, sessions, per-uid quotas;
//   reaper (reaper.h)               the reaper thread, deferred frees, heap trim;
//   registry_stats.h                telemetry protos from the core's views;
//   cluster::PeerService            multi-node jobs (PeerJoiner).
//
// Teardown runs on the reaper thread, never on the data path: a session
// whose rank is gone and whose job has nothing in flight is retired into
// the deferred-free queue, and its memory (engine detach, region unmaps, the
// segment) is released outside every registry lock once the ingress thread
// has finished a poll pass that began after the retirement.
//
// Threads: all public methods are thread-safe. recent_mu_ guards the
// telemetry of the jobs that ended; it is taken before the core's lock, so
// a job leaves the core's list and enters recent_ at one instant.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dmagather/v1/control.pb.h"
#include "dmagather/v1/telemetry.pb.h"
#include "server/engines/copy_engine.h"
#include "server/ingress/ingress.h"
#include "server/service/peer_cred.h"
#include "server/service/reaper.h"
#include "server/service/registry_core.h"
#include "server/service/registry_stats.h"
#include "server/service/ticket_table.h"

namespace dmagather::server::cluster {
class PeerService;
}

namespace dmagather::server::service {

// The gRPC requests as the core takes them (after CheckJoinRequest /
// CheckRegisterRequest).
JoinSpec JoinSpecOf(const v1::JoinRequest& req);
RegisterSpec RegisterSpecOf(const v1::RegisterRequest& req);

class Registry {
 public:
  // `tickets`: the fd channel's hand-overs, claimed by Join and Register;
  // `clock`: when the reaper trims the heap.
  Registry(engines::CopyEngine* engine, TicketTable* tickets, Limits limits = Limits{},
           common::Clock* clock = &common::RealClock());
  ~Registry();

  // The daemon's doorbell memfd (st_dev, st_ino): never registrable as a buffer.
  void SetDoorbellIdentity(dev_t dev, ino_t ino) { core_.SetDoorbellIdentity(dev, ino); }
  // Multi-node jobs (Join with a job id) go through `peers` (null: this
  // daemon runs without --peer_listen and refuses them).
  void SetPeers(cluster::PeerService* peers);
  cluster::PeerService* peers() const { return peers_; }

  // Starts the reaper thread; `ingress_epoch` reports the ingress thread's
  // completed poll passes (nullptr: no ingress thread, free at once).
  // `kick` (may be empty) wakes the ingress thread for a pass while frees wait.
  void StartReaper(std::function<uint64_t()> ingress_epoch, std::function<void()> kick = nullptr);
  // The ingress thread's sleeps, for the stats (set before serving).
  void SetIngressSleeps(std::function<uint64_t()> sleeps) { ingress_sleeps_ = std::move(sleeps); }
  void StopReaper() { reaper_.Stop(); }

  // RegistryCore::Join after the request checks (backend, ABI version).
  absl::StatusOr<Joined> Join(const v1::JoinRequest& req, const PeerCred& caller);
  void EndSession(const Joined& j) { core_.EndSession(j); }
  absl::Status Leave(uint64_t session_id, const std::string& secret) { return core_.Leave(session_id, secret); }
  absl::StatusOr<uint32_t> Register(const v1::RegisterRequest& req);
  absl::Status Deregister(uint64_t session_id, const std::string& secret, uint32_t region_id) {
    return core_.Deregister(session_id, secret, region_id);
  }

  absl::Status Resume(uint64_t session_id, const std::string& secret, uint64_t gap_ns, uint32_t ops_pending,
                      const std::vector<CapturedDefinition>& captured) {
    return core_.Resume(session_id, secret, gap_ns, ops_pending, captured);
  }

  // Shutdown for a successor (RegistryCore::FreezeForHandover).
  void FreezeForHandover() { core_.FreezeForHandover(); }
  int total_ops_running() const { return core_.total_ops_running(); }
  bool stopping() const { return core_.stopping(); }
  int total_ops_in_flight() const { return core_.total_ops_in_flight(); }

  // Ingress hooks.
  uint64_t version() const { return core_.version(); }
  std::vector<ingress::JobFeed> Snapshot() const { return core_.Snapshot(); }
  // One reaper pass (the thread runs it every 20 ms; tests call it): a core
  // sweep, the ended jobs' telemetry kept, the frees that are due, a trim.
  void Reap() ABSL_LOCKS_EXCLUDED(recent_mu_);

  // Telemetry. Node totals always; per-job entries only for jobs `viewer`
  // may see (its own uid's, or all for an operator).
  void FillStats(const std::string& job_key, const Viewer& viewer, v1::StatsReply* out) const
      ABSL_LOCKS_EXCLUDED(recent_mu_);
  // Everything (for in-daemon callers that serve operators only).
  void FillStats(const std::string& job_key, v1::StatsReply* out) const {
    FillStats(job_key, Viewer::Everything(), out);
  }
  int num_jobs() const { return core_.num_jobs(); }
  int num_sessions() const { return core_.num_sessions(); }

 private:
  class PeerServiceJoiner;
  // A reaper thread pass: true when idle (no jobs, no frees waiting).
  bool ReaperPass();

  engines::CopyEngine* const engine_;
  RegistryCore core_;
  cluster::PeerService* peers_ = nullptr;
  std::unique_ptr<PeerServiceJoiner> joiner_;

  // Reaper: set by StartReaper before its thread starts, read-only after.
  std::function<uint64_t()> ingress_epoch_;
  std::function<uint64_t()> ingress_sleeps_;
  std::function<void()> kick_;
  DeferredFrees frees_;
  HeapTrimmer trimmer_;  // Reap only (one pass at a time).
  ReaperThread reaper_;

  // Telemetry of the last jobs that ended, newest first.
  static constexpr size_t kRecentJobs = 16;
  mutable absl::Mutex recent_mu_;
  std::deque<v1::JobStats> recent_ ABSL_GUARDED_BY(recent_mu_);
};

}  // namespace dmagather::server::service
