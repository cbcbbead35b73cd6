#include "server/service/registry_core.h"

#include <glog/logging.h>

#include "abi/fd_channel_v1.h"
#include "abi/graph_v1.h"
#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace dmagather::server::service {

using scheduler::Job;
using scheduler::Rank;

namespace {

absl::Status NoSession(uint64_t id) {
  return absl::NotFoundError(absl::StrCat("no session ", id, " with that secret"));
}

}  // namespace

RegistryCore::RegistryCore(engines::CopyEngine* engine, TicketTable* tickets, const Limits& limits)
    : engine_(engine),
      tickets_(tickets),
      quota_(UidQuota::Create({limits.max_jobs_per_uid, limits.max_sessions_per_uid})),
      ledger_(RegionLedger::Create({limits.max_regions_per_uid, limits.max_mapped_bytes_per_uid})) {}

absl::StatusOr<Handover> RegistryCore::ClaimSegment(const JoinSpec& req, const PeerCred& caller) {
  if (!req.job_id.empty()) {
    if (peers_ == nullptr) {
      return absl::FailedPreconditionError(
          "join with a job id (a multi-node job): this dmagatherd runs without --peer_listen, so it cannot "
          "reach other nodes' daemons");
    }
    DMAG_RETURN_IF_ERROR(peers_->CheckJobId(req.job_id));
  }
  if (req.segment_ticket.empty()) {
    return absl::PermissionDeniedError(
        "join: no segment ticket (hand the segment over on the fd channel first; clients before 0.3 named "
        "shared memory, which dmagatherd no longer opens)");
  }
  DMAG_ASSIGN_OR_RETURN(Handover segment, tickets_->Take(req.segment_ticket, abi::kFdSegment));
  if (caller.uid != segment.uid || caller.pid != segment.pid) {
    // The ticket is spent either way: whoever leaked it must hand over again.
    return absl::PermissionDeniedError(
        absl::StrCat("join: the segment ticket was handed over by pid ", segment.pid, " (uid ", segment.uid,
                     "), but this Join comes from pid ", caller.pid, " (uid ", caller.uid,
                     "); a ticket is good only for the process that handed the memory over"));
  }
  return segment;
}

absl::StatusOr<Joined> RegistryCore::Join(const JoinSpec& req, const PeerCred& caller) {
  if (stopping()) return absl::UnavailableError("dmagatherd is shutting down");
  DMAG_ASSIGN_OR_RETURN(Handover segment, ClaimSegment(req, caller));
  // The session limit is checked (and the session counted) before anything
  // is mapped for it; every early return below gives the count back.
  DMAG_ASSIGN_OR_RETURN(UidQuota::Reservation session_quota, quota_->ReserveSession(segment.uid));
  const uint64_t id = next_session_id_.fetch_add(1);
  // Mapping the segment and attaching the rank to the engine (cuda:
  // cudaHostRegister) happen outside the registry lock, and so does the
  // unmapping of a session that failed to join (declared before the lock).
  DMAG_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Session::Open(id, req, segment, engine_));
  absl::MutexLock lock(&mu_);
  return AddToJobLocked(req, session, &session_quota);
}

absl::StatusOr<RegistryCore::JobEntry*> RegistryCore::FindOrCreateJobLocked(const JoinSpec& req, uid_t uid) {
  const bool multi_node = !req.job_id.empty();
  const JobId key{uid, req.job_key};
  auto found = jobs_.find(key);
  if (found == jobs_.end()) {
    auto job = std::make_shared<Job>(req.job_key, req.world_size, uid, multi_node);
    if (req.resume) job->MarkResuming();
    // A multi-node job coming back waits for the ranks that were here.
    if (req.resume && multi_node) DMAG_RETURN_IF_ERROR(job->ExpectLocal(req.local_ranks));
    DMAG_ASSIGN_OR_RETURN(UidQuota::Reservation job_quota, quota_->ReserveJob(uid, req.job_key));
    if (job_created_) job_created_();
    JobEntry& entry = jobs_[key];
    entry.job = std::move(job);
    entry.sessions.resize(req.world_size);
    entry.quota = std::move(job_quota);
    version_.fetch_add(1);
    LOG(INFO) << "job '" << req.job_key << "' created: " << req.world_size << " ranks, uid " << uid;
    return &entry;
  }
  const Job& job = *found->second.job;
  if (job.world_size() != req.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("job '", req.job_key, "' has world size ", job.world_size(),
                                                   ", rank ", req.rank, " asked for ", req.world_size));
  }
  if (job.resuming() != req.resume) {
    // A rank back from an earlier daemon and a rank new to the job do not
    // make one job: the one that does not fit is refused, and says why.
    return absl::FailedPreconditionError(
        req.resume ? absl::StrCat("job '", req.job_key, "' runs on this dmagatherd already; rank ", req.rank,
                                  " cannot take it back from an earlier one (was rank ", req.rank, " restarted?)")
                   : absl::StrCat("job '", req.job_key,
                                  "' is being taken back from the ranks of an earlier dmagatherd; "
                                  "rank ",
                                  req.rank, " joined as new (a restarted rank process?)"));
  }
  if (job.multi_node() != multi_node) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", req.job_key, "': rank ", req.rank,
        multi_node ? " gave a job id but earlier ranks did not" : " gave no job id but earlier ranks did"));
  }
  if (req.resume && multi_node) DMAG_RETURN_IF_ERROR(found->second.job->ExpectLocal(req.local_ranks));
  return &found->second;
}

absl::StatusOr<Joined> RegistryCore::AddToJobLocked(const JoinSpec& req, const std::shared_ptr<Session>& session,
                                                    UidQuota::Reservation* quota) {
  const bool multi_node = !req.job_id.empty();
  DMAG_ASSIGN_OR_RETURN(JobEntry * entry, FindOrCreateJobLocked(req, session->uid()));
  const std::shared_ptr<Job>& job = entry->job;
  DMAG_RETURN_IF_ERROR(job->AddRank(session->rank()));
  job->NoteReconnect(req.reconnect_s);
  if (multi_node) {
    const int timeout_ms = req.join_timeout_ms > 0 ? req.join_timeout_ms : 60000;
    absl::Status peered = peers_->AddRank(job, req.job_id, timeout_ms);
    if (!peered.ok()) {
      job->RemoveRank(session->rank().get());
      return peered;
    }
  }
  entry->sessions[req.rank] = session;
  sessions_[session->id()] = SessionEntry{session, std::move(*quota)};
  // The ingress thread's snapshot gains the job (a multi-node job's feed is
  // refreshed at each local join: it starts once its ring is up).
  if (job->all_joined() || multi_node) version_.fetch_add(1);
  LOG(INFO) << "job '" << req.job_key << "': rank " << req.rank << " (pid " << session->pid() << ") joined, "
            << job->joined() << "/" << job->world_size();
  return Joined{job, session};
}

void RegistryCore::EndSession(const Joined& j) {
  Session& s = *j.session;
  Rank& k = *s.rank();
  const bool clean = k.state() == Rank::State::kLeft;
  if (frozen_.load(std::memory_order_acquire) || j.job->handed_back()) {
    // Stopping for a successor, or the job handed back to its ranks: the
    // rank's ops stay as they are, for the job it joins next
    // (FreezeForHandover, Job::HandBack).
  } else if (!j.job->all_joined()) {
    j.job->RemoveRank(&k);
    k.set_state(Rank::State::kLeft);
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(JobId{j.job->uid(), j.job->key()});
    if (it != jobs_.end() && it->second.job == j.job && it->second.sessions[k.rank()] == j.session) {
      it->second.sessions[k.rank()].reset();
    }
  } else {
    // A rank gone before its job was taken back: the job starts (and its
    // ops end with the failure below) so that no rank waits for it.
    if (j.job->awaiting_resume()) StartTakenBack(*j.job);
    // The ops the rank saw done ended on every rank with real inputs (a
    // device wrote done after all their copies, or the CPU published it):
    // they are spared. The rest get their error records before the rank's
    // ready flags are released (which lets the devices run them on whatever
    // the rank left), so no rank sees one done before its error.
    const absl::Status why =
        absl::AbortedError(clean ? absl::StrCat("rank ", k.rank(), " (pid ", k.pid(), ") left job '", j.job->key(), "'")
                                 : absl::StrCat("rank ", k.rank(), " (pid ", k.pid(), ") of job '", j.job->key(),
                                                "' exited or was killed"));
    const uint32_t spare = k.completion() != nullptr ? abi::LoadAcquire(&k.completion()->done_seq) : 0;
    if (!clean) {
      k.set_state(Rank::State::kGone);
      LOG(WARNING) << "job '" << j.job->key() << "': rank " << k.rank() << " (pid " << k.pid()
                   << ") went away without leaving; failing the job's pending operations";
    }
    j.job->CloseDeviceDone(why, k.rank(), &spare);
    k.ReleaseReadyWaiters();
    j.job->FailAfter(why, spare, k.rank());
  }
  SessionEntry ended;  // Its quota goes back once the lock is released.
  absl::MutexLock lock(&mu_);
  if (auto it = sessions_.find(s.id()); it != sessions_.end()) {
    ended = std::move(it->second);
    sessions_.erase(it);
  }
  s.ended.store(true, std::memory_order_release);
  version_.fetch_add(1);
}

std::shared_ptr<Session> RegistryCore::FindSession(uint64_t id, const std::string& secret) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || !it->second.session->SecretMatches(secret)) return nullptr;
  return it->second.session;
}

absl::Status RegistryCore::CheckSession(uint64_t session_id, const std::string& secret) const {
  return FindSession(session_id, secret) != nullptr ? absl::OkStatus() : NoSession(session_id);
}

absl::Status RegistryCore::Leave(uint64_t session_id, const std::string& secret) {
  auto s = FindSession(session_id, secret);
  if (s == nullptr) return NoSession(session_id);
  s->rank()->set_state(Rank::State::kLeft);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> RegistryCore::Register(const RegisterSpec& req) {
  auto s = FindSession(req.session_id, req.session_secret);
  if (s == nullptr) return NoSession(req.session_id);
  DMAG_ASSIGN_OR_RETURN(RegionClaim claim, ClaimRegion(req, *s, tickets_, doorbell_));
  // One registration of this session at a time: the same memfd and range
  // registered again is the region already there (no second mapping).
  absl::MutexLock reg_lock(&s->register_mu);
  if (claim.what.host) {
    auto same = s->by_inode.find(claim.what.key);
    if (same != s->by_inode.end()) return same->second;
  }
  {
    absl::MutexLock lock(&mu_);
    if (s->ended.load(std::memory_order_acquire)) return NoSession(req.session_id);
  }
  // Charged against the uid's limits before anything is mapped; the charge
  // then lives as long as the daemon holds the region (RegionLedger).
  DMAG_ASSIGN_OR_RETURN(std::unique_ptr<RegionLedger::Charge> charge,
                        ledger_->Reserve(s->uid(), claim.what.host_bytes));
  if (req.region_id != 0) {
    // A resumed session's region under its old id: descriptors already in
    // the ring name it. Later ids are above it, so never the same.
    if (!s->resume() || s->resumed.load()) {
      return absl::InvalidArgumentError(
          "register: a region id may be asked for only by a resumed session before Resume");
    }
    if (s->registered.count(req.region_id) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("register: region ", req.region_id, " is registered already"));
    }
  }
  auto region = engine_->Import(claim.spec);
  if (!region.ok()) return region.status();  // The charge goes with it.
  uint32_t id = req.region_id;
  if (id == 0) {
    id = next_region_id_.fetch_add(1);
  } else {
    for (uint32_t next = next_region_id_.load(); next <= id && !next_region_id_.compare_exchange_weak(next, id + 1);) {
    }
  }
  s->input()->regions.Add(id, RegionLedger::Attach(*std::move(region), std::move(charge)));
  if (claim.what.host) s->by_inode[claim.what.key] = id;
  s->registered[id] = claim.what;
  return id;
}

absl::Status RegistryCore::Deregister(uint64_t session_id, const std::string& secret, uint32_t region_id) {
  auto s = FindSession(session_id, secret);
  if (s == nullptr) return NoSession(session_id);
  absl::MutexLock reg_lock(&s->register_mu);
  // A device may have written an op's done flag a little before the CPU
  // counts the op out (Job::FinishOp): give the count that long to fall.
  absl::Status removed;
  for (int i = 0; i < 500; ++i) {
    removed = s->input()->regions.Remove(region_id, s->rank()->inflight);
    if (!absl::IsFailedPrecondition(removed)) break;
    absl::SleepFor(absl::Microseconds(100));
  }
  DMAG_RETURN_IF_ERROR(removed);
  auto it = s->registered.find(region_id);
  if (it != s->registered.end()) {
    // Un-charged when the last holder (a captured or running op) lets go.
    if (it->second.host) s->by_inode.erase(it->second.key);
    s->registered.erase(it);
  }
  return absl::OkStatus();
}

absl::Status RegistryCore::Resume(uint64_t session_id, const std::string& secret, uint64_t gap_ns, uint32_t ops_pending,
                                  const std::vector<CapturedDefinition>& captured) {
  auto s = FindSession(session_id, secret);
  if (s == nullptr) return NoSession(session_id);
  if (!s->resume()) return absl::FailedPreconditionError("resume: the session did not join to take its job back");
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, entry] : jobs_) {
      if (entry.sessions.size() > size_t(s->rank_index()) && entry.sessions[s->rank_index()] == s) job = entry.job;
    }
  }
  if (job == nullptr) return NoSession(session_id);
  if (captured.size() > abi::kGraphSlotsV1) {
    return absl::InvalidArgumentError(
        absl::StrCat("resume: ", captured.size(), " captured ops; a rank has ", abi::kGraphSlotsV1, " graph slots"));
  }
  if (!captured.empty() && job->multi_node()) {
    return absl::FailedPreconditionError("resume: a multi-node job's captured ops cannot be taken back");
  }
  // Read before the session counts as back: a bad definition fails this
  // Resume (the rank gives up, UNAVAILABLE) and the job waits for no one.
  std::vector<std::pair<uint32_t, scheduler::RankPart>> parts;
  for (const CapturedDefinition& def : captured) {
    DMAG_ASSIGN_OR_RETURN(scheduler::RankPart part,
                          DecodeCaptured(def, s->rank_index(), job->world_size(), s->input()->regions));
    parts.emplace_back(def.seq, std::move(part));
  }
  if (s->resumed.exchange(true)) return absl::OkStatus();  // Said once already.
  for (auto& [seq, part] : parts) job->AddCapturedDefinition(s->rank_index(), seq, std::move(part));
  handover_.ranks_resumed.fetch_add(1, std::memory_order_relaxed);
  handover_.ops_handed_over.fetch_add(ops_pending, std::memory_order_relaxed);
  handover_.gap.Record(gap_ns);
  if (!job->RankResumed()) return absl::OkStatus();
  if (job->multi_node()) {
    // Every node tells the coordinator its newest op done; each starts after
    // the newest of all once the ring is formed again (PeerService).
    const uint32_t done = NewestDone(*job);
    job->SetResumeReady(done);
    handover_.jobs_taken_over.fetch_add(1, std::memory_order_relaxed);
    LOG(INFO) << "job '" << job->key() << "': its " << job->local_count()
              << " rank(s) here are back (newest op done here: " << done << "); forming the ring again";
    return absl::OkStatus();
  }
  const uint32_t done = StartTakenBack(*job);
  handover_.jobs_taken_over.fetch_add(1, std::memory_order_relaxed);
  LOG(INFO) << "job '" << job->key() << "' taken back from an earlier dmagatherd: " << job->local_count()
            << " ranks, going on after op " << done;
  return absl::OkStatus();
}

uint32_t RegistryCore::StartTakenBack(Job& job) {
  const uint32_t done = NewestDone(job);
  const Job::Rearmed r = job.RearmCaptured(done, *engine_);
  if (r.ops + r.dropped > 0) {
    LOG(INFO) << "job '" << job.key() << "': " << r.ops << " captured op(s) armed again (" << r.run_again
              << " replay(s) the earlier daemon left unfinished run again, " << r.released
              << " released with an error), " << r.dropped << " definition(s) not held by every rank dropped";
  }
  job.StartAfter(done);
  version_.fetch_add(1);  // The ingress thread's snapshot gains the job.
  return done;
}

uint32_t RegistryCore::NewestDone(const Job& job) {
  // The newest op any rank saw done (its data is complete everywhere).
  uint32_t done = 0;
  bool first = true;
  for (const auto& k : job.ranks()) {
    if (k == nullptr || k->completion() == nullptr) continue;
    const uint32_t d = abi::LoadAcquire(&k->completion()->done_seq);
    if (first || int32_t(d - done) > 0) done = d;
    first = false;
  }
  return done;
}

void RegistryCore::FreezeForHandover() {
  absl::MutexLock lock(&mu_);
  frozen_.store(true, std::memory_order_release);
  stopping_.store(true, std::memory_order_release);
}

int RegistryCore::total_ops_in_flight() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [key, entry] : jobs_) n += entry.job->ops_in_flight();
  return n;
}

int RegistryCore::total_ops_running() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [key, entry] : jobs_) n += entry.job->ops_running();
  return n;
}

std::vector<ingress::JobFeed> RegistryCore::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<ingress::JobFeed> out;
  out.reserve(jobs_.size());
  for (const auto& [key, entry] : jobs_) {
    if (!entry.job->all_joined() && !entry.job->multi_node()) continue;
    // A job taken back starts once its ranks are all back (Resume), or is
    // fed as it is once failed, so its ops end with the failure. (A
    // multi-node one is fed at once: the ingress thread starts it with its
    // ring, after StartAfter.)
    if (entry.job->awaiting_resume() && !entry.job->failed() && !entry.job->multi_node()) continue;
    ingress::JobFeed feed;
    feed.job = entry.job;
    for (const auto& s : entry.sessions) feed.inputs.push_back(s != nullptr ? s->input() : nullptr);
    out.push_back(std::move(feed));
  }
  return out;
}

bool RegistryCore::SweepJobLocked(const JobEntry& entry, uint64_t epoch, DeferredFrees* frees) {
  const Job& job = *entry.job;
  bool any_live = false;
  for (const auto& s : entry.sessions) {
    if (s == nullptr) continue;
    const Rank::State st = s->rank()->state();
    if (st == Rank::State::kActive || st == Rank::State::kJoining || !s->ended.load()) {
      any_live = true;
    } else if (s->rank()->inflight.load() == 0 && job.ops_in_flight() == 0 && job.all_joined()) {
      // No op can write its completion block any more: ops created from
      // now on never include a rank that is gone.
      frees->Retire(epoch, s);
    }
  }
  if (any_live || job.ops_in_flight() != 0) return false;
  // A job whose ranks never all joined ends once none is left joining.
  return job.all_joined() || job.joined() == 0;
}

void RegistryCore::CountRetiredLocked(const Job& job) {
  retired_.ops += job.counters.ops.load();
  retired_.bytes += job.counters.bytes.load();
  retired_.fallback_ops += job.counters.fallback_ops.load();
  for (int c = 0; c < common::kNumApiStatus; ++c) retired_.errors[c] += job.counters.errors[c].load();
}

void RegistryCore::SweepHandedBackLocked(uint64_t epoch, DeferredFrees* frees,
                                         std::vector<std::shared_ptr<Job>>* released) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    auto cur = it++;
    JobEntry& entry = cur->second;
    // Handed back once nothing of it runs (its ring aborted, the engine's
    // copies done) and the ingress thread has made a whole pass since it
    // stopped reading the job's rings: its sessions then end, and their
    // ranks rewind their rings and join again.
    if (!entry.job->handing_back()) continue;
    if (!entry.hand_back_seen) {
      entry.hand_back_seen = true;
      entry.hand_back_epoch = epoch;
    }
    if (entry.job->ops_running() != 0 || (epoch != 0 && epoch < entry.hand_back_epoch + 2)) continue;
    entry.job->MarkHandedBack();
    CountRetiredLocked(*entry.job);  // What it served stays in the node's totals.
    entry.quota.Reset();             // The job its ranks join next counts instead.
    handed_back_.push_back(std::move(entry));
    jobs_.erase(cur);
    version_.fetch_add(1);
  }
  for (auto it = handed_back_.begin(); it != handed_back_.end();) {
    bool live = false;
    for (const auto& s : it->sessions) live |= s != nullptr && !s->ended.load();
    if (live) {
      ++it;
      continue;
    }
    for (const auto& s : it->sessions) frees->Retire(epoch, s);
    released->push_back(std::move(it->job));
    it = handed_back_.erase(it);
  }
}

std::vector<JobView> RegistryCore::Sweep(uint64_t epoch, DeferredFrees* frees) {
  std::vector<JobView> ended;
  // Jobs handed back and done with: their last reference may go here, and a
  // job's end stops its ring's threads, which is not done under mu_.
  std::vector<std::shared_ptr<Job>> released;
  absl::MutexLock lock(&mu_);
  SweepHandedBackLocked(epoch, frees, &released);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    auto cur = it++;
    JobEntry& entry = cur->second;
    if (!SweepJobLocked(entry, epoch, frees)) continue;
    const Job& job = *entry.job;
    if (job.all_joined()) {
      for (const auto& s : entry.sessions) frees->Retire(epoch, s);
      ++retired_.jobs_completed;
      CountRetiredLocked(job);
      ended.push_back(JobView{entry.job, entry.sessions});
    }
    LOG(INFO) << "job '" << job.key() << "' ended (" << job.counters.ops.load() << " ops)";
    jobs_.erase(cur);  // The job's quota goes back.
    version_.fetch_add(1);
  }
  return ended;
}

RegistryCore::View RegistryCore::view() const {
  absl::MutexLock lock(&mu_);
  View v;
  v.jobs.reserve(jobs_.size());
  for (const auto& [key, entry] : jobs_) v.jobs.push_back(JobView{entry.job, entry.sessions});
  v.retired = retired_;
  return v;
}

int RegistryCore::num_jobs() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(jobs_.size());
}

int RegistryCore::num_sessions() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sessions_.size());
}

}  // namespace dmagather::server::service
