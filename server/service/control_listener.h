// ControlListener: accepts the control socket's connections itself, so the
// daemon knows who is on the other end of every gRPC call. gRPC 1.51 cannot
// tell a Unix-socket caller's uid; the kernel can (SO_PEERCRED at accept).
// Each admitted connection is handed to the gRPC server
// (grpc::AddInsecureChannelFromFd), whose calls then name it as "fd:<n>";
// PeerOf(context->peer()) gives back the uid and pid the kernel reported.
//
// Limits: at most `max_connections` open and `max_connections_per_uid` per
// user (FairShare: a user's flood is shed, never another user's
// connections); a connection gRPC has closed is noticed by the sweep (its
// descriptor number no longer names the same socket) and its slot returns.
//
// Threads: Listen/Start/Stop from the daemon's main thread; accept and sweep
// on the listener's own thread; PeerOf from any gRPC thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/memfd.h"
#include "server/service/fair_share.h"
#include "server/service/peer_cred.h"

namespace grpc {
class Server;
}

namespace dmagather::server::service {

class ControlListener {
 public:
  struct Options {
    std::string path;
    unsigned mode = 0660;
    int max_connections = 1024;
    int max_connections_per_uid = 64;
  };
  // Binds and listens (a stale file at `path` must have been removed).
  static absl::StatusOr<std::unique_ptr<ControlListener>> Listen(const Options& options);
  ~ControlListener();

  // Starts accepting into `server` (started, with no listening port of its own).
  void Start(grpc::Server* server);
  // Stops accepting, removes the path. Connections already handed to gRPC
  // end with the server's shutdown.
  void Stop();

  // The caller of a gRPC call, from ServerContext::peer(); nullopt for a
  // peer this listener did not admit (or one already gone).
  std::optional<PeerCred> PeerOf(const std::string& grpc_peer) const;

  uint64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  uint64_t shed() const { return shed_.load(std::memory_order_relaxed); }
  int open_connections() const;

 private:
  struct Conn {
    PeerCred cred;
    dev_t dev = 0;
    ino_t ino = 0;
  };
  explicit ControlListener(const Options& options)
      : options_(options), share_(options.max_connections, options.max_connections_per_uid) {}
  void Loop();
  void AcceptAll();
  // Forgets connections whose descriptor gRPC has closed.
  void Sweep();
  bool StillOpen(int fd, const Conn& c) const;

  const Options options_;
  common::UniqueFd listen_;
  common::UniqueFd wake_;
  grpc::Server* server_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> shed_{0};
  mutable absl::Mutex mu_;
  std::map<int, Conn> conns_ ABSL_GUARDED_BY(mu_);  // By descriptor number (gRPC's "fd:<n>").
  FairShare share_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dmagather::server::service
