// Telemetry protos from the registry core's plain views: the per-job
// entries (JobStats) and the node totals of a StatsReply. Part of the
// service edge: nothing below it fills a protobuf.
//
// Threads: any; pure functions over what the caller passes (jobs and
// sessions read through their atomics, no registry lock held).
#pragma once

#include <sys/types.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "dmagather/v1/telemetry.pb.h"
#include "server/engines/copy_engine.h"
#include "server/scheduler/job.h"
#include "server/service/registry_core.h"
#include "server/service/session.h"

namespace dmagather::server::service {

// Who asks for telemetry: a uid (from a telemetry ticket) or nobody known.
struct Viewer {
  bool operator_view = false;  // Sees every job.
  bool known = false;          // uid is the kernel's; sees its own jobs.
  uid_t uid = 0;
  static Viewer Everything() { return Viewer{true, true, 0}; }
  bool Sees(uid_t owner) const { return operator_view || (known && uid == owner); }
};

// One job's entry: counters, latencies, ring, and each rank's state.
v1::JobStats JobStatsOf(const scheduler::Job& job, const std::vector<std::shared_ptr<Session>>& sessions);

// The entry of a job the reaper swept: "failed" if it failed other than
// by a rank leaving, else "ended".
v1::JobStats EndedJobStats(const JobView& ended);

// What a StatsReply says, gathered by the caller.
struct NodeStatsInput {
  std::vector<JobView> live;
  const std::deque<v1::JobStats>* recent = nullptr;  // Newest first.
  RetiredTotals retired;
  RegionLedger::Held held;
  engines::EngineStats engine;
  uint64_t ingress_sleeps = 0;
  const HandoverCounters* handover = nullptr;  // Restarts survived (null: none shown).
};

// Node totals always; per-job entries (of `job_key`, or all when empty)
// only for jobs `viewer` may see.
void FillNodeStats(const NodeStatsInput& in, const std::string& job_key, const Viewer& viewer, v1::StatsReply* out);

}  // namespace dmagather::server::service
