// The hip client backend on the fake libamdhip64 (tests/common/hip), as the
// runtime of one ROCm major ($DMAGATHER_FAKE_HIP_VERSION, set per target in
// BUILD): a stream handle that is not a live HIP stream is
// INVALID_ARGUMENT before any HIP call uses it (ROCm 7.0 dereferences it in
// hipMemcpyAsync/hipEventRecord: the fake aborts there, so a missed check
// kills this test), and device memory is recognised with that major's
// hipMemoryTypeDevice.
#include <dlfcn.h>
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
  const OwnShardCopy copy{dst, src, sizeof(src)};
  EXPECT_EQ(backend_->CopyOwnShards(&copy, 1, bogus, false).code(), absl::StatusCode::kInvalidArgument);
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

// The own shards of an op: device memory with this major's device-to-device
// kind (hipMemcpyDeviceToDeviceNoCU, 1024, from 6.1: SDMA rather than a blit
// kernel), a send in host memory with hipMemcpyDefault; bytes checked.
TEST_F(HipBackendTest, OwnShardsOfDeviceMemoryUseThisMajorsEngineCopyKind) {
  auto out = backend_->Allocate(4096);
  auto in = backend_->Allocate(2048);
  ASSERT_TRUE(out.ok() && in.ok());
  char* o = static_cast<char*>((*out)->data());
  char* i = static_cast<char*>((*in)->data());
  for (int k = 0; k < 2048; ++k) i[k] = static_cast<char>(k * 7 + 1);  // The fake's memory is host memory.
  std::memset(o, 0, 4096);
  char host[16] = "host shard";
  const OwnShardCopy copies[] = {{o + 1024, i, 1024}, {o + 3072, i + 1024, 1024}};
  ASSERT_TRUE(backend_->CopyOwnShards(copies, 2, nullptr, false).ok());
  EXPECT_EQ(std::memcmp(o + 1024, i, 1024), 0);
  EXPECT_EQ(std::memcmp(o + 3072, i + 1024, 1024), 0);
  EXPECT_EQ(o[0], 0);
  EXPECT_EQ(o[2048], 0);
  void* lib = dlopen(std::getenv("DMAGATHER_HIP_LIB"), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto last_kind = reinterpret_cast<int (*)()>(dlsym(lib, "fake_hip_last_memcpy_kind"));
  ASSERT_NE(last_kind, nullptr);
  const bool no_cu = api_->abi.major > 6 || (api_->abi.major == 6 && api_->abi.minor >= 1);
  EXPECT_EQ(last_kind(), no_cu ? 1024 : 3) << api_->abi.runtime_version;
  EXPECT_EQ(api_->abi.d2d_kind, no_cu ? 1024 : 3);

  const OwnShardCopy from_host{o, host, sizeof(host)};
  ASSERT_TRUE(backend_->CopyOwnShards(&from_host, 1, nullptr, false).ok());
  EXPECT_STREQ(o, "host shard");
  EXPECT_EQ(last_kind(), static_cast<int>(hipMemcpyDefault));
  dlclose(lib);
}

}  // namespace
}  // namespace dmagather::client
