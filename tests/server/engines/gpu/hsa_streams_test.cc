// HsaStreams (server/engines/gpu/hip/hsa_streams.h) on a fake HSA: which engine
// each copy took (the plan's engine for its link, ROCr's choice where the
// link has none; a copy within one GPU forced onto one of its engines), an engine the driver
// reports unusable never used, events that complete only when every copy
// they cover has (whatever order the fake finishes copies in), and bytes
// counted per source device and engine.
#include "server/engines/gpu/hip/hsa_streams.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace dmagather::server::engines::gpu::hip {
namespace {

struct FakeHsa {
  struct Copy {
    uint64_t dst_agent, src_agent;
    uint32_t engine;  // 0: hsa_amd_memory_async_copy (ROCr's choice).
    size_t bytes;
    uint64_t signal;
    bool force_sdma = false;
  };
  std::map<uint64_t, hsa_signal_value_t> signals;
  std::vector<Copy> copies;
  uint64_t next = 1;
  void Finish(size_t copy, hsa_signal_value_t value = 0) { signals[copies[copy].signal] = value; }
};
FakeHsa* fake = nullptr;

hsa_status_t Create(hsa_signal_value_t v, uint32_t, const hsa_agent_t*, hsa_signal_t* s) {
  s->handle = fake->next++;
  fake->signals[s->handle] = v;
  return HSA_STATUS_SUCCESS;
}
hsa_status_t Destroy(hsa_signal_t s) { return fake->signals.erase(s.handle) ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR; }
void Store(hsa_signal_t s, hsa_signal_value_t v) { fake->signals[s.handle] = v; }
hsa_signal_value_t Load(hsa_signal_t s) { return fake->signals.at(s.handle); }
hsa_status_t AsyncCopy(void*, hsa_agent_t dst, const void*, hsa_agent_t src, size_t bytes, uint32_t,
                       const hsa_signal_t*, hsa_signal_t done) {
  fake->copies.push_back(FakeHsa::Copy{dst.handle, src.handle, 0, bytes, done.handle});
  return HSA_STATUS_SUCCESS;
}
hsa_status_t OnEngine(void*, hsa_agent_t dst, const void*, hsa_agent_t src, size_t bytes, uint32_t, const hsa_signal_t*,
                      hsa_signal_t done, uint32_t engine, bool force) {
  fake->copies.push_back(FakeHsa::Copy{dst.handle, src.handle, engine, bytes, done.handle, force});
  return HSA_STATUS_SUCCESS;
}

// Agents' handles: 100 + device.
std::vector<hsa_agent_t> Agents(int n) {
  std::vector<hsa_agent_t> a(n);
  for (int d = 0; d < n; ++d) a[d].handle = 100 + d;
  return a;
}

CopyCmd Cmd(char* buf, uint64_t bytes, int dst_device, int src_device) {
  CopyCmd c{buf, buf, bytes, 0, 1};
  c.dst_device = dst_device;
  c.src_device = src_device;
  return c;
}

class HsaStreamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake = &hsa_;
    api_ = HsaCopyApi{Create, Destroy, Store, Load, AsyncCopy, OnEngine};
  }
  void TearDown() override { fake = nullptr; }

  FakeHsa hsa_;
  HsaCopyApi api_;
  char buf_[64] = {};
};

TEST_F(HsaStreamsTest, EachCopyTakesTheEngineOfItsLink) {
  // Every link of 3 devices may use engines 0..3.
  SdmaEnginePlan plan = SdmaEnginePlan::Build(
      3, [](int, int) { return uint32_t{0xF}; }, 0);
  HsaStreams hs(&api_, plan, Agents(3));
  HsaStreams::Stream* s = hs.CreateStream(0);
  const CopyCmd cmds[] = {Cmd(buf_, 10, 1, 0), Cmd(buf_, 20, 2, 0), Cmd(buf_, 30, 0, 1), Cmd(buf_, 40, 0, 0)};
  ASSERT_TRUE(hs.Copy(s, cmds, 4).ok());
  ASSERT_EQ(hsa_.copies.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(hsa_.copies[i].engine, plan.EngineFor(cmds[i].dst_device, cmds[i].src_device)) << i;
    EXPECT_NE(hsa_.copies[i].engine, 0u) << i;
    EXPECT_EQ(hsa_.copies[i].dst_agent, 100u + cmds[i].dst_device);
    EXPECT_EQ(hsa_.copies[i].src_agent, 100u + cmds[i].src_device);
  }
  // Links out of device 0 run on distinct engines of device 0.
  EXPECT_NE(hsa_.copies[0].engine, hsa_.copies[1].engine);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(hsa_.copies[i].force_sdma) << i;
  // A copy within one device has no link: it goes on one of that device's
  // engines (its first outgoing link's), forced onto SDMA.
  EXPECT_EQ(hsa_.copies[3].engine, plan.EngineFor(1, 0));
  EXPECT_EQ(hsa_.copies[3].src_agent, 100u);
  EXPECT_TRUE(hsa_.copies[3].force_sdma);
  hs.DestroyStream(s);
}

TEST_F(HsaStreamsTest, UnusableEnginesAreNeverUsedAndALinkWithoutOneIsRocrsChoice) {
  // 1<-0: the driver reports only engine 2 usable; 0<-1: engines 0 and 1,
  // but the operator skips engine 0; every link of device 2 reports none.
  auto status = [](int dst, int src) -> absl::StatusOr<uint32_t> {
    if (dst == 1 && src == 0) return uint32_t{0x4};
    if (dst == 0 && src == 1) return uint32_t{0x3};
    return uint32_t{0};
  };
  SdmaEnginePlan plan = SdmaEnginePlan::Build(3, status, /*skip_mask=*/0x1);
  HsaStreams hs(&api_, plan, Agents(3));
  HsaStreams::Stream* s = hs.CreateStream(1);
  const CopyCmd cmds[] = {Cmd(buf_, 8, 1, 0), Cmd(buf_, 16, 0, 1), Cmd(buf_, 32, 2, 0)};
  ASSERT_TRUE(hs.Copy(s, cmds, 3).ok());
  ASSERT_EQ(hsa_.copies.size(), 3u);
  EXPECT_EQ(hsa_.copies[0].engine, 0x4u);
  EXPECT_EQ(hsa_.copies[1].engine, 0x2u);
  EXPECT_EQ(hsa_.copies[2].engine, 0u);  // hsa_amd_memory_async_copy: ROCr picks.
  EXPECT_FALSE(plan.WhyRocr(2, 0).empty());
  // Bytes per source device and engine; -1 is ROCr's choice.
  const std::vector<CopyEngineBytes> c = hs.Counters();
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].device, 0);
  EXPECT_EQ(c[0].engine, -1);
  EXPECT_EQ(c[0].bytes, 32u);
  EXPECT_EQ(c[1].device, 0);
  EXPECT_EQ(c[1].engine, 2);
  EXPECT_EQ(c[1].bytes, 8u);
  EXPECT_EQ(c[2].device, 1);
  EXPECT_EQ(c[2].engine, 1);
  EXPECT_EQ(c[2].bytes, 16u);
}

TEST_F(HsaStreamsTest, WithoutCopyOnEngineEveryCopyIsRocrsChoiceAndCountedSo) {
  api_.copy_on_engine = nullptr;  // ROCm < 5.7.
  SdmaEnginePlan plan = SdmaEnginePlan::Build(
      2, [](int, int) { return uint32_t{0x3}; }, 0);
  HsaStreams hs(&api_, plan, Agents(2));
  HsaStreams::Stream* s = hs.CreateStream(0);
  const CopyCmd cmd = Cmd(buf_, 12, 0, 1);
  ASSERT_TRUE(hs.Copy(s, &cmd, 1).ok());
  ASSERT_EQ(hsa_.copies.size(), 1u);
  EXPECT_EQ(hsa_.copies[0].engine, 0u);
  const std::vector<CopyEngineBytes> c = hs.Counters();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].device, 1);
  EXPECT_EQ(c[0].engine, -1);
  EXPECT_EQ(c[0].bytes, 12u);
}

TEST_F(HsaStreamsTest, AnEventCompletesOnlyWhenEveryCopyItCoversHas) {
  // The engine's pattern: copies fan out on streams 1 and 2, each joins
  // stream 0, the op's end event is recorded on stream 0.
  SdmaEnginePlan plan = SdmaEnginePlan::Build(
      3, [](int, int) { return uint32_t{0xF}; }, 0);
  HsaStreams hs(&api_, plan, Agents(3));
  HsaStreams::Stream* s0 = hs.CreateStream(0);
  HsaStreams::Stream* s1 = hs.CreateStream(0);
  HsaStreams::Stream* s2 = hs.CreateStream(0);
  HsaStreams::Event* j1 = hs.CreateEvent();
  HsaStreams::Event* j2 = hs.CreateEvent();
  HsaStreams::Event* end = hs.CreateEvent();
  const CopyCmd from1[] = {Cmd(buf_, 4, 0, 1), Cmd(buf_, 4, 0, 1)};
  const CopyCmd from2 = Cmd(buf_, 4, 0, 2);
  ASSERT_TRUE(hs.Copy(s1, from1, 2).ok());   // Copies 0, 1.
  ASSERT_TRUE(hs.Copy(s2, &from2, 1).ok());  // Copy 2.
  ASSERT_TRUE(hs.Record(j1, s1).ok());
  ASSERT_TRUE(hs.Wait(s0, j1).ok());
  ASSERT_TRUE(hs.Record(j2, s2).ok());
  ASSERT_TRUE(hs.Wait(s0, j2).ok());
  ASSERT_TRUE(hs.Record(end, s0).ok());  // Stream 0 itself issued nothing.

  auto done = [&](HsaStreams::Event* e) {
    absl::StatusOr<bool> d = hs.Query(e);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() && *d;
  };
  EXPECT_FALSE(done(end));
  hsa_.Finish(1);  // Stream 1's second copy first: its first is still running.
  EXPECT_FALSE(done(end));
  EXPECT_FALSE(done(j1));
  hsa_.Finish(2);
  EXPECT_TRUE(done(j2));
  EXPECT_FALSE(done(end));
  hsa_.Finish(0);
  EXPECT_TRUE(done(j1));
  EXPECT_TRUE(done(end));

  // The next op: an end event recorded later covers only what came after
  // plus what stream 0 waited on (all complete now), and new copies.
  const CopyCmd again = Cmd(buf_, 4, 0, 1);
  ASSERT_TRUE(hs.Copy(s1, &again, 1).ok());  // Copy 3.
  ASSERT_TRUE(hs.Record(j1, s1).ok());
  ASSERT_TRUE(hs.Wait(s0, j1).ok());
  ASSERT_TRUE(hs.Record(end, s0).ok());
  EXPECT_FALSE(done(end));
  hsa_.Finish(3);
  EXPECT_TRUE(done(end));
  hs.DestroyEvent(j1);
  hs.DestroyEvent(j2);
  hs.DestroyEvent(end);
}

TEST_F(HsaStreamsTest, AFailedCopyIsTheEventsError) {
  SdmaEnginePlan plan = SdmaEnginePlan::Build(
      2, [](int, int) { return uint32_t{0x1}; }, 0);
  HsaStreams hs(&api_, plan, Agents(2));
  HsaStreams::Stream* s = hs.CreateStream(0);
  HsaStreams::Event* e = hs.CreateEvent();
  const CopyCmd cmd = Cmd(buf_, 4, 0, 1);
  ASSERT_TRUE(hs.Copy(s, &cmd, 1).ok());
  ASSERT_TRUE(hs.Record(e, s).ok());
  hsa_.Finish(0, -1);
  EXPECT_FALSE(hs.Query(e).ok());
  hs.DestroyEvent(e);
}

TEST_F(HsaStreamsTest, ACopyNamingAnotherNodesDeviceIsRefused) {
  SdmaEnginePlan plan = SdmaEnginePlan::Build(
      2, [](int, int) { return uint32_t{0x1}; }, 0);
  HsaStreams hs(&api_, plan, Agents(2));
  HsaStreams::Stream* s = hs.CreateStream(0);
  const CopyCmd cmd = Cmd(buf_, 4, 0, 5);
  EXPECT_EQ(hs.Copy(s, &cmd, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(hsa_.copies.empty());
}

}  // namespace
}  // namespace dmagather::server::engines::gpu::hip
