// RegistrationCache: the buffers this rank registered with the daemon, by
// their base address in this process, and the rules that keep the map true:
// a pointer resolves to (region id, offset) inside one registration; a
// registration is valid only while its allocation lives (same buffer id,
// or, for VMM memory, the same mappings); a new registration first drops
// those it overlaps (memory freed and reused, or unmapped and remapped).
// No RPC here: the communicator registers and deregisters with the daemon
// and keeps this map in step.
//
// Threads: the communicator's user thread only (one call at a time).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "abi/descriptor_v1.h"
#include "absl/status/statusor.h"
#include "client/backend.h"

namespace dmagather::client {

class RegistrationCache {
 public:
  struct Region {
    uint64_t bytes = 0;
    uint32_t id = 0;
    uint64_t buffer_id = 0;              // Allocation identity (0: not tracked by the backend).
    std::vector<VmmChunk> chunks;        // VMM: the mappings registered (checked instead of buffer_id).
    std::unique_ptr<OwnedBuffer> owned;  // Set when dmagather_alloc made it (freed with the entry).
  };

  // `rank` only names the rank in messages.
  explicit RegistrationCache(int rank) : rank_(rank) {}

  // Region + offset of [ptr, ptr+bytes) (`what` names the buffer in the
  // message when it is not inside one registration).
  absl::StatusOr<abi::BufferRefV1> Lookup(const void* ptr, uint64_t bytes, const char* what) const;
  // Whether [ptr, ptr+bytes) is inside a registration that still describes
  // that memory (not freed and reused, not unmapped and remapped).
  bool Current(const void* ptr, uint64_t bytes, const ClientBackend& backend) const;
  // Current(), or inside memory dmagather_alloc made (alive until Free).
  bool Held(const void* ptr, uint64_t bytes, const ClientBackend& backend) const;

  // Whether `e` is registered already, exactly (the cache hit).
  bool Hit(const MemoryExport& e) const;
  // Whether registering `e` must first drop registrations: those it
  // overlaps, and VMM ones whose chunks were unmapped or remapped since.
  bool AnyStale(const MemoryExport& e, const ClientBackend& backend) const;
  // Takes those registrations out of the map, with their bases (the caller
  // deregisters them with the daemon, then lets them go).
  std::vector<std::pair<uintptr_t, Region>> TakeStale(const MemoryExport& e, const ClientBackend& backend);

  void Insert(const MemoryExport& e, uint32_t region_id, std::unique_ptr<OwnedBuffer> owned);
  // The registration starting exactly at `base`, or null.
  const Region* Find(const void* base) const;
  void Erase(const void* base);
  void Clear() { regions_.clear(); }
  // Calls f(base, region) for each registration (the reconnect thread,
  // while the user thread cannot change the map: DaemonLink's lock).
  template <typename F>
  void ForEach(F f) const {
    for (const auto& [base, r] : regions_) f(base, r);
  }
  size_t size() const { return regions_.size(); }

 private:
  using Map = std::map<uintptr_t, Region>;
  // The registration holding [ptr, ptr+bytes), or end().
  Map::const_iterator Containing(const void* ptr, uint64_t bytes) const;
  static bool CurrentAt(uintptr_t base, const Region& r, const void* ptr, uint64_t bytes, const ClientBackend& backend);
  // Whether the registration at `base` must go before `e` is registered: it
  // overlaps `e` and is not the very same mappings (VMM regions may overlap).
  static bool Overlaps(uintptr_t base, const Region& r, const MemoryExport& e);
  static bool Stale(uintptr_t base, const Region& r, const MemoryExport& e, const ClientBackend& backend);

  const int rank_;
  Map regions_;
};

}  // namespace dmagather::client
