// The control channel's conversions that need no daemon: gRPC statuses
// (FALLBACK kept) and where the socket is.
#include "client/control_channel.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "common/status.h"
#include "dmagather/dmagather.h"

namespace dmagather::client {
namespace {

TEST(ControlChannelTest, GrpcStatusesKeepTheirCodeAndTheFallbackMark) {
  EXPECT_TRUE(FromGrpc(grpc::Status::OK, "join").ok());
  absl::Status fallback =
      FromGrpc(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "backend differs", "dmagather.fallback"), "join");
  EXPECT_TRUE(common::IsFallback(fallback)) << fallback;
  EXPECT_EQ(fallback.message(), "join: backend differs");
  absl::Status plain = FromGrpc(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no peers"), "join");
  EXPECT_FALSE(common::IsFallback(plain));
  EXPECT_EQ(plain.code(), absl::StatusCode::kFailedPrecondition);
  absl::Status quota = FromGrpc(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "limit"), "register");
  EXPECT_EQ(quota.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(quota.message(), "register: limit");
}

TEST(ControlChannelTest, TheSocketIsTheOptionThenTheEnvironmentThenTheDefault) {
  ASSERT_EQ(unsetenv("DMAGATHER_SOCKET"), 0);
  EXPECT_EQ(ResolveSocket(""), DMAGATHER_DEFAULT_SOCKET);
  ASSERT_EQ(setenv("DMAGATHER_SOCKET", "/tmp/env.sock", 1), 0);
  EXPECT_EQ(ResolveSocket(""), "/tmp/env.sock");
  EXPECT_EQ(ResolveSocket("/tmp/explicit.sock"), "/tmp/explicit.sock");
  ASSERT_EQ(setenv("DMAGATHER_SOCKET", "", 1), 0);
  EXPECT_EQ(ResolveSocket(""), DMAGATHER_DEFAULT_SOCKET) << "empty means unset";
}

TEST(ControlChannelTest, NoDaemonNoJobId) {
  auto id = CreateJobId("/nonexistent/dmagather.sock");
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(id.status().message().find("/nonexistent/dmagather.sock"), std::string::npos) << id.status();
}

}  // namespace
}  // namespace dmagather::client
