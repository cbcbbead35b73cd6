#include "server/daemon.h"

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <functional>

#include "absl/strings/str_cat.h"
#include "abi/ring_v1.h"
#include "dmagather/dmagather.h"
#include "common/status.h"
#include "server/ingress/ingress.h"
#include "server/service/control_service.h"
#include "server/service/registry.h"
#include "server/service/telemetry_service.h"

namespace dmagather::server {
namespace {

// True if something answers on the socket (another daemon is running).
bool SocketAlive(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool alive = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return alive;
}

std::string DoorbellName(const std::string& socket_path) {
  return absl::StrCat("/dmagather-doorbell-", absl::Hex(std::hash<std::string>()(socket_path)));
}

}  // namespace

const char* Daemon::Version() { return DMAGATHER_VERSION_STRING; }

Daemon::Daemon(const DaemonOptions& options) : options_(options) {}

Daemon::~Daemon() { Stop("daemon destroyed"); }

const char* Daemon::backend() const { return engine_->name(); }

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const DaemonOptions& options) {
  if (options.socket_path.empty() || options.socket_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", options.socket_path,
                                                   "' is empty or longer than ", sizeof(sockaddr_un{}.sun_path) - 1,
                                                   " bytes"));
  }
  auto d = std::unique_ptr<Daemon>(new Daemon(options));
  DMAG_ASSIGN_OR_RETURN(engines::CreatedEngine e, engines::CreateEngine(options.engine));
  d->engine_ = std::move(e.engine);
  d->engine_reason_ = std::move(e.reason);
  return d;
}

absl::Status Daemon::Start() {
  const std::string& path = options_.socket_path;
  if (SocketAlive(path)) {
    return absl::AlreadyExistsError(absl::StrCat("another dmagatherd already serves ", path));
  }
  unlink(path.c_str());  // A stale socket of a daemon that died.
  const std::string bell = DoorbellName(path);
  shm_unlink(bell.c_str());
  DMAG_ASSIGN_OR_RETURN(doorbell_, common::ShmMapping::Create(bell, sizeof(abi::DoorbellV1), 0666));
  auto* db = static_cast<abi::DoorbellV1*>(doorbell_.data());
  db->stamp = abi::kDoorbellStampV1;
  db->magic = abi::kMagic;

  registry_ = std::make_unique<service::Registry>(engine_.get());
  service::Registry* reg = registry_.get();
  ingress::Ingress::Options io;
  io.op_timeout = options_.op_timeout;
  ingress_ = std::make_unique<ingress::Ingress>(
      io, engine_.get(), db,
      ingress::Ingress::Hooks{[reg] { return reg->version(); }, [reg] { return reg->Snapshot(); }});
  ingress::Ingress* ing = ingress_.get();
  registry_->StartReaper([ing] { return ing->epoch(); });
  control_ = std::make_unique<service::ControlService>(reg, Version(), bell, engine_->name());
  started_ = absl::Now();
  telemetry_ = std::make_unique<service::TelemetryService>(reg, [this](v1::HealthReply* h) {
    h->set_version(Version());
    h->set_backend(engine_->name());
    h->set_backend_reason(engine_reason_);
    h->set_uptime_s(absl::ToDoubleSeconds(absl::Now() - started_));
    h->set_worker_threads(engine_->worker_threads());
  });

  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(control_.get());
  builder.RegisterService(telemetry_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) return absl::UnavailableError(absl::StrCat("cannot listen on unix:", path));
  if (chmod(path.c_str(), options_.socket_mode) != 0) {
    LOG(WARNING) << "chmod " << path << ": " << strerror(errno);
  }
  ingress_->Start();
  LOG(INFO) << "dmagatherd " << Version() << " serving on " << path << ", backend " << engine_->name() << " ("
            << engine_reason_ << "), " << engine_->worker_threads() << " worker threads";
  return absl::OkStatus();
}

void Daemon::Stop(const std::string& reason) {
  if (stopped_ || server_ == nullptr) return;
  stopped_ = true;
  LOG(INFO) << "stopping: " << reason;
  registry_->FailAll(absl::UnavailableError(absl::StrCat("dmagatherd is shutting down (", reason, ")")));
  absl::Time deadline = absl::Now() + options_.drain_timeout;
  while (registry_->total_ops_in_flight() != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  if (registry_->total_ops_in_flight() != 0) {
    LOG(WARNING) << registry_->total_ops_in_flight() << " op(s) still in flight after the drain timeout";
  }
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  registry_->StopReaper();
  ingress_->Stop();
  engine_->Stop();
  server_->Wait();
  unlink(options_.socket_path.c_str());
  doorbell_.Unlink();
  LOG(INFO) << "stopped";
}

}  // namespace dmagather::server
