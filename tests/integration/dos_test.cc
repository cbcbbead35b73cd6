// Denial of service by a local user, with a real daemon and a second uid
// (65534, when run as root): one user's connections or leaked tickets never
// keep another user's ranks out, and what a flood costs the daemon is
// bounded by that user's share.
#include <dirent.h>
#include <grp.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "abi/descriptor_v2.h"
#include "abi/fd_channel_v1.h"
#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "common/fd_exchange.h"
#include "common/memfd.h"
#include "dmagather/v1/control.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/integration/rank_checks.h"
#include "tests/integration/raw_control.h"

namespace dmagather::testing {
namespace {

namespace v1 = ::dmagather::v1;

bool BecomeNobody() { return geteuid() == 0 && setgroups(0, nullptr) == 0 && setgid(65534) == 0 && setuid(65534) == 0; }

int ConnectUnix(const std::string& path, int type) {
  int s = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size());
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(s);
    return -1;
  }
  return s;
}

// The first Join event, or the call's status.
grpc::Status TryJoin(const std::string& socket, const v1::JoinRequest& req) {
  auto stub = v1::Control::NewStub(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->Join(&ctx, req);
  v1::JoinEvent first;
  if (stream->Read(&first) && first.has_joined()) {
    ctx.TryCancel();
    stream->Finish();
    return grpc::Status::OK;
  }
  return stream->Finish();
}

struct Flood {
  std::atomic<int> opened{0};
  std::atomic<int> ready{0};
  std::atomic<int> release{0};
  std::atomic<int> was_nobody{0};
};

// A child that becomes uid 65534, opens `n` connections of `type` to `path`
// and holds them (whatever the daemon left open) until released.
RankProcess StartFlood(Flood* f, const std::string& path, int type, int n) {
  return RankProcess(0, [=](int, const Reporter& rep) {
    f->was_nobody.store(BecomeNobody() ? 1 : 0);
    std::vector<int> held;
    // A full backlog refuses a non-blocking connect: try again until the
    // daemon has accepted (and kept or closed) all n, or 20 s pass.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (static_cast<int>(held.size()) < n && std::chrono::steady_clock::now() < deadline) {
      const int s = ConnectUnix(path, type | SOCK_NONBLOCK);
      if (s >= 0) {
        held.push_back(s);
      } else {
        usleep(1000);
      }
    }
    f->opened.store(static_cast<int>(held.size()));
    f->ready.store(1);
    REQUIRE(WaitFor([&] { return f->release.load() != 0; }, 300), "never released");
    for (int s : held) close(s);
    return 0;
  });
}

TEST(DosTest, OneUsersSilentFdChannelConnectionsDoNotKeepAnotherUserOut) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as a second uid";
  // The flood stays for the whole test; every user may connect.
  auto daemon = DaemonProcess::Start({"--fd_timeout_ms=60000", "--socket_mode=0666"});
  ASSERT_NE(daemon, nullptr);
  ASSERT_EQ(chmod(daemon->dir().c_str(), 0755), 0);  // Let uid 65534 reach the sockets.
  const std::string fdsock = common::FdChannelPath(daemon->socket());
  const int base_fds = ProcFds(daemon->pid());
  Flood* f = SharedPage<Flood>();
  RankProcess flood = StartFlood(f, fdsock, SOCK_SEQPACKET, 300);
  ASSERT_TRUE(WaitFor([&] { return f->ready.load() != 0; }, 120));
  ASSERT_EQ(f->was_nobody.load(), 1);
  ASSERT_EQ(f->opened.load(), 300) << "the flood could not connect: nothing was tested";
  // The daemon keeps at most the flooder's share (32) of them.
  std::cerr << "uid 65534 holds " << f->opened.load() << " fd-channel connections; daemon fds " << base_fds << " -> "
            << ProcFds(daemon->pid()) << "\n";
  EXPECT_LE(ProcFds(daemon->pid()), base_fds + 32 + 8) << "open: " << f->opened.load();
  // Root's requests, one after another, all served (pings, and a few real
  // hand-overs: unclaimed tickets have a per-user limit of their own).
  int ok = 0;
  std::string first_error;
  for (int i = 0; i < 180; ++i) {
    auto buf = common::MemfdMapping::Create("test-buf", 4096);
    ASSERT_TRUE(buf.ok());
    auto t = i % 18 != 0 ? common::ExchangeFd(fdsock, abi::kFdPing, -1, 0)
                         : common::ExchangeFd(fdsock, abi::kFdBuffer, buf->fd(), 4096);
    if (t.ok()) {
      ++ok;
    } else if (first_error.empty()) {
      first_error = std::string(t.status().message());
    }
  }
  EXPECT_EQ(ok, 180) << first_error;
  // And a whole job of root's joins and runs, bit-exact, during the flood.
  ExpectJobBitExact(daemon->socket(), UniqueJob("dos-fd"), 2, 20);
  f->release.store(1);
  EXPECT_EQ(flood.Reap(60).exit_code, 0);
  FreeSharedPage(f);
}

TEST(DosTest, ControlSocketConnectionsAreBoundedPerUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as a second uid";
  auto daemon = DaemonProcess::Start({"--max_connections_per_uid=16", "--socket_mode=0666"});
  ASSERT_NE(daemon, nullptr);
  ASSERT_EQ(chmod(daemon->dir().c_str(), 0755), 0);
  ExpectJobBitExact(daemon->socket(), UniqueJob("dos-warm"), 2, 2);
  const int base_fds = ProcFds(daemon->pid());
  Flood* f = SharedPage<Flood>();
  RankProcess flood = StartFlood(f, daemon->socket(), SOCK_STREAM, 400);
  ASSERT_TRUE(WaitFor([&] { return f->ready.load() != 0; }, 120));
  ASSERT_EQ(f->was_nobody.load(), 1);
  ASSERT_EQ(f->opened.load(), 400) << "the flood could not connect: nothing was tested";
  // 400 connections asked for; the daemon holds the user's 16 (and gRPC's
  // own descriptors for them), not 400.
  const int during = ProcFds(daemon->pid());
  std::cerr << "uid 65534 holds " << f->opened.load() << " control connections; daemon fds " << base_fds << " -> "
            << during << "\n";
  EXPECT_LE(during, base_fds + 16 + 16) << "flood opened " << f->opened.load();
  // Another user (root) still joins and runs.
  ExpectJobBitExact(daemon->socket(), UniqueJob("dos-grpc"), 2, 20);
  f->release.store(1);
  EXPECT_EQ(flood.Reap(60).exit_code, 0);
  // The slots and descriptors come back once the flood has gone.
  EXPECT_TRUE(WaitFor([&] { return ProcFds(daemon->pid()) <= base_fds + 2; }, 30))
      << ProcFds(daemon->pid()) << " fds, baseline " << base_fds;
  FreeSharedPage(f);
}

struct TicketShare {
  char ticket[64] = {};
  std::atomic<int> handed{0};
  std::atomic<int> tried{0};
  std::atomic<int> was_nobody{0};
};

TEST(DosTest, ASegmentTicketIsGoodOnlyForTheProcessThatHandedItOver) {
  auto daemon = DaemonProcess::Start({"--socket_mode=0666"});
  ASSERT_NE(daemon, nullptr);
  ASSERT_EQ(chmod(daemon->dir().c_str(), 0755), 0);
  const std::string socket = daemon->socket();
  const std::string fdsock = common::FdChannelPath(socket);
  TicketShare* sh = SharedPage<TicketShare>();
  // The owner hands a segment over and leaves its ticket where a thief finds it.
  RankProcess owner(0, [&](int, const Reporter& rep) {
    common::MemfdMapping seg = MakeSegment(21);
    auto t = common::ExchangeFd(fdsock, abi::kFdSegment, seg.fd(), abi::SegmentLayoutV1::kBytes);
    REQUIRE(t.ok(), std::string(t.status().message()));
    memcpy(sh->ticket, t->ticket.data(), std::min(t->ticket.size(), sizeof(sh->ticket)));
    sh->handed.store(static_cast<int>(t->ticket.size()));
    REQUIRE(WaitFor([&] { return sh->tried.load() != 0; }, 120), "the thief never tried");
    // Spent by the thief's attempt: the owner must hand over again.
    grpc::Status spent = TryJoin(socket, JoinReq(UniqueJob("owner"), 1, 0, t->ticket, 21, getpid()));
    REQUIRE(spent.error_code() == grpc::StatusCode::NOT_FOUND, spent.error_message());
    auto again = common::ExchangeFd(fdsock, abi::kFdSegment, seg.fd(), abi::SegmentLayoutV1::kBytes);
    REQUIRE(again.ok(), std::string(again.status().message()));
    grpc::Status own = TryJoin(socket, JoinReq(UniqueJob("owner"), 1, 0, again->ticket, 21, getpid()));
    REQUIRE(own.ok(), own.error_message());
    return 0;
  });
  ASSERT_TRUE(WaitFor([&] { return sh->handed.load() != 0; }, 120));
  // The thief: another uid where the test can be one, else another process.
  RankProcess thief(1, [&](int, const Reporter& rep) {
    sh->was_nobody.store(BecomeNobody() ? 1 : 0);
    const std::string ticket(sh->ticket, sh->handed.load());
    grpc::Status s = TryJoin(socket, JoinReq(UniqueJob("thief"), 1, 0, ticket, 21, getpid()));
    sh->tried.store(1);
    REQUIRE(s.error_code() == grpc::StatusCode::PERMISSION_DENIED,
            absl::StrCat(int(s.error_code()), " ", s.error_message()));
    REQUIRE(s.error_message().find("only for the process that handed the memory over") != std::string::npos,
            s.error_message());
    return 0;
  });
  RankReport t = thief.Reap(120);
  RankReport o = owner.Reap(120);
  EXPECT_EQ(t.exit_code, 0) << t.message;
  EXPECT_EQ(o.exit_code, 0) << o.message;
  if (geteuid() == 0) EXPECT_EQ(sh->was_nobody.load(), 1);
  FreeSharedPage(sh);
}

TEST(DosTest, AnOversizedRequestIsRefusedAndTheSessionLives) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  const std::string socket = daemon->socket();
  auto reports = RunRanks(1, [&](int, const Reporter& rep) {
    auto stub = v1::Control::NewStub(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
    common::MemfdMapping seg = MakeSegment(31);
    auto t = common::ExchangeFd(common::FdChannelPath(socket), abi::kFdSegment, seg.fd(), abi::SegmentLayoutV1::kBytes);
    REQUIRE(t.ok(), std::string(t.status().message()));
    grpc::ClientContext jctx;
    auto join = stub->Join(&jctx, JoinReq(UniqueJob("big"), 1, 0, t->ticket, 31, getpid()));
    v1::JoinEvent first;
    REQUIRE(join->Read(&first) && first.has_joined(), "no join");
    // 5 MiB in one message: over gRPC's 4 MiB receive limit.
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    req.set_session_id(first.joined().session_id());
    req.set_session_secret(first.joined().session_secret());
    req.set_memory_kind("cuda_ipc");
    req.set_bytes(4096);
    req.set_handle(std::string(5 << 20, 'x'));
    v1::RegisterReply reply;
    grpc::Status s = stub->Register(&ctx, req, &reply);
    REQUIRE(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat(int(s.error_code()), " ", s.error_message()));
    // The session is still there: a normal call on it is answered as usual.
    grpc::ClientContext ctx2;
    v1::DeregisterRequest dreq;
    dreq.set_session_id(first.joined().session_id());
    dreq.set_session_secret(first.joined().session_secret());
    dreq.set_region_id(12345);
    v1::DeregisterReply dreply;
    grpc::Status d = stub->Deregister(&ctx2, dreq, &dreply);
    REQUIRE(d.error_code() != grpc::StatusCode::UNAVAILABLE && d.error_code() != grpc::StatusCode::CANCELLED,
            absl::StrCat("the session's connection went with the big message: ", int(d.error_code()), " ",
                         d.error_message()));
    REQUIRE(Contains(d.error_message(), "region") || d.ok(), d.error_message());
    jctx.TryCancel();
    join->Finish();
    return 0;
  });
  EXPECT_EQ(reports[0].exit_code, 0) << reports[0].message;
}

TEST(DosTest, AHostDaemonTakesNoDeviceMemoryHandOvers) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  // Any descriptor at all (here a pipe) as "device memory": refused at the door.
  auto t = common::ExchangeFd(common::FdChannelPath(daemon->socket()), abi::kFdDeviceMemory, p[0], 4096);
  close(p[0]);
  close(p[1]);
  ASSERT_FALSE(t.ok()) << "a device-memory ticket for a pipe";
  EXPECT_NE(t.status().message().find("takes no device-memory hand-overs"), std::string::npos) << t.status();
}

TEST(DosTest, DmagatherctlWithoutPermissionSaysSo) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as a second uid";
  auto daemon = DaemonProcess::Start({"--socket_mode=0660"});
  ASSERT_NE(daemon, nullptr);
  ASSERT_EQ(chmod(daemon->dir().c_str(), 0755), 0);
  const std::string socket = daemon->socket();
  // The build tree is root's: a copy the other uid can run.
  const std::string ctl = daemon->dir() + "/dmagatherctl";
  int cp_rc = -1;
  RunProgram({"/bin/cp", "tools/dmagatherctl", ctl}, &cp_rc);
  ASSERT_EQ(cp_rc, 0);
  ASSERT_EQ(chmod(ctl.c_str(), 0755), 0);
  auto reports = RunRanks(1, [&](int, const Reporter& rep) {
    REQUIRE(BecomeNobody(), "setuid 65534 failed");
    int rc = -1;
    const std::string out =
        RunProgram({"/bin/sh", "-c", "exec '" + ctl + "' --socket='" + socket + "' health 2>&1"}, &rc);
    REQUIRE(rc == 4, absl::StrCat("exit ", rc, ": ", out));
    REQUIRE(Contains(out, "permission denied") && Contains(out, "mode 660") && !Contains(out, "is dmagatherd running"),
            out);
    return 0;
  });
  EXPECT_EQ(reports[0].exit_code, 0) << reports[0].message;
}

}  // namespace
}  // namespace dmagather::testing
