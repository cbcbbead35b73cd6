#include "server/service/registry.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/cluster/job_id.h"
#include "server/cluster/peer_service.h"
#include "server/service/request_checks.h"

namespace dmagather::server::service {

// Multi-node routing through the daemon's PeerService.
class Registry::PeerServiceJoiner final : public PeerJoiner {
 public:
  explicit PeerServiceJoiner(cluster::PeerService* peers) : peers_(peers) {}
  absl::Status CheckJobId(const std::string& job_id) override { return cluster::ParseJobId(job_id).status(); }
  absl::Status AddRank(const std::shared_ptr<scheduler::Job>& job, const std::string& job_id, int timeout_ms) override {
    return peers_->AddRank(job, job_id, absl::Milliseconds(timeout_ms));
  }

 private:
  cluster::PeerService* const peers_;
};

JoinSpec JoinSpecOf(const v1::JoinRequest& req) {
  JoinSpec s;
  s.job_key = req.job_key();
  s.world_size = req.world_size();
  s.rank = req.rank();
  s.segment_token = req.segment_token();
  s.segment_ticket = req.segment_ticket();
  s.job_id = req.job_id();
  s.join_timeout_ms = req.join_timeout_ms();
  s.device.kind = req.device().kind().empty() ? "cpu" : req.device().kind();
  s.device.ordinal = req.device().ordinal();
  s.device.uuid = req.device().uuid();
  s.device.pci_bus_id = req.device().pci_bus_id();
  s.resume = req.resume();
  s.reconnect_s = int(req.reconnect_s());
  s.local_ranks.assign(req.local_ranks().begin(), req.local_ranks().end());
  return s;
}

RegisterSpec RegisterSpecOf(const v1::RegisterRequest& req) {
  RegisterSpec s;
  s.session_id = req.session_id();
  s.session_secret = req.session_secret();
  s.memory_kind = req.memory_kind();
  s.bytes = req.bytes();
  s.handle = req.handle();
  s.ticket = req.ticket();
  s.tickets.assign(req.tickets().begin(), req.tickets().end());
  s.region_id = req.region_id();
  return s;
}

Registry::Registry(engines::CopyEngine* engine, TicketTable* tickets, Limits limits, common::Clock* clock)
    : engine_(engine), core_(engine, tickets, limits), trimmer_(clock), reaper_([this] { return ReaperPass(); }) {
  core_.SetJobCreatedHook([this] { reaper_.Wake(); });
}

Registry::~Registry() { StopReaper(); }

void Registry::SetPeers(cluster::PeerService* peers) {
  peers_ = peers;
  joiner_ = peers != nullptr ? std::make_unique<PeerServiceJoiner>(peers) : nullptr;
  core_.SetPeerJoiner(joiner_.get());
}

void Registry::StartReaper(std::function<uint64_t()> ingress_epoch, std::function<void()> kick) {
  ingress_epoch_ = std::move(ingress_epoch);
  kick_ = std::move(kick);
  reaper_.Start();
}

absl::StatusOr<Joined> Registry::Join(const v1::JoinRequest& req, const PeerCred& caller) {
  if (stopping()) return absl::UnavailableError("dmagatherd is shutting down");
  DMAG_RETURN_IF_ERROR(CheckJoinRequest(req));
  if (!req.backend().empty() && req.backend() != engine_->name()) {
    return common::FallbackError(absl::StrCat("the client wants backend '", req.backend(),
                                              "' but this dmagatherd runs '", engine_->name(), "'"));
  }
  if (req.abi_version() > 2) {
    return common::FallbackError(absl::StrCat("the client writes shared-memory descriptors v", req.abi_version(),
                                              "; this dmagatherd reads v1 and v2 (upgrade dmagatherd)"));
  }
  return core_.Join(JoinSpecOf(req), caller);
}

absl::StatusOr<uint32_t> Registry::Register(const v1::RegisterRequest& req) {
  // An unknown session is named before a malformed request.
  DMAG_RETURN_IF_ERROR(core_.CheckSession(req.session_id(), req.session_secret()));
  DMAG_RETURN_IF_ERROR(CheckRegisterRequest(req));
  return core_.Register(RegisterSpecOf(req));
}

void Registry::Reap() {
  const uint64_t epoch = ingress_epoch_ ? ingress_epoch_() : 0;
  {
    // A job leaves the core and enters recent_ at one instant for FillStats;
    // its telemetry is taken before any of its memory is freed.
    absl::MutexLock lock(&recent_mu_);
    for (const JobView& view : core_.Sweep(epoch, &frees_)) {
      recent_.push_front(EndedJobStats(view));
      if (recent_.size() > kRecentJobs) recent_.pop_back();
    }
  }
  std::vector<std::shared_ptr<Retirable>> due = frees_.TakeDue(epoch, /*gated=*/ingress_epoch_ != nullptr);
  for (auto& s : due) s->ReleaseMemory();  // Engine detach, unmaps: outside every lock.
  trimmer_.AfterPass(static_cast<int>(due.size()));
}

bool Registry::ReaperPass() {
  Reap();
  const bool frees_waiting = !frees_.empty();
  // Deferred frees wait for an ingress pass: ask for one.
  if (frees_waiting && kick_) kick_();
  return core_.num_jobs() == 0 && !frees_waiting;
}

void Registry::FillStats(const std::string& job_key, const Viewer& viewer, v1::StatsReply* out) const {
  NodeStatsInput in;
  in.held = core_.held_regions();
  in.engine = engine_->stats();
  in.ingress_sleeps = ingress_sleeps_ ? ingress_sleeps_() : 0;
  in.handover = &core_.handover();
  absl::MutexLock lock(&recent_mu_);
  RegistryCore::View view = core_.view();
  in.live = std::move(view.jobs);
  in.retired = view.retired;
  in.recent = &recent_;
  FillNodeStats(in, job_key, viewer, out);
}

}  // namespace dmagather::server::service
