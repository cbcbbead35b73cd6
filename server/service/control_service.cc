#include "server/service/control_service.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace dmagather::server::service {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()),
                      common::IsFallback(s) ? kGrpcFallbackDetails : "");
}

grpc::Status ControlService::Join(grpc::ServerContext* ctx, const v1::JoinRequest* req,
                                  grpc::ServerWriter<v1::JoinEvent>* writer) {
  auto joined = registry_->Join(*req);
  if (!joined.ok()) {
    LOG(WARNING) << "join of rank " << req->rank() << " to job '" << req->job_key()
                 << "' refused: " << joined.status().message();
    return ToGrpc(joined.status());
  }
  const Joined& j = *joined;
  const int timeout_ms = req->join_timeout_ms() > 0 ? req->join_timeout_ms() : 60000;
  const bool all = j.job->WaitAllJoined(absl::Now() + absl::Milliseconds(timeout_ms),
                                        [&] { return ctx->IsCancelled() || registry_->stopping(); });
  if (!all) {
    std::vector<int> missing = j.job->missing_ranks();
    registry_->EndSession(j);
    if (registry_->stopping()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "dmagatherd is shutting down");
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("job '", req->job_key(), "': only ", req->world_size() - missing.size(),
                                     " of ", req->world_size(), " ranks joined within ", timeout_ms,
                                     " ms (missing rank(s) ", absl::StrJoin(missing, ","), ")"));
  }
  v1::JoinEvent ev;
  v1::JoinReply* reply = ev.mutable_joined();
  reply->set_session_id(j.session->id());
  reply->set_daemon_version(version_);
  reply->set_backend(backend_);
  reply->set_world_size(j.job->world_size());
  reply->set_session_secret(j.session->secret());
  reply->set_abi_version(j.session->abi_version());
  for (const auto& r : j.job->ranks()) reply->add_peer_pids(r->pid());
  if (!writer->Write(ev)) {
    registry_->EndSession(j);
    return grpc::Status(grpc::StatusCode::CANCELLED, "client went away during join");
  }
  // Hold the stream: its end is how the daemon learns that the rank is gone.
  while (!ctx->IsCancelled() && j.session->rank()->state() == scheduler::Rank::State::kActive &&
         !registry_->stopping()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (registry_->stopping() && !ctx->IsCancelled()) {
    v1::JoinEvent bye;
    bye.mutable_shutdown()->set_reason("dmagatherd is shutting down");
    writer->Write(bye);
  }
  registry_->EndSession(j);
  return grpc::Status::OK;
}

grpc::Status ControlService::Leave(grpc::ServerContext*, const v1::LeaveRequest* req, v1::LeaveReply*) {
  return ToGrpc(registry_->Leave(req->session_id(), req->session_secret()));
}

grpc::Status ControlService::Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                                      v1::RegisterReply* reply) {
  auto id = registry_->Register(*req);
  if (!id.ok()) return ToGrpc(id.status());
  reply->set_region_id(*id);
  return grpc::Status::OK;
}

grpc::Status ControlService::Deregister(grpc::ServerContext*, const v1::DeregisterRequest* req,
                                        v1::DeregisterReply*) {
  return ToGrpc(registry_->Deregister(req->session_id(), req->session_secret(), req->region_id()));
}

}  // namespace dmagather::server::service
