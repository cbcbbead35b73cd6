#include "server/ingress/region_table.h"

#include "absl/strings/str_cat.h"

namespace dmagather::server::ingress {

void RegionTable::Add(uint32_t region_id, std::shared_ptr<engines::ImportedRegion> region) {
  absl::MutexLock lock(&mu_);
  registered_bytes_ += region->bytes();
  regions_[region_id] = std::move(region);
}

absl::Status RegionTable::Remove(uint32_t region_id, const std::atomic<uint32_t>& inflight) {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(region_id);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("region ", region_id, " is not registered by rank ", rank_));
  }
  uint32_t n = inflight.load(std::memory_order_acquire);
  if (n != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("region ", region_id, " of rank ", rank_, " may be in use by ", n,
                     " outstanding operation(s); wait for them before freeing or deregistering it"));
  }
  registered_bytes_ -= it->second->bytes();
  regions_.erase(it);
  return absl::OkStatus();
}

std::shared_ptr<engines::ImportedRegion> RegionTable::Hold(uint32_t region_id) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(region_id);
  return it == regions_.end() ? nullptr : it->second;
}

absl::StatusOr<char*> RegionTable::Resolve(uint32_t region_id, uint64_t offset, uint64_t bytes,
                                           const char* what) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(region_id);
  if (it == regions_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " buffer names region ", region_id, ", which rank ", rank_, " has not registered"));
  }
  const engines::ImportedRegion& r = *it->second;
  if (offset > r.bytes() || bytes > r.bytes() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, " buffer [", offset, ", +", bytes,
                                                   ") runs past the end of region ", region_id, " (", r.bytes(),
                                                   " bytes) of rank ", rank_));
  }
  return r.base() + offset;
}

void RegionTable::Clear() {
  absl::flat_hash_map<uint32_t, std::shared_ptr<engines::ImportedRegion>> regions;
  {
    absl::MutexLock lock(&mu_);
    regions.swap(regions_);
    registered_bytes_ = 0;
  }
  // Unmapped here, outside the lock.
}

uint64_t RegionTable::registered_bytes() const {
  absl::MutexLock lock(&mu_);
  return registered_bytes_;
}

int RegionTable::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(regions_.size());
}

}  // namespace dmagather::server::ingress
