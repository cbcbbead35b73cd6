#include "server/service/telemetry_service.h"

#include <algorithm>

#include "abi/fd_channel_v1.h"
#include "server/service/metrics.h"

namespace dmagather::server::service {

Viewer TelemetryService::ViewerOf(const std::string& ticket) const {
  Viewer v;
  if (ticket.empty() || tickets_ == nullptr) return v;
  auto h = tickets_->Take(ticket, abi::kFdTelemetry);
  if (!h.ok()) return v;
  v.known = true;
  v.uid = h->uid;
  v.operator_view = h->uid == 0;
  if (operator_gid_ >= 0) {
    const gid_t g = static_cast<gid_t>(operator_gid_);
    v.operator_view |= h->gid == g || std::find(h->groups.begin(), h->groups.end(), g) != h->groups.end();
  }
  return v;
}

grpc::Status TelemetryService::Health(grpc::ServerContext*, const v1::HealthRequest*, v1::HealthReply* reply) {
  health_(reply);  // Sets NOT_SERVING (and the reason) when a self-check fails.
  if (registry_->stopping()) {
    reply->set_status("STOPPING");
  } else if (reply->status().empty()) {
    reply->set_status("SERVING");
  }
  reply->set_jobs(registry_->num_jobs());
  reply->set_sessions(registry_->num_sessions());
  return grpc::Status::OK;
}

grpc::Status TelemetryService::Stats(grpc::ServerContext*, const v1::StatsRequest* req, v1::StatsReply* reply) {
  registry_->FillStats(req->job_key(), ViewerOf(req->ticket()), reply);
  if (!req->job_key().empty() && reply->jobs_size() == 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job '" + req->job_key() + "'");
  }
  return grpc::Status::OK;
}

grpc::Status TelemetryService::Metrics(grpc::ServerContext* ctx, const v1::MetricsRequest* req,
                                       v1::MetricsReply* reply) {
  v1::HealthReply health;
  Health(ctx, nullptr, &health);
  v1::StatsReply stats;
  registry_->FillStats("", ViewerOf(req->ticket()), &stats);
  reply->set_text(RenderPrometheus(health, stats));
  return grpc::Status::OK;
}

}  // namespace dmagather::server::service
