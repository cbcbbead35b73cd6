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
// bootstrap thread per job until its ring runs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
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
  int links = 4;                  // Connections to the next node, per job.
  uint64_t chunk_bytes = 1 << 20; // Ring chunk.
  uint64_t transit_bytes = uint64_t{4} << 30;  // Host staging per job (GPU backends).
  bool force_staging = false;                   // --ring_staging=always.
  absl::Duration handshake_timeout = absl::Seconds(5);
  // --peer_timeout_ms: a next node silent this long is failed; heartbeats go
  // back every fifth of it (zero: none).
  absl::Duration peer_timeout = absl::Seconds(5);
};

struct PeerStats {
  std::string address, transport, transport_reason;
  uint64_t auth_failures = 0;
};

class PeerService {
 public:
  // `engine`: the node's copy engine (rings stage through it where rank
  // memory is not host memory).
  static absl::StatusOr<std::unique_ptr<PeerService>> Create(const PeerOptions& options,
                                                             engines::CopyEngine* engine);
  ~PeerService();
  void Stop();

  const std::string& address() const { return address_; }
  // A fresh job id naming this daemon as coordinator.
  absl::StatusOr<std::string> NewJobId() const;
  // A rank of `job` joined here with `job_id`; `deadline` bounds the
  // bootstrap. The job completes (or fails) asynchronously.
  absl::Status AddRank(const std::shared_ptr<scheduler::Job>& job, const std::string& job_id, absl::Time deadline);
  PeerStats stats() const;

 private:
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
    std::mutex mu;
    std::condition_variable cv;
    bool changed = true;  // Local ranks changed since the last NodeUpdate.
    // Links from the previous node (by link index), handshaken and upgraded.
    std::vector<std::unique_ptr<transport::Connection>> prev_links;
    std::vector<int> prev_from;  // Node index each prev link claimed.
    int prev_count = 0;
    // Coordinator: every node's latest update (by handler), and the table.
    std::vector<std::shared_ptr<CoordNode>> nodes;
    bool table_ready = false;
    v1::NodeTable table;
  };

  PeerService(const PeerOptions& options, engines::CopyEngine* engine);
  void AcceptLoop();
  void Handle(std::unique_ptr<transport::Connection> conn);
  void ServeCoordinator(const std::shared_ptr<Pending>& p, transport::Connection& conn);
  // Coordinator, under p.mu: builds the table once every rank is placed.
  void MaybeBuildTableLocked(Pending& p);
  // Coordinator, under p.mu: a node's daemon went away before the table was
  // sent; every node still waiting gets a table that says so.
  void FailSetupLocked(Pending& p, const std::string& node);
  void Bootstrap(std::shared_ptr<Pending> p);
  absl::Status RunBootstrap(Pending& p, const std::shared_ptr<scheduler::Job>& job);
  absl::StatusOr<std::unique_ptr<transport::Connection>> Dial(const Pending& p, const std::string& address,
                                                              v1::PeerHello hello);
  std::shared_ptr<Pending> Find(const std::string& tag) const;
  void Forget(const std::shared_ptr<Pending>& p);

  const PeerOptions options_;
  engines::CopyEngine* const engine_;
  std::unique_ptr<transport::Transport> tcp_;        // Bootstrap (always tcp).
  std::unique_ptr<transport::Transport> transport_;  // Data links.
  std::string transport_reason_;
  std::unique_ptr<transport::Listener> listener_;
  std::string address_;
  std::thread accept_thread_;

  mutable std::mutex mu_;
  std::condition_variable threads_cv_;
  std::map<std::string, std::shared_ptr<Pending>> pending_;  // By job tag.
  int threads_ = 0;  // Handler and bootstrap threads alive.
  bool stopping_ = false;
  std::atomic<uint64_t> auth_failures_{0};
};

}  // namespace dmagather::server::cluster
