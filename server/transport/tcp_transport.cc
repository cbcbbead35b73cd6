#include "server/transport/tcp_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dmagather::server::transport {
namespace {

using common::ErrnoStatus;

std::string AddressOf(const sockaddr* sa) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(sa, sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in), host, sizeof(host), port,
                  sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return sa->sa_family == AF_INET6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

void Tune(int fd, const TcpOptions& o) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  if (o.socket_buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &o.socket_buffer_bytes, sizeof(int));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &o.socket_buffer_bytes, sizeof(int));
  }
  const int64_t ms = absl::ToInt64Milliseconds(o.user_timeout);
  if (ms > 0) {
    unsigned int v = static_cast<unsigned int>(ms);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, sizeof(v));
    int idle = std::max(1, int(ms / 4000)), intvl = 1, cnt = std::max(1, int(ms / 1000));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  }
}

absl::StatusOr<addrinfo*> Resolve(const std::string& address, bool passive) {
  std::string host;
  int port = 0;
  DMAG_RETURN_IF_ERROR(SplitHostPort(address, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve '", address, "': ", gai_strerror(rc)));
  }
  return res;
}

class TcpConnection : public Connection {
 public:
  TcpConnection(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  ~TcpConnection() override { close(fd_); }

  absl::Status Send(const void* header, size_t header_len, const void* payload, size_t len) override {
    iovec iov[2] = {{const_cast<void*>(header), header_len}, {const_cast<void*>(payload), len}};
    int n_iov = len != 0 ? 2 : 1;
    iovec* cur = iov;
    while (n_iov > 0) {
      msghdr msg{};
      msg.msg_iov = cur;
      msg.msg_iovlen = n_iov;
      ssize_t k = sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (k < 0) {
        if (errno == EINTR) continue;
        return Failed("send", errno);
      }
      size_t left = static_cast<size_t>(k);
      while (n_iov > 0 && left >= cur->iov_len) {
        left -= cur->iov_len;
        ++cur;
        --n_iov;
      }
      if (n_iov > 0) {
        cur->iov_base = static_cast<char*>(cur->iov_base) + left;
        cur->iov_len -= left;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Recv(void* dst, size_t len) override {
    char* p = static_cast<char*>(dst);
    while (len > 0) {
      ssize_t k = recv(fd_, p, len, 0);
      if (k == 0) {
        return absl::UnavailableError(absl::StrCat("connection to ", peer_, " closed by the peer"));
      }
      if (k < 0) {
        if (errno == EINTR) continue;
        return Failed("recv", errno);
      }
      p += k;
      len -= static_cast<size_t>(k);
    }
    return absl::OkStatus();
  }

  void Shutdown() override {
    if (!shut_.exchange(true)) ::shutdown(fd_, SHUT_RDWR);
  }
  const std::string& peer() const override { return peer_; }
  int fd() const override { return fd_; }

 private:
  absl::Status Failed(const char* call, int err) const {
    if (shut_.load()) return absl::UnavailableError(absl::StrCat("connection to ", peer_, " was shut down"));
    return absl::UnavailableError(absl::StrCat(call, " to ", peer_, ": ", strerror(err)));
  }
  const int fd_;
  const std::string peer_;
  std::atomic<bool> shut_{false};
};

class TcpListener : public Listener {
 public:
  TcpListener(int fd, std::string address, TcpOptions options)
      : fd_(fd), address_(std::move(address)), options_(options) {}
  ~TcpListener() override { close(fd_); }

  absl::StatusOr<std::unique_ptr<Connection>> Accept() override {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t sl = sizeof(ss);
      int fd = accept4(fd_, reinterpret_cast<sockaddr*>(&ss), &sl, SOCK_CLOEXEC);
      if (fd >= 0) {
        Tune(fd, options_);
        return std::make_unique<TcpConnection>(fd, AddressOf(reinterpret_cast<sockaddr*>(&ss)));
      }
      if (shut_.load()) return absl::CancelledError("listener shut down");
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
        if (errno == EMFILE || errno == ENFILE) usleep(10000);
        continue;
      }
      return ErrnoStatus("accept");
    }
  }
  void Shutdown() override {
    if (!shut_.exchange(true)) ::shutdown(fd_, SHUT_RDWR);
  }
  const std::string& address() const override { return address_; }

 private:
  const int fd_;
  const std::string address_;
  const TcpOptions options_;
  std::atomic<bool> shut_{false};
};

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(const TcpOptions& o) : options_(o) {}
  const char* name() const override { return "tcp"; }

  absl::StatusOr<std::unique_ptr<Listener>> Listen(const std::string& address) override {
    DMAG_ASSIGN_OR_RETURN(addrinfo * res, Resolve(address, /*passive=*/true));
    absl::Status last = absl::InvalidArgumentError(absl::StrCat("no address for '", address, "'"));
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) {
        last = ErrnoStatus("socket");
        continue;
      }
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 256) != 0) {
        last = ErrnoStatus(absl::StrCat("listen on ", address).c_str());
        close(fd);
        continue;
      }
      sockaddr_storage ss{};
      socklen_t sl = sizeof(ss);
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl);
      freeaddrinfo(res);
      return std::unique_ptr<Listener>(new TcpListener(fd, AddressOf(reinterpret_cast<sockaddr*>(&ss)), options_));
    }
    freeaddrinfo(res);
    return last;
  }

  absl::StatusOr<std::unique_ptr<Connection>> Connect(const std::string& address, absl::Duration timeout) override {
    DMAG_ASSIGN_OR_RETURN(addrinfo * res, Resolve(address, /*passive=*/false));
    absl::Status last = absl::UnavailableError(absl::StrCat("no address for '", address, "'"));
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd < 0) {
        last = ErrnoStatus("socket");
        continue;
      }
      Tune(fd, options_);
      int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        rc = poll(&p, 1, static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout))));
        int err = 0;
        socklen_t el = sizeof(err);
        if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0) {
          rc = 0;
        } else {
          errno = rc == 0 ? ETIMEDOUT : (err != 0 ? err : errno);
          rc = -1;
        }
      }
      if (rc != 0) {
        last = absl::UnavailableError(absl::StrCat("connect to ", address, ": ", strerror(errno)));
        close(fd);
        continue;
      }
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      freeaddrinfo(res);
      return std::unique_ptr<Connection>(new TcpConnection(fd, address));
    }
    freeaddrinfo(res);
    return last;
  }

  absl::StatusOr<std::unique_ptr<Connection>> Upgrade(std::unique_ptr<Connection> bootstrap, bool) override {
    return bootstrap;
  }

 private:
  const TcpOptions options_;
};

}  // namespace

std::unique_ptr<Transport> MakeTcpTransport(const TcpOptions& options) {
  return std::make_unique<TcpTransport>(options);
}

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  size_t colon;
  if (!address.empty() && address[0] == '[') {
    size_t close_b = address.find(']');
    if (close_b == std::string::npos || close_b + 1 >= address.size() || address[close_b + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not [v6-address]:port"));
    }
    *host = address.substr(1, close_b - 1);
    colon = close_b + 1;
  } else {
    colon = address.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
    }
    *host = address.substr(0, colon);
  }
  if (!absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "': bad port"));
  }
  return absl::OkStatus();
}

}  // namespace dmagather::server::transport
