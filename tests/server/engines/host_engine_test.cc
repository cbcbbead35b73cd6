// The host engine cuts copies into chunks shared by its workers; every byte
// must land exactly once, whatever the sizes and chunking.
#include "server/engines/host/host_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/memfd.h"
#include "server/engines/host/stream_copy.h"

namespace dmagather::server::engines::host {
namespace {

class TestOp : public EngineOp {
 public:
  void OnEngineDone(absl::Status s) override {
    status = s;
    calls++;
    done.Notify();
  }
  absl::Status status;
  std::atomic<int> calls{0};
  absl::Notification done;
};

TEST(HostEngineTest, ChunkedCopiesAreBitExact) {
  HostEngine::Options o;
  o.workers = 3;
  o.chunk_bytes = 4096;
  auto engine = HostEngine::Create(o);
  ASSERT_TRUE(engine.ok());
  std::mt19937 rng(3);
  const size_t sizes[] = {1, 4095, 4096, 4097, 100000, 1 << 20};
  std::vector<std::vector<char>> src, dst;
  TestOp op;
  for (size_t n : sizes) {
    src.emplace_back(n);
    dst.emplace_back(n + 16, 0x11);
    for (auto& c : src.back()) c = char(rng());
  }
  for (size_t i = 0; i < src.size(); ++i) {
    op.plan.copies.push_back(CopyCmd{dst[i].data() + 8, src[i].data(), src[i].size(), 0, 1});
    op.plan.bytes += src[i].size();
  }
  (*engine)->Execute(&op);
  op.done.WaitForNotification();
  EXPECT_TRUE(op.status.ok());
  EXPECT_EQ(op.calls.load(), 1);
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(std::memcmp(dst[i].data() + 8, src[i].data(), src[i].size()), 0) << sizes[i];
    for (int g = 0; g < 8; ++g) {  // Guard bytes untouched.
      EXPECT_EQ(dst[i][g], 0x11);
      EXPECT_EQ(dst[i][8 + src[i].size() + g], 0x11);
    }
  }
  EXPECT_EQ((*engine)->stats().bytes, op.plan.bytes);
}

TEST(StreamCopyTest, EveryAlignmentAndTailIsBitExact) {
  std::mt19937 rng(11);
  const size_t n = kStreamMinBytes * 3 + 77;
  std::vector<char> src(n + 128), dst(n + 256);
  for (auto& c : src) c = char(rng());
  for (size_t so = 0; so < 64; so += 7) {
    for (size_t d_off = 0; d_off < 64; d_off += 5) {
      for (size_t len : {size_t{1}, kStreamMinBytes - 1, kStreamMinBytes, kStreamMinBytes + 63, n}) {
        std::fill(dst.begin(), dst.end(), char(0x3C));
        StreamCopy(dst.data() + d_off, src.data() + so, len);
        ASSERT_EQ(std::memcmp(dst.data() + d_off, src.data() + so, len), 0) << so << " " << d_off << " " << len;
        for (size_t g = 0; g < d_off; ++g) ASSERT_EQ(dst[g], char(0x3C));
        ASSERT_EQ(dst[d_off + len], char(0x3C)) << "wrote past the end";
      }
    }
  }
}

TEST(HostEngineTest, EmptyPlanCompletesImmediately) {
  auto engine = HostEngine::Create({});
  ASSERT_TRUE(engine.ok());
  TestOp op;
  (*engine)->Execute(&op);
  EXPECT_TRUE(op.done.HasBeenNotified());
  EXPECT_EQ(op.calls.load(), 1);
}

TEST(HostEngineTest, RejectsBadOptions) {
  HostEngine::Options o;
  o.workers = 0;
  EXPECT_FALSE(HostEngine::Create(o).ok());
  o.workers = 2;
  o.chunk_bytes = 100;
  EXPECT_FALSE(HostEngine::Create(o).ok());
}

TEST(HostEngineTest, ImportsOnlySharedMemory) {
  auto engine = HostEngine::Create({});
  RegionSpec spec;
  spec.kind = kMemoryCudaIpc;
  EXPECT_EQ((*engine)->Import(spec).status().code(), absl::StatusCode::kFailedPrecondition);
  spec.kind = kMemoryHostMemfd;
  spec.bytes = 4096;
  EXPECT_EQ((*engine)->Import(spec).status().code(), absl::StatusCode::kInvalidArgument);  // No descriptor.
  // A memfd without seals, and one too short, are refused; a sealed one is mapped (only the bytes asked for).
  auto unsealed = common::MemfdMapping::Create("test-unsealed", 8192, 0);
  ASSERT_TRUE(unsealed.ok()) << unsealed.status();
  spec.fd = unsealed->fd();
  EXPECT_EQ((*engine)->Import(spec).status().code(), absl::StatusCode::kPermissionDenied);
  auto sealed = common::MemfdMapping::Create("test-sealed", 8192);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  spec.fd = sealed->fd();
  spec.bytes = 8193;
  EXPECT_EQ((*engine)->Import(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.bytes = 4096;
  auto region = (*engine)->Import(spec);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->bytes(), 4096u);
  static_cast<char*>(sealed->data())[100] = 7;
  EXPECT_EQ((*region)->base()[100], 7);
}

}  // namespace
}  // namespace dmagather::server::engines::host
