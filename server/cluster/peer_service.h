// PeerService: this daemon's side of multi-node jobs - the peer listener
// (--peer_listen), the job coordinator (on the daemon named in a job id),
// and each job's bootstrap up to a running Ring.
//
// Life of a multi-node job here:
//  1. A rank joins with a job id. The Registry adds it to a Job created
//     multi_node and calls AddRank; the first one starts the job's
//     bootstrap thread.
//  2. Bootstrap connects to the coordinator named in the id (the daemon of
//     rank 0; possibly this one), authenticates with the job secret and
//     sends a NodeUpdate each time a rank joins here.
//  3. The coordinator waits until every rank of the world has joined some
//     node, orders the nodes by their lowest rank and sends each its
//     NodeTable (or an error: a rank on two nodes, world sizes that differ).
//  4. Each node opens `links` authenticated connections to the next node in
//     the table (the listener hands the previous node's to it), upgrades
//     them to the job's transport, starts a Ring and gives the Job its
//     Topology. Only then do the local ranks' Join calls return.
// A failure on the way (coordinator unreachable, bad secret, join timeout)
// fails the Job, so the local ranks' Join calls end with the reason.
//
// Threads: the accept thread; one handler thread per incoming connection
// until its handshake (and, for the coordinator, the table) is done; one
// bootstrap thread per job until its ring runs. mu_ guards the table of
// bootstrapping jobs and the thread count; each job's Pending::mu its links
// and (coordinator) the nodes' updates and the table.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "dmagather/v1/peer.pb.h"
#include "server/cluster/job_id.h"
#include "server/engines/copy_engine.h"
#include "server/scheduler/job.h"
#include "server/transport/transport.h"

namespace dmagather::server::cluster {

class Ring;

struct PeerOptions {
  std::string listen;     // host:port to accept peer daemons on (port 0: any).
  std::string advertise;  // What other daemons connect to (default: the bound listen address).
  std::string transport = "auto";
  int links = 4;                               // Connections to the next node, per job.
  uint64_t chunk_bytes = 1 << 20;              // Ring chunk.
  uint64_t transit_bytes = uint64_t{4} << 30;  // Host staging per job (GPU backends).
  bool force_staging = false;                  // --ring_staging=always.
  absl::Duration handshake_timeout = absl::Seconds(5);
  // --peer_timeout_ms: a next node silent this long is failed; heartbeats go
  // back every fifth of it (zero: none).
  absl::Duration peer_timeout = absl::Seconds(5);
  // Join deadlines of the bootstrap; each job's ring runs on it too.
  common::Clock* clock = &common::RealClock();
};

struct PeerStats {
  std::string address, transport, transport_reason;
  uint64_t auth_failures = 0;
};

class PeerService {
 public:
  // `engine`: the node's copy engine (rings stage through it where rank
  // memory is not host memory).
  static absl::StatusOr<std::unique_ptr<PeerService>> Create(const PeerOptions& options, engines::CopyEngine* engine);
  ~PeerService();
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& address() const { return address_; }
  // A fresh job id naming this daemon as coordinator.
  absl::StatusOr<std::string> NewJobId() const;
  // A rank of `job` joined here with `job_id`; the bootstrap must be done
  // within `timeout` of the first rank's call (on options.clock). The job
  // completes (or fails) asynchronously.
  absl::Status AddRank(const std::shared_ptr<scheduler::Job>& job, const std::string& job_id, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  PeerStats stats() const;

 private:
  // Written and read under its job's Pending::mu.
  struct CoordNode {
    v1::NodeUpdate update;
    bool have = false;
  };
  // One multi-node job while it bootstraps.
  struct Pending {
    JobId id;
    std::weak_ptr<scheduler::Job> job;
    absl::Time deadline;
    bool coordinator = false;
    absl::Mutex mu;
    absl::CondVar cv;                         // Ranks changed / a link arrived / the table is ready / stopping.
    bool changed ABSL_GUARDED_BY(mu) = true;  // Local ranks changed since the last NodeUpdate.
    // Links from the previous node (by link index), handshaken and upgraded.
    std::vector<std::unique_ptr<transport::Connection>> prev_links ABSL_GUARDED_BY(mu);
    std::vector<int> prev_from ABSL_GUARDED_BY(mu);  // Node index each prev link claimed.
    int prev_count ABSL_GUARDED_BY(mu) = 0;
    // Coordinator: every node's latest update (by handler), and the table.
    std::vector<std::shared_ptr<CoordNode>> nodes ABSL_GUARDED_BY(mu);
    bool table_ready ABSL_GUARDED_BY(mu) = false;
    v1::NodeTable table ABSL_GUARDED_BY(mu);
    // Coordinator of a job coming back: a node's daemon came back after the
    // table went out, so this round's ring cannot form; it starts over.
    bool stale ABSL_GUARDED_BY(mu) = false;
  };

  PeerService(const PeerOptions& options, engines::CopyEngine* engine);
  void AcceptLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Handle(std::unique_ptr<transport::Connection> conn) ABSL_LOCKS_EXCLUDED(mu_);
  void ServeCoordinator(const std::shared_ptr<Pending>& p, transport::Connection& conn) ABSL_LOCKS_EXCLUDED(mu_);
  // Coordinator: builds the table once every rank is placed.
  void MaybeBuildTableLocked(Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Coordinator: a node's daemon went away before the table was sent; every
  // node still waiting gets a table that says so.
  void FailSetupLocked(Pending& p, const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Coordinator: the ranks no node reported yet, for a message.
  static std::string MissingRanks(Pending& p, int world_size) ABSL_LOCKS_EXCLUDED(p.mu);
  void Bootstrap(std::shared_ptr<Pending> p) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RunBootstrap(Pending& p, const std::shared_ptr<scheduler::Job>& job) ABSL_LOCKS_EXCLUDED(mu_, p.mu);
  // The previous node's `links` ring links, once the listener has them all
  // (or the setup went stale, or `deadline` passed).
  absl::StatusOr<std::vector<std::unique_ptr<transport::Connection>>> AwaitPrevLinks(
      Pending& p, const scheduler::Job& job, int links, int prev, const std::string& prev_name, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(p.mu);
  // Reports this node's ranks to the coordinator (again each time they
  // change) until its node table comes.
  absl::StatusOr<v1::NodeTable> AwaitTable(Pending& p, const std::shared_ptr<scheduler::Job>& job)
      ABSL_LOCKS_EXCLUDED(mu_, p.mu);
  // Tries until `deadline` (the bootstrap's when absl::InfiniteFuture()).
  absl::StatusOr<std::unique_ptr<transport::Connection>> Dial(const Pending& p, const std::string& address,
                                                              v1::PeerHello hello,
                                                              absl::Time deadline = absl::InfiniteFuture())
      ABSL_LOCKS_EXCLUDED(mu_);
  bool stopping() const ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<Pending> Find(const std::string& tag) const ABSL_LOCKS_EXCLUDED(mu_);
  void Forget(const std::shared_ptr<Pending>& p) ABSL_LOCKS_EXCLUDED(mu_);

  const PeerOptions options_;
  engines::CopyEngine* const engine_;
  std::unique_ptr<transport::Transport> tcp_;        // Bootstrap (always tcp).
  std::unique_ptr<transport::Transport> transport_;  // Data links.
  std::string transport_reason_;
  std::unique_ptr<transport::Listener> listener_;
  std::string address_;
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  absl::CondVar threads_cv_;                                                      // threads_ reached 0.
  std::map<std::string, std::shared_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);  // By job tag.
  int threads_ ABSL_GUARDED_BY(mu_) = 0;  // Handler and bootstrap threads alive.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> auth_failures_{0};
};

}  // namespace dmagather::server::cluster
