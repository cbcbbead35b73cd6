// RegionLedger: what each uid's registered regions hold in the daemon, for
// the per-user limits and for telemetry. A charge lives exactly as long as
// the daemon holds the region: it is attached to the region's shared_ptr
// (Attach), so a region dropped by Deregister but still held by a captured
// (persistent) op or an op in flight stays charged until the last holder
// lets go — what the daemon holds is what is charged and shown.
//
// Threads: any; every method is thread-safe. Shared (shared_ptr) by the
// registry and every charged region, so a region freed after the registry
// is gone still finds its ledger.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::service {

class RegionLedger : public std::enable_shared_from_this<RegionLedger> {
 public:
  struct Limits {
    int max_regions_per_uid = 0;            // 0: no limit.
    uint64_t max_mapped_bytes_per_uid = 0;  // Host bytes; 0: no limit.
  };
  struct Held {
    int regions = 0;
    uint64_t bytes = 0;  // Host bytes mapped in the daemon.
  };
  // One region's share of its uid's usage; returned when destroyed.
  class Charge {
   public:
    Charge(std::shared_ptr<RegionLedger> ledger, uid_t uid, uint64_t bytes)
        : ledger_(std::move(ledger)), uid_(uid), bytes_(bytes) {}
    ~Charge() { ledger_->Release(uid_, bytes_); }
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;

   private:
    const std::shared_ptr<RegionLedger> ledger_;
    const uid_t uid_;
    const uint64_t bytes_;
  };

  static std::shared_ptr<RegionLedger> Create(const Limits& limits) {
    return std::shared_ptr<RegionLedger>(new RegionLedger(limits));
  }

  // Charges one region of `bytes` host bytes to `uid`, or says which limit
  // it would pass.
  absl::StatusOr<std::unique_ptr<Charge>> Reserve(uid_t uid, uint64_t bytes);
  // The same region, holding `charge` until its last holder drops it (same
  // pointer: engines may still downcast it).
  static std::shared_ptr<engines::ImportedRegion> Attach(std::shared_ptr<engines::ImportedRegion> region,
                                                         std::unique_ptr<Charge> charge);

  Held held(uid_t uid) const;
  Held total() const;

 private:
  explicit RegionLedger(const Limits& limits) : limits_(limits) {}
  void Release(uid_t uid, uint64_t bytes);

  const Limits limits_;
  mutable absl::Mutex mu_;
  std::map<uid_t, Held> per_uid_ ABSL_GUARDED_BY(mu_);
  Held total_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dmagather::server::service
