// The client side of an fd-channel exchange against an in-process listener:
// a rank that requires the daemon's uid hands nothing to a listener of any
// other uid (the check comes before the request is sent), and reports the
// uid of the one it did hand over to.
#include "common/fd_exchange.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "abi/fd_channel_v1.h"
#include "common/memfd.h"

namespace dmagather::common {
namespace {

class FdExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/dmagather-fdx-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/d.sock.fd";
    listen_.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.c_str(), path_.size());
    ASSERT_EQ(bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(listen(listen_.get(), 4), 0);
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  // Accepts one connection; the bytes of the request it got (0: none).
  ssize_t ServeOne(bool reply) {
    UniqueFd c(accept(listen_.get(), nullptr, nullptr));
    abi::FdRequestV1 req{};
    const ssize_t n = recv(c.get(), &req, sizeof(req), 0);
    if (reply && n == ssize_t(sizeof(req))) {
      abi::FdReplyV1 r{};
      r.stamp = abi::kFdReplyStampV1;
      r.magic = abi::kMagic;
      send(c.get(), &r, sizeof(r), MSG_NOSIGNAL);
    }
    return n;
  }
  std::string dir_, path_;
  UniqueFd listen_;
};

TEST_F(FdExchangeTest, NothingIsHandedToAListenerOfAnotherUid) {
  ssize_t got = -1;
  std::thread server([&] { got = ServeOne(/*reply=*/false); });
  auto mem = MemfdMapping::Create("fdx-test", 4096);
  ASSERT_TRUE(mem.ok());
  auto r = ExchangeFd(path_, abi::kFdSegment, mem->fd(), 4096, 1000, int64_t(getuid()) + 1);
  server.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_NE(r.status().message().find("nothing handed over"), std::string::npos) << r.status();
  EXPECT_EQ(got, 0) << "the listener received a request";
}

TEST_F(FdExchangeTest, TheListenersUidIsReported) {
  ssize_t got = -1;
  std::thread server([&] { got = ServeOne(/*reply=*/true); });
  auto r = ExchangeFd(path_, abi::kFdPing, -1, 0, 1000, int64_t(getuid()));
  server.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(got, ssize_t(sizeof(abi::FdRequestV1)));
  EXPECT_EQ(r->daemon_uid, int64_t(getuid()));
}

}  // namespace
}  // namespace dmagather::common
