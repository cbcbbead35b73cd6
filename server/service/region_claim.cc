#include "server/service/region_claim.h"

#include <sys/stat.h>

#include "abi/fd_channel_v1.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dmagather::server::service {
namespace {

absl::Status FromOtherProcess(const Session& s, const char* what) {
  return absl::PermissionDeniedError(
      absl::StrCat("register: ", what, " handed over by another process than rank ", s.rank_index(),
                   "'s (a ticket works only for the process, and uid, that handed the memory over)"));
}

absl::Status BytesDiffer(uint64_t asked, uint64_t handed) {
  return absl::InvalidArgumentError(
      absl::StrCat("register: ", asked, " bytes asked for, but ", handed, " were handed over"));
}

// Exported device allocations (cuda_vmm): every ticket from the session's
// own process, their chunks adding up to the registered bytes.
absl::Status ClaimDeviceChunks(const RegisterSpec& req, const Session& s, TicketTable* tickets, RegionClaim* c) {
  uint64_t handed_bytes = 0;
  for (const std::string& t : req.tickets) {
    DMAG_ASSIGN_OR_RETURN(Handover h, tickets->Take(t, abi::kFdDeviceMemory));
    if (h.uid != s.uid() || h.pid != s.pid()) return FromOtherProcess(s, "device memory was");
    handed_bytes += h.bytes;
    for (const common::UniqueFd& fd : h.fds) c->spec.fds.push_back(fd.get());
    c->device_handovers.push_back(std::move(h));
  }
  if (handed_bytes != req.bytes) return BytesDiffer(req.bytes, handed_bytes);
  return absl::OkStatus();
}

// A host buffer (one memfd): from the session's own process (a ticket of
// another uid or process is refused without saying whose it was), neither
// the rank's segment nor the doorbell.
absl::Status ClaimHostBuffer(const RegisterSpec& req, const Session& s, TicketTable* tickets,
                             const DoorbellIdentity& doorbell, RegionClaim* c) {
  DMAG_ASSIGN_OR_RETURN(c->buffer, tickets->Take(req.ticket, abi::kFdBuffer));
  if (c->buffer.uid != s.uid() || c->buffer.pid != s.pid()) return FromOtherProcess(s, "the buffer was");
  if (c->buffer.bytes != req.bytes) return BytesDiffer(req.bytes, c->buffer.bytes);
  struct stat st;
  if (fstat(c->buffer.fd.get(), &st) != 0) return common::ErrnoStatus("register: fstat of the handed-over buffer");
  if (st.st_dev == s.segment_dev() && st.st_ino == s.segment_ino()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register: rank ", s.rank_index(),
        " handed over its own rank segment as a data buffer; the segment "
        "(request ring and completion block) can never be a buffer: allocate buffers with dmagather_alloc"));
  }
  if (doorbell.ino != 0 && st.st_dev == doorbell.dev && st.st_ino == doorbell.ino) {
    return absl::InvalidArgumentError(absl::StrCat("register: rank ", s.rank_index(),
                                                   " handed over dmagatherd's doorbell page as a data buffer; it can "
                                                   "never be a buffer: allocate buffers with dmagather_alloc"));
  }
  c->spec.fd = c->buffer.fd.get();
  c->what.host = true;
  c->what.key = Session::HostKey{st.st_dev, st.st_ino, req.bytes};
  c->what.host_bytes = req.bytes;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RegionClaim> ClaimRegion(const RegisterSpec& req, const Session& s, TicketTable* tickets,
                                        const DoorbellIdentity& doorbell) {
  RegionClaim c;
  c.spec.kind = req.memory_kind;
  c.spec.bytes = req.bytes;
  c.spec.handle = req.handle;
  c.spec.rank = s.rank()->engine();
  c.spec.owner_pid = s.pid();
  if (!req.tickets.empty()) DMAG_RETURN_IF_ERROR(ClaimDeviceChunks(req, s, tickets, &c));
  if (!req.ticket.empty()) DMAG_RETURN_IF_ERROR(ClaimHostBuffer(req, s, tickets, doorbell, &c));
  return c;
}

}  // namespace dmagather::server::service
