#include "server/service/control_service.h"

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/api_names.h"
#include "common/status.h"
#include "server/cluster/peer_service.h"
#include "server/service/wait_spin.h"

namespace dmagather::server::service {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()),
                      common::IsFallback(s) ? kGrpcFallbackDetails : "");
}

// One open Join. gRPC owns it until OnDone; its reactions only set flags
// and wake the watcher, which does every write and the Finish.
class JoinReactor final : public grpc::ServerWriteReactor<v1::JoinEvent> {
 public:
  enum class Phase { kWaiting, kWritingReply, kActive };

  JoinReactor(ControlService* service, const v1::JoinRequest& req) : service_(service), req_(req) {}

  void OnWriteDone(bool ok) override {
    write_ok_.store(ok, std::memory_order_release);
    writing_.store(false, std::memory_order_release);
    service_->Wake();
  }
  void OnCancel() override {
    cancelled_.store(true, std::memory_order_release);
    service_->Wake();
  }
  void OnDone() override { delete this; }

  // Watcher-thread state.
  ControlService* const service_;
  const v1::JoinRequest req_;
  std::optional<Joined> joined_;
  absl::Time deadline_;
  int timeout_ms_ = 0;
  Phase phase_ = Phase::kWaiting;
  v1::JoinEvent event_;  // Outlives its write.
  // Set by reactions.
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> writing_{false};
  std::atomic<bool> write_ok_{true};
};

ControlService::ControlService(Registry* registry, std::string version, std::string backend, WhoIsCalling who,
                               common::Clock* clock)
    : registry_(registry),
      who_(std::move(who)),
      clock_(clock),
      version_(std::move(version)),
      backend_(std::move(backend)) {
  watcher_ = std::thread([this] { WatcherLoop(); });
}

ControlService::~ControlService() { Stop(); }

void ControlService::Wake() {
  {
    absl::MutexLock lock(&mu_);
    wake_ = true;
  }
  cv_.Signal();
}

void ControlService::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.Signal();
  if (watcher_.joinable()) watcher_.join();
}

int ControlService::open_joins() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(reactors_.size());
}

grpc::ServerWriteReactor<v1::JoinEvent>* ControlService::Join(grpc::CallbackServerContext* ctx,
                                                              const v1::JoinRequest* req) {
  auto* r = new JoinReactor(this, *req);
  const std::optional<PeerCred> caller = who_ != nullptr ? who_(ctx->peer()) : std::nullopt;
  if (!caller.has_value()) {
    r->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                           absl::StrCat("join: dmagatherd cannot tell who is calling (peer '", ctx->peer(), "')")));
    return r;
  }
  auto joined = registry_->Join(*req, *caller);
  if (!joined.ok()) {
    LOG(WARNING) << "join of rank " << req->rank() << " to job '" << req->job_key()
                 << "' refused: " << joined.status().message();
    r->Finish(ToGrpc(joined.status()));  // gRPC deletes r (OnDone).
    return r;
  }
  r->joined_ = *std::move(joined);
  r->timeout_ms_ = req->join_timeout_ms() > 0 ? req->join_timeout_ms() : 60000;
  r->deadline_ = clock_->Now() + absl::Milliseconds(r->timeout_ms_);
  {
    absl::MutexLock lock(&mu_);
    reactors_.push_back(r);
    wake_ = true;
  }
  cv_.Signal();
  return r;
}

void ControlService::WatcherLoop() {
  std::vector<JoinReactor*> batch, done;
  absl::MutexLock lock(&mu_);
  for (;;) {
    // Open Joins are polled every 20 ms (a job completing, a session the
    // daemon ends); with none, only Wake() or a second passing wakes it.
    // The pause is real time (a poll's cadence, not a verdict): Step decides
    // each Join's deadline on clock_.
    const absl::Duration pause = reactors_.empty() ? absl::Seconds(1) : absl::Milliseconds(20);
    while (!wake_ && !stop_ && !cv_.WaitWithTimeout(&mu_, pause)) {
    }
    if (stop_) break;
    wake_ = false;
    batch = reactors_;  // Only this thread finishes them, so they stay valid.
    mu_.Unlock();
    done.clear();
    for (JoinReactor* r : batch) {
      if (Step(r)) done.push_back(r);
    }
    mu_.Lock();
    if (!done.empty()) {
      reactors_.erase(
          std::remove_if(reactors_.begin(), reactors_.end(),
                         [&](JoinReactor* r) { return std::find(done.begin(), done.end(), r) != done.end(); }),
          reactors_.end());
    }
  }
}

bool ControlService::StepWaiting(JoinReactor* r, bool cancelled, bool stopping, bool back_here) {
  const Joined& j = *r->joined_;
  if ((j.job->all_joined() || back_here) && !cancelled) {
    v1::JoinReply* reply = r->event_.mutable_joined();
    reply->set_session_id(j.session->id());
    reply->set_daemon_version(version_);
    reply->set_backend(backend_);
    reply->set_world_size(j.job->world_size());
    reply->set_session_secret(j.session->secret());
    reply->set_abi_version(j.session->abi_version());
    reply->set_wait_spin(AdvisedWaitSpin(UsableCpus(), registry_->num_sessions()));
    reply->set_resumed(j.session->resume());
    reply->set_takes_captured(true);
    reply->set_takes_alltoall(true);
    for (const auto& k : j.job->ranks()) reply->add_peer_pids(k != nullptr ? k->pid() : 0);  // 0: another node.
    r->phase_ = JoinReactor::Phase::kWritingReply;
    r->writing_.store(true, std::memory_order_release);
    r->StartWrite(&r->event_);
    return false;
  }
  const bool failed = j.job->failed();  // A multi-node job whose setup failed.
  if (j.job->handed_back()) {
    // Handed back before this rank's reply (Job::HandBack): it joins again.
    registry_->EndSession(j);
    r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           absl::StrCat("job '", r->req_.job_key(), "' is handed back to its ranks (",
                                        j.job->hand_back_why().message(), "): join again")));
    return true;
  }
  if (!cancelled && !stopping && !failed && clock_->Now() < r->deadline_) return false;
  std::vector<int> missing = j.job->missing_ranks();
  registry_->EndSession(j);
  if (failed) {
    r->Finish(ToGrpc(j.job->failure()));
  } else if (stopping) {
    r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "dmagatherd is shutting down"));
  } else if (cancelled) {
    r->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled its join"));
  } else {
    const int world = r->req_.world_size();
    r->Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                           absl::StrCat("job '", r->req_.job_key(), "': only ", world - int(missing.size()), " of ",
                                        world, " ranks joined within ", r->timeout_ms_, " ms (missing rank(s) ",
                                        absl::StrJoin(missing, ","), ")")));
  }
  return true;
}

bool ControlService::Step(JoinReactor* r) {
  const Joined& j = *r->joined_;
  const bool cancelled = r->cancelled_.load(std::memory_order_acquire);
  const bool stopping = registry_->stopping();
  // A multi-node job coming back answers once its ranks here are back:
  // they register again and Resume before the coordinator's table comes.
  const bool back_here = j.job->multi_node() && j.job->resuming() && j.job->local_joined();
  if (r->phase_ == JoinReactor::Phase::kWaiting) return StepWaiting(r, cancelled, stopping, back_here);
  if (r->phase_ == JoinReactor::Phase::kWritingReply) {
    if (r->writing_.load(std::memory_order_acquire)) return false;
    if (!r->write_ok_.load(std::memory_order_acquire)) {
      registry_->EndSession(j);
      r->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away during join"));
      return true;
    }
    r->phase_ = JoinReactor::Phase::kActive;
  }
  // Active: the open stream is the session. Its end from the client's side
  // (OnCancel) means the rank is gone.
  const scheduler::Rank::State st = j.session->rank()->state();
  // Back, waiting for the ring to form again (a multi-node job taken back).
  const bool forming = st == scheduler::Rank::State::kJoining && back_here && !j.job->failed();
  if (!cancelled && (st == scheduler::Rank::State::kActive || forming) && !stopping && !j.job->handed_back()) {
    return false;
  }
  if (cancelled) {
    registry_->EndSession(j);
    r->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the rank's stream ended"));
    return true;
  }
  if (stopping || j.job->handed_back()) {
    // Either way the rank joins again and its job goes on (a daemon that
    // stops; a multi-node job whose ring lost a node: Job::HandBack).
    registry_->EndSession(j);
    r->event_.Clear();
    r->event_.mutable_shutdown()->set_reason(
        stopping ? "dmagatherd is shutting down"
                 : absl::StrCat("job '", j.job->key(), "' is handed back to its ranks to form its ring again (",
                                j.job->hand_back_why().message(), ")"));
    r->StartWriteAndFinish(&r->event_, grpc::WriteOptions(), grpc::Status::OK);
    return true;
  }
  if (st == scheduler::Rank::State::kLeft) {  // Its own Leave (the session's secret).
    registry_->EndSession(j);
    r->Finish(grpc::Status::OK);
    return true;
  }
  // The daemon took the rank out (e.g. it corrupted its request ring): say why.
  const std::string why =
      j.job->failed() ? std::string(j.job->failure().message()) : "the daemon removed the rank from its job";
  registry_->EndSession(j);
  r->event_.Clear();
  r->event_.mutable_ended()->set_reason(why);
  if (j.job->failed()) r->event_.mutable_ended()->set_code(common::ToApiStatus(j.job->failure()));
  r->StartWriteAndFinish(&r->event_, grpc::WriteOptions(), grpc::Status::OK);
  return true;
}

grpc::Status ControlService::CreateJobId(grpc::ServerContext*, const v1::CreateJobIdRequest*,
                                         v1::CreateJobIdReply* reply) {
  if (registry_->peers() == nullptr) {
    return ToGrpc(absl::FailedPreconditionError(
        "this dmagatherd runs without --peer_listen: it cannot coordinate a multi-node job"));
  }
  auto id = registry_->peers()->NewJobId();
  if (!id.ok()) return ToGrpc(id.status());
  reply->set_job_id(*id);
  return grpc::Status::OK;
}

grpc::Status ControlService::Leave(grpc::ServerContext*, const v1::LeaveRequest* req, v1::LeaveReply*) {
  absl::Status s = registry_->Leave(req->session_id(), req->session_secret());
  if (s.ok()) Wake();  // The watcher ends the stream now.
  return ToGrpc(s);
}

grpc::Status ControlService::Register(grpc::ServerContext*, const v1::RegisterRequest* req, v1::RegisterReply* reply) {
  auto id = registry_->Register(*req);
  if (!id.ok()) return ToGrpc(id.status());
  reply->set_region_id(*id);
  return grpc::Status::OK;
}

grpc::Status ControlService::Deregister(grpc::ServerContext*, const v1::DeregisterRequest* req, v1::DeregisterReply*) {
  return ToGrpc(registry_->Deregister(req->session_id(), req->session_secret(), req->region_id()));
}

grpc::Status ControlService::Resume(grpc::ServerContext*, const v1::ResumeRequest* req, v1::ResumeReply*) {
  std::vector<CapturedDefinition> captured;
  for (const v1::CapturedOp& c : req->captured()) captured.push_back({c.seq(), c.slot(), c.descriptors()});
  return ToGrpc(
      registry_->Resume(req->session_id(), req->session_secret(), req->gap_us() * 1000, req->ops_pending(), captured));
}

}  // namespace dmagather::server::service
