// The client side of one fd-channel exchange (abi/fd_channel_v1.h): connect
// to `<socket>.fd`, send one request with at most one descriptor, read the
// reply (a ticket, and the doorbell descriptor for a segment). Used by the
// client library (Join, Register) and by the daemon's health self-check
// (kFdPing) and tests.
//
// Threads: any; blocking, bounded by `timeout_ms`.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/memfd.h"

namespace dmagather::common {

// Whether something accepts a connection on the Unix socket at `path` now
// (`type`: SOCK_STREAM for the control socket, SOCK_SEQPACKET for the fd
// channel). A socket file whose daemon died answers at once: refused.
bool UnixSocketAccepts(const std::string& path, int type = SOCK_STREAM);

// Where the fd channel of the daemon serving gRPC on `socket_path` listens.
std::string FdChannelPath(const std::string& socket_path);

struct FdExchangeResult {
  std::string ticket;  // kFdTicketBytesV1 bytes (empty for a ping).
  UniqueFd fd;         // The descriptor the daemon sent back (kFdSegment: its doorbell), or none.
  // Who listens on the channel, as the kernel says (SO_PEERCRED of the
  // connection); -1 where it cannot tell. A rank that comes back to a
  // restarted daemon checks it is the same user as the one it left.
  int64_t daemon_uid = -1;
};

// `fd` < 0 sends no descriptor. A refusal comes back as the daemon's status
// and sentence. `require_uid` >= 0: nothing is sent unless the process
// listening on the channel runs as that uid (PERMISSION_DENIED).
absl::StatusOr<FdExchangeResult> ExchangeFd(const std::string& channel_path, uint32_t kind, int fd, uint64_t bytes,
                                            int timeout_ms = 5000, int64_t require_uid = -1);
// The same with several descriptors in one request (kFdDeviceMemory).
absl::StatusOr<FdExchangeResult> ExchangeFds(const std::string& channel_path, uint32_t kind,
                                             const std::vector<int>& fds, uint64_t bytes, int timeout_ms = 5000,
                                             int64_t require_uid = -1);

}  // namespace dmagather::common
