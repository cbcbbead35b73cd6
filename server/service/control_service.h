// gRPC Control service: Join (a stream held for the session's life),
// Leave, Register, Deregister. Control plane only: no per-op traffic.
//
// Join is a callback (reactor) method: an open session costs a JoinReactor
// object, not a thread. One watcher thread serves every open Join: it sends
// the reply once the job's ranks are all in (or ends the call at the join
// timeout), ends the stream when the rank leaves, and at shutdown sends the
// Shutdown event. A stream that ends from the client's side (the rank
// died: OnCancel) wakes the watcher, which tells the registry at once.
// Leave, Register and Deregister are short synchronous calls.
//
// Threads: gRPC's callback threads create reactors and run their reactions
// (which only set flags); the watcher thread does every write, Finish and
// registry call of a Join; Stop() after the gRPC server has shut down.
// mu_ guards the open Joins and the watcher's wake/stop flags.
#pragma once

#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "dmagather/v1/control.grpc.pb.h"
#include "server/service/registry.h"

namespace dmagather::server::service {

class JoinReactor;

class ControlService final : public v1::Control::WithCallbackMethod_Join<v1::Control::Service> {
 public:
  // `who` names the caller of a call from its ServerContext::peer()
  // (ControlListener::PeerOf); a Join whose caller it cannot name is refused.
  using WhoIsCalling = std::function<std::optional<PeerCred>(const std::string& grpc_peer)>;
  ControlService(Registry* registry, std::string version, std::string backend, WhoIsCalling who,
                 common::Clock* clock = &common::RealClock());
  ~ControlService() override;

  grpc::ServerWriteReactor<v1::JoinEvent>* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req) override;
  grpc::Status Leave(grpc::ServerContext* ctx, const v1::LeaveRequest* req, v1::LeaveReply* reply) override;
  grpc::Status CreateJobId(grpc::ServerContext* ctx, const v1::CreateJobIdRequest* req,
                           v1::CreateJobIdReply* reply) override;
  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req, v1::RegisterReply* reply) override;
  grpc::Status Deregister(grpc::ServerContext* ctx, const v1::DeregisterRequest* req,
                          v1::DeregisterReply* reply) override;
  grpc::Status Resume(grpc::ServerContext* ctx, const v1::ResumeRequest* req, v1::ResumeReply* reply) override;

  // Wakes the watcher (a Join arrived, a stream was cancelled, shutdown).
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the watcher thread (after the gRPC server has finished every call).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  int open_joins() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class JoinReactor;
  void WatcherLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // One watcher step for one reactor; true when it is finished (dropped).
  bool Step(JoinReactor* r);
  // Step before the reply: write it once the job is complete here, or end
  // the Join (handed back, failed, stopping, cancelled, timed out).
  bool StepWaiting(JoinReactor* r, bool cancelled, bool stopping, bool back_here);

  Registry* const registry_;
  const WhoIsCalling who_;
  common::Clock* const clock_;  // Join deadlines.
  const std::string version_;
  const std::string backend_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // wake_ or stop_ set.
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Open Joins not yet finished (owned by gRPC until OnDone).
  std::vector<JoinReactor*> reactors_ ABSL_GUARDED_BY(mu_);
  std::thread watcher_;
};

// The binary error details that mark a FAILED_PRECONDITION as FALLBACK.
inline constexpr char kGrpcFallbackDetails[] = "dmagather.fallback";

// absl::Status -> grpc::Status (code, message; FALLBACK marked in the details).
grpc::Status ToGrpc(const absl::Status& s);

}  // namespace dmagather::server::service
