#include "common/fd_exchange.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "abi/fd_channel_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace dmagather::common {

namespace {

// A connection to the fd channel at `path`, with send and receive timeouts.
absl::StatusOr<UniqueFd> ConnectFdChannel(const std::string& path, int timeout_ms) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("fd channel path '", path, "' is too long"));
  }
  UniqueFd s(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s.valid()) return ErrnoStatus("socket(AF_UNIX, SOCK_SEQPACKET)");
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size());
  if (connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM) {
      struct stat st;
      std::string who = stat(path.c_str(), &st) == 0
                            ? absl::StrCat(" (owner uid ", st.st_uid, ", gid ", st.st_gid, ", mode ",
                                           absl::StrFormat("%04o", st.st_mode & 07777), ")")
                            : "";
      return absl::PermissionDeniedError(absl::StrCat("permission denied connecting to dmagatherd's fd channel ", path,
                                                      who, ": this user may not use this daemon"));
    }
    return absl::UnavailableError(absl::StrCat("cannot connect to dmagatherd's fd channel ", path, ": ", strerror(err),
                                               " (is dmagatherd 0.3 or newer running?)"));
  }
  return s;
}

// Sends the request and the descriptors to hand over (SCM_RIGHTS).
absl::Status SendFdRequest(int sock, uint32_t kind, const std::vector<int>& fds, uint64_t bytes) {
  abi::FdRequestV1 req{};
  req.stamp = abi::kFdRequestStampV1;
  req.magic = abi::kMagic;
  req.kind = kind;
  req.bytes = bytes;
  iovec iov{&req, sizeof(req)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> ctl(fds.empty() ? 0 : CMSG_SPACE(sizeof(int) * fds.size()) + alignof(cmsghdr));
  if (!fds.empty()) {
    // Aligned start inside the buffer.
    char* at = ctl.data();
    at += (alignof(cmsghdr) - reinterpret_cast<uintptr_t>(at) % alignof(cmsghdr)) % alignof(cmsghdr);
    memset(at, 0, CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = at;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(req))) return ErrnoStatus("sendmsg to dmagatherd's fd channel");
  return absl::OkStatus();
}

// Reads the reply: its status, its ticket and at most one descriptor (any
// more are closed and make the reply malformed).
absl::StatusOr<FdExchangeResult> ReceiveFdReply(int sock, const std::string& path, uint32_t kind, int timeout_ms) {
  abi::FdReplyV1 reply{};
  iovec riov{&reply, sizeof(reply)};
  alignas(cmsghdr) char rctl[CMSG_SPACE(sizeof(int) * 4)];
  msghdr rmsg{};
  rmsg.msg_iov = &riov;
  rmsg.msg_iovlen = 1;
  rmsg.msg_control = rctl;
  rmsg.msg_controllen = sizeof(rctl);
  ssize_t n;
  do {
    n = recvmsg(sock, &rmsg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::DeadlineExceededError(
          absl::StrCat("dmagatherd's fd channel ", path, " did not answer within ", timeout_ms, " ms"));
    }
    return ErrnoStatus("recvmsg from dmagatherd's fd channel");
  }
  FdExchangeResult out;
  int extra = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&rmsg); c != nullptr; c = CMSG_NXTHDR(&rmsg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (!out.fd.valid()) {
        out.fd.reset(got);
      } else {
        close(got);
        ++extra;
      }
    }
  }
  if (n == 0)
    return absl::UnavailableError(absl::StrCat("dmagatherd's fd channel ", path, " closed without an answer"));
  if (n != static_cast<ssize_t>(sizeof(reply)) || (rmsg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 ||
      reply.stamp != abi::kFdReplyStampV1 || reply.magic != abi::kMagic || extra != 0) {
    return absl::InternalError(absl::StrCat("dmagatherd's fd channel ", path, " sent a malformed reply"));
  }
  if (reply.status != 0) {
    reply.message[sizeof(reply.message) - 1] = '\0';
    const int code = reply.status > 0 && reply.status <= 16 ? reply.status : int(absl::StatusCode::kUnknown);
    return absl::Status(static_cast<absl::StatusCode>(code), reply.message);
  }
  if (kind != abi::kFdPing) out.ticket.assign(reinterpret_cast<const char*>(reply.ticket), sizeof(reply.ticket));
  return out;
}

}  // namespace

std::string FdChannelPath(const std::string& socket_path) { return socket_path + ".fd"; }

bool UnixSocketAccepts(const std::string& path, int type) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  UniqueFd s(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!s.valid()) return false;
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size());
  return connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

absl::StatusOr<FdExchangeResult> ExchangeFd(const std::string& path, uint32_t kind, int fd, uint64_t bytes,
                                            int timeout_ms, int64_t require_uid) {
  std::vector<int> fds;
  if (fd >= 0) fds.push_back(fd);
  return ExchangeFds(path, kind, fds, bytes, timeout_ms, require_uid);
}

absl::StatusOr<FdExchangeResult> ExchangeFds(const std::string& path, uint32_t kind, const std::vector<int>& fds,
                                             uint64_t bytes, int timeout_ms, int64_t require_uid) {
  if (fds.size() > 253) return absl::InvalidArgumentError("more than 253 descriptors in one fd-channel message");
  DMAG_ASSIGN_OR_RETURN(UniqueFd s, ConnectFdChannel(path, timeout_ms));
  ucred cred{};
  socklen_t len = sizeof(cred);
  const bool known = getsockopt(s.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && len == sizeof(cred);
  if (require_uid >= 0 && (!known || int64_t(cred.uid) != require_uid)) {
    return absl::PermissionDeniedError(absl::StrCat("the process on ", path, " runs as uid ",
                                                    known ? std::to_string(cred.uid) : std::string("unknown"),
                                                    ", not uid ", require_uid, ": nothing handed over"));
  }
  DMAG_RETURN_IF_ERROR(SendFdRequest(s.get(), kind, fds, bytes));
  DMAG_ASSIGN_OR_RETURN(FdExchangeResult out, ReceiveFdReply(s.get(), path, kind, timeout_ms));
  if (known) out.daemon_uid = cred.uid;
  return out;
}

}  // namespace dmagather::common
