// The ibverbs transport: RC queue pairs; each frame is one
// IBV_WR_RDMA_WRITE_WITH_IMM into the receiver's registered staging ring,
// so the receiver's completion proves the data landed. Queue-pair numbers
// are exchanged over the link's TCP bootstrap connection.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/transport/transport.h"

namespace dmagather::server::transport {

// UNAVAILABLE with the reason when no RDMA device can be opened.
absl::StatusOr<std::unique_ptr<Transport>> MakeIbverbsTransport();

}  // namespace dmagather::server::transport
