// RegionClaim: the memory a Register hands over, claimed and checked before
// the engine imports it. Host memory comes as one memfd ticket (the buffer
// must not be the rank's own segment or the daemon's doorbell); exported
// device allocations (cuda_vmm) as one ticket per chunk. Every ticket must
// come from the session's own process and add up to the registered bytes.
//
// Threads: the registering gRPC thread, under the session's register_mu.
#pragma once

#include <sys/types.h>

#include <vector>

#include "absl/status/statusor.h"
#include "server/engines/copy_engine.h"
#include "server/service/requests.h"
#include "server/service/session.h"
#include "server/service/ticket_table.h"

namespace dmagather::server::service {

// The daemon's doorbell memfd (st_dev, st_ino; ino 0: none): never a buffer.
struct DoorbellIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
};

struct RegionClaim {
  engines::RegionSpec spec;  // Its fds are borrowed from the hand-overs below.
  Session::Registered what;
  Handover buffer;
  std::vector<Handover> device_handovers;
};

// Takes the tickets of `req` (spending them) and checks what they hand over
// against session `s`. The claim must outlive the engine's Import of `spec`.
absl::StatusOr<RegionClaim> ClaimRegion(const RegisterSpec& req, const Session& s, TicketTable* tickets,
                                        const DoorbellIdentity& doorbell);

}  // namespace dmagather::server::service
