// gRPC Telemetry service: Health, Stats (per job and rank), Metrics
// (Prometheus text).
#pragma once

#include <functional>

#include "dmagather/v1/telemetry.grpc.pb.h"
#include "server/service/registry.h"

namespace dmagather::server::service {

class TelemetryService final : public v1::Telemetry::Service {
 public:
  // `health` fills what only the daemon knows (version, backend, uptime) and
  // runs its self-check: it sets status NOT_SERVING with a reason when
  // something a Join needs (the fd channel, the doorbell) does not work.
  TelemetryService(Registry* registry, std::function<void(v1::HealthReply*)> health)
      : registry_(registry), health_(std::move(health)) {}

  grpc::Status Health(grpc::ServerContext*, const v1::HealthRequest*, v1::HealthReply* reply) override;
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest* req, v1::StatsReply* reply) override;
  grpc::Status Metrics(grpc::ServerContext*, const v1::MetricsRequest*, v1::MetricsReply* reply) override;

 private:
  Registry* const registry_;
  std::function<void(v1::HealthReply*)> health_;
};

}  // namespace dmagather::server::service
