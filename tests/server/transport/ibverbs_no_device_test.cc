// The real libibverbs on a machine without an RDMA device (CI, dev
// machines): the ibverbs transport says why it is unavailable and
// --transport=auto falls back to tcp with that reason. Skipped where a
// device is usable.

#include <cstdio>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/transport/ibverbs_transport.h"
#include "server/transport/transport.h"

namespace dmagather::server::transport {
namespace {

using ::testing::HasSubstr;

class NoDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetIbverbsOptions(IbverbsOptions{});  // dmagatherd's defaults: the first device with an active port.
    auto t = MakeIbverbsTransport();
    if (t.ok()) GTEST_SKIP() << "an RDMA device is usable here";
    status_ = t.status();
  }
  absl::Status status_;
};

TEST_F(NoDeviceTest, IbverbsIsUnavailableWithTheReason) {
  EXPECT_EQ(status_.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status_.message()), HasSubstr("no RDMA device")) << status_;
  std::printf("MakeIbverbsTransport(): %s\n", status_.ToString().c_str());
}

TEST_F(NoDeviceTest, ExplicitIbverbsIsUnavailable) {
  std::string reason;
  auto t = CreateTransport("ibverbs", &reason);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("no RDMA device"));
}

TEST_F(NoDeviceTest, AutoFallsBackToTcpAndSaysWhy) {
  std::string reason;
  auto t = CreateTransport("auto", &reason);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_STREQ((*t)->name(), "tcp");
  EXPECT_THAT(reason, HasSubstr("ibverbs unavailable"));
  EXPECT_THAT(reason, HasSubstr("no RDMA device"));
  EXPECT_THAT(reason, HasSubstr("using tcp"));
}

}  // namespace
}  // namespace dmagather::server::transport
