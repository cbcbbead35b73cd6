#include "server/ingress/session.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace dmagather::server::ingress {

absl::StatusOr<std::shared_ptr<Session>> Session::Open(uint64_t id, int rank, int pid,
                                                       const std::string& name, uint64_t token) {
  DMAG_ASSIGN_OR_RETURN(common::ShmMapping m, common::ShmMapping::Open(name, abi::SegmentLayoutV1::kBytes));
  abi::SegmentViewV1 v = abi::SegmentViewV1::At(m.data());
  const abi::SegmentHeaderV1& h = *v.header;
  if (h.magic != abi::kMagic || h.stamp != abi::kSegmentStampV1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "segment %s is not a v1 dmagather segment (stamp 0x%08x, expected 0x%08x): client and "
        "daemon versions differ",
        name, h.stamp, abi::kSegmentStampV1));
  }
  if (h.token != token) {
    return absl::PermissionDeniedError(absl::StrCat("segment ", name, " token does not match the join request"));
  }
  if (h.ring_slots != abi::kRingSlotsV1 || h.descriptor_stamp != abi::kDescriptorStampV1 ||
      h.completion_stamp != abi::kCompletionStampV1 || h.segment_bytes != abi::SegmentLayoutV1::kBytes ||
      h.completion_offset != abi::SegmentLayoutV1::kCompletionOffset ||
      h.ring_offset != abi::SegmentLayoutV1::kRingOffset ||
      h.descriptors_offset != abi::SegmentLayoutV1::kDescriptorsOffset) {
    return absl::InvalidArgumentError(absl::StrCat("segment ", name, " has an unexpected v1 layout"));
  }
  auto s = std::shared_ptr<Session>(new Session(id, rank, pid, std::move(m)));
  return s;
}

Session::Session(uint64_t id, int rank, int pid, common::ShmMapping segment)
    : id_(id), rank_(rank), pid_(pid), uid_(segment.owner_uid()), segment_(std::move(segment)) {
  view_ = abi::SegmentViewV1::At(segment_.data());
  finished.assign(abi::kRingSlotsV1, 0);
  // Whatever the client left there, the daemon starts the protocol clean.
  abi::StoreRelease(&view_.completion->done_seq, 0u);
  abi::StoreRelease(&view_.completion->error_count, 0u);
  abi::StoreRelease(&view_.completion->daemon_state, static_cast<uint32_t>(abi::kDaemonServing));
  ring_head = abi::LoadAcquire(&view_.ring->tail);
  abi::StoreRelease(&view_.ring->head, ring_head);
}

const char* Session::state_name() const {
  switch (state()) {
    case State::kJoining:
      return "joining";
    case State::kActive:
      return "active";
    case State::kLeft:
      return "left";
    case State::kGone:
      return "failed";
  }
  return "unknown";
}

absl::Status Session::AddRegion(uint32_t region_id, std::shared_ptr<engines::ImportedRegion> region) {
  absl::MutexLock lock(&mu_);
  registered_bytes_ += region->bytes();
  regions_[region_id] = std::move(region);
  return absl::OkStatus();
}

absl::Status Session::RemoveRegion(uint32_t region_id) {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(region_id);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("region ", region_id, " is not registered by rank ", rank_));
  }
  uint32_t n = inflight.load(std::memory_order_acquire);
  if (n != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "region ", region_id, " of rank ", rank_, " may be in use by ", n,
        " outstanding operation(s); wait for them before freeing or deregistering it"));
  }
  registered_bytes_ -= it->second->bytes();
  regions_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<char*> Session::Resolve(uint32_t region_id, uint64_t offset, uint64_t bytes,
                                       const char* what) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(region_id);
  if (it == regions_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " buffer names region ", region_id,
                                                   ", which rank ", rank_, " has not registered"));
  }
  const engines::ImportedRegion& r = *it->second;
  if (offset > r.bytes() || bytes > r.bytes() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, " buffer [", offset, ", +", bytes,
                                                   ") runs past the end of region ", region_id,
                                                   " (", r.bytes(), " bytes) of rank ", rank_));
  }
  return r.base() + offset;
}

uint64_t Session::registered_bytes() const {
  absl::MutexLock lock(&mu_);
  return registered_bytes_;
}

int Session::num_regions() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(regions_.size());
}

void Session::ReleaseMemory() {
  if (released_.exchange(true)) return;
  absl::flat_hash_map<uint32_t, std::shared_ptr<engines::ImportedRegion>> regions;
  {
    absl::MutexLock lock(&mu_);
    regions.swap(regions_);
    registered_bytes_ = 0;
  }
  regions.clear();
  view_ = abi::SegmentViewV1{};
  segment_ = common::ShmMapping();
}

}  // namespace dmagather::server::ingress
