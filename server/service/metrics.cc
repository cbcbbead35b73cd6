#include "server/service/metrics.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace dmagather::server::service {
namespace {

std::string Label(const std::string& v) {
  return absl::StrReplaceAll(v, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

class Writer {
 public:
  void Family(const char* name, const char* type, const char* help) {
    absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  }
  template <typename V>
  void Sample(const char* name, const std::string& labels, V value) {
    absl::StrAppend(&out_, name, labels.empty() ? "" : "{", labels, labels.empty() ? "" : "}", " ", value, "\n");
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// The daemon's node-wide families: liveness, totals, engines, memory.
void WriteNodeFamilies(const v1::HealthReply& health, const v1::StatsReply& stats, Writer* w) {
  w->Family("dmagather_up", "gauge", "1 while dmagatherd is serving.");
  w->Sample("dmagather_up",
            absl::StrCat("version=\"", Label(health.version()), "\",backend=\"", Label(health.backend()), "\""), 1);
  w->Family("dmagather_uptime_seconds", "gauge", "Seconds since dmagatherd started.");
  w->Sample("dmagather_uptime_seconds", "", health.uptime_s());
  w->Family("dmagather_jobs", "gauge", "Jobs known to the daemon.");
  w->Sample("dmagather_jobs", "", health.jobs());
  w->Family("dmagather_sessions", "gauge", "Rank sessions attached to the daemon.");
  w->Sample("dmagather_sessions", "", health.sessions());
  w->Family("dmagather_ops_total", "counter", "AllGather operations completed successfully.");
  w->Sample("dmagather_ops_total", "", stats.total_ops());
  w->Family("dmagather_bytes_total", "counter", "Bytes written into AllGather outputs.");
  w->Sample("dmagather_bytes_total", "", stats.total_bytes());
  w->Family("dmagather_errors_total", "counter", "Failed rank-operations by status code.");
  for (const auto& e : stats.errors())
    w->Sample("dmagather_errors_total", absl::StrCat("code=\"", e.code(), "\""), e.count());
  w->Family("dmagather_fallbacks_total", "counter", "Degraded modes taken, by reason.");
  for (const auto& f : stats.fallbacks()) {
    w->Sample("dmagather_fallbacks_total", absl::StrCat("reason=\"", Label(f.reason()), "\""), f.count());
  }
  if (stats.copy_engines_size() > 0) {  // GPU backends: per engine the daemon assigned, else per GPU.
    w->Family("dmagather_copy_engine_bytes_total", "counter",
              "Bytes copied per GPU and DMA engine the daemon assigned (engine=\"runtime\": the runtime's choice).");
    for (const auto& c : stats.copy_engines()) {
      w->Sample("dmagather_copy_engine_bytes_total",
                absl::StrCat("device=\"", c.device(), "\",engine=\"",
                             c.engine() < 0 ? std::string("runtime") : absl::StrCat(c.engine()), "\""),
                c.bytes());
    }
  }
  w->Family("dmagather_registered_bytes", "gauge", "Bytes of rank memory imported by the daemon.");
  w->Sample("dmagather_registered_bytes", "", stats.registered_bytes());
  w->Family("dmagather_jobs_completed_total", "counter", "Jobs that ended and were released.");
  w->Sample("dmagather_jobs_completed_total", "", stats.jobs_completed());
  w->Family("dmagather_jobs_taken_over_total", "counter",
            "Jobs this daemon took back from the ranks of an earlier one (daemon restarts survived).");
  w->Sample("dmagather_jobs_taken_over_total", "", stats.jobs_taken_over());
  w->Family("dmagather_ranks_resumed_total", "counter", "Rank sessions that came back from an earlier daemon.");
  w->Sample("dmagather_ranks_resumed_total", "", stats.ranks_resumed());
  w->Family("dmagather_ops_handed_over_total", "counter",
            "Ops the ranks had submitted and not seen done when their earlier daemon went away.");
  w->Sample("dmagather_ops_handed_over_total", "", stats.ops_handed_over());
  w->Family("dmagather_handover_gap_microseconds", "gauge",
            "A rank's time without a daemon across a restart (loss seen to Resume).");
  w->Sample("dmagather_handover_gap_microseconds", "quantile=\"0.5\"", stats.handover_gap().p50_us());
  w->Sample("dmagather_handover_gap_microseconds", "quantile=\"1\"", stats.handover_gap().max_us());
}

// Per job and per rank: ops, bytes, latency quantiles, errors, memory.
void WriteJobFamilies(const v1::StatsReply& stats, Writer* w) {
  w->Family("dmagather_job_ops_total", "counter", "AllGather operations completed, per job.");
  for (const auto& j : stats.jobs())
    w->Sample("dmagather_job_ops_total", absl::StrCat("job=\"", Label(j.job_key()), "\""), j.ops());
  w->Family("dmagather_job_bytes_total", "counter", "Bytes written into outputs, per job.");
  for (const auto& j : stats.jobs())
    w->Sample("dmagather_job_bytes_total", absl::StrCat("job=\"", Label(j.job_key()), "\""), j.bytes());
  w->Family("dmagather_job_device_done_ops_total", "counter",
            "Ops whose done flags a GPU wrote after the copies, per job (no CPU on the op's path).");
  for (const auto& j : stats.jobs())
    w->Sample("dmagather_job_device_done_ops_total", absl::StrCat("job=\"", Label(j.job_key()), "\""),
              j.device_done_ops());
  w->Family("dmagather_job_latency_microseconds", "gauge", "Op latency (first descriptor seen to last done flag).");
  for (const auto& j : stats.jobs()) {
    std::string job = absl::StrCat("job=\"", Label(j.job_key()), "\"");
    w->Sample("dmagather_job_latency_microseconds", absl::StrCat(job, ",quantile=\"0.5\""), j.latency().p50_us());
    w->Sample("dmagather_job_latency_microseconds", absl::StrCat(job, ",quantile=\"0.99\""), j.latency().p99_us());
  }
  w->Family("dmagather_job_hop_latency_microseconds", "gauge", "Daemon hop: last descriptor seen to copies enqueued.");
  for (const auto& j : stats.jobs()) {
    std::string job = absl::StrCat("job=\"", Label(j.job_key()), "\"");
    w->Sample("dmagather_job_hop_latency_microseconds", absl::StrCat(job, ",quantile=\"0.5\""),
              j.hop_latency().p50_us());
    w->Sample("dmagather_job_hop_latency_microseconds", absl::StrCat(job, ",quantile=\"0.99\""),
              j.hop_latency().p99_us());
  }
  w->Family("dmagather_rank_ops_total", "counter", "Operations completed, per rank.");
  for (const auto& j : stats.jobs()) {
    for (const auto& r : j.ranks()) {
      w->Sample("dmagather_rank_ops_total", absl::StrCat("job=\"", Label(j.job_key()), "\",rank=\"", r.rank(), "\""),
                r.ops());
    }
  }
  w->Family("dmagather_rank_errors_total", "counter", "Failed operations, per rank and status code.");
  for (const auto& j : stats.jobs()) {
    for (const auto& r : j.ranks()) {
      for (const auto& e : r.errors()) {
        w->Sample("dmagather_rank_errors_total",
                  absl::StrCat("job=\"", Label(j.job_key()), "\",rank=\"", r.rank(), "\",code=\"", e.code(), "\""),
                  e.count());
      }
    }
  }
  w->Family("dmagather_rank_registered_bytes", "gauge", "Registered memory, per rank.");
  for (const auto& j : stats.jobs()) {
    for (const auto& r : j.ranks()) {
      w->Sample("dmagather_rank_registered_bytes",
                absl::StrCat("job=\"", Label(j.job_key()), "\",rank=\"", r.rank(), "\""), r.registered_bytes());
    }
  }
}

}  // namespace

std::string RenderPrometheus(const v1::HealthReply& health, const v1::StatsReply& stats) {
  Writer w;
  WriteNodeFamilies(health, stats, &w);
  WriteJobFamilies(stats, &w);
  return w.Take();
}

}  // namespace dmagather::server::service
