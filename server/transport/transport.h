// Transport: how one daemon moves bytes to another (the ring between nodes).
//
// A small table of operations in the spirit of NCCL's ncclNet_t, as a C++
// interface with one implementation per file:
//   tcp      (tcp_transport.cc)     real sockets; always available;
//   ibverbs  (ibverbs_transport.cc) RC queue pairs, RDMA write with
//                                   immediate; needs an RDMA device.
//
// Every daemon-to-daemon connection starts as a TCP connection (the peer
// listener, --peer_listen), which carries the authentication handshake and
// the bootstrap messages. A data link is then made by Upgrade(): tcp keeps
// the socket; ibverbs exchanges its queue-pair numbers over it and keeps it
// open to notice a peer that goes away.
//
// Frames: the ring sends a fixed-size header and a payload with one Send()
// and reads them back with Recv() calls of exactly those sizes, in order.
// Send returns once the payload buffer may be reused.
//
// Threads: Send and Recv of one Connection may run on two threads at once
// (one each); Shutdown from any thread, and it makes blocked calls fail.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dmagather::server::transport {

class Connection {
 public:
  virtual ~Connection() = default;
  // Sends `header` then `len` bytes of `payload` (may be null when len is 0).
  virtual absl::Status Send(const void* header, size_t header_len, const void* payload, size_t len) = 0;
  // Reads exactly `len` bytes.
  virtual absl::Status Recv(void* dst, size_t len) = 0;
  // Makes blocked and later Send/Recv fail (UNAVAILABLE). Idempotent.
  virtual void Shutdown() = 0;
  // "address:port" of the other end, for messages.
  virtual const std::string& peer() const = 0;
  // The socket (for poll() during bootstrap); -1 where there is none.
  virtual int fd() const = 0;
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Blocks until a connection arrives or Shutdown() is called (then
  // CANCELLED).
  virtual absl::StatusOr<std::unique_ptr<Connection>> Accept() = 0;
  virtual void Shutdown() = 0;
  // The bound "address:port" (the port filled in when 0 was asked for).
  virtual const std::string& address() const = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Bootstrap (TCP for every transport).
  virtual absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) = 0;
  virtual absl::StatusOr<std::unique_ptr<Connection>> Connect(const std::string& address, absl::Duration timeout) = 0;
  // Turns an authenticated bootstrap connection into a data link. Both ends
  // call it (`initiator`: the end that connected), in the same order for
  // each link. tcp: returns `bootstrap` itself.
  virtual absl::StatusOr<std::unique_ptr<Connection>> Upgrade(std::unique_ptr<Connection> bootstrap,
                                                              bool initiator) = 0;
};

// "tcp", "ibverbs" or "auto" (ibverbs when a device is usable, else tcp;
// *reason says why). Unknown names are INVALID_ARGUMENT; "ibverbs" without a
// device is UNAVAILABLE with the reason.
absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const std::string& name, std::string* reason);

// "host:port" / "[v6]:port" split; INVALID_ARGUMENT naming the text.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

}  // namespace dmagather::server::transport
