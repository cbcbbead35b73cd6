// Multi-node jobs: where each rank runs, and the cross-node part of an op.
//
// A job whose ranks span several nodes is a Job on every node's daemon with
// the same world size; each daemon holds its local ranks only (the others'
// slots stay empty). The cluster layer (server/cluster) learns the
// Topology at join (from the job's coordinator) and gives the Job a
// RemotePart - the ring between the nodes' daemons - which moves the other
// nodes' shards into the local ranks' outputs while the engine gathers the
// local ones. Nothing in this layer knows how the bytes travel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/latency_histogram.h"

namespace dmagather::server::scheduler {

class Op;

struct Topology {
  int world_size = 0;
  int my_node = 0;
  std::vector<std::vector<int>> node_ranks;  // Per node (ring order), ascending.
  std::vector<std::string> node_names;       // "host (address)", for messages.
  std::vector<int> node_of_rank;             // world_size entries.
  int num_nodes() const { return static_cast<int>(node_ranks.size()); }
  const std::vector<int>& local_ranks() const { return node_ranks[my_node]; }
};

// What telemetry shows of the cross-node part.
struct RemoteStats {
  std::string transport, transport_reason;
  int links = 0;
  std::string next, prev;  // Node names.
  uint64_t bytes_sent = 0, bytes_received = 0, frames_sent = 0, frames_received = 0, ops = 0;
  uint64_t busy_ns = 0;                    // Summed time ops spent in the ring.
  uint64_t transit_bytes = 0;              // Host staging held (GPU backends).
  common::LatencySummaryNs chunk_latency;  // Receiving one chunk's payload.
};

class RemotePart {
 public:
  virtual ~RemotePart() = default;
  // The ingress thread, once per op, after this node's verdict on its local
  // ranks' parts (OK, or the refusal / invalid part / disagreement and the
  // rank it names). Never blocks. Ends exactly once with
  // op->PartDone(the op's verdict across all nodes, rank it names).
  virtual void Start(Op* op, const absl::Status& local_verdict, int failed_rank) = 0;
  // The job failed (`why`): ops in flight end with it; links close.
  virtual void Abort(const absl::Status& why) = 0;
  // What op `seq` still waits for (for timeout messages), "" if nothing.
  virtual std::string Pending(uint32_t seq) const = 0;
  // Stops its threads; nothing calls into the job after it returns.
  virtual void Close() = 0;
  virtual RemoteStats stats() const = 0;
};

}  // namespace dmagather::server::scheduler
