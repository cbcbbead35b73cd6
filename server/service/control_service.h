// gRPC Control service: Join (a stream held for the session's life),
// Leave, Register, Deregister. Control plane only: no per-op traffic.
#pragma once

#include "absl/time/time.h"
#include "dmagather/v1/control.grpc.pb.h"
#include "server/service/registry.h"

namespace dmagather::server::service {

class ControlService final : public v1::Control::Service {
 public:
  ControlService(Registry* registry, std::string version, std::string backend)
      : registry_(registry), version_(std::move(version)), backend_(std::move(backend)) {}

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest* req,
                    grpc::ServerWriter<v1::JoinEvent>* writer) override;
  grpc::Status Leave(grpc::ServerContext* ctx, const v1::LeaveRequest* req, v1::LeaveReply* reply) override;
  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                        v1::RegisterReply* reply) override;
  grpc::Status Deregister(grpc::ServerContext* ctx, const v1::DeregisterRequest* req,
                          v1::DeregisterReply* reply) override;

 private:
  Registry* const registry_;
  const std::string version_;
  const std::string backend_;
};

// The binary error details that mark a FAILED_PRECONDITION as FALLBACK.
inline constexpr char kGrpcFallbackDetails[] = "dmagather.fallback";

// absl::Status -> grpc::Status (code, message; FALLBACK marked in the details).
grpc::Status ToGrpc(const absl::Status& s);

}  // namespace dmagather::server::service
