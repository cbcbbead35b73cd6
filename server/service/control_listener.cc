#include "server/service/control_listener.h"

#include <glog/logging.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dmagather::server::service {

absl::StatusOr<std::unique_ptr<ControlListener>> ControlListener::Listen(const Options& options) {
  sockaddr_un addr{};
  if (options.path.empty() || options.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", options.path, "' is empty or too long"));
  }
  auto l = std::unique_ptr<ControlListener>(new ControlListener(options));
  l->listen_.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!l->listen_.valid()) return common::ErrnoStatus("socket(AF_UNIX, SOCK_STREAM)");
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, options.path.c_str(), options.path.size());
  if (bind(l->listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return common::ErrnoStatus(absl::StrCat("bind(", options.path, ")"));
  }
  absl::Status s;
  if (chmod(options.path.c_str(), options.mode) != 0) {
    s = common::ErrnoStatus(absl::StrCat("chmod(", options.path, ")"));
  } else if (listen(l->listen_.get(), 128) != 0) {
    s = common::ErrnoStatus(absl::StrCat("listen(", options.path, ")"));
  } else {
    l->wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!l->wake_.valid()) s = common::ErrnoStatus("eventfd");
  }
  if (!s.ok()) {
    unlink(options.path.c_str());
    return s;
  }
  return l;
}

ControlListener::~ControlListener() { Stop(); }

void ControlListener::Start(grpc::Server* server) {
  server_ = server;
  thread_ = std::thread([this] { Loop(); });
}

void ControlListener::Stop() {
  if (stop_.exchange(true)) return;
  if (wake_.valid()) {
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  if (listen_.valid()) {
    listen_.reset();
    unlink(options_.path.c_str());
  }
}

int ControlListener::open_connections() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(conns_.size());
}

bool ControlListener::StillOpen(int fd, const Conn& c) const {
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_dev == c.dev && st.st_ino == c.ino;
}

std::optional<PeerCred> ControlListener::PeerOf(const std::string& grpc_peer) const {
  int fd = -1;
  if (!absl::StartsWith(grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer.substr(3), &fd)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = conns_.find(fd);
  if (it == conns_.end() || !StillOpen(fd, it->second)) return std::nullopt;
  return it->second.cred;
}

void ControlListener::Sweep() {
  absl::MutexLock lock(&mu_);
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (StillOpen(it->first, it->second)) {
      ++it;
    } else {
      share_.Remove(it->second.cred.uid);
      it = conns_.erase(it);
    }
  }
}

void ControlListener::AcceptAll() {
  for (int i = 0; i < 64; ++i) {  // Bounded: the sweep and Stop get their turn.
    int fd = accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        LOG_EVERY_N(WARNING, 100) << "control socket accept: " << strerror(errno);
      }
      return;
    }
    common::UniqueFd owned(fd);
    ucred cred{};
    socklen_t len = sizeof(cred);
    struct stat st;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || fstat(fd, &st) != 0) continue;
    accepted_.fetch_add(1, std::memory_order_relaxed);
    {
      absl::MutexLock lock(&mu_);
      // A number gRPC closed since the last sweep may come back now: its old entry goes.
      if (auto old = conns_.find(fd); old != conns_.end()) {
        share_.Remove(old->second.cred.uid);
        conns_.erase(old);
      }
      FairShare::Decision d = share_.Decide(cred.uid);
      if (d.verdict == FairShare::Verdict::kEvict) {
        // Connections live in gRPC, which cannot be asked to close one: stale
        // entries of that user are swept first, and if it still holds the
        // most, the newcomer is shed rather than an open one torn down.
        d.verdict = FairShare::Verdict::kRefuse;
        d.why = absl::StrCat("all ", options_.max_connections, " control connections are taken");
      }
      if (d.verdict == FairShare::Verdict::kRefuse) {
        shed_.fetch_add(1, std::memory_order_relaxed);
        LOG_EVERY_N(WARNING, 1000) << "control socket: connection of pid " << cred.pid << " (uid " << cred.uid
                                   << ") closed: " << d.why << " (dmagatherd --max_connections_per_uid)";
        continue;
      }
      share_.Add(cred.uid);
      conns_[fd] = Conn{PeerCred{cred.uid, cred.gid, cred.pid}, st.st_dev, st.st_ino};
    }
    grpc::AddInsecureChannelFromFd(server_, owned.release());
  }
}

void ControlListener::Loop() {
  while (!stop_.load(std::memory_order_acquire)) {
    pollfd p[2] = {{wake_.get(), POLLIN, 0}, {listen_.get(), POLLIN, 0}};
    const int r = poll(p, 2, 250);
    if (stop_.load(std::memory_order_acquire)) break;
    if (r < 0 && errno != EINTR) {
      LOG(ERROR) << "control socket poll: " << strerror(errno);
      usleep(10000);
      continue;
    }
    Sweep();
    if (r > 0 && (p[1].revents & POLLIN) != 0) AcceptAll();
  }
}

}  // namespace dmagather::server::service
