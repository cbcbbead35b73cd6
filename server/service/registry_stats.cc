#include "server/service/registry_stats.h"

#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/api_names.h"

namespace dmagather::server::service {

using scheduler::Job;
using scheduler::Rank;

namespace {

void FillLatency(const common::LatencyHistogram& h, v1::LatencySummary* out) {
  common::LatencySummaryNs s = h.Summary();
  out->set_p50_us(s.p50 / 1e3);
  out->set_p99_us(s.p99 / 1e3);
  out->set_max_us(s.max / 1e3);
  out->set_count(s.count);
}

template <typename Counters, typename Msg>
void FillErrors(const Counters& errors, Msg* out) {
  for (int c = 1; c < common::kNumApiStatus; ++c) {
    uint64_t n = errors[c];
    if (n == 0) continue;
    auto* e = out->add_errors();
    e->set_code(common::ApiStatusName(c));
    e->set_count(n);
  }
}

void FillRing(const Job& job, const scheduler::RemotePart& remote, v1::RingStats* ring) {
  const scheduler::RemoteStats rs = remote.stats();
  ring->set_nodes(job.topology()->num_nodes());
  ring->set_node(job.topology()->my_node);
  ring->set_transport(rs.transport);
  ring->set_transport_reason(rs.transport_reason);
  ring->set_links(rs.links);
  ring->set_next(rs.next);
  ring->set_prev(rs.prev);
  ring->set_bytes_sent(rs.bytes_sent);
  ring->set_bytes_received(rs.bytes_received);
  ring->set_ops(rs.ops);
  ring->set_transit_bytes(rs.transit_bytes);
  ring->set_busy_s(rs.busy_ns * 1e-9);
  ring->set_throughput_gbps(rs.busy_ns != 0 ? rs.bytes_received * 8.0 / rs.busy_ns : 0.0);
  auto* cl = ring->mutable_chunk_latency();
  cl->set_p50_us(rs.chunk_latency.p50 / 1e3);
  cl->set_p99_us(rs.chunk_latency.p99 / 1e3);
  cl->set_max_us(rs.chunk_latency.max / 1e3);
  cl->set_count(rs.chunk_latency.count);
}

// One rank's entry; true when it is active.
bool FillRank(const Job& job, int r, const std::shared_ptr<Session>& s, v1::RankStats* rs) {
  rs->set_rank(r);
  if (s == nullptr) {
    const scheduler::Topology* topo = job.topology();
    rs->set_state(topo != nullptr && topo->node_of_rank[r] != topo->my_node
                      ? absl::StrCat("remote (node ", topo->node_of_rank[r], ")")
                      : "missing");
    return false;
  }
  const Rank& k = *s->rank();
  rs->set_pid(k.pid());
  rs->set_state(k.state_name());
  rs->set_ops(k.counters.ops.load());
  rs->set_bytes(k.counters.bytes.load());
  FillErrors(k.counters.errors, rs);
  FillLatency(k.counters.latency, rs->mutable_latency());
  rs->set_registered_bytes(s->input()->regions.registered_bytes());
  rs->set_regions(s->input()->regions.size());
  return k.state() == Rank::State::kActive;
}

void AddFallback(const char* reason, uint64_t count, v1::StatsReply* out) {
  if (count == 0) return;
  auto* f = out->add_fallbacks();
  f->set_reason(reason);
  f->set_count(count);
}

}  // namespace

v1::JobStats JobStatsOf(const Job& job, const std::vector<std::shared_ptr<Session>>& sessions) {
  v1::JobStats js;
  js.set_job_key(job.key());
  js.set_uid(job.uid());
  js.set_world_size(job.world_size());
  js.set_ops(job.counters.ops.load());
  js.set_bytes(job.counters.bytes.load());
  js.set_fallback_ops(job.counters.fallback_ops.load());
  js.set_device_done_ops(job.counters.device_done_ops.load());
  js.set_done_before_cpu(job.counters.done_before_cpu.load());
  FillErrors(job.counters.errors, &js);
  FillLatency(job.counters.latency, js.mutable_latency());
  FillLatency(job.counters.hop_latency, js.mutable_hop_latency());
  if (const scheduler::RemotePart* remote = job.remote(); remote != nullptr) FillRing(job, *remote, js.mutable_ring());
  int active = 0;
  uint64_t registered = 0;
  for (int r = 0; r < job.world_size(); ++r) {
    v1::RankStats* rs = js.add_ranks();
    if (FillRank(job, r, sessions[r], rs)) ++active;
    registered += rs->registered_bytes();
  }
  js.set_registered_bytes(registered);
  js.set_state(job.failed() ? (active == 0 ? "finished" : "failed") : (job.all_joined() ? "running" : "joining"));
  return js;
}

v1::JobStats EndedJobStats(const JobView& ended) {
  const Job& job = *ended.job;
  v1::JobStats js = JobStatsOf(job, ended.sessions);
  js.set_state(job.failed() && !absl::IsAborted(job.failure()) ? "failed" : "ended");
  return js;
}

void FillNodeStats(const NodeStatsInput& in, const std::string& job_key, const Viewer& viewer, v1::StatsReply* out) {
  uint64_t ops = in.retired.ops, bytes = in.retired.bytes, fallback_ops = in.retired.fallback_ops, registered = 0;
  std::array<uint64_t, common::kNumApiStatus> errors = in.retired.errors;
  for (const JobView& view : in.live) {
    const Job& job = *view.job;
    ops += job.counters.ops.load();
    bytes += job.counters.bytes.load();
    fallback_ops += job.counters.fallback_ops.load();
    for (int c = 0; c < common::kNumApiStatus; ++c) errors[c] += job.counters.errors[c].load();
    v1::JobStats js = JobStatsOf(job, view.sessions);
    registered += js.registered_bytes();
    if ((job_key.empty() || job_key == job.key()) && viewer.Sees(job.uid())) *out->add_jobs() = std::move(js);
  }
  if (in.recent != nullptr) {
    for (const v1::JobStats& js : *in.recent) {
      if ((job_key.empty() || job_key == js.job_key()) && viewer.Sees(js.uid())) *out->add_jobs() = js;
    }
  }
  out->set_total_ops(ops);
  out->set_total_bytes(bytes);
  FillErrors(errors, out);
  out->set_registered_bytes(registered);
  out->set_held_regions(in.held.regions);
  out->set_held_bytes(in.held.bytes);
  out->set_jobs_completed(in.retired.jobs_completed);
  out->set_same_device_copies(in.engine.same_device_copies);
  out->set_ingress_sleeps(in.ingress_sleeps);
  out->set_engine_wakeups(in.engine.thread_wakeups);
  out->set_ops_held_on_cpu(in.engine.held_on_cpu);
  for (const engines::CopyEngineBytes& c : in.engine.copy_engines) {
    auto* e = out->add_copy_engines();
    e->set_device(static_cast<uint32_t>(c.device));
    e->set_engine(c.engine);
    e->set_bytes(c.bytes);
  }
  if (in.handover != nullptr) {
    out->set_jobs_taken_over(in.handover->jobs_taken_over.load());
    out->set_ranks_resumed(in.handover->ranks_resumed.load());
    out->set_ops_handed_over(in.handover->ops_handed_over.load());
    FillLatency(in.handover->gap, out->mutable_handover_gap());
  }
  AddFallback("same_device_copy_on_sm", in.engine.same_device_copies, out);
  AddFallback("op_refused_by_rank", fallback_ops, out);
}

}  // namespace dmagather::server::service
