#include "server/service/region_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dmagather::server::service {

absl::StatusOr<std::unique_ptr<RegionLedger::Charge>> RegionLedger::Reserve(uid_t uid, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  Held& h = per_uid_[uid];
  if (limits_.max_regions_per_uid > 0 && h.regions >= limits_.max_regions_per_uid) {
    const int n = h.regions;
    if (n == 0) per_uid_.erase(uid);
    return absl::ResourceExhaustedError(
        absl::StrCat("register: uid ", uid, " already holds ", n,
                     " regions in dmagatherd (registered, or kept by captured or running ops), the per-user limit "
                     "(dmagatherd --max_regions_per_uid); deregister or free buffers, or destroy graphs, first"));
  }
  const uint64_t cap = limits_.max_mapped_bytes_per_uid;
  if (cap > 0 && bytes > cap - std::min(h.bytes, cap)) {
    const uint64_t held = h.bytes;
    if (h.regions == 0) per_uid_.erase(uid);
    return absl::ResourceExhaustedError(
        absl::StrCat("register: ", bytes, " more host bytes would take uid ", uid, " past ", cap,
                     " mapped bytes, the per-user limit (dmagatherd --max_mapped_bytes_per_uid; it holds ", held,
                     ", counting regions kept by captured or running ops)"));
  }
  ++h.regions;
  h.bytes += bytes;
  ++total_.regions;
  total_.bytes += bytes;
  return std::make_unique<Charge>(shared_from_this(), uid, bytes);
}

void RegionLedger::Release(uid_t uid, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = per_uid_.find(uid);
  if (it == per_uid_.end()) return;
  --it->second.regions;
  it->second.bytes -= bytes;
  --total_.regions;
  total_.bytes -= bytes;
  if (it->second.regions == 0) per_uid_.erase(it);
}

std::shared_ptr<engines::ImportedRegion> RegionLedger::Attach(std::shared_ptr<engines::ImportedRegion> region,
                                                              std::unique_ptr<Charge> charge) {
  engines::ImportedRegion* p = region.get();
  std::shared_ptr<Charge> c(std::move(charge));
  // The deleter owns the region and the charge: both go with the last holder.
  return std::shared_ptr<engines::ImportedRegion>(
      p, [region = std::move(region), c = std::move(c)](engines::ImportedRegion*) mutable {
        region.reset();  // Unmapped first, then un-charged.
        c.reset();
      });
}

RegionLedger::Held RegionLedger::held(uid_t uid) const {
  absl::MutexLock lock(&mu_);
  auto it = per_uid_.find(uid);
  return it == per_uid_.end() ? Held{} : it->second;
}

RegionLedger::Held RegionLedger::total() const {
  absl::MutexLock lock(&mu_);
  return total_;
}

}  // namespace dmagather::server::service
