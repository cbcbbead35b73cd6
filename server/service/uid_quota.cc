#include "server/service/uid_quota.h"

#include "absl/strings/str_cat.h"

namespace dmagather::server::service {

UidQuota::Reservation& UidQuota::Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    Reset();
    quota_ = std::move(o.quota_);
    o.quota_ = nullptr;
    uid_ = o.uid_;
    kind_ = o.kind_;
  }
  return *this;
}

void UidQuota::Reservation::Reset() {
  if (quota_ == nullptr) return;
  quota_->Release(uid_, kind_);
  quota_ = nullptr;
}

absl::StatusOr<UidQuota::Reservation> UidQuota::ReserveSession(uid_t uid) {
  absl::MutexLock lock(&mu_);
  auto it = per_uid_.find(uid);
  const int held = it == per_uid_.end() ? 0 : it->second.sessions;
  if (limits_.max_sessions_per_uid > 0 && held >= limits_.max_sessions_per_uid) {
    return absl::ResourceExhaustedError(
        absl::StrCat("join: uid ", uid, " already has ", limits_.max_sessions_per_uid,
                     " open sessions, the per-user limit (dmagatherd --max_sessions_per_uid); end some ranks first"));
  }
  ++per_uid_[uid].sessions;
  return Reservation(shared_from_this(), uid, Kind::kSession);
}

absl::StatusOr<UidQuota::Reservation> UidQuota::ReserveJob(uid_t uid, const std::string& job_key) {
  absl::MutexLock lock(&mu_);
  auto it = per_uid_.find(uid);
  const int held = it == per_uid_.end() ? 0 : it->second.jobs;
  if (limits_.max_jobs_per_uid > 0 && held >= limits_.max_jobs_per_uid) {
    return absl::ResourceExhaustedError(absl::StrCat("join: uid ", uid, " already has ", limits_.max_jobs_per_uid,
                                                     " jobs, the per-user limit (dmagatherd --max_jobs_per_uid); job '",
                                                     job_key, "' was not created"));
  }
  ++per_uid_[uid].jobs;
  return Reservation(shared_from_this(), uid, Kind::kJob);
}

void UidQuota::Release(uid_t uid, Kind kind) {
  absl::MutexLock lock(&mu_);
  auto it = per_uid_.find(uid);
  if (it == per_uid_.end()) return;
  Held& h = it->second;
  --(kind == Kind::kJob ? h.jobs : h.sessions);
  if (h.jobs == 0 && h.sessions == 0) per_uid_.erase(it);
}

UidQuota::Held UidQuota::held(uid_t uid) const {
  absl::MutexLock lock(&mu_);
  auto it = per_uid_.find(uid);
  return it == per_uid_.end() ? Held{} : it->second;
}

int UidQuota::uids() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(per_uid_.size());
}

}  // namespace dmagather::server::service
