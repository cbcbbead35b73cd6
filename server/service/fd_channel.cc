#include "server/service/fd_channel.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "abi/device_memory_v1.h"
#include "abi/fd_channel_v1.h"
#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "server/service/fd_request.h"

namespace dmagather::server::service {
namespace {

constexpr int kMaxFdsPerMessage = abi::kMaxFdsPerRequestV1 + 4;  // Room to see (and close) a few extra descriptors.

}  // namespace

absl::StatusOr<std::unique_ptr<FdChannel>> FdChannel::Listen(const Options& options, TicketTable* tickets,
                                                             int doorbell_fd) {
  sockaddr_un addr{};
  if (options.path.empty() || options.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("fd channel path '", options.path, "' is empty or too long"));
  }
  auto ch = std::unique_ptr<FdChannel>(new FdChannel(options, tickets, doorbell_fd));
  ch->listen_.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!ch->listen_.valid()) return common::ErrnoStatus("socket(AF_UNIX, SOCK_SEQPACKET)");
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, options.path.c_str(), options.path.size());
  if (bind(ch->listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return common::ErrnoStatus(absl::StrCat("bind(", options.path, ")"));
  }
  if (chmod(options.path.c_str(), options.mode) != 0) {
    absl::Status s = common::ErrnoStatus(absl::StrCat("chmod(", options.path, ")"));
    unlink(options.path.c_str());
    return s;
  }
  if (listen(ch->listen_.get(), 128) != 0) {
    absl::Status s = common::ErrnoStatus(absl::StrCat("listen(", options.path, ")"));
    unlink(options.path.c_str());
    return s;
  }
  ch->wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!ch->wake_.valid()) {
    unlink(options.path.c_str());
    return common::ErrnoStatus("eventfd");
  }
  return ch;
}

FdChannel::~FdChannel() { Stop(); }

void FdChannel::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void FdChannel::Stop() {
  if (stop_.exchange(true)) return;
  if (wake_.valid()) {
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  conns_.clear();
  if (listen_.valid()) {
    listen_.reset();
    unlink(options_.path.c_str());
  }
}

void FdChannel::AcceptAll() {
  for (int i = 0; i < 64; ++i) {  // Bounded: connections already open get their turn.
    int fd = accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        LOG_EVERY_N(WARNING, 100) << "fd channel accept: " << strerror(errno);
      }
      return;
    }
    accepted_.fetch_add(1, std::memory_order_relaxed);
    Conn c;
    c.fd.reset(fd);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      continue;  // Closed here: the kernel has no credentials for it.
    }
    c.uid = cred.uid;
    c.gid = cred.gid;
    c.pid = cred.pid;
    Admit(std::move(c));
  }
}

void FdChannel::Admit(Conn c) {
  const FairShare::Decision d = share_.Decide(c.uid);
  if (d.verdict == FairShare::Verdict::kRefuse) {
    shed_.fetch_add(1, std::memory_order_relaxed);
    LOG_EVERY_N(WARNING, 1000) << "fd channel: connection of pid " << c.pid << " closed: " << d.why
                               << " (dmagatherd --fd_max_connections_per_uid)";
    return;  // c.fd closes here.
  }
  if (d.verdict == FairShare::Verdict::kEvict) {
    auto oldest = std::find_if(conns_.begin(), conns_.end(), [&](const Conn& o) { return o.uid == d.evict_uid; });
    share_.Remove(oldest->uid);
    conns_.erase(oldest);  // Closes it.
    shed_.fetch_add(1, std::memory_order_relaxed);
  }
  // Supplementary groups as the kernel has them for the peer (Linux 4.13+).
  gid_t groups[256];
  socklen_t glen = sizeof(groups);
  if (getsockopt(c.fd.get(), SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0) {
    c.groups.assign(groups, groups + glen / sizeof(gid_t));
  }
  c.deadline_ns = options_.clock->NowNs() + uint64_t(absl::ToInt64Nanoseconds(options_.timeout));
  share_.Add(c.uid);
  conns_.push_back(std::move(c));
}

void FdChannel::Reply(const Conn& c, const absl::Status& status, const std::string& ticket, int fd) {
  abi::FdReplyV1 r{};
  r.stamp = abi::kFdReplyStampV1;
  r.magic = abi::kMagic;
  r.status = static_cast<int32_t>(status.code());
  if (!status.ok()) {
    const size_t n = std::min(status.message().size(), sizeof(r.message) - 1);
    memcpy(r.message, status.message().data(), n);
  } else if (!ticket.empty()) {
    memcpy(r.ticket, ticket.data(), std::min(ticket.size(), sizeof(r.ticket)));
  }
  iovec iov{&r, sizeof(r)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = ctl;
    msg.msg_controllen = sizeof(ctl);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  }
  // Non-blocking: the socket's buffer is empty, so one small reply fits; a
  // peer that is gone just misses it.
  (void)!sendmsg(c.fd.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
}

bool FdChannel::Serve(Conn& c) {
  abi::FdRequestV1 req{};
  iovec iov{&req, sizeof(req)};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof(ctl);
  ssize_t n = recvmsg(c.fd.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  // Every descriptor that arrived is owned here and closed unless it becomes a ticket.
  std::vector<common::UniqueFd> fds;
  if (n >= 0) {
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        fds.emplace_back(fd);
      }
    }
  }
  if (n <= 0) return true;  // Closed by the peer, or an error: nothing to answer.
  auto refuse = [&](absl::Status s) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    Reply(c, s, "", -1);
    return true;
  };
  auto parsed = ParseFdRequest(&req, static_cast<size_t>(n), msg.msg_flags, fds.size());
  if (!parsed.ok()) return refuse(parsed.status());
  req = *parsed;
  if (req.kind == abi::kFdPing) {
    Reply(c, absl::OkStatus(), "", -1);
    return true;
  }
  // Every ticket carries who handed it over (from the kernel) and the kind.
  Handover h;
  h.kind = req.kind;
  h.uid = c.uid;
  h.gid = c.gid;
  h.pid = c.pid;
  if (req.kind == abi::kFdTelemetry) {
    // A ticket that only says who the caller is (for Telemetry.Stats/Metrics).
    h.groups = c.groups;
  } else if (req.kind == abi::kFdDeviceMemory) {
    if (!options_.device_memory) {
      return refuse(absl::FailedPreconditionError(
          "fd channel: this dmagatherd runs on host memory and takes no device-memory hand-overs"));
    }
    // Exported GPU allocations (not memfds): the engine checks them when it
    // imports them, for the session of this very process only.
    h.bytes = req.bytes;
    h.fds = std::move(fds);
  } else {
    absl::Status ok = common::CheckSealedMemfd(fds[0].get(), req.bytes);
    if (!ok.ok()) return refuse(common::Annotate(ok, "fd channel: "));
    h.bytes = req.bytes;
    h.fd = std::move(fds[0]);
  }
  auto ticket = tickets_->Issue(std::move(h));
  if (!ticket.ok()) return refuse(ticket.status());
  Reply(c, absl::OkStatus(), *ticket, req.kind == abi::kFdSegment ? doorbell_fd_ : -1);
  return true;
}

void FdChannel::Loop() {
  std::vector<pollfd> pfds;
  uint64_t next_expiry = options_.clock->NowNs();
  constexpr uint64_t kSweepNs = 250'000'000;
  while (!stop_.load(std::memory_order_acquire)) {
    const uint64_t now = options_.clock->NowNs();
    uint64_t wake_at = now + kSweepNs;
    for (const Conn& c : conns_) wake_at = std::min(wake_at, c.deadline_ns);
    pfds.clear();
    pfds.push_back({wake_.get(), POLLIN, 0});
    pfds.push_back({listen_.get(), POLLIN, 0});
    for (const Conn& c : conns_) pfds.push_back({c.fd.get(), POLLIN, 0});
    // Never more than a sweep: a FakeClock's time moves without waking poll.
    const int timeout_ms =
        static_cast<int>(std::min<uint64_t>(wake_at > now ? wake_at - now : 0, kSweepNs) / 1'000'000) + 1;
    int r = poll(pfds.data(), pfds.size(), timeout_ms);
    if (r < 0 && errno != EINTR) {
      LOG(ERROR) << "fd channel poll: " << strerror(errno);
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    if (stop_.load(std::memory_order_acquire)) break;
    // Connections first (their pollfd indices are valid only before accepting more).
    const uint64_t t = options_.clock->NowNs();
    size_t keep = 0;
    for (size_t i = 0; i < conns_.size(); ++i) {
      bool done = false;
      if (r > 0 && pfds[i + 2].revents != 0) done = Serve(conns_[i]);
      if (!done && conns_[i].deadline_ns <= t) done = true;  // Silent too long: closed.
      if (done) {
        share_.Remove(conns_[i].uid);
      } else {
        if (keep != i) conns_[keep] = std::move(conns_[i]);
        ++keep;
      }
    }
    conns_.resize(keep);  // Closes the finished ones.
    if (r > 0 && (pfds[1].revents & POLLIN) != 0) AcceptAll();
    if (t >= next_expiry) {
      tickets_->Expire();
      next_expiry = t + kSweepNs;
    }
  }
}

}  // namespace dmagather::server::service
