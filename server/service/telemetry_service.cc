#include "server/service/telemetry_service.h"

#include "server/service/metrics.h"

namespace dmagather::server::service {

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
  registry_->FillStats(req->job_key(), reply);
  if (!req->job_key().empty() && reply->jobs_size() == 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job '" + req->job_key() + "'");
  }
  return grpc::Status::OK;
}

grpc::Status TelemetryService::Metrics(grpc::ServerContext* ctx, const v1::MetricsRequest*, v1::MetricsReply* reply) {
  v1::HealthReply health;
  Health(ctx, nullptr, &health);
  v1::StatsReply stats;
  registry_->FillStats("", &stats);
  reply->set_text(RenderPrometheus(health, stats));
  return grpc::Status::OK;
}

}  // namespace dmagather::server::service
