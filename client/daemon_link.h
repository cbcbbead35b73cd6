// DaemonLink: one rank's link to its node's dmagatherd - the control
// channel (Join stream, Register, Deregister, Leave) - and what keeps the
// rank's job alive when that daemon goes away (crash, restart, upgrade):
// the rank does not fail its ops, it waits up to the grace period
// (DMAGATHER_RECONNECT_S) for a daemon on the same socket, joins it again
// under the same job with the same segment (its ring rewound to the first
// op not seen done), registers again each region under its old id, and
// calls Resume; the new daemon goes on from the newest op any rank saw done
// (docs/ARCHITECTURE.md, "Daemon restarts"). Past the grace period, or where
// the job cannot be taken back (a multi-node job with ops captured into CUDA
// graphs, a daemon of another user or one that cannot resume), the done
// flag is marked gone as before: UNAVAILABLE, saying why.
//
// Threads: the communicator's user thread calls Join, Start, the
// registration calls and Close; the control channel's watcher thread
// reports a lost stream (OnLost); the link's own reconnect thread takes the
// job back. mu_ guards the channel and the registration cache's changes:
// the user thread takes it around each registration RPC (never while it
// waits for an op), the reconnect thread for a whole attempt, so a
// Register waits out a daemon restart. Lock order: mu_, then rc_mu_; the
// done flag's own lock is a leaf. The per-op path takes neither.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/backend.h"
#include "client/control_channel.h"
#include "client/done_flag.h"
#include "client/registration_cache.h"
#include "client/ring_writer.h"
#include "common/clock.h"
#include "common/memfd.h"

namespace dmagather::client {

class DaemonLink {
 public:
  // What the link works on; all outlive it. `segment_fd`: the rank's
  // segment memfd (handed over again to a new daemon).
  struct Parts {
    RingWriter* ring = nullptr;
    RegistrationCache* regions = nullptr;
    DoneFlag* done = nullptr;
    int segment_fd = -1;
    uint64_t segment_bytes = 0;
  };
  // `reconnect_s`: the grace period (0: the job ends with its daemon),
  // decided on `clock`.
  DaemonLink(std::string socket_path, int rank, int reconnect_s, Parts parts,
             const common::Clock* clock = &common::RealClock());
  ~DaemonLink();

  // The first Join (params without ticket): hands the segment over, maps
  // the daemon's doorbell into the ring, joins.
  absl::StatusOr<JoinAnswer> Join(const JoinParams& params) ABSL_LOCKS_EXCLUDED(mu_);
  // After the client backend exists: starts the watcher. `backend`
  // describes memory for re-registration; `resumable` says whether the job
  // may be taken back now (not a multi-node job with captured ops);
  // `captured` gives the ops captured into live CUDA graphs, handed to the
  // daemon that takes the job back.
  void Start(ClientBackend* backend, std::function<bool()> resumable,
             std::function<std::vector<CapturedDefinition>()> captured) ABSL_LOCKS_EXCLUDED(mu_);

  // Registration, each under mu_ (waits while a daemon restart is taken back).
  absl::Status Register(const MemoryExport& e, std::unique_ptr<OwnedBuffer> owned) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the registrations `e` makes stale (their ids and bases appended to `dropped`).
  void DropStale(const MemoryExport& e, const ClientBackend& backend,
                 std::vector<std::pair<uint32_t, uintptr_t>>* dropped) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Deregister(const void* base) ABSL_LOCKS_EXCLUDED(mu_);
  // Leaves (best effort), ends the stream, stops the reconnect thread.
  void Close(bool leave) ABSL_LOCKS_EXCLUDED(mu_);
  // Joined, and not closed since (also while a restart is being taken back).
  bool joined() const ABSL_LOCKS_EXCLUDED(mu_);

  // Restarts survived so far (each taken back), for the logs and tests.
  int restarts_survived() const { return restarts_.load(); }

 private:
  // The watcher thread: the stream ended.
  void OnLost(const std::string& reason, bool resumable, int code) ABSL_LOCKS_EXCLUDED(rc_mu_);
  void ReconnectLoop() ABSL_LOCKS_EXCLUDED(mu_, rc_mu_);
  // Takes the job back within the grace period, or marks the done flag gone.
  void TakeBack(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_, rc_mu_);
  // One attempt: connect, hand over, rewind, join, register, resume.
  // *fatal when trying again cannot help.
  absl::Status TryRejoin(uint64_t lost_ns, absl::Time deadline, bool* fatal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new channel: its segment hand-over mapped into the ring's doorbell.
  absl::StatusOr<std::unique_ptr<ControlChannel>> Connect(std::string* ticket, int timeout_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool stopping() const ABSL_LOCKS_EXCLUDED(rc_mu_);
  // Waits until the link is taken back after `generation` (true), or given
  // up on (false).
  bool WaitTakenBack(int generation) ABSL_LOCKS_EXCLUDED(mu_);
  // A monotonic stamp for the gap a rank logs and reports (measured, never decided on).
  static uint64_t LostNow();

  const std::string socket_path_;
  const int rank_;
  const int reconnect_s_;
  const Parts parts_;
  const common::Clock* const clock_;

  mutable absl::Mutex mu_;
  std::unique_ptr<ControlChannel> control_ ABSL_GUARDED_BY(mu_);
  JoinParams params_ ABSL_GUARDED_BY(mu_);
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  int64_t daemon_uid_ ABSL_GUARDED_BY(mu_) = -1;  // Who served the first Join (SO_PEERCRED).
  ClientBackend* backend_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Every doorbell mapped so far: the user thread may still ring an old one.
  std::vector<common::MemfdMapping> doorbells_ ABSL_GUARDED_BY(mu_);
  std::function<bool()> resumable_;
  std::function<std::vector<CapturedDefinition>()> captured_;

  mutable absl::Mutex rc_mu_;
  absl::CondVar rc_cv_;
  bool lost_ ABSL_GUARDED_BY(rc_mu_) = false;
  bool stop_ ABSL_GUARDED_BY(rc_mu_) = false;
  std::string lost_reason_ ABSL_GUARDED_BY(rc_mu_);
  std::thread reconnector_;
  std::atomic<int> restarts_{0};
  std::atomic<int> params_join_ms_{60000};  // The join timeout (bounds a wait for the take-back).
};

}  // namespace dmagather::client
