// The tcp transport: plain sockets, TCP_NODELAY, large socket buffers,
// keepalive and TCP_USER_TIMEOUT so a cut link fails within a bounded time.
#pragma once

#include <memory>
#include <string>

#include "server/transport/transport.h"

namespace dmagather::server::transport {

struct TcpOptions {
  int socket_buffer_bytes = 4 << 20;
  // Unacknowledged data older than this fails the connection (0: kernel default).
  absl::Duration user_timeout = absl::Seconds(20);
};

std::unique_ptr<Transport> MakeTcpTransport(const TcpOptions& options = TcpOptions{});

}  // namespace dmagather::server::transport
