// TicketTable: descriptors clients handed over on the fd channel, waiting to
// be claimed by the gRPC call (Join, Register) that presents their ticket.
// A ticket is 128 random bits (getrandom), bound to the kernel's identity of
// the process that handed the descriptor over (SO_PEERCRED uid, gid, pid),
// its kind and its byte count; it is good for one claim (a failed claim
// spends it too) within `ttl`. Each uid may hold at most `max_per_uid`
// unclaimed tickets, so no user can pin the daemon's descriptors.
//
// Threads: Issue/Expire on the fd-channel thread, Take on gRPC threads; all
// methods are thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/memfd.h"

namespace dmagather::server::service {

// What a client handed over, and who it was according to the kernel.
struct Handover {
  uint32_t kind = 0;  // abi::FdKindV1
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
  uint64_t bytes = 0;
  common::UniqueFd fd;
  std::vector<common::UniqueFd> fds;  // kFdDeviceMemory: the exported allocations, in order.
  std::vector<gid_t> groups;          // Supplementary groups (SO_PEERGROUPS), for the operator check.
};

class TicketTable {
 public:
  struct Options {
    absl::Duration ttl = absl::Seconds(5);
    common::Clock* clock = &common::RealClock();  // Expiry (tests pass a FakeClock).
    int max_per_uid = 64;
  };
  TicketTable() : TicketTable(Options{}) {}
  explicit TicketTable(const Options& options) : options_(options) {}

  // A fresh ticket for `h`. RESOURCE_EXHAUSTED when h.uid holds too many.
  absl::StatusOr<std::string> Issue(Handover h);
  // Claims the ticket (always spends it). NOT_FOUND when it is unknown,
  // spent, expired or of another kind.
  absl::StatusOr<Handover> Take(const std::string& ticket, uint32_t kind);
  // Drops expired tickets (closing their descriptors).
  void Expire();
  size_t size() const;

 private:
  struct Entry {
    Handover handover;
    absl::Time expires;
  };
  using Map = absl::flat_hash_map<std::string, Entry>;
  void EraseLocked(Map::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  Map entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, int> per_uid_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dmagather::server::service
