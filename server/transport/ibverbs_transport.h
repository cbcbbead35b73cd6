// The ibverbs transport: RC queue pairs; each frame is copied into a
// registered send staging slot and written with IBV_WR_RDMA_WRITE_WITH_IMM
// into the receiver's registered staging ring, so the receiver's completion
// proves the data landed. The receiver returns credits (a zero-byte
// IBV_WR_SEND_WITH_IMM carrying the number of slots it has consumed) so the
// sender never overwrites an unread slot. Queue-pair numbers and ring
// addresses are exchanged over the link's TCP bootstrap connection, which
// stays open to notice a peer that goes away. docs/TRANSPORT_IBVERBS.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "server/transport/transport.h"
#include "server/transport/verbs_api.h"

namespace dmagather::server::transport {

struct IbverbsOptions {
  // Device name (e.g. "mlx5_0"); empty: the first device with an active port.
  std::string device;
  // Port number; 0: the device's first active port.
  int port = 0;
  // GID index; -1: automatic (0 on InfiniBand; on RoCE the first RoCE v2 GID
  // with an IPv4-mapped address, else the first RoCE v2 GID, else 0).
  int gid_index = -1;
  // Receive staging ring of each link: `slots` slots of `slot_bytes`.
  int slots = 16;
  size_t slot_bytes = 256 + (size_t{1} << 20);
  // How long a closing link waits for its last sends (tests pass a FakeClock).
  const common::Clock* clock = &common::RealClock();
};

// Limits on IbverbsOptions (checked by MakeIbverbsTransport).
inline constexpr int kIbverbsMaxSlots = 256;
inline constexpr size_t kIbverbsMaxSlotBytes = size_t{1} << 30;

// The options from dmagatherd's flags (server/flags/cluster.cc):
//   --ib_device      device name, optionally "name:port" ("": the first
//                    device with an active port)
//   --ib_gid_index   GID index (RoCE); -1: automatic
//   --ib_slots       staging slots per link (default 16)
//   --ib_slot_bytes  bytes per staging slot (default 256 + 1 MiB)
// INVALID_ARGUMENT naming the flag when the device's port does not parse or
// the slot size is not positive; MakeIbverbsTransport checks the ranges.
absl::StatusOr<IbverbsOptions> IbverbsOptionsFromFlags(const std::string& device, int gid_index, int slots,
                                                       int64_t slot_bytes);

// The options the daemon's ibverbs transport is made with: main.cc sets them
// from the flags before the daemon starts (until then, the defaults). The
// transport is created by the peer service (server/cluster), whose options
// do not carry them, hence this one process-wide setting. Any thread.
void SetIbverbsOptions(const IbverbsOptions& options);

// The ibverbs transport over libibverbs with the options SetIbverbsOptions
// gave.
// UNAVAILABLE with the reason when no RDMA device can be used ("no RDMA
// device (ibv_get_device_list found none)", "... has no active port").
absl::StatusOr<std::unique_ptr<Transport>> MakeIbverbsTransport();

// The same over any verbs table (tests pass a fake). `api` must outlive the
// transport and every connection it makes.
absl::StatusOr<std::unique_ptr<Transport>> MakeIbverbsTransport(VerbsApi* api, const IbverbsOptions& options);

}  // namespace dmagather::server::transport
