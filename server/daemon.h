// Daemon: wires the stages together and owns them: the engine, the registry
// of jobs and sessions, the ingress thread, the doorbell page (a sealed
// memfd, never named), the fd channel (`<socket>.fd`: descriptors and
// kernel credentials from clients) and the gRPC server on the Unix socket.
// main.cc parses flags and calls Create/Run.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/memfd.h"
#include "server/cluster/peer_service.h"
#include "server/engines/factory.h"

namespace grpc {
class Server;
}

namespace dmagather::v1 {
class HealthReply;
}  // namespace dmagather::v1

namespace dmagather::server {

namespace ingress {
class Ingress;
}
namespace service {
class Registry;
class ControlService;
class TelemetryService;
class FdChannel;
class ControlListener;
class TicketTable;
class MetricsHttpServer;
}  // namespace service

struct DaemonOptions {
  std::string socket_path;
  unsigned socket_mode = 0666;
  engines::EngineOptions engine;
  absl::Duration op_timeout = absl::Seconds(60);
  absl::Duration drain_timeout = absl::Seconds(10);
  // The fd channel: a connection that sends nothing is closed after this.
  absl::Duration fd_timeout = absl::Seconds(2);
  int fd_max_connections_per_uid = 32;
  // The control socket: connections open at once, in all and per uid.
  int max_connections = 1024;
  int max_connections_per_uid = 64;
  // How long a hand-over's ticket waits for its Join/Register.
  absl::Duration ticket_ttl = absl::Seconds(5);
  // Per-uid limits (jobs, sessions, regions, mapped host bytes; 0 = none).
  int max_jobs_per_uid = 64;
  int max_sessions_per_uid = 1024;
  int max_regions_per_uid = 16384;
  uint64_t max_mapped_bytes_per_uid = 0;
  // Members of this group (and root) see every job in telemetry; "" = root only.
  std::string operator_group;
  // Prometheus GET /metrics on this HOST:PORT; empty = none.
  std::string metrics_listen;
  // Multi-node jobs: the peer listener (peers.listen empty = none).
  cluster::PeerOptions peers;
  // Every decision on time (op timeouts, Join deadlines, ticket expiry, the
  // fd channel's silent connections, the drain on Stop, the peers' and
  // rings' deadlines and heartbeats) reads this clock.
  common::Clock* clock = &common::RealClock();
};

class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(const DaemonOptions& options);
  ~Daemon();

  // Cleans up what a daemon that died left on the socket path (when nothing
  // answers there), then starts serving; returns once both sockets accept
  // connections.
  absl::Status Start();
  // Graceful stop: new ops fail UNAVAILABLE, in-flight ops finish (up to
  // drain_timeout), clients are told, both sockets are removed.
  void Stop(const std::string& reason);

  const std::string& backend_reason() const { return engine_reason_; }
  const char* backend() const;
  static const char* Version();

 private:
  explicit Daemon(const DaemonOptions& options);
  // What a Join needs, tried for real: "" when fine, else the reason.
  std::string SelfCheck() const;
  // Start: refuses a socket another daemon serves, removes what a dead one
  // left, and creates the doorbell.
  absl::Status ClaimSocketsAndDoorbell(const std::string& path, const std::string& fd_path);
  // Start: the ticket table and the fd channel on `fd_path`, serving.
  absl::Status StartFdChannel(const std::string& fd_path);
  // The Health reply's fields (a Telemetry Health call's thread).
  void FillHealth(v1::HealthReply* h) const;
  // --metrics_listen: logs (and goes on without it) when it cannot listen.
  void StartMetricsHttp();

  DaemonOptions options_;
  std::unique_ptr<engines::CopyEngine> engine_;
  std::string engine_reason_;
  uint64_t stay_awake_ns_ = 0;  // --stay_awake_us as resolved for the engine.
  common::MemfdMapping doorbell_;
  std::unique_ptr<service::TicketTable> tickets_;
  std::unique_ptr<service::FdChannel> fd_channel_;
  std::unique_ptr<service::ControlListener> listener_;
  std::unique_ptr<service::Registry> registry_;
  std::unique_ptr<ingress::Ingress> ingress_;
  std::unique_ptr<service::ControlService> control_;
  std::unique_ptr<service::TelemetryService> telemetry_;
  std::unique_ptr<grpc::Server> server_;
  int64_t operator_gid_ = -1;
  std::unique_ptr<service::MetricsHttpServer> metrics_http_;
  std::unique_ptr<cluster::PeerService> peers_;
  absl::Time started_;
  bool stopped_ = false;
};

}  // namespace dmagather::server
