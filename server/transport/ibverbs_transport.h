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

// The options with these environment variables applied:
//   DMAGATHER_IB_DEVICE      device name, optionally "name:port"
//   DMAGATHER_IB_GID_INDEX   GID index (RoCE); default automatic
//   DMAGATHER_IB_SLOTS       staging slots per link (default 16)
//   DMAGATHER_IB_SLOT_BYTES  bytes per staging slot (default 256 + 1 MiB)
// INVALID_ARGUMENT naming the variable when a value does not parse.
absl::StatusOr<IbverbsOptions> IbverbsOptionsFromEnv();

// The ibverbs transport over libibverbs with IbverbsOptionsFromEnv().
// UNAVAILABLE with the reason when no RDMA device can be used ("no RDMA
// device (ibv_get_device_list found none)", "... has no active port").
absl::StatusOr<std::unique_ptr<Transport>> MakeIbverbsTransport();

// The same over any verbs table (tests pass a fake). `api` must outlive the
// transport and every connection it makes.
absl::StatusOr<std::unique_ptr<Transport>> MakeIbverbsTransport(VerbsApi* api, const IbverbsOptions& options);

}  // namespace dmagather::server::transport
