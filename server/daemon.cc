#include "server/daemon.h"

#include <glog/logging.h>
#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <functional>

#include "abi/fd_channel_v1.h"
#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "common/fd_exchange.h"
#include "common/status.h"
#include "dmagather/dmagather.h"
#include "server/ingress/ingress.h"
#include "server/service/control_listener.h"
#include "server/service/control_service.h"
#include "server/service/fd_channel.h"
#include "server/service/metrics.h"
#include "server/service/metrics_http.h"
#include "server/service/registry.h"
#include "server/service/telemetry_service.h"
#include "server/service/ticket_table.h"

namespace dmagather::server {
namespace {

// The /dev/shm name under which daemons before 0.3 kept their doorbell (only
// to remove what such a daemon left behind; nothing is named there now).
std::string LegacyDoorbellName(const std::string& socket_path) {
  return absl::StrCat("/dmagather-doorbell-", absl::Hex(std::hash<std::string>()(socket_path)));
}

}  // namespace

const char* Daemon::Version() { return DMAGATHER_VERSION_STRING; }

Daemon::Daemon(const DaemonOptions& options) : options_(options) {}

Daemon::~Daemon() { Stop("daemon destroyed"); }

const char* Daemon::backend() const { return engine_->name(); }

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const DaemonOptions& options) {
  const size_t fd_suffix = common::FdChannelPath("").size();
  if (options.socket_path.empty() || options.socket_path.size() + fd_suffix >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", options.socket_path, "' is empty or longer than ",
                                                   sizeof(sockaddr_un{}.sun_path) - 1 - fd_suffix,
                                                   " bytes (the fd channel adds '", common::FdChannelPath(""), "')"));
  }
  auto d = std::unique_ptr<Daemon>(new Daemon(options));
  if (!options.operator_group.empty()) {
    group gr, *found = nullptr;
    std::vector<char> buf(16384);
    if (getgrnam_r(options.operator_group.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--operator_group: no group '", options.operator_group, "' on this system"));
    }
    d->operator_gid_ = found->gr_gid;
  }
  DMAG_ASSIGN_OR_RETURN(engines::CreatedEngine e, engines::CreateEngine(options.engine));
  d->engine_ = std::move(e.engine);
  d->engine_reason_ = std::move(e.reason);
  d->stay_awake_ns_ = e.stay_awake_ns;
  return d;
}

absl::Status Daemon::ClaimSocketsAndDoorbell(const std::string& path, const std::string& fd_path) {
  if (common::UnixSocketAccepts(path) || common::UnixSocketAccepts(fd_path, SOCK_SEQPACKET)) {
    return absl::AlreadyExistsError(absl::StrCat("another dmagatherd already serves ", path));
  }
  // What a daemon that died (SIGKILL, crash) left behind: its socket files,
  // and a doorbell in /dev/shm from a daemon before 0.3.
  for (const std::string& p : {path, fd_path}) {
    if (unlink(p.c_str()) == 0) LOG(INFO) << "removed the stale socket " << p << " of a daemon that is gone";
  }
  if (shm_unlink(LegacyDoorbellName(path).c_str()) == 0) {
    LOG(INFO) << "removed /dev/shm" << LegacyDoorbellName(path) << " left by an older dmagatherd";
  }
  // The doorbell: a sealed memfd that every client maps, handed over with
  // each segment ticket. Sealed (shrink, grow, seal) so no client can make
  // the daemon's or another client's access to it fault.
  DMAG_ASSIGN_OR_RETURN(doorbell_, common::MemfdMapping::Create("dmagather-doorbell", sizeof(abi::DoorbellV1)));
  auto* db = static_cast<abi::DoorbellV1*>(doorbell_.data());
  db->stamp = abi::kDoorbellStampV1;
  db->magic = abi::kMagic;
  return absl::OkStatus();
}

void Daemon::FillHealth(v1::HealthReply* h) const {
  h->set_version(Version());
  h->set_backend(engine_->name());
  h->set_backend_reason(engine_reason_);
  for (const std::string& b : engines::BuiltBackends()) h->add_built_backends(b);
  h->set_uptime_s(absl::ToDoubleSeconds(options_.clock->Now() - started_));
  h->set_worker_threads(engine_->worker_threads());
  if (peers_ != nullptr) {
    const cluster::PeerStats ps = peers_->stats();
    h->set_peer_address(ps.address);
    h->set_transport(ps.transport);
    h->set_transport_reason(ps.transport_reason);
    h->set_peer_auth_failures(ps.auth_failures);
    h->set_transport_fallbacks(options_.peers.transport == "auto" && ps.transport == "tcp" ? 1 : 0);
  }
  const std::string why = SelfCheck();
  if (!why.empty()) {
    h->set_status("NOT_SERVING");
    h->set_reason(why);
  }
}

absl::Status Daemon::StartFdChannel(const std::string& fd_path) {
  service::TicketTable::Options to;
  to.ttl = options_.ticket_ttl;
  to.clock = options_.clock;
  tickets_ = std::make_unique<service::TicketTable>(to);
  service::FdChannel::Options fo;
  fo.path = fd_path;
  fo.mode = options_.socket_mode;
  fo.timeout = options_.fd_timeout;
  fo.clock = options_.clock;
  fo.max_connections_per_uid = options_.fd_max_connections_per_uid;
  fo.device_memory = !engine_->host_addressable();
  DMAG_ASSIGN_OR_RETURN(fd_channel_, service::FdChannel::Listen(fo, tickets_.get(), doorbell_.fd()));
  fd_channel_->Start();
  return absl::OkStatus();
}

absl::Status Daemon::Start() {
  const std::string& path = options_.socket_path;
  const std::string fd_path = common::FdChannelPath(path);
  DMAG_RETURN_IF_ERROR(ClaimSocketsAndDoorbell(path, fd_path));
  auto* db = static_cast<abi::DoorbellV1*>(doorbell_.data());
  DMAG_RETURN_IF_ERROR(StartFdChannel(fd_path));

  service::Limits limits;
  limits.max_jobs_per_uid = options_.max_jobs_per_uid;
  limits.max_sessions_per_uid = options_.max_sessions_per_uid;
  limits.max_regions_per_uid = options_.max_regions_per_uid;
  limits.max_mapped_bytes_per_uid = options_.max_mapped_bytes_per_uid;
  registry_ = std::make_unique<service::Registry>(engine_.get(), tickets_.get(), limits, options_.clock);
  struct stat bell_st;
  if (fstat(doorbell_.fd(), &bell_st) == 0) registry_->SetDoorbellIdentity(bell_st.st_dev, bell_st.st_ino);
  service::Registry* reg = registry_.get();
  if (!options_.peers.listen.empty()) {
    cluster::PeerOptions po = options_.peers;
    po.clock = options_.clock;
    auto peers = cluster::PeerService::Create(po, engine_.get());
    if (!peers.ok()) {
      fd_channel_->Stop();
      return common::Annotate(peers.status(), "--peer_listen: ");
    }
    peers_ = *std::move(peers);
    registry_->SetPeers(peers_.get());
  }
  ingress::Ingress::Options io;
  io.op_timeout = options_.op_timeout;
  io.stay_awake_ns = stay_awake_ns_;
  io.clock = options_.clock;
  ingress_ = std::make_unique<ingress::Ingress>(
      io, engine_.get(), db,
      ingress::Ingress::Hooks{[reg] { return reg->version(); }, [reg] { return reg->Snapshot(); }});
  ingress::Ingress* ing = ingress_.get();
  registry_->SetIngressSleeps([ing] { return ing->sleeps(); });
  registry_->StartReaper([ing] { return ing->epoch(); }, [ing] { ing->Kick(); });
  // The listener (below) exists before the first call can come in.
  control_ = std::make_unique<service::ControlService>(
      reg, Version(), engine_->name(), [this](const std::string& peer) { return listener_->PeerOf(peer); },
      options_.clock);
  started_ = options_.clock->Now();
  telemetry_ = std::make_unique<service::TelemetryService>(reg, tickets_.get(), operator_gid_,
                                                           [this](v1::HealthReply* h) { FillHealth(h); });

  // No listening port of gRPC's own: the listener accepts (and knows who
  // connected), then hands each connection to the server.
  grpc::ServerBuilder builder;
  builder.RegisterService(control_.get());
  builder.RegisterService(telemetry_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    fd_channel_->Stop();
    return absl::UnavailableError(absl::StrCat("cannot start the gRPC server for unix:", path));
  }
  // The control socket is bound last, once everything behind it serves: a
  // rank that finds it accepting (one coming back after a restart polls it)
  // is answered at once.
  service::ControlListener::Options lo;
  lo.path = path;
  lo.mode = options_.socket_mode;
  lo.max_connections = options_.max_connections;
  lo.max_connections_per_uid = options_.max_connections_per_uid;
  auto listener = service::ControlListener::Listen(lo);
  if (!listener.ok()) {
    server_->Shutdown();
    server_.reset();
    fd_channel_->Stop();
    return listener.status();
  }
  listener_ = *std::move(listener);
  listener_->Start(server_.get());
  ingress_->Start();
  StartMetricsHttp();
  LOG(INFO) << "dmagatherd " << Version() << " serving on " << path << " (fd channel " << fd_path << "), backend "
            << engine_->name() << " (" << engine_reason_ << "), " << engine_->worker_threads() << " worker threads";
  return absl::OkStatus();
}

void Daemon::Stop(const std::string& reason) {
  if (stopped_ || server_ == nullptr) return;
  stopped_ = true;
  LOG(INFO) << "stopping: " << reason;
  if (metrics_http_ != nullptr) metrics_http_->Stop();
  // Every stop hands the jobs to the next daemon (docs/ARCHITECTURE.md,
  // "Daemon restarts"): no new Join, no op started from now on, the ops on
  // the engine finish and publish done, and the ranks' rings keep the rest
  // for the daemon that takes the jobs back. No rank's op is failed here.
  registry_->FreezeForHandover();
  ingress_->Stop();
  const absl::Time deadline = options_.clock->Now() + options_.drain_timeout;
  while (registry_->total_ops_running() != 0 && options_.clock->Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (registry_->total_ops_running() != 0) {
    LOG(WARNING) << registry_->total_ops_running() << " op(s) still running after the drain timeout";
  }
  control_->Wake();                       // Open Joins get their Shutdown event now.
  if (peers_ != nullptr) peers_->Stop();  // Bootstraps end; multi-node jobs end (not taken back yet).
  listener_->Stop();                      // No new connections; removes the socket.
  // Each open Join gets its Shutdown event or its refusal from the watcher
  // (a few ms); then the server stops at once: anything still open is
  // cancelled, which a rank takes as the daemon gone, as it would the
  // event. (Waiting out a deadline here was the whole of a planned
  // restart's gap: docs/perf/restart-gap-1206.)
  const absl::Time joins_done = options_.clock->Now() + absl::Milliseconds(100);
  while (control_->open_joins() != 0 && options_.clock->Now() < joins_done) absl::SleepFor(absl::Milliseconds(1));
  server_->Shutdown(common::GrpcDeadlineIn(absl::ZeroDuration()));
  registry_->StopReaper();
  ingress_->Stop();
  engine_->Stop();
  server_->Wait();
  control_->Stop();     // Every Join has finished (Wait returned): the watcher can go.
  fd_channel_->Stop();  // Removes <socket>.fd.
  unlink(options_.socket_path.c_str());
  LOG(INFO) << "stopped";
}

void Daemon::StartMetricsHttp() {
  if (options_.metrics_listen.empty()) return;
  // The text `dmagatherctl metrics` prints (Telemetry.Metrics), every job.
  auto m = service::MetricsHttpServer::Start(options_.metrics_listen, [this] {
    v1::HealthReply health;
    telemetry_->Health(nullptr, nullptr, &health);
    v1::StatsReply stats;
    registry_->FillStats("", &stats);
    return service::RenderPrometheus(health, stats);
  });
  if (!m.ok()) {
    // Not fatal: any local user could hold the port before the daemon
    // starts, and that must not stop the node's AllGathers.
    LOG(ERROR) << m.status().message() << "; serving without the HTTP metrics endpoint";
    return;
  }
  metrics_http_ = *std::move(m);
  LOG(INFO) << "Prometheus metrics on http://" << metrics_http_->address() << "/metrics";
}

std::string Daemon::SelfCheck() const {
  // The doorbell every Join hands out: still mapped and intact.
  const auto* db = static_cast<const abi::DoorbellV1*>(doorbell_.data());
  if (db == nullptr || db->stamp != abi::kDoorbellStampV1 || db->magic != abi::kMagic || doorbell_.fd() < 0) {
    return "the doorbell page is not usable";
  }
  // The fd channel, as a client reaches it: by its path, for real.
  auto ping = common::ExchangeFd(common::FdChannelPath(options_.socket_path), abi::kFdPing, -1, 0, 1000);
  if (!ping.ok()) {
    return absl::StrCat("the fd channel does not work, so no rank can join: ", ping.status().message());
  }
  return "";
}

}  // namespace dmagather::server
