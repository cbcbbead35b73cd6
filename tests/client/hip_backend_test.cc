// The hip client backend on the fake libamdhip64 (tests/common/hip), as the
// runtime of one ROCm major ($DMAGATHER_FAKE_HIP_VERSION, set per target in
// BUILD): a stream handle that is not a live HIP stream is
// INVALID_ARGUMENT before any HIP call uses it (ROCm 7.0 dereferences it in
// hipMemcpyAsync/hipEventRecord: the fake aborts there, so a missed check
// kills this test), and device memory is recognised with that major's
// hipMemoryTypeDevice.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "abi/completion_v1.h"
#include "client/backend.h"
#include "common/hip/hip_api.h"

namespace dmagather::client {
namespace {

class HipBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto api = ::dmagather::common::hip::Hip();
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *api;
    ASSERT_EQ(api_->abi.runtime_version, std::atoi(std::getenv("DMAGATHER_FAKE_HIP_VERSION")));
    block_ = static_cast<abi::CompletionV1*>(std::aligned_alloc(4096, 4096));
    std::memset(block_, 0, 4096);
    ClientBackendContext ctx;
    ctx.completion = block_;
    ctx.flag_bytes = 4096;
    ctx.device = 0;
    auto b = CreateClientBackend("hip", ctx);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = *std::move(b);
  }
  void TearDown() override {
    backend_.reset();
    std::free(block_);
  }

  const ::dmagather::common::hip::HipApi* api_ = nullptr;
  abi::CompletionV1* block_ = nullptr;
  std::unique_ptr<ClientBackend> backend_;
};

TEST_F(HipBackendTest, BadStreamIsInvalidArgumentBeforeAnyUse) {
  void* bogus = reinterpret_cast<void*>(uintptr_t{0xdead0});
  absl::Status st = backend_->CheckStream(bogus);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("is not a live HIP stream of this process"), std::string::npos) << st;
  // The call that checked it: 7.0's library has no hipStreamGetId and its
  // hipStreamGetFlags no longer checks.
  const auto& abi = api_->abi;
  const char* check = abi.major < 7 ? "hipStreamGetFlags" : abi.minor == 0 ? "hipStreamGetDevice" : "hipStreamGetId";
  EXPECT_NE(st.message().find(check), std::string::npos) << st;

  // Every call that hands a stream to HIP checks it (a wait may name
  // another stream than the submit did).
  EXPECT_EQ(backend_->WaitDoneOnStream(bogus, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->WriteReady(bogus, 1).code(), absl::StatusCode::kInvalidArgument);
  char src[4] = "abc", dst[4] = {};
  EXPECT_EQ(backend_->CopyAsync(dst, src, sizeof(src), bogus).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(block_->ready_seq, 0u);

  hipStream_t s = nullptr;
  ASSERT_EQ(api_->hipStreamCreateWithFlags(&s, hipStreamNonBlocking), hipSuccess);
  EXPECT_TRUE(backend_->CheckStream(s).ok()) << backend_->CheckStream(s);
  // The submit path on a live stream works (the fake runs it at once).
  EXPECT_TRUE(backend_->WriteReady(s, 7).ok());
  EXPECT_EQ(block_->ready_seq, 7u);
  ASSERT_EQ(api_->hipStreamDestroy(s), hipSuccess);
  // Destroyed: refused too.
  EXPECT_EQ(backend_->CheckStream(s).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(HipBackendTest, DefaultAndPerThreadStreamsAreValid) {
  EXPECT_TRUE(backend_->CheckStream(nullptr).ok());
  EXPECT_TRUE(backend_->CheckStream(reinterpret_cast<void*>(uintptr_t{2})).ok());  // hipStreamPerThread
}

TEST_F(HipBackendTest, DeviceMemoryIsRecognisedWithThisMajorsMemoryType) {
  auto buf = backend_->Allocate(4096);
  ASSERT_TRUE(buf.ok()) << buf.status();
  const MemoryExport& e = (*buf)->export_info();
  EXPECT_EQ(e.base, reinterpret_cast<uintptr_t>((*buf)->data()));
  EXPECT_EQ(e.handle.size(), sizeof(hipIpcMemHandle_t));
}

}  // namespace
}  // namespace dmagather::client
