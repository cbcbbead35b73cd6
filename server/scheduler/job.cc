#include "server/scheduler/job.h"

#include <algorithm>

#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/api_names.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/status.h"
#include "server/scheduler/completion_writer.h"
#include "server/scheduler/planner.h"

namespace dmagather::server::scheduler {

void Op::OnEngineDone(absl::Status status) { PartDone(status, -1); }

void Op::PartDone(const absl::Status& status, int failed_rank) {
  absl::Status verdict;
  int who;
  {
    absl::MutexLock lock(&part_mu);
    if (!status.ok() && part_status.ok()) {
      part_status = status;
      part_failed_rank = failed_rank;
    }
    if (open_parts.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    verdict = std::move(part_status);
    who = part_failed_rank;
    part_status = absl::OkStatus();
    part_failed_rank = -1;
  }
  // Copies that finished after the job failed may have read a dead rank's
  // buffer (the cuda engine lets such waits go on): report the job's failure.
  if (verdict.ok() && job->failed() && !job->Spared(seq)) {
    job->FinishOp(this, job->failure(), job->failed_rank());
    return;
  }
  job->FinishOp(this, verdict, who);
}

Job::Job(std::string key, int world_size, uid_t uid, bool multi_node)
    : key_(std::move(key)),
      world_size_(world_size),
      uid_(uid),
      multi_node_(multi_node),
      local_count_(world_size),
      ranks_(world_size),
      slots_(abi::kRingSlotsV1) {
  static std::atomic<uint64_t> next_engine_job{0};
  const uint64_t engine_job = next_engine_job.fetch_add(1, std::memory_order_relaxed) + 1;
  for (Op& op : slots_) {
    op.job = this;
    op.job_id = engine_job;
    op.parts.resize(world_size);
    op.ranks.resize(world_size);
  }
}

Job::~Job() {
  // The ring's threads call into the job: stop them while it is whole.
  if (remote_ != nullptr) remote_->Close();
}

absl::Status Job::AddRank(std::shared_ptr<Rank> rank) {
  absl::MutexLock lock(&mu_);
  int r = rank->rank();
  if (!expected_local_.empty() && !std::binary_search(expected_local_.begin(), expected_local_.end(), r)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", key_, "': rank ", r, " comes back to this node, but its ranks here were others"));
  }
  if (all_joined_.load()) {
    return absl::AlreadyExistsError(absl::StrCat("job '", key_, "' is already complete (all ", world_size_,
                                                 " ranks joined); rank ", r, " cannot join it again"));
  }
  if (ranks_[r] != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("rank ", r, " of job '", key_, "' has already joined (pid ", ranks_[r]->pid(), ")"));
  }
  ranks_[r] = std::move(rank);
  if (++joined_ == world_size_ && !multi_node_) ActivateLocked();
  return absl::OkStatus();
}

void Job::ActivateLocked() {
  for (auto& k : ranks_) {
    if (k != nullptr) k->set_state(Rank::State::kActive);
  }
  for (Op& op : slots_) {
    for (int i = 0; i < world_size_; ++i) op.ranks[i] = ranks_[i] != nullptr ? ranks_[i]->engine() : nullptr;
  }
  local_count_.store(joined_, std::memory_order_release);
  all_joined_.store(true, std::memory_order_release);
}

std::vector<int> Job::joined_ranks() const {
  absl::MutexLock lock(&mu_);
  std::vector<int> out;
  for (int r = 0; r < world_size_; ++r) {
    if (ranks_[r] != nullptr) out.push_back(r);
  }
  return out;
}

absl::Status Job::SetTopology(std::shared_ptr<const Topology> topology, std::shared_ptr<RemotePart> remote) {
  absl::MutexLock lock(&mu_);
  if (all_joined_.load() || !multi_node_) return absl::FailedPreconditionError("the job's topology is already set");
  std::vector<int> here;
  for (int r = 0; r < world_size_; ++r) {
    if (ranks_[r] != nullptr) here.push_back(r);
  }
  if (here != topology->local_ranks()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", key_, "': the coordinator's table puts rank(s) ", absl::StrJoin(topology->local_ranks(), ","),
        " on this node, but rank(s) ", absl::StrJoin(here, ","), " joined here"));
  }
  topology_ = std::move(topology);
  remote_ = std::move(remote);
  ActivateLocked();
  return absl::OkStatus();
}

void Job::RemoveRank(const Rank* rank) {
  absl::MutexLock lock(&mu_);
  if (all_joined_.load()) return;  // Fixed from now on; the session just ends.
  int r = rank->rank();
  if (ranks_[r].get() == rank) {
    ranks_[r].reset();
    --joined_;
  }
}

int Job::joined() const {
  absl::MutexLock lock(&mu_);
  return joined_;
}

std::vector<int> Job::missing_ranks() const {
  absl::MutexLock lock(&mu_);
  std::vector<int> missing;
  for (int r = 0; r < world_size_; ++r) {
    if (ranks_[r] == nullptr) missing.push_back(r);
  }
  return missing;
}

std::vector<std::shared_ptr<Rank>> Job::ranks() const {
  absl::MutexLock lock(&mu_);
  return ranks_;
}

void Job::Fail(const absl::Status& status, int failed_rank) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_.load() || handing_back_.load()) return;
    failure_ = status;
    failed_rank_ = failed_rank;
    failed_.store(true, std::memory_order_release);
  }
  // The other nodes learn it through the ring; ops in flight end with it.
  if (remote_ != nullptr && all_joined_.load()) remote_->Abort(status);
}

void Job::FailAfter(const absl::Status& status, uint32_t spare, int failed_rank) {
  if (!failed()) {
    spare_.store(spare, std::memory_order_release);
    has_spare_.store(true, std::memory_order_release);
  }
  Fail(status, failed_rank);
}

void Job::CloseDeviceDone(const absl::Status& status, int failed_rank, const uint32_t* spare) {
  absl::MutexLock lock(&completion_mu_);
  device_done_closed_ = true;
  const int32_t code = common::ToApiStatus(status);
  for (Op& op : slots_) {
    if (op.state.load(std::memory_order_acquire) != Op::kRunning || !op.gpu_done) continue;
    if (spare != nullptr && int32_t(op.seq - *spare) <= 0) continue;
    for (int r = 0; r < world_size_; ++r) {
      RankPart& p = op.parts[r];
      Rank* k = ranks_[r].get();
      if (!p.started || p.error_recorded || k == nullptr || k->completion() == nullptr) continue;
      RecordError(k->completion(), op.seq, code, failed_rank, status.message());
      p.error_recorded = true;
    }
  }
}

absl::Status Job::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

int Job::failed_rank() const {
  absl::MutexLock lock(&mu_);
  return failed_rank_;
}

Op* Job::SlotFor(uint32_t seq, uint64_t now_ns) {
  Op& op = slots_[seq % slots_.size()];
  int state = op.state.load(std::memory_order_acquire);
  if (state == Op::kWaiting && op.seq == seq) return &op;
  if (state != Op::kFree) return nullptr;
  op.seq = seq;
  op.arrived = 0;
  op.first_arrival_ns = now_ns;
  op.matched_ns = 0;
  for (RankPart& p : op.parts) p.Reset();
  inflight_ops_.fetch_add(1, std::memory_order_acq_rel);
  op.state.store(Op::kWaiting, std::memory_order_release);
  return &op;
}

absl::Status Job::LocalVerdict(Op* op, int* failed_rank) {
  // One decision for every rank: a rank that refused (or sent something
  // invalid) fails the op everywhere, so no rank copies while another
  // takes the framework's path. Invalid parts win over fallbacks.
  int refused = -1;
  for (int r = 0; r < world_size_; ++r) {
    const absl::Status& s = op->parts[r].status;
    if (s.ok()) continue;
    if (refused < 0 || (common::IsFallback(op->parts[refused].status) && !common::IsFallback(s))) refused = r;
  }
  *failed_rank = refused;
  if (refused >= 0) {
    const absl::Status& why = op->parts[refused].status;
    if (common::IsFallback(why)) {
      return common::FallbackError(absl::StrCat(op->Label(), " cannot be served by dmagather: ", why.message()));
    }
    return absl::InvalidArgumentError(absl::StrCat(op->Label(), " failed: ", why.message()));
  }
  return CheckAgreement(*op);
}

void Job::Dispatch(Op* op, engines::CopyEngine* engine) {
  op->matched_ns = common::MonotonicNs();
  int failed_rank = -1;
  absl::Status verdict = LocalVerdict(op, &failed_rank);
  if (common::IsFallback(verdict) && (remote_ == nullptr || failed_rank >= 0)) {
    counters.fallback_ops.fetch_add(1, std::memory_order_relaxed);
  }
  op->gpu_done = false;
  if (remote_ != nullptr) {
    // Every node hears every node's verdict through the ring and ends the
    // op the same way; the engine copies only when this node's is OK.
    op->open_parts.store(verdict.ok() ? 2 : 1, std::memory_order_release);
    if (verdict.ok()) BuildPlan(op);
    op->state.store(Op::kRunning, std::memory_order_release);
    remote_->Start(op, verdict, failed_rank);
    if (verdict.ok()) engine->Execute(op);
    return;
  }
  if (!verdict.ok()) {
    FinishOp(op, verdict, failed_rank);
    return;
  }
  int captured = 0;
  for (const RankPart& p : op->parts) captured += p.graph_slot >= 0 ? 1 : 0;
  if (captured != 0) {
    if (captured != world_size_) {
      std::vector<int> which;
      for (int r = 0; r < world_size_; ++r) {
        if (op->parts[r].graph_slot >= 0) which.push_back(r);
      }
      FinishOp(
          op,
          absl::InvalidArgumentError(absl::StrCat(op->Label(), ": ranks disagree: rank(s) ", absl::StrJoin(which, ","),
                                                  " captured it into a CUDA graph, the others submitted it directly")),
          -1);
      return;
    }
    if (engine->host_addressable()) {
      // Nothing on host memory can start a replay but a rank writing the
      // flag itself, and polling for that would keep the daemon awake.
      FinishOp(op,
               absl::InvalidArgumentError(
                   absl::StrCat(op->Label(), ": captured (graph) ops need a GPU backend; this dmagatherd runs '",
                                engine->name(), "' on host memory")),
               -1);
      return;
    }
    // The definition of a persistent op: armed here, completed at once; its
    // replays come from the ranks' graphs.
    FinishOp(op, DefinePersistent(op), -1);
    return;
  }
  BuildPlan(op);
  if (engine->writes_done()) {
    // Done on the device: the engine writes the ranks' done flags after the
    // copies. Decided under completion_mu_ with CloseDeviceDone, which runs
    // before a gone rank's ready flags are released: an op either sees the
    // job closed, or is running when it runs (and gets its error record
    // before any device can pass that rank's flags).
    absl::MutexLock lock(&completion_mu_);
    op->gpu_done = !device_done_closed_;
  }
  op->open_parts.store(1, std::memory_order_release);
  op->state.store(Op::kRunning, std::memory_order_release);
  engine->Execute(op);
  // Recorded here, not in FinishOp: the engine may finish the op (and the
  // slot be reused) before Execute returns, so the op is not touched again.
  counters.hop_latency.Record(common::MonotonicNs() - op->matched_ns);
}

absl::Status Job::DefinePersistent(Op* op) {
  if (persistent_.size() >= size_t{abi::kGraphSlotsV1} * 64) {
    return absl::ResourceExhaustedError(
        absl::StrCat(op->Label(), ": job '", key_, "' already has ", persistent_.size(), " captured ops"));
  }
  BuildPlan(op);
  std::vector<Rank*> ranks;
  std::vector<int> slots;
  for (int r = 0; r < world_size_; ++r) {
    ranks.push_back(ranks_[r].get());
    slots.push_back(op->parts[r].graph_slot);
  }
  // A slot a rank defines again replaces its earlier op (the client reuses
  // a slot only after the graph that held it is gone).
  for (auto& p : persistent_) {
    if (p != nullptr && p->state() != PersistentOp::kRunning) {
      bool same = false;
      for (int r = 0; r < world_size_ && !same; ++r) same = p->slot(r) == slots[r];
      if (same) p->Retire();
    }
  }
  auto p = std::make_unique<PersistentOp>(this, std::move(ranks), std::move(slots));
  p->plan = op->plan;
  p->ranks = op->ranks;
  p->job_id = op->job_id;  // Its replays go out on the job's own streams.
  for (RankPart& part : op->parts) {
    for (auto& h : part.holds) p->holds.push_back(std::move(h));
    part.holds.clear();
  }
  persistent_.push_back(std::move(p));
  persistent_count_.store(persistent_.size(), std::memory_order_release);
  has_persistent_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

int Job::PollPersistent(engines::CopyEngine* engine) {
  if (!has_persistent_.load(std::memory_order_relaxed)) return 0;
  const bool is_failed = failed();
  const int32_t code = is_failed ? common::ToApiStatus(failure()) : 0;
  int started = 0;
  for (size_t i = 0; i < persistent_.size(); ++i) {
    PersistentOp* p = persistent_[i].get();
    if (p->retired() || p->state() == PersistentOp::kReleased) {
      // Retired (its slot defined again, or a rank's graph gone) or released
      // for good (the job failed): nothing more to do once it is not running.
      if (p->state() != PersistentOp::kRunning) {
        persistent_.erase(persistent_.begin() + i);
        persistent_count_.store(persistent_.size(), std::memory_order_release);
        --i;
      }
      continue;
    }
    if (p->Poll(engine, is_failed, code) == PersistentOp::Polled::kStarted) ++started;
  }
  // Nothing armed any more: the ingress thread may sleep on the doorbell again.
  if (persistent_.empty()) has_persistent_.store(false, std::memory_order_release);
  return started;
}

void Job::PersistentStarted() { inflight_ops_.fetch_add(1, std::memory_order_acq_rel); }

void Job::PersistentFinished(uint64_t bytes, int32_t code) {
  if (code == 0) {
    counters.ops.fetch_add(1, std::memory_order_relaxed);
    counters.bytes.fetch_add(bytes, std::memory_order_relaxed);
  } else {
    counters.errors[code].fetch_add(1, std::memory_order_relaxed);
  }
  inflight_ops_.fetch_sub(1, std::memory_order_acq_rel);
}

void Job::Sweep(uint64_t now_ns, absl::Duration op_timeout) {
  const uint64_t timeout_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(op_timeout));
  if (!failed() && remote_ != nullptr) {
    for (Op& op : slots_) {
      if (op.state.load(std::memory_order_acquire) != Op::kRunning) continue;
      if (now_ns - op.first_arrival_ns < timeout_ns) continue;
      const std::string pending = remote_->Pending(op.seq);
      if (pending.empty()) continue;
      Fail(absl::DeadlineExceededError(absl::StrCat(op.Label(), " of job '", key_, "' timed out after ",
                                                    absl::FormatDuration(op_timeout), " waiting for ", pending,
                                                    "; the job is stopped")),
           -1);
      break;
    }
  }
  if (!failed()) {
    for (Op& op : slots_) {
      if (op.state.load(std::memory_order_acquire) != Op::kWaiting) continue;
      if (now_ns - op.first_arrival_ns < timeout_ns) continue;
      std::vector<int> missing, present;
      for (int r = 0; r < world_size_; ++r) {
        if (ranks_[r] == nullptr) continue;  // On another node.
        (op.parts[r].arrived ? present : missing).push_back(r);
      }
      Fail(absl::DeadlineExceededError(absl::StrCat(op.Label(), " of job '", key_, "' timed out after ",
                                                    absl::FormatDuration(op_timeout), ": rank(s) ",
                                                    absl::StrJoin(missing, ","), " never submitted it (rank(s) ",
                                                    absl::StrJoin(present, ","), " did); the job is stopped")),
           missing.empty() ? -1 : missing[0]);
      break;
    }
  }
  if (!failed()) return;
  absl::Status why = failure();
  int who = failed_rank();
  for (Op& op : slots_) {
    if (op.state.load(std::memory_order_acquire) == Op::kWaiting) FinishOp(&op, why, who);
  }
}

void Job::FinishOp(Op* op, const absl::Status& status, int failed_rank) {
  const uint64_t now = common::MonotonicNs();
  bool all_ok = true;
  uint64_t op_bytes = 0;
  if (handing_back()) {
    // Handed back to its ranks (HandBack): the op is taken again, after the
    // newest op done anywhere, by the job its ranks join next; nothing of
    // this one may reach them.
    op->state.store(Op::kFree, std::memory_order_release);
    inflight_ops_.fetch_sub(1, std::memory_order_acq_rel);
    return;
  }
  {
    absl::MutexLock lock(&completion_mu_);
    const uint32_t n_slots = static_cast<uint32_t>(slots_.size());
    // Every rank's error record before any rank's done flag: a daemon that
    // dies between two ranks' flags leaves each rank's record in place, so
    // the next daemon can count the op done on every rank (StartAfter).
    for (int r = 0; r < world_size_; ++r) {
      RankPart& p = op->parts[r];
      const absl::Status& st = p.status.ok() ? status : p.status;
      if (!p.started || st.ok()) continue;
      all_ok = false;
      const int32_t code = common::ToApiStatus(st);
      // Under completion_mu_: error_count is a read-modify-write.
      if (!p.error_recorded) {
        RecordError(ranks_[r]->completion(), op->seq, code, p.status.ok() ? failed_rank : r, st.message());
        p.error_recorded = true;
      }
      ranks_[r]->counters.errors[code].fetch_add(1, std::memory_order_relaxed);
      counters.errors[code].fetch_add(1, std::memory_order_relaxed);
    }
    for (int r = 0; r < world_size_; ++r) {
      RankPart& p = op->parts[r];
      if (!p.started) continue;
      Rank* k = ranks_[r].get();
      if ((p.status.ok() ? status : p.status).ok()) {
        const uint64_t b = p.payload_bytes(world_size_);
        k->counters.ops.fetch_add(1, std::memory_order_relaxed);
        k->counters.bytes.fetch_add(b, std::memory_order_relaxed);
        op_bytes += b;
      }
      k->counters.latency.Record(now - p.submit_ns);
      k->finished[op->seq % n_slots] = op->seq;
      uint32_t published = 0;
      while (k->finished[k->next_publish % n_slots] == k->next_publish) {
        ++k->next_publish;
        ++published;
      }
      if (published != 0) {
        // Count the ops out before the client can see them done: a client
        // that frees a buffer right after its wait must find it unused.
        k->inflight.fetch_sub(published, std::memory_order_acq_rel);
        if (!PublishDone(k->completion(), k->next_publish - 1)) {
          counters.done_before_cpu.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
  }
  if (all_ok) {
    if (op->gpu_done) counters.device_done_ops.fetch_add(1, std::memory_order_relaxed);
    counters.ops.fetch_add(1, std::memory_order_relaxed);
    counters.bytes.fetch_add(op_bytes, std::memory_order_relaxed);
    counters.latency.Record(now - op->first_arrival_ns);
  }
  op->state.store(Op::kFree, std::memory_order_release);
  inflight_ops_.fetch_sub(1, std::memory_order_acq_rel);  // Last touch of the job.
}

int Job::ops_running() const {
  int waiting = 0;  // In flight but waiting for parts: the rest run (graph replays included).
  for (const Op& op : slots_) waiting += op.state.load(std::memory_order_acquire) == Op::kWaiting;
  return ops_in_flight() - waiting;
}

}  // namespace dmagather::server::scheduler
