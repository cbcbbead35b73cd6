// FdChannel: the daemon's second Unix socket (`<socket>.fd`, SOCK_SEQPACKET,
// same mode as the gRPC socket), through which clients hand over file
// descriptors (abi/fd_channel_v1.h). gRPC 1.51 can neither pass descriptors
// nor tell who is calling; here the kernel says (SO_PEERCRED on accept).
//
// One thread serves every connection (poll, non-blocking accept and
// recvmsg): a connection gets one request, one reply, and is closed; one
// that says nothing within `timeout` is closed; at most `max_connections`
// are open at once and at most `max_connections_per_uid` per user (the peer's
// uid from SO_PEERCRED): a newcomer beyond its user's share is closed at
// once, and when the table is full it takes the oldest slot of the user
// holding the most (FairShare), so one user's silent connections never keep
// another user's hand-overs out; messages are
// fixed-size (an oversized one is truncated and refused) and carry at most
// one descriptor (extra ones are closed). A valid hand-over (a memfd sealed
// against shrinking, see common/memfd.h) becomes a ticket in the
// TicketTable; a segment's reply carries the daemon's doorbell descriptor.
//
// Threads: Start/Stop from the daemon's main thread; everything else on the
// channel's own thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/memfd.h"
#include "server/service/fair_share.h"
#include "server/service/ticket_table.h"

namespace dmagather::server::service {

class FdChannel {
 public:
  struct Options {
    std::string path;
    unsigned mode = 0660;
    absl::Duration timeout = absl::Seconds(2);
    int max_connections = 256;
    int max_connections_per_uid = 32;
    // Device-memory hand-overs (exported GPU allocations): only a GPU engine
    // imports them; a daemon on host memory refuses them at the door.
    bool device_memory = true;
    common::Clock* clock = &common::RealClock();  // Deadlines (tests pass a FakeClock).
  };
  // Binds and listens (an existing file at `path` must have been removed by
  // the caller). `doorbell_fd` stays owned by the caller.
  static absl::StatusOr<std::unique_ptr<FdChannel>> Listen(const Options& options, TicketTable* tickets,
                                                           int doorbell_fd);
  ~FdChannel();

  void Start();
  // Stops the thread, closes every connection and the socket, removes the path.
  void Stop();

  // Telemetry.
  uint64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  // Connections closed unheard: over their user's share, or evicted for another user.
  uint64_t shed() const { return shed_.load(std::memory_order_relaxed); }

 private:
  struct Conn {
    common::UniqueFd fd;
    uid_t uid = 0;
    gid_t gid = 0;
    pid_t pid = 0;
    std::vector<gid_t> groups;
    uint64_t deadline_ns = 0;
  };
  FdChannel(const Options& options, TicketTable* tickets, int doorbell_fd)
      : options_(options),
        tickets_(tickets),
        doorbell_fd_(doorbell_fd),
        share_(options.max_connections, options.max_connections_per_uid) {}
  void Loop();
  void AcceptAll();
  // Takes a new connection into the table, or closes it (FairShare).
  void Admit(Conn c);
  // Reads the request and answers it. False while nothing has arrived yet.
  bool Serve(Conn& c);
  void Reply(const Conn& c, const absl::Status& status, const std::string& ticket, int fd);

  const Options options_;
  TicketTable* const tickets_;
  const int doorbell_fd_;
  common::UniqueFd listen_;
  common::UniqueFd wake_;    // eventfd: Stop() wakes the thread.
  std::vector<Conn> conns_;  // Oldest first.
  FairShare share_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> shed_{0};
};

}  // namespace dmagather::server::service
