// HsaCopyQueue (server/engines/gpu/hip/hsa_copy_queue.h) on a fake HSA: which
// engine each copy took (and ROCr's choice where no engine is given or the
// runtime has no copy_on_engine), the dependency chain that keeps issue
// order, completion checked in issue order whatever order the fake
// finishes copies in, errors, and that no signal is reused while a copy
// may still wait on it.
#include "server/engines/gpu/hip/hsa_copy_queue.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace dmagather::server::engines::gpu::hip {
namespace {

// One fake HSA for the test at a time (the table holds plain functions).
struct FakeHsa {
  struct Copy {
    uint32_t engine;  // 0: hsa_amd_memory_async_copy (ROCr's choice).
    size_t bytes;
    std::vector<uint64_t> deps;
    uint64_t signal;
    bool finished = false;
  };
  std::map<uint64_t, hsa_signal_value_t> signals;
  std::vector<Copy> copies;
  uint64_t next = 1;
  hsa_status_t fail_next_copy = HSA_STATUS_SUCCESS;
  int reused_while_needed = 0;

  // A signal some copy that has not completed still depends on.
  bool Needed(uint64_t s) const {
    for (const Copy& c : copies) {
      for (uint64_t d : c.deps) {
        if (d == s && !c.finished) return true;
      }
    }
    return false;
  }
  void Finish(size_t copy, hsa_signal_value_t value = 0) {
    copies[copy].finished = true;
    signals[copies[copy].signal] = value;
  }
};
FakeHsa* fake = nullptr;

hsa_status_t Create(hsa_signal_value_t v, uint32_t, const hsa_agent_t*, hsa_signal_t* s) {
  s->handle = fake->next++;
  fake->signals[s->handle] = v;
  return HSA_STATUS_SUCCESS;
}
hsa_status_t Destroy(hsa_signal_t s) { return fake->signals.erase(s.handle) ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR; }
void Store(hsa_signal_t s, hsa_signal_value_t v) {
  if (fake->Needed(s.handle)) ++fake->reused_while_needed;
  fake->signals[s.handle] = v;
}
hsa_signal_value_t Load(hsa_signal_t s) { return fake->signals.at(s.handle); }
hsa_status_t Record(uint32_t engine, size_t bytes, uint32_t n, const hsa_signal_t* deps, hsa_signal_t done) {
  if (fake->fail_next_copy != HSA_STATUS_SUCCESS) {
    hsa_status_t st = fake->fail_next_copy;
    fake->fail_next_copy = HSA_STATUS_SUCCESS;
    return st;
  }
  FakeHsa::Copy c{engine, bytes, {}, done.handle, false};
  for (uint32_t i = 0; i < n; ++i) c.deps.push_back(deps[i].handle);
  fake->copies.push_back(c);
  return HSA_STATUS_SUCCESS;
}
hsa_status_t AsyncCopy(void*, hsa_agent_t, const void*, hsa_agent_t, size_t bytes, uint32_t n, const hsa_signal_t* deps,
                       hsa_signal_t done) {
  return Record(0, bytes, n, deps, done);
}
hsa_status_t OnEngine(void*, hsa_agent_t, const void*, hsa_agent_t, size_t bytes, uint32_t n, const hsa_signal_t* deps,
                      hsa_signal_t done, uint32_t engine, bool) {
  return Record(engine, bytes, n, deps, done);
}

class HsaCopyQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake = &hsa_;
    api_ = HsaCopyApi{Create, Destroy, Store, Load, AsyncCopy, OnEngine};
  }
  void TearDown() override { fake = nullptr; }
  absl::Status Copy(HsaCopyQueue& q, size_t bytes, uint32_t engine) {
    return q.Copy(buf_, hsa_agent_t{1}, buf_, hsa_agent_t{2}, bytes, engine);
  }

  FakeHsa hsa_;
  HsaCopyApi api_;
  char buf_[64] = {};
};

TEST_F(HsaCopyQueueTest, EachCopyTakesItsEngineAndBytesAreCountedPerEngine) {
  HsaCopyQueue q(&api_);
  ASSERT_TRUE(Copy(q, 100, 0x4).ok());
  ASSERT_TRUE(Copy(q, 50, 0x100).ok());
  ASSERT_TRUE(Copy(q, 7, 0).ok());  // No engine for this link: ROCr's choice.
  ASSERT_EQ(hsa_.copies.size(), 3u);
  EXPECT_EQ(hsa_.copies[0].engine, 0x4u);
  EXPECT_EQ(hsa_.copies[1].engine, 0x100u);
  EXPECT_EQ(hsa_.copies[2].engine, 0u);
  EXPECT_EQ(q.bytes_on_engine(2), 100u);
  EXPECT_EQ(q.bytes_on_engine(8), 50u);
  EXPECT_EQ(q.bytes_rocr_choice(), 7u);
  // Stream order: each copy depends on the previous one's signal.
  EXPECT_TRUE(hsa_.copies[0].deps.empty());
  EXPECT_EQ(hsa_.copies[1].deps, (std::vector<uint64_t>{hsa_.copies[0].signal}));
  EXPECT_EQ(hsa_.copies[2].deps, (std::vector<uint64_t>{hsa_.copies[1].signal}));
}

TEST_F(HsaCopyQueueTest, WithoutCopyOnEngineEveryCopyIsRocrsChoice) {
  api_.copy_on_engine = nullptr;  // ROCm < 5.7.
  HsaCopyQueue q(&api_);
  ASSERT_TRUE(Copy(q, 10, 0x2).ok());
  EXPECT_EQ(hsa_.copies[0].engine, 0u);
  EXPECT_EQ(q.bytes_on_engine(1), 0u);
  EXPECT_EQ(q.bytes_rocr_choice(), 10u);
}

TEST_F(HsaCopyQueueTest, CompletionIsInIssueOrderWhateverOrderCopiesFinish) {
  HsaCopyQueue q(&api_);
  ASSERT_TRUE(Copy(q, 1, 0x1).ok());
  const uint64_t first = q.Mark();
  ASSERT_TRUE(Copy(q, 1, 0x1).ok());
  ASSERT_TRUE(Copy(q, 1, 0x1).ok());
  const uint64_t third = q.Mark();
  EXPECT_EQ(first, 1u);
  EXPECT_EQ(third, 3u);

  hsa_.Finish(2);  // The last finishes first: nothing before it is done.
  EXPECT_EQ(*q.Complete(first), false);
  EXPECT_EQ(*q.Complete(third), false);
  hsa_.Finish(0);
  EXPECT_EQ(*q.Complete(first), true);
  EXPECT_EQ(*q.Complete(third), false);  // Copy 2 is still running.
  hsa_.Finish(1);
  EXPECT_EQ(*q.Complete(third), true);
  EXPECT_EQ(*q.Complete(0), true);
}

TEST_F(HsaCopyQueueTest, SignalsAreReusedOnlyWhenNoCopyWaitsOnThem) {
  HsaCopyQueue q(&api_);
  for (int round = 0; round < 50; ++round) {
    ASSERT_TRUE(Copy(q, 1, 0x1).ok());  // A
    ASSERT_TRUE(Copy(q, 1, 0x2).ok());  // B, waits on A's signal.
    const size_t a = hsa_.copies.size() - 2;
    hsa_.Finish(a);
    ASSERT_EQ(*q.Complete(q.Mark()), false);
    ASSERT_TRUE(Copy(q, 1, 0x4).ok());  // C: must not take A's signal while B may still wait on it.
    hsa_.Finish(a + 1);
    hsa_.Finish(a + 2);
    ASSERT_EQ(*q.Complete(q.Mark()), true);
  }
  EXPECT_EQ(hsa_.reused_while_needed, 0);
  EXPECT_LE(q.signals_created(), 4u);  // Warm-up only: the per-op path creates none.
}

TEST_F(HsaCopyQueueTest, ErrorsAreReported) {
  HsaCopyQueue q(&api_);
  hsa_.fail_next_copy = HSA_STATUS_ERROR_INVALID_ARGUMENT;
  absl::Status st = Copy(q, 1, 0x8);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("hsa_amd_memory_async_copy_on_engine(engine bit 0x8)"), std::string::npos) << st;
  EXPECT_EQ(q.Mark(), 0u);
  EXPECT_EQ(q.bytes_on_engine(3), 0u);

  ASSERT_TRUE(Copy(q, 1, 0x8).ok());
  hsa_.Finish(0, -1);  // The copy failed on the device.
  auto done = q.Complete(q.Mark());
  ASSERT_FALSE(done.ok());
  EXPECT_NE(done.status().message().find("SDMA copy 1 failed"), std::string::npos) << done.status();
}

}  // namespace
}  // namespace dmagather::server::engines::gpu::hip
