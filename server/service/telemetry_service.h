// gRPC Telemetry service: Health, Stats (per job and rank), Metrics
// (Prometheus text).
//
// Who sees what: gRPC 1.51 cannot say who is calling, so Stats and Metrics
// take a ticket the caller got from the fd channel (kFdTelemetry; the
// kernel gave the daemon its uid, gid and supplementary groups there).
// With a valid ticket the caller sees its own uid's jobs, or every job if
// it is root or a member of the operator group; without one (or with a
// spent, expired or made-up one) only node totals. Health shows only node
// counts.
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
  // `operator_gid`: members see every job (-1: only root does).
  TelemetryService(Registry* registry, TicketTable* tickets, int64_t operator_gid,
                   std::function<void(v1::HealthReply*)> health)
      : registry_(registry), tickets_(tickets), operator_gid_(operator_gid), health_(std::move(health)) {}

  grpc::Status Health(grpc::ServerContext*, const v1::HealthRequest*, v1::HealthReply* reply) override;
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest* req, v1::StatsReply* reply) override;
  grpc::Status Metrics(grpc::ServerContext*, const v1::MetricsRequest*, v1::MetricsReply* reply) override;

 private:
  // Who a telemetry ticket says the caller is (nobody known if invalid).
  Viewer ViewerOf(const std::string& ticket) const;

  Registry* const registry_;
  TicketTable* const tickets_;
  const int64_t operator_gid_;
  std::function<void(v1::HealthReply*)> health_;
};

}  // namespace dmagather::server::service
