#include "client/registration_cache.h"

#include "absl/strings/str_format.h"

namespace dmagather::client {

absl::StatusOr<abi::BufferRefV1> RegistrationCache::Lookup(const void* ptr, uint64_t bytes, const char* what) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = regions_.upper_bound(p);
  if (it != regions_.begin()) {
    --it;
    const uint64_t off = p - it->first;
    if (off <= it->second.bytes && bytes <= it->second.bytes - off) {
      abi::BufferRefV1 ref{};
      ref.region_id = it->second.id;
      ref.offset = off;
      return ref;
    }
    if (off < it->second.bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("rank %d: %s buffer %p + %u bytes runs past the end of its allocation (%u bytes at %p)",
                          rank_, what, ptr, bytes, it->second.bytes, reinterpret_cast<void*>(it->first)));
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "rank %d: %s buffer %p is not inside memory from dmagather_alloc or dmagather_register", rank_, what, ptr));
}

RegistrationCache::Map::const_iterator RegistrationCache::Containing(const void* ptr, uint64_t bytes) const {
  if (!Lookup(ptr, bytes, "").ok()) return regions_.end();
  return --regions_.upper_bound(reinterpret_cast<uintptr_t>(ptr));
}

bool RegistrationCache::CurrentAt(uintptr_t base, const Region& r, const void* ptr, uint64_t bytes,
                                  const ClientBackend& backend) {
  if (!r.chunks.empty()) return backend.ChunksCurrent(base, r.chunks, ptr, bytes);
  return backend.BufferId(ptr) == r.buffer_id;
}

bool RegistrationCache::Current(const void* ptr, uint64_t bytes, const ClientBackend& backend) const {
  auto it = Containing(ptr, bytes);
  return it != regions_.end() && CurrentAt(it->first, it->second, ptr, bytes, backend);
}

bool RegistrationCache::Held(const void* ptr, uint64_t bytes, const ClientBackend& backend) const {
  auto it = Containing(ptr, bytes);
  return it != regions_.end() && (it->second.owned != nullptr || CurrentAt(it->first, it->second, ptr, bytes, backend));
}

bool RegistrationCache::Hit(const MemoryExport& e) const {
  auto same = regions_.find(e.base);
  if (same == regions_.end() || same->second.bytes != e.bytes || same->second.buffer_id != e.buffer_id) {
    return false;
  }
  if (same->second.chunks.size() != e.chunks.size()) return false;
  for (size_t i = 0; i < e.chunks.size(); ++i) {
    if (same->second.chunks[i].id != e.chunks[i].id) return false;
  }
  return true;
}

bool RegistrationCache::Overlaps(uintptr_t base, const Region& r, const MemoryExport& e) {
  if (!(base < e.base + e.bytes && e.base < base + r.bytes)) return false;  // No overlap.
  if (r.chunks.empty() || e.chunks.empty() || base == e.base) return true;
  // Two VMM registrations over shared chunks are both valid while every
  // shared chunk is the same mapping in both.
  for (const VmmChunk& c : r.chunks) {
    const uintptr_t cb = base + c.offset;
    if (cb + c.bytes <= e.base || cb >= e.base + e.bytes) continue;
    bool same = false;
    for (const VmmChunk& d : e.chunks) {
      if (e.base + d.offset == cb && d.bytes == c.bytes && d.id == c.id) same = true;
    }
    if (!same) return true;
  }
  return false;
}

bool RegistrationCache::Stale(uintptr_t base, const Region& r, const MemoryExport& e, const ClientBackend& backend) {
  if (Overlaps(base, r, e)) return true;
  // VMM registrations whose chunks the allocator has unmapped (or remapped)
  // since: the daemon's import still maps the old physical memory, which
  // the device gets back only when the import goes. Checked on every new
  // registration (one pointer attribute per registered chunk).
  return !r.chunks.empty() && r.owned == nullptr &&
         !backend.ChunksCurrent(base, r.chunks, reinterpret_cast<const void*>(base), r.bytes);
}

bool RegistrationCache::AnyStale(const MemoryExport& e, const ClientBackend& backend) const {
  bool stale = false;
  for (const auto& [base, r] : regions_) stale |= Stale(base, r, e, backend);
  return stale;
}

std::vector<std::pair<uintptr_t, RegistrationCache::Region>> RegistrationCache::TakeStale(
    const MemoryExport& e, const ClientBackend& backend) {
  std::vector<std::pair<uintptr_t, Region>> out;
  for (auto it = regions_.begin(); it != regions_.end();) {
    auto cur = it++;
    if (!Stale(cur->first, cur->second, e, backend)) continue;
    out.emplace_back(cur->first, std::move(cur->second));
    regions_.erase(cur);
  }
  return out;
}

void RegistrationCache::Insert(const MemoryExport& e, uint32_t region_id, std::unique_ptr<OwnedBuffer> owned) {
  Region& r = regions_[e.base];
  r.bytes = e.bytes;
  r.id = region_id;
  r.buffer_id = e.buffer_id;
  r.chunks = e.chunks;
  r.owned = std::move(owned);
}

const RegistrationCache::Region* RegistrationCache::Find(const void* base) const {
  auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
  return it == regions_.end() ? nullptr : &it->second;
}

void RegistrationCache::Erase(const void* base) { regions_.erase(reinterpret_cast<uintptr_t>(base)); }

}  // namespace dmagather::client
