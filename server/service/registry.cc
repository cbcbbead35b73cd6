#include "server/service/registry.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/api_names.h"

namespace dmagather::server::service {

using ingress::Session;
using scheduler::Job;

namespace {

absl::Status CheckJoinRequest(const v1::JoinRequest& req) {
  if (req.job_key().empty() || req.job_key().size() > 128) {
    return absl::InvalidArgumentError("job_key must be 1..128 characters");
  }
  for (char c : req.job_key()) {
    if (c < 0x21 || c > 0x7e) return absl::InvalidArgumentError("job_key must be printable ASCII without spaces");
  }
  if (req.world_size() < 1 || req.world_size() > static_cast<int>(abi::kMaxRanksV1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", req.world_size(), " is outside 1..", abi::kMaxRanksV1));
  }
  if (req.rank() < 0 || req.rank() >= req.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", req.rank(), " is outside 0..", req.world_size() - 1));
  }
  return absl::OkStatus();
}


void FillLatency(const common::LatencyHistogram& h, v1::LatencySummary* out) {
  common::LatencySummaryNs s = h.Summary();
  out->set_p50_us(s.p50 / 1e3);
  out->set_p99_us(s.p99 / 1e3);
  out->set_max_us(s.max / 1e3);
  out->set_count(s.count);
}

template <typename Counters, typename Msg>
void FillErrors(const Counters& errors, Msg* out) {
  for (int c = 1; c < ingress::kNumApiStatus; ++c) {
    uint64_t n = errors[c].load(std::memory_order_relaxed);
    if (n == 0) continue;
    auto* e = out->add_errors();
    e->set_code(common::ApiStatusName(c));
    e->set_count(n);
  }
}

v1::JobStats StatsOf(const Job& job) {
  v1::JobStats js;
  js.set_job_key(job.key());
  js.set_world_size(job.world_size());
  js.set_ops(job.counters.ops.load());
  js.set_bytes(job.counters.bytes.load());
  FillErrors(job.counters.errors, &js);
  FillLatency(job.counters.latency, js.mutable_latency());
  FillLatency(job.counters.hop_latency, js.mutable_hop_latency());
  int active = 0;
  uint64_t registered = 0;
  auto sessions = job.sessions();
  for (int r = 0; r < job.world_size(); ++r) {
    auto* rs = js.add_ranks();
    rs->set_rank(r);
    const auto& s = sessions[r];
    if (s == nullptr) {
      rs->set_state("missing");
      continue;
    }
    rs->set_pid(s->pid());
    rs->set_state(s->state_name());
    if (s->state() == Session::State::kActive) ++active;
    rs->set_ops(s->counters.ops.load());
    rs->set_bytes(s->counters.bytes.load());
    FillErrors(s->counters.errors, rs);
    FillLatency(s->counters.latency, rs->mutable_latency());
    rs->set_registered_bytes(s->registered_bytes());
    rs->set_regions(s->num_regions());
    registered += s->registered_bytes();
  }
  js.set_registered_bytes(registered);
  js.set_state(job.failed() ? (active == 0 ? "finished" : "failed") : (job.all_joined() ? "running" : "joining"));
  return js;
}

}  // namespace

absl::StatusOr<Joined> Registry::Join(const v1::JoinRequest& req) {
  if (stopping()) return absl::UnavailableError("dmagatherd is shutting down");
  absl::Status ok = CheckJoinRequest(req);
  if (!ok.ok()) return ok;
  if (!req.backend().empty() && req.backend() != engine_->name()) {
    return absl::FailedPreconditionError(absl::StrCat("the client wants backend '", req.backend(),
                                                      "' but this dmagatherd runs '", engine_->name(), "'"));
  }
  absl::MutexLock lock(&mu_);
  uint64_t id = next_session_id_++;
  auto session = Session::Open(id, req.rank(), req.pid(), req.segment_name(), req.segment_token());
  if (!session.ok()) return session.status();
  std::shared_ptr<Job>& job = jobs_[req.job_key()];
  if (job == nullptr) {
    job = std::make_shared<Job>(req.job_key(), req.world_size(), (*session)->uid());
    version_.fetch_add(1);
    LOG(INFO) << "job '" << req.job_key() << "' created: " << req.world_size() << " ranks, uid " << job->uid();
  }
  if (job->world_size() != req.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("job '", req.job_key(), "' has world size ", job->world_size(),
                                                   ", rank ", req.rank(), " asked for ", req.world_size()));
  }
  if (job->uid() != (*session)->uid()) {
    return absl::PermissionDeniedError(absl::StrCat("job '", req.job_key(), "' belongs to uid ", job->uid(),
                                                    "; rank ", req.rank(), " runs as uid ", (*session)->uid()));
  }
  (*session)->cuda_device = req.cuda_device();
  if (std::string(engine_->name()) == "cuda" && req.cuda_device() < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this dmagatherd runs the cuda backend but rank ", req.rank(),
        " has no CUDA device (no GPU visible to it, or its libdmagather has no CUDA support)"));
  }
  auto flag = engine_->AttachFlags((*session)->flag_pages(), Session::kFlagPagesBytes,
                                   &(*session)->view().completion->ready_seq);
  if (!flag.ok()) return flag.status();
  (*session)->ready_flag_device = *flag;
  (*session)->flags_attached = *flag != 0;
  absl::Status added = job->AddRank(*session);
  if (!added.ok()) {
    ReleaseSessionMemory(session->get());
    return added;
  }
  sessions_[id] = *session;
  LOG(INFO) << "job '" << req.job_key() << "': rank " << req.rank() << " (pid " << req.pid() << ") joined, "
            << job->joined() << "/" << job->world_size();
  return Joined{job, *session};
}

void Registry::EndSession(const Joined& j) {
  Session& s = *j.session;
  const bool clean = s.state() == Session::State::kLeft;
  if (!j.job->all_joined()) {
    j.job->RemoveRank(&s);
    s.set_state(Session::State::kLeft);
  } else if (clean) {
    ReleaseGpuWaits(&s);
    j.job->Fail(absl::AbortedError(absl::StrCat("rank ", s.rank(), " (pid ", s.pid(), ") left job '",
                                                j.job->key(), "'")),
                s.rank());
  } else {
    s.set_state(Session::State::kGone);
    ReleaseGpuWaits(&s);
    LOG(WARNING) << "job '" << j.job->key() << "': rank " << s.rank() << " (pid " << s.pid()
                 << ") went away without leaving; failing the job's pending operations";
    j.job->Fail(absl::AbortedError(absl::StrCat("rank ", s.rank(), " (pid ", s.pid(), ") of job '",
                                                j.job->key(), "' exited or was killed")),
                s.rank());
  }
  absl::MutexLock lock(&mu_);
  sessions_.erase(s.id());
  version_.fetch_add(1);
}

absl::Status Registry::Leave(uint64_t session_id) {
  auto s = FindSession(session_id);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("no session ", session_id));
  s->set_state(Session::State::kLeft);
  return absl::OkStatus();
}

void Registry::ReleaseSessionMemory(Session* s) {
  if (s == nullptr || s->memory_released()) return;
  if (s->flags_attached) {
    engine_->DetachFlags(s->flag_pages());
    s->flags_attached = false;
  }
  s->ReleaseMemory();
}

void Registry::ReleaseGpuWaits(Session* s) {
  // The rank is gone, so its stream will never write ready_seq: move it past
  // every op it may still have in flight (at most kRingSlotsV1 after the
  // last published done), so engine streams waiting on it (cuda) drain. The
  // job has failed by now, so those ops complete with its error.
  if (s->memory_released() || !s->flags_attached) return;
  abi::CompletionV1* c = s->view().completion;
  abi::StoreSeqCst(&c->ready_seq, abi::LoadAcquire(&c->done_seq) + abi::kRingSlotsV1 + 1);
}

std::shared_ptr<Session> Registry::FindSession(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second;
}

absl::StatusOr<uint32_t> Registry::Register(const v1::RegisterRequest& req) {
  auto s = FindSession(req.session_id());
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("no session ", req.session_id()));
  engines::RegionSpec spec;
  spec.bytes = req.bytes();
  switch (req.kind()) {
    case v1::MEMORY_KIND_HOST_SHM:
      spec.kind = engines::MemoryKind::kHostShm;
      spec.shm_name = req.shm_name();
      break;
    case v1::MEMORY_KIND_CUDA_IPC:
      spec.kind = engines::MemoryKind::kCudaIpc;
      spec.ipc_handle = req.ipc_handle();
      spec.device = s->cuda_device;
      break;
    default:
      return absl::InvalidArgumentError("unknown memory kind");
  }
  auto region = engine_->Import(spec);
  if (!region.ok()) return region.status();
  if ((*region)->owner_uid() >= 0 && (*region)->owner_uid() != static_cast<int64_t>(s->uid())) {
    return absl::PermissionDeniedError(absl::StrCat("buffer ", req.shm_name(), " belongs to uid ",
                                                    (*region)->owner_uid(), ", not to rank ", s->rank(),
                                                    "'s uid ", s->uid()));
  }
  uint32_t id = next_region_id_.fetch_add(1);
  absl::Status st = s->AddRegion(id, *std::move(region));
  if (!st.ok()) return st;
  return id;
}

absl::Status Registry::Deregister(uint64_t session_id, uint32_t region_id) {
  auto s = FindSession(session_id);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("no session ", session_id));
  return s->RemoveRegion(region_id);
}

void Registry::FailAll(const absl::Status& why) {
  stopping_.store(true, std::memory_order_release);
  absl::MutexLock lock(&mu_);
  for (auto& [key, job] : jobs_) {
    job->Fail(why, -1);
    for (auto& s : job->sessions()) {
      if (s != nullptr && !s->memory_released()) {
        abi::StoreRelease(&s->view().completion->daemon_state, static_cast<uint32_t>(abi::kDaemonStopping));
      }
    }
  }
}

int Registry::total_ops_in_flight() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [key, job] : jobs_) n += job->ops_in_flight();
  return n;
}

std::vector<std::shared_ptr<Job>> Registry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Job>> out;
  out.reserve(jobs_.size());
  for (const auto& [key, job] : jobs_) out.push_back(job);
  return out;
}

void Registry::Reap() {
  absl::MutexLock lock(&mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    auto cur = it++;
    Job& job = *cur->second;
    bool any_live = false;
    for (const auto& s : job.sessions()) {
      if (s == nullptr) continue;
      Session::State st = s->state();
      if (st == Session::State::kActive || st == Session::State::kJoining) {
        any_live = true;
      } else if (s->inflight.load() == 0 && job.ops_in_flight() == 0 && !s->memory_released() &&
                 job.all_joined()) {
        // No op can write its completion block any more: ops created from
        // now on never include a rank that is gone.
        ReleaseSessionMemory(s.get());
      }
    }
    if (any_live || job.ops_in_flight() != 0) continue;
    if (job.all_joined()) {
      recent_.push_front(StatsOf(job));
      recent_.front().set_state(job.failed() && !absl::IsAborted(job.failure()) ? "failed" : "ended");
      if (recent_.size() > kRecentJobs) recent_.pop_back();
      for (const auto& s : job.sessions()) ReleaseSessionMemory(s.get());
      ++jobs_completed_;
      retired_ops_ += job.counters.ops.load();
      retired_bytes_ += job.counters.bytes.load();
      for (int c = 0; c < ingress::kNumApiStatus; ++c) retired_errors_[c] += job.counters.errors[c].load();
    } else if (job.joined() != 0) {
      continue;  // Ranks still joining.
    }
    LOG(INFO) << "job '" << job.key() << "' ended (" << job.counters.ops.load() << " ops)";
    jobs_.erase(cur);
    version_.fetch_add(1);
  }
}

int Registry::num_jobs() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(jobs_.size());
}

int Registry::num_sessions() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sessions_.size());
}


void Registry::FillStats(const std::string& job_key, v1::StatsReply* out) const {
  absl::MutexLock lock(&mu_);
  uint64_t ops = retired_ops_, bytes = retired_bytes_, registered = 0;
  std::array<uint64_t, ingress::kNumApiStatus> errors = retired_errors_;
  for (const auto& [key, job] : jobs_) {
    ops += job->counters.ops.load();
    bytes += job->counters.bytes.load();
    for (int c = 0; c < ingress::kNumApiStatus; ++c) errors[c] += job->counters.errors[c].load();
    v1::JobStats js = StatsOf(*job);
    registered += js.registered_bytes();
    if (job_key.empty() || job_key == key) *out->add_jobs() = std::move(js);
  }
  for (const v1::JobStats& js : recent_) {
    if (job_key.empty() || job_key == js.job_key()) *out->add_jobs() = js;
  }
  out->set_total_ops(ops);
  out->set_total_bytes(bytes);
  for (int c = 1; c < ingress::kNumApiStatus; ++c) {
    if (errors[c] == 0) continue;
    auto* e = out->add_errors();
    e->set_code(common::ApiStatusName(c));
    e->set_count(errors[c]);
  }
  out->set_registered_bytes(registered);
  out->set_jobs_completed(jobs_completed_);
  engines::EngineStats es = engine_->stats();
  out->set_same_device_copies(es.same_device_copies);
  if (es.same_device_copies != 0) {
    auto* f = out->add_fallbacks();
    f->set_reason("same_device_copy_on_sm");
    f->set_count(es.same_device_copies);
  }
}

}  // namespace dmagather::server::service
