#include "server/service/registry.h"

#include "server/cluster/job_id.h"
#include "server/cluster/peer_service.h"

#include <glog/logging.h>
#include <malloc.h>
#include <sys/stat.h>

#include <chrono>

#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "abi/fd_channel_v1.h"
#include "common/api_names.h"
#include "common/memory_kinds.h"
#include "common/status.h"
#include "server/service/request_checks.h"

namespace dmagather::server::service {

using scheduler::Job;
using scheduler::Rank;

namespace {

void FillLatency(const common::LatencyHistogram& h, v1::LatencySummary* out) {
  common::LatencySummaryNs s = h.Summary();
  out->set_p50_us(s.p50 / 1e3);
  out->set_p99_us(s.p99 / 1e3);
  out->set_max_us(s.max / 1e3);
  out->set_count(s.count);
}

template <typename Counters, typename Msg>
void FillErrors(const Counters& errors, Msg* out) {
  for (int c = 1; c < common::kNumApiStatus; ++c) {
    uint64_t n = errors[c].load(std::memory_order_relaxed);
    if (n == 0) continue;
    auto* e = out->add_errors();
    e->set_code(common::ApiStatusName(c));
    e->set_count(n);
  }
}

v1::JobStats StatsOf(const Job& job, const std::vector<std::shared_ptr<Session>>& sessions) {
  v1::JobStats js;
  js.set_job_key(job.key());
  js.set_uid(job.uid());
  js.set_world_size(job.world_size());
  js.set_ops(job.counters.ops.load());
  js.set_bytes(job.counters.bytes.load());
  js.set_fallback_ops(job.counters.fallback_ops.load());
  FillErrors(job.counters.errors, &js);
  FillLatency(job.counters.latency, js.mutable_latency());
  FillLatency(job.counters.hop_latency, js.mutable_hop_latency());
  if (const scheduler::RemotePart* remote = job.remote(); remote != nullptr) {
    const scheduler::RemoteStats rs = remote->stats();
    v1::RingStats* ring = js.mutable_ring();
    ring->set_nodes(job.topology()->num_nodes());
    ring->set_node(job.topology()->my_node);
    ring->set_transport(rs.transport);
    ring->set_transport_reason(rs.transport_reason);
    ring->set_links(rs.links);
    ring->set_next(rs.next);
    ring->set_prev(rs.prev);
    ring->set_bytes_sent(rs.bytes_sent);
    ring->set_bytes_received(rs.bytes_received);
    ring->set_ops(rs.ops);
    ring->set_transit_bytes(rs.transit_bytes);
    ring->set_busy_s(rs.busy_ns * 1e-9);
    ring->set_throughput_gbps(rs.busy_ns != 0 ? rs.bytes_received * 8.0 / rs.busy_ns : 0.0);
    auto* cl = ring->mutable_chunk_latency();
    cl->set_p50_us(rs.chunk_latency.p50 / 1e3);
    cl->set_p99_us(rs.chunk_latency.p99 / 1e3);
    cl->set_max_us(rs.chunk_latency.max / 1e3);
    cl->set_count(rs.chunk_latency.count);
  }
  int active = 0;
  uint64_t registered = 0;
  for (int r = 0; r < job.world_size(); ++r) {
    auto* rs = js.add_ranks();
    rs->set_rank(r);
    const auto& s = sessions[r];
    if (s == nullptr) {
      const scheduler::Topology* topo = job.topology();
      rs->set_state(topo != nullptr && topo->node_of_rank[r] != topo->my_node
                        ? absl::StrCat("remote (node ", topo->node_of_rank[r], ")")
                        : "missing");
      continue;
    }
    const Rank& k = *s->rank();
    rs->set_pid(k.pid());
    rs->set_state(k.state_name());
    if (k.state() == Rank::State::kActive) ++active;
    rs->set_ops(k.counters.ops.load());
    rs->set_bytes(k.counters.bytes.load());
    FillErrors(k.counters.errors, rs);
    FillLatency(k.counters.latency, rs->mutable_latency());
    rs->set_registered_bytes(s->input()->regions.registered_bytes());
    rs->set_regions(s->input()->regions.size());
    registered += s->input()->regions.registered_bytes();
  }
  js.set_registered_bytes(registered);
  js.set_state(job.failed() ? (active == 0 ? "finished" : "failed") : (job.all_joined() ? "running" : "joining"));
  return js;
}

}  // namespace

Registry::~Registry() { StopReaper(); }

void Registry::StartReaper(std::function<uint64_t()> ingress_epoch, std::function<void()> kick) {
  ingress_epoch_ = std::move(ingress_epoch);
  kick_ = std::move(kick);
  reaper_ = std::thread([this] { ReaperLoop(); });
}

void Registry::WakeReaper() {
  {
    std::lock_guard<std::mutex> lock(reaper_mu_);
    reaper_wake_ = true;
  }
  reaper_cv_.notify_one();
}

void Registry::StopReaper() {
  {
    std::lock_guard<std::mutex> lock(reaper_mu_);
    reaper_stop_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
}

void Registry::ReaperLoop() {
  std::unique_lock<std::mutex> lock(reaper_mu_);
  bool idle = false;
  while (!reaper_stop_) {
    // Every 20 ms while there are jobs or frees waiting; an idle daemon
    // wakes once a second (Join wakes it: WakeReaper).
    reaper_cv_.wait_for(lock, idle ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(20),
                        [this] { return reaper_stop_ || reaper_wake_; });
    if (reaper_stop_) break;
    reaper_wake_ = false;
    lock.unlock();
    Reap();
    bool frees_waiting;
    {
      absl::MutexLock l(&mu_);
      frees_waiting = !retired_.empty();
      idle = jobs_.empty() && !frees_waiting;
    }
    // Deferred frees wait for an ingress pass: ask for one.
    if (frees_waiting && kick_) kick_();
    lock.lock();
  }
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
  const bool multi_node = !req.job_id().empty();
  if (multi_node) {
    if (peers_ == nullptr) {
      return absl::FailedPreconditionError(
          "join with a job id (a multi-node job): this dmagatherd runs without --peer_listen, so it cannot "
          "reach other nodes' daemons");
    }
    DMAG_RETURN_IF_ERROR(cluster::ParseJobId(req.job_id()).status());
  }
  if (req.segment_ticket().empty()) {
    return absl::PermissionDeniedError(
        "join: no segment ticket (hand the segment over on the fd channel first; clients before 0.3 named "
        "shared memory, which dmagatherd no longer opens)");
  }
  DMAG_ASSIGN_OR_RETURN(Handover segment, tickets_->Take(req.segment_ticket(), abi::kFdSegment));
  if (caller.uid != segment.uid || caller.pid != segment.pid) {
    // The ticket is spent either way: whoever leaked it must hand over again.
    return absl::PermissionDeniedError(absl::StrCat(
        "join: the segment ticket was handed over by pid ", segment.pid, " (uid ", segment.uid,
        "), but this Join comes from pid ", caller.pid, " (uid ", caller.uid,
        "); a ticket is good only for the process that handed the memory over"));
  }
  const uid_t uid = segment.uid;
  uint64_t id;
  {
    // The session limit is checked (and the session counted) before
    // anything is mapped for it.
    absl::MutexLock lock(&mu_);
    Usage& u = usage_[uid];
    if (limits_.max_sessions_per_uid > 0 && u.sessions >= limits_.max_sessions_per_uid) {
      DropUsageLocked(uid);
      return absl::ResourceExhaustedError(absl::StrCat(
          "join: uid ", uid, " already has ", limits_.max_sessions_per_uid,
          " open sessions, the per-user limit (dmagatherd --max_sessions_per_uid); end some ranks first"));
    }
    ++u.sessions;
    id = next_session_id_++;
  }
  // Mapping the segment and attaching the rank to the engine (cuda:
  // cudaHostRegister) happen outside the registry lock.
  auto opened = Session::Open(id, req, segment, engine_);
  absl::MutexLock lock(&mu_);
  auto uncount = [&](absl::Status why) {
    --usage_[uid].sessions;
    DropUsageLocked(uid);
    return why;
  };
  if (!opened.ok()) return uncount(opened.status());
  std::shared_ptr<Session> session = *std::move(opened);
  const JobId key{uid, req.job_key()};
  auto found = jobs_.find(key);
  if (found == jobs_.end()) {
    Usage& u = usage_[uid];
    if (limits_.max_jobs_per_uid > 0 && u.jobs >= limits_.max_jobs_per_uid) {
      return uncount(absl::ResourceExhaustedError(absl::StrCat(
          "join: uid ", uid, " already has ", limits_.max_jobs_per_uid,
          " jobs, the per-user limit (dmagatherd --max_jobs_per_uid); job '", req.job_key(), "' was not created")));
    }
    ++u.jobs;
    WakeReaper();
    found = jobs_.emplace(key, JobEntry{}).first;
    found->second.job = std::make_shared<Job>(req.job_key(), req.world_size(), uid, multi_node);
    found->second.sessions.resize(req.world_size());
    version_.fetch_add(1);
    LOG(INFO) << "job '" << req.job_key() << "' created: " << req.world_size() << " ranks, uid " << uid;
  }
  JobEntry& entry = found->second;
  const std::shared_ptr<Job>& job = entry.job;
  if (job->world_size() != req.world_size()) {
    return uncount(absl::InvalidArgumentError(absl::StrCat("job '", req.job_key(), "' has world size ",
                                                           job->world_size(), ", rank ", req.rank(), " asked for ",
                                                           req.world_size())));
  }
  if (job->multi_node() != multi_node) {
    return uncount(absl::InvalidArgumentError(absl::StrCat(
        "job '", req.job_key(), "': rank ", req.rank(), multi_node ? " gave a job id but earlier ranks did not"
                                                                   : " gave no job id but earlier ranks did")));
  }
  if (absl::Status added = job->AddRank(session->rank()); !added.ok()) return uncount(added);
  if (multi_node) {
    const int timeout_ms = req.join_timeout_ms() > 0 ? req.join_timeout_ms() : 60000;
    absl::Status peered = peers_->AddRank(job, req.job_id(), absl::Now() + absl::Milliseconds(timeout_ms));
    if (!peered.ok()) {
      job->RemoveRank(session->rank().get());
      return uncount(peered);
    }
  }
  session->charged_session = true;
  entry.sessions[req.rank()] = session;
  sessions_[id] = session;
  // The ingress thread's snapshot gains the job (a multi-node job's feed is
  // refreshed at each local join: it starts once its ring is up).
  if (job->all_joined() || multi_node) version_.fetch_add(1);
  LOG(INFO) << "job '" << req.job_key() << "': rank " << req.rank() << " (pid " << session->pid() << ") joined, "
            << job->joined() << "/" << job->world_size();
  return Joined{job, session};
}

void Registry::EndSession(const Joined& j) {
  Session& s = *j.session;
  Rank& k = *s.rank();
  const bool clean = k.state() == Rank::State::kLeft;
  if (!j.job->all_joined()) {
    j.job->RemoveRank(&k);
    k.set_state(Rank::State::kLeft);
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(JobId{j.job->uid(), j.job->key()});
    if (it != jobs_.end() && it->second.job == j.job && it->second.sessions[k.rank()] == j.session) {
      it->second.sessions[k.rank()].reset();
    }
  } else if (clean) {
    k.ReleaseReadyWaiters();
    j.job->Fail(absl::AbortedError(absl::StrCat("rank ", k.rank(), " (pid ", k.pid(), ") left job '",
                                                j.job->key(), "'")),
                k.rank());
  } else {
    k.set_state(Rank::State::kGone);
    k.ReleaseReadyWaiters();
    LOG(WARNING) << "job '" << j.job->key() << "': rank " << k.rank() << " (pid " << k.pid()
                 << ") went away without leaving; failing the job's pending operations";
    j.job->Fail(absl::AbortedError(absl::StrCat("rank ", k.rank(), " (pid ", k.pid(), ") of job '",
                                                j.job->key(), "' exited or was killed")),
                k.rank());
  }
  absl::MutexLock lock(&mu_);
  sessions_.erase(s.id());
  if (s.charged_session) {
    s.charged_session = false;
    --usage_[s.uid()].sessions;
    DropUsageLocked(s.uid());
  }
  s.ended.store(true, std::memory_order_release);
  version_.fetch_add(1);
}

std::shared_ptr<Session> Registry::FindSession(uint64_t id, const std::string& secret) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || !it->second->SecretMatches(secret)) return nullptr;
  return it->second;
}

absl::Status Registry::Leave(uint64_t session_id, const std::string& secret) {
  auto s = FindSession(session_id, secret);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("no session ", session_id, " with that secret"));
  s->rank()->set_state(Rank::State::kLeft);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Registry::Register(const v1::RegisterRequest& req) {
  auto s = FindSession(req.session_id(), req.session_secret());
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("no session ", req.session_id(), " with that secret"));
  engines::RegionSpec spec;
  spec.kind = req.memory_kind();
  spec.bytes = req.bytes();
  spec.handle = req.handle();
  spec.rank = s->rank()->engine();
  DMAG_RETURN_IF_ERROR(CheckRegisterRequest(req));
  Handover buffer;
  std::vector<Handover> device_handovers;
  Session::Registered what;
  spec.owner_pid = s->pid();
  if (!req.tickets().empty()) {
    // Exported device allocations (cuda_vmm): every ticket from the session's
    // own process, their chunks adding up to the registered bytes.
    uint64_t handed_bytes = 0;
    for (const std::string& t : req.tickets()) {
      DMAG_ASSIGN_OR_RETURN(Handover h, tickets_->Take(t, abi::kFdDeviceMemory));
      if (h.uid != s->uid() || h.pid != s->pid()) {
        return absl::PermissionDeniedError(absl::StrCat(
            "register: device memory was handed over by another process than rank ", s->rank_index(),
            "'s (a ticket works only for the process, and uid, that handed the memory over)"));
      }
      handed_bytes += h.bytes;
      for (const common::UniqueFd& fd : h.fds) spec.fds.push_back(fd.get());
      device_handovers.push_back(std::move(h));
    }
    if (handed_bytes != req.bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("register: ", req.bytes(), " bytes asked for, but ",
                                                     handed_bytes, " were handed over"));
    }
  }
  if (!req.ticket().empty()) {
    DMAG_ASSIGN_OR_RETURN(buffer, tickets_->Take(req.ticket(), abi::kFdBuffer));
    // The buffer must come from the session's own process: a ticket of
    // another uid or process is refused without saying whose it was.
    if (buffer.uid != s->uid() || buffer.pid != s->pid()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "register: the buffer was handed over by another process than rank ", s->rank_index(),
          "'s (a ticket works only for the process, and uid, that handed the memory over)"));
    }
    if (buffer.bytes != req.bytes()) {
      return absl::InvalidArgumentError(absl::StrCat("register: ", req.bytes(), " bytes asked for, but ",
                                                     buffer.bytes, " were handed over"));
    }
    struct stat st;
    if (fstat(buffer.fd.get(), &st) != 0) return common::ErrnoStatus("register: fstat of the handed-over buffer");
    if (st.st_dev == s->segment_dev() && st.st_ino == s->segment_ino()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register: rank ", s->rank_index(), " handed over its own rank segment as a data buffer; the segment "
          "(request ring and completion block) can never be a buffer: allocate buffers with dmagather_alloc"));
    }
    if (doorbell_ino_ != 0 && st.st_dev == doorbell_dev_ && st.st_ino == doorbell_ino_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "register: rank ", s->rank_index(), " handed over dmagatherd's doorbell page as a data buffer; it can "
          "never be a buffer: allocate buffers with dmagather_alloc"));
    }
    spec.fd = buffer.fd.get();
    what.host = true;
    what.key = Session::HostKey{st.st_dev, st.st_ino, req.bytes()};
    what.host_bytes = req.bytes();
  }
  // One registration of this session at a time: the same memfd and range
  // registered again is the region already there (no second mapping).
  absl::MutexLock reg_lock(&s->register_mu);
  if (what.host) {
    auto same = s->by_inode.find(what.key);
    if (same != s->by_inode.end()) return same->second;
  }
  {
    absl::MutexLock lock(&mu_);
    if (s->ended.load(std::memory_order_acquire)) {
      return absl::NotFoundError(absl::StrCat("no session ", req.session_id(), " with that secret"));
    }
  }
  // Charged against the uid's limits before anything is mapped; the charge
  // then lives as long as the daemon holds the region (RegionLedger).
  DMAG_ASSIGN_OR_RETURN(std::unique_ptr<RegionLedger::Charge> charge, ledger_->Reserve(s->uid(), what.host_bytes));
  auto region = engine_->Import(spec);
  if (!region.ok()) return region.status();  // The charge goes with it.
  uint32_t id = next_region_id_.fetch_add(1);
  s->input()->regions.Add(id, RegionLedger::Attach(*std::move(region), std::move(charge)));
  if (what.host) s->by_inode[what.key] = id;
  s->registered[id] = what;
  return id;
}

absl::Status Registry::Deregister(uint64_t session_id, const std::string& secret, uint32_t region_id) {
  auto s = FindSession(session_id, secret);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("no session ", session_id, " with that secret"));
  absl::MutexLock reg_lock(&s->register_mu);
  DMAG_RETURN_IF_ERROR(s->input()->regions.Remove(region_id, s->rank()->inflight));
  auto it = s->registered.find(region_id);
  if (it != s->registered.end()) {
    // Un-charged when the last holder (a captured or running op) lets go.
    if (it->second.host) s->by_inode.erase(it->second.key);
    s->registered.erase(it);
  }
  return absl::OkStatus();
}

void Registry::DropUsageLocked(uid_t uid) {
  auto it = usage_.find(uid);
  if (it != usage_.end() && it->second.jobs == 0 && it->second.sessions == 0) {
    usage_.erase(it);
  }
}

void Registry::FailAll(const absl::Status& why) {
  stopping_.store(true, std::memory_order_release);
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : jobs_) {
    entry.job->Fail(why, -1);
    for (auto& s : entry.sessions) {
      // Only live sessions: an ended one may be released by the reaper
      // (outside this lock) at any moment, and its rank is gone anyway.
      if (s != nullptr && !s->ended.load(std::memory_order_acquire)) {
        abi::StoreRelease(&s->rank()->completion()->daemon_state, static_cast<uint32_t>(abi::kDaemonStopping));
      }
    }
  }
}

int Registry::total_ops_in_flight() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [key, entry] : jobs_) n += entry.job->ops_in_flight();
  return n;
}

std::vector<ingress::JobFeed> Registry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<ingress::JobFeed> out;
  out.reserve(jobs_.size());
  for (const auto& [key, entry] : jobs_) {
    if (!entry.job->all_joined() && !entry.job->multi_node()) continue;
    ingress::JobFeed feed;
    feed.job = entry.job;
    for (const auto& s : entry.sessions) feed.inputs.push_back(s != nullptr ? s->input() : nullptr);
    out.push_back(std::move(feed));
  }
  return out;
}

void Registry::Reap() {
  const uint64_t epoch = ingress_epoch_ ? ingress_epoch_() : 0;
  std::vector<std::shared_ptr<Session>> to_free;
  {
    absl::MutexLock lock(&mu_);
    auto retire = [&](const std::shared_ptr<Session>& s) {
      if (s == nullptr || s->memory_released()) return;
      for (const auto& [e, r] : retired_) {
        if (r == s) return;
      }
      retired_.emplace_back(epoch, s);
    };
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      auto cur = it++;
      JobEntry& entry = cur->second;
      Job& job = *entry.job;
      bool any_live = false;
      for (const auto& s : entry.sessions) {
        if (s == nullptr) continue;
        const Rank::State st = s->rank()->state();
        if (st == Rank::State::kActive || st == Rank::State::kJoining || !s->ended.load()) {
          any_live = true;
        } else if (s->rank()->inflight.load() == 0 && job.ops_in_flight() == 0 && job.all_joined()) {
          // No op can write its completion block any more: ops created from
          // now on never include a rank that is gone.
          retire(s);
        }
      }
      if (any_live || job.ops_in_flight() != 0) continue;
      if (job.all_joined()) {
        recent_.push_front(StatsOf(job, entry.sessions));
        recent_.front().set_state(job.failed() && !absl::IsAborted(job.failure()) ? "failed" : "ended");
        if (recent_.size() > kRecentJobs) recent_.pop_back();
        for (const auto& s : entry.sessions) retire(s);
        ++jobs_completed_;
        retired_ops_ += job.counters.ops.load();
        retired_bytes_ += job.counters.bytes.load();
        retired_fallback_ops_ += job.counters.fallback_ops.load();
        for (int c = 0; c < common::kNumApiStatus; ++c) retired_errors_[c] += job.counters.errors[c].load();
      } else if (job.joined() != 0) {
        continue;  // Ranks still joining.
      }
      LOG(INFO) << "job '" << job.key() << "' ended (" << job.counters.ops.load() << " ops)";
      --usage_[job.uid()].jobs;
      DropUsageLocked(job.uid());
      jobs_.erase(cur);
      version_.fetch_add(1);
    }
    // Free what the ingress thread can no longer be reading: it has
    // completed a whole poll pass since the retirement.
    while (!retired_.empty() && (!ingress_epoch_ || epoch >= retired_.front().first + 2)) {
      to_free.push_back(std::move(retired_.front().second));
      retired_.pop_front();
    }
  }
  const int n_freed = static_cast<int>(to_free.size());
  for (auto& s : to_free) s->ReleaseMemory();  // Engine detach, unmaps: outside the lock.
  to_free.clear();
  // Sessions that ended leave freed heap behind (their gRPC streams and
  // connections, protobufs, sessions); glibc keeps it in its arenas unless
  // asked. Hand it back to the kernel now and then, not on every pass.
  if (freed_since_trim_ += n_freed; freed_since_trim_ > 0) {
    const absl::Time now = absl::Now();
    if (now - last_trim_ >= absl::Seconds(1)) {
      malloc_trim(0);
      last_trim_ = now;
      freed_since_trim_ = 0;
    }
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

void Registry::FillStats(const std::string& job_key, const Viewer& viewer, v1::StatsReply* out) const {
  auto visible = [&](uid_t owner) { return viewer.operator_view || (viewer.known && viewer.uid == owner); };
  absl::MutexLock lock(&mu_);
  uint64_t ops = retired_ops_, bytes = retired_bytes_, registered = 0, fallback_ops = retired_fallback_ops_;
  std::array<uint64_t, common::kNumApiStatus> errors = retired_errors_;
  for (const auto& [key, entry] : jobs_) {
    const Job& job = *entry.job;
    ops += job.counters.ops.load();
    bytes += job.counters.bytes.load();
    fallback_ops += job.counters.fallback_ops.load();
    for (int c = 0; c < common::kNumApiStatus; ++c) errors[c] += job.counters.errors[c].load();
    v1::JobStats js = StatsOf(job, entry.sessions);
    registered += js.registered_bytes();
    if ((job_key.empty() || job_key == key.second) && visible(key.first)) *out->add_jobs() = std::move(js);
  }
  for (const v1::JobStats& js : recent_) {
    if ((job_key.empty() || job_key == js.job_key()) && visible(js.uid())) *out->add_jobs() = js;
  }
  out->set_total_ops(ops);
  out->set_total_bytes(bytes);
  for (int c = 1; c < common::kNumApiStatus; ++c) {
    if (errors[c] == 0) continue;
    auto* e = out->add_errors();
    e->set_code(common::ApiStatusName(c));
    e->set_count(errors[c]);
  }
  out->set_registered_bytes(registered);
  const RegionLedger::Held held = ledger_->total();
  out->set_held_regions(held.regions);
  out->set_held_bytes(held.bytes);
  out->set_jobs_completed(jobs_completed_);
  engines::EngineStats es = engine_->stats();
  out->set_same_device_copies(es.same_device_copies);
  for (const engines::CopyEngineBytes& c : es.copy_engines) {
    auto* e = out->add_copy_engines();
    e->set_device(static_cast<uint32_t>(c.device));
    e->set_engine(c.engine);
    e->set_bytes(c.bytes);
  }
  if (es.same_device_copies != 0) {
    auto* f = out->add_fallbacks();
    f->set_reason("same_device_copy_on_sm");
    f->set_count(es.same_device_copies);
  }
  if (fallback_ops != 0) {
    auto* f = out->add_fallbacks();
    f->set_reason("op_refused_by_rank");
    f->set_count(fallback_ops);
  }
}

}  // namespace dmagather::server::service
