// UidQuota: the jobs and sessions each uid holds, against the per-uid
// limits (RegionLedger does the same for registered regions). A count is
// held by a Reservation: taking one checks the limit and counts, and the
// count goes back when the Reservation is destroyed or Reset, so no early
// return on an error path can leak it. The registry core keeps a job's
// reservation in its job entry and a session's in its session entry.
//
// Threads: any; every method is thread-safe (mu_, a leaf lock). Shared
// (shared_ptr) with every outstanding reservation, so one may outlive the
// registry.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dmagather::server::service {

class UidQuota : public std::enable_shared_from_this<UidQuota> {
 public:
  struct Limits {
    int max_jobs_per_uid = 0;      // 0: no limit.
    int max_sessions_per_uid = 0;  // 0: no limit.
  };
  struct Held {
    int jobs = 0;
    int sessions = 0;
  };
  enum class Kind { kJob, kSession };

  // One job or session counted against its uid until destroyed or Reset.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept { *this = std::move(o); }
    Reservation& operator=(Reservation&& o) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() { Reset(); }

    // Gives the count back (no-op when nothing is held).
    void Reset();
    bool held() const { return quota_ != nullptr; }

   private:
    friend class UidQuota;
    Reservation(std::shared_ptr<UidQuota> quota, uid_t uid, Kind kind)
        : quota_(std::move(quota)), uid_(uid), kind_(kind) {}
    std::shared_ptr<UidQuota> quota_;
    uid_t uid_ = 0;
    Kind kind_ = Kind::kSession;
  };

  static std::shared_ptr<UidQuota> Create(const Limits& limits) {
    return std::shared_ptr<UidQuota>(new UidQuota(limits));
  }

  // Counts one more session (job) of `uid`, or RESOURCE_EXHAUSTED naming
  // the limit and its flag. `job_key` only names the job in the message.
  absl::StatusOr<Reservation> ReserveSession(uid_t uid) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Reservation> ReserveJob(uid_t uid, const std::string& job_key) ABSL_LOCKS_EXCLUDED(mu_);

  Held held(uid_t uid) const ABSL_LOCKS_EXCLUDED(mu_);
  // Uids holding anything (a uid whose counts reach zero is forgotten).
  int uids() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit UidQuota(const Limits& limits) : limits_(limits) {}
  void Release(uid_t uid, Kind kind) ABSL_LOCKS_EXCLUDED(mu_);

  const Limits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uid_t, Held> per_uid_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dmagather::server::service
