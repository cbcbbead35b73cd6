#include "client/daemon_link.h"

#include <unistd.h>

#include <cstdio>

#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/status.h"

namespace dmagather::client {
namespace {

// A daemon's answer that another attempt would only repeat: a refusal of
// the request itself (another job, a mismatch, a limit), a daemon that
// does not know the call, or a job lost across nodes (PEER_FAILED). Anything
// else - no daemon yet, one still starting or stopping, a call cut by a
// daemon that died under it (gRPC says UNAVAILABLE, CANCELLED, UNKNOWN or
// INTERNAL then, depending on where the stream was) - is tried again
// within the grace period.
bool Refused(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s) || absl::IsAlreadyExists(s) ||
         absl::IsPermissionDenied(s) || absl::IsResourceExhausted(s) || absl::IsOutOfRange(s) ||
         absl::IsUnimplemented(s) || absl::IsAborted(s);
}

}  // namespace

DaemonLink::DaemonLink(std::string socket_path, int rank, int reconnect_s, Parts parts, const common::Clock* clock)
    : socket_path_(std::move(socket_path)), rank_(rank), reconnect_s_(reconnect_s), parts_(parts), clock_(clock) {}

uint64_t DaemonLink::LostNow() { return common::MonotonicNs(); }

DaemonLink::~DaemonLink() { Close(/*leave=*/false); }

absl::StatusOr<std::unique_ptr<ControlChannel>> DaemonLink::Connect(std::string* ticket, int timeout_ms) {
  DMAG_ASSIGN_OR_RETURN(std::unique_ptr<ControlChannel> ch,
                        ControlChannel::Connect(socket_path_, common::RealClock(), timeout_ms));
  // Coming back, the segment goes only to a daemon of the uid this rank
  // first joined (the kernel's SO_PEERCRED, checked before anything is sent).
  auto handed = ch->HandOverSegment(parts_.segment_fd, parts_.segment_bytes, rank_, daemon_uid_);
  if (!handed.ok()) {
    return absl::IsPermissionDenied(handed.status()) && daemon_uid_ >= 0
               ? common::Annotate(handed.status(), "not the daemon this rank joined: ")
               : handed.status();
  }
  if (daemon_uid_ < 0) daemon_uid_ = handed->daemon_uid;
  auto bell = common::MemfdMapping::Map(handed->fd.get(), sizeof(abi::DoorbellV1));
  if (!bell.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot map the daemon's doorbell: ", bell.status().message()));
  }
  doorbells_.push_back(*std::move(bell));
  *ticket = handed->ticket;
  return ch;
}

absl::StatusOr<JoinAnswer> DaemonLink::Join(const JoinParams& params) {
  absl::MutexLock lock(&mu_);
  params_ = params;
  params_.reconnect_s = reconnect_s_;
  params_join_ms_ = params.join_timeout_ms;
  DMAG_ASSIGN_OR_RETURN(control_, Connect(&params_.segment_ticket, 1000));
  parts_.ring->SetDoorbell(static_cast<abi::DoorbellV1*>(doorbells_.back().data()));
  DMAG_ASSIGN_OR_RETURN(JoinAnswer answer, control_->Join(params_));
  // Coming back to a multi-node job, the daemon waits for these ranks.
  if (!params_.job_id.empty()) params_.local_ranks = answer.local_ranks;
  joined_ = true;
  return answer;
}

void DaemonLink::Start(ClientBackend* backend, std::function<bool()> resumable,
                       std::function<std::vector<CapturedDefinition>()> captured) {
  absl::MutexLock lock(&mu_);
  backend_ = backend;
  resumable_ = std::move(resumable);
  captured_ = std::move(captured);
  control_->StartWatcher([this](const std::string& reason, bool can, int code) { OnLost(reason, can, code); });
  if (reconnect_s_ > 0) reconnector_ = std::thread([this] { ReconnectLoop(); });
}

void DaemonLink::OnLost(const std::string& reason, bool resumable, int code) {
  {
    absl::MutexLock lock(&rc_mu_);
    if (!stop_ && resumable && reconnect_s_ > 0 && resumable_ && resumable_()) {
      lost_ = true;
      lost_reason_ = reason;
      rc_cv_.Signal();
      return;
    }
  }
  parts_.done->MarkGone(reason, code);
}

bool DaemonLink::stopping() const {
  absl::MutexLock lock(&rc_mu_);
  return stop_;
}

void DaemonLink::ReconnectLoop() {
  for (;;) {
    std::string reason;
    {
      absl::MutexLock lock(&rc_mu_);
      while (!lost_ && !stop_) rc_cv_.Wait(&rc_mu_);
      if (stop_) return;
      lost_ = false;
      reason = lost_reason_;
    }
    TakeBack(reason);
  }
}

void DaemonLink::TakeBack(const std::string& reason) {
  const absl::Time deadline = clock_->Now() + absl::Seconds(reconnect_s_);  // Decided on the clock seam.
  const uint64_t lost_ns = LostNow();
  fprintf(stderr,
          "dmagather: rank %d: %s; waiting up to %d s for dmagatherd to take the job back (DMAGATHER_RECONNECT_S)\n",
          rank_, reason.c_str(), reconnect_s_);
  absl::MutexLock lock(&mu_);
  if (control_ != nullptr) control_->EndStream();
  absl::Status last;
  bool fatal = false;
  int attempts = 0;
  while (!stopping()) {
    ++attempts;
    last = TryRejoin(lost_ns, deadline, &fatal);
    if (last.ok() || fatal || clock_->Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (last.ok()) {
    restarts_.fetch_add(1);
    fprintf(stderr, "dmagather: rank %d: back on dmagatherd after %.3f s (%d attempt(s)); the job goes on\n", rank_,
            (LostNow() - lost_ns) / 1e9, attempts);
    return;
  }
  const std::string why =
      fatal ? absl::StrCat(reason, "; dmagatherd came back but could not take the job back: ", last.message())
            : absl::StrCat(reason, "; no dmagatherd took the job back within ", reconnect_s_,
                           " s (DMAGATHER_RECONNECT_S; last: ", last.message(), ")");
  fprintf(stderr, "dmagather: rank %d: %s\n", rank_, why.c_str());
  // A node of a multi-node job that did not come back: PEER_FAILED, as the
  // daemon said.
  parts_.done->MarkGone(why, fatal && absl::IsAborted(last) ? 4 : DoneFlag::kUnavailable);
}

absl::Status DaemonLink::TryRejoin(uint64_t lost_ns, absl::Time deadline, bool* fatal) {
  *fatal = false;
  // A socket file left by a daemon that died answers nobody: ask the kernel
  // (at once) before gRPC (which would wait its connect timeout).
  if (!common::UnixSocketAccepts(socket_path_)) {
    return absl::UnavailableError(absl::StrCat("no dmagatherd listening at ", socket_path_));
  }
  std::string ticket;
  // A short connect: a daemon still starting is tried again in 50 ms on a
  // fresh channel (gRPC would back off for a second on this one).
  auto ch = Connect(&ticket, 200);
  if (!ch.ok()) {
    *fatal = absl::IsPermissionDenied(ch.status());
    return ch.status();
  }
  // No daemon reads the ring now (the one that took it is gone, the new one
  // maps it at Join): it reads again from the first op not seen done.
  const uint32_t pending = parts_.ring->Rewind();
  JoinParams p = params_;
  p.segment_ticket = ticket;
  p.resume = true;
  // A multi-node job forms its ring again within what is left of the grace
  // period (the other nodes' daemons may be coming back too).
  if (!p.job_id.empty()) {
    p.join_timeout_ms = int(std::max<int64_t>(1000, absl::ToInt64Milliseconds(deadline - clock_->Now())));
  }
  auto answer = (*ch)->Join(p);
  if (!answer.ok()) {
    *fatal = Refused(answer.status());
    return answer.status();
  }
  if (!answer->resumed) {
    *fatal = true;
    return absl::FailedPreconditionError(
        absl::StrCat("dmagatherd ", answer->daemon_version, " cannot take a job back (it is older than this library)"));
  }
  const std::vector<CapturedDefinition> captured = captured_ ? captured_() : std::vector<CapturedDefinition>{};
  if (!captured.empty() && !answer->takes_captured) {
    *fatal = true;
    return absl::FailedPreconditionError(absl::StrCat("dmagatherd ", answer->daemon_version,
                                                      " cannot take back ops captured into CUDA graphs (it is older "
                                                      "than this library)"));
  }
  // Every region under its old id: descriptors in the ring name them. This
  // thread is the library's own: the rank's device is made current on it
  // first, or the driver cannot describe VMM or pool memory here (and each
  // such region would be skipped as if freed).
  const ClientBackend* backend = backend_;  // Read under mu_ (the lambda below is not seen to hold it).
  absl::Status st = backend->PrepareThread();
  if (!st.ok()) return st;
  ControlChannel* channel = ch->get();
  parts_.regions->ForEach([&](uintptr_t base, const RegistrationCache::Region& r) {
    if (!st.ok()) return;
    absl::StatusOr<MemoryExport> e = r.owned != nullptr
                                         ? absl::StatusOr<MemoryExport>(r.owned->export_info())
                                         : backend->Describe(reinterpret_cast<const void*>(base), r.bytes);
    if (!e.ok()) return;  // Freed meanwhile: an op naming it fails validation; the next use registers anew.
    st = channel->Register(*e, rank_, nullptr, r.id).status();
  });
  if (!st.ok()) {
    *fatal = Refused(st);
    return st;
  }
  if (absl::Status resumed = (*ch)->Resume((LostNow() - lost_ns) / 1000, pending, captured); !resumed.ok()) {
    *fatal = Refused(resumed);
    return resumed;
  }
  control_ = *std::move(ch);
  parts_.ring->SetDoorbell(static_cast<abi::DoorbellV1*>(doorbells_.back().data()));
  control_->StartWatcher([this](const std::string& reason, bool can, int code) { OnLost(reason, can, code); });
  parts_.ring->Ring();
  return absl::OkStatus();
}

absl::Status DaemonLink::Register(const MemoryExport& e, std::unique_ptr<OwnedBuffer> owned) {
  for (int attempt = 0;; ++attempt) {
    const int generation = restarts_.load();
    {
      absl::MutexLock lock(&mu_);
      auto id = control_->Register(e, rank_, owned.get());
      if (id.ok()) {
        parts_.regions->Insert(e, *id, std::move(owned));
        return absl::OkStatus();
      }
      // The daemon went away under the call: once it is taken back (or given
      // up on), the registration goes to the new one.
      if (!absl::IsUnavailable(id.status()) || attempt > 0 || reconnect_s_ == 0) return id.status();
    }
    if (!WaitTakenBack(generation)) return parts_.done->GoneStatus();
  }
}

bool DaemonLink::WaitTakenBack(int generation) {
  // A control-plane path only: polled. Bounded by the grace period and a
  // join's answer (the take-back is given up on by then, or done).
  const absl::Time deadline = clock_->Now() + absl::Seconds(reconnect_s_) + absl::Milliseconds(params_join_ms_ + 10000);
  while (restarts_.load() == generation && !parts_.done->gone() && clock_->Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  return restarts_.load() != generation;
}

void DaemonLink::DropStale(const MemoryExport& e, const ClientBackend& backend,
                           std::vector<std::pair<uint32_t, uintptr_t>>* dropped) {
  absl::MutexLock lock(&mu_);
  for (const auto& [base, r] : parts_.regions->TakeStale(e, backend)) {
    control_->Deregister(r.id).IgnoreError();  // Best effort: the daemon drops it at Leave at the latest.
    dropped->emplace_back(r.id, base);
  }
}

absl::Status DaemonLink::Deregister(const void* base) {
  absl::MutexLock lock(&mu_);
  const RegistrationCache::Region* r = parts_.regions->Find(base);
  if (r == nullptr) return absl::OkStatus();
  absl::Status st = control_->Deregister(r->id);
  parts_.regions->Erase(base);  // Freed here (if the library made it); the daemon's side goes with the Deregister.
  // A daemon gone (for good, or until one takes the job back without this
  // region) holds nothing to deregister.
  return parts_.done->gone() || absl::IsUnavailable(st) ? absl::OkStatus() : st;
}

void DaemonLink::Close(bool leave) {
  {
    absl::MutexLock lock(&rc_mu_);
    stop_ = true;
    rc_cv_.Signal();
  }
  if (reconnector_.joinable()) reconnector_.join();
  absl::MutexLock lock(&mu_);
  if (control_ == nullptr) return;
  if (leave && control_->joined()) {
    if (!parts_.done->gone()) control_->Leave();
    // The daemon ends the stream once it sees the Leave; cancel in case it cannot.
    for (int i = 0; i < 100 && !parts_.done->gone(); ++i) usleep(2000);
  }
  control_->EndStream();
  control_.reset();
  joined_ = false;
}

bool DaemonLink::joined() const {
  absl::MutexLock lock(&mu_);
  return joined_;
}

}  // namespace dmagather::client
