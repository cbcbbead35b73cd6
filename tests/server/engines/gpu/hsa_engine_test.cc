// The GPU engine over HsaStreams (the hip runtime's path when dmagatherd
// assigns SDMA engines itself), on the fake runtime for devices, identities
// and imports and a fake HSA for the copies: one rank per device, gated on
// the CPU as hip is. The fake HSA runs copies on its own thread in a
// shuffled order that only respects each copy's dependency signals, and can
// hold back every copy into one device: the op must stay incomplete however
// often the engine polls, until those copies ran.
// Checked: the AllGather's bytes, which engine each copy took (the plan's
// engine of its link, never one the driver reports unusable), and the
// engine's bytes per engine (what dmagatherctl stats shows).
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server/engines/gpu/gpu_engine.h"
#include "server/engines/gpu/hip/hsa_streams.h"
#include "tests/fakes/fake_gpu_runtime.h"
#include "tests/server/engines/gpu/engine_fixture.h"

namespace dmagather::server::engines::gpu::hip {
namespace {

using testing::FakeRuntime;

using enginetest::GpuEngineTest;
using enginetest::Job;
using enginetest::kHipLike;
using enginetest::TestOp;

// Copies wait in `pending` until the worker runs them; signals live here.
struct FakeHsa {
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
    uint64_t src_agent, dst_agent;
    uint32_t engine;
    std::vector<uint64_t> deps;
    uint64_t signal;
  };
  uint64_t loads = 0;       // Signal reads by the engine so far.
  uint64_t held_agent = 0;  // Copies into this agent do not run (0: none held).
  uint64_t bytes_run = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, hsa_signal_value_t> signals;
  std::vector<Copy> pending;
  std::vector<Copy> issued;  // Every copy, in issue order.
  uint64_t next = 1;
  bool stop = false;
  std::mt19937 rng{12345};
  std::thread worker;

  void Start() {
    worker = std::thread([this] {
      std::unique_lock<std::mutex> l(mu);
      for (;;) {
        cv.wait(l, [&] { return stop || !pending.empty(); });
        if (stop) return;
        // Any copy whose dependencies have completed, picked at random.
        std::vector<size_t> runnable;
        for (size_t i = 0; i < pending.size(); ++i) {
          bool ok = pending[i].dst_agent != held_agent;
          for (uint64_t d : pending[i].deps) ok = ok && signals.at(d) == 0;
          if (ok) runnable.push_back(i);
        }
        if (runnable.empty()) {
          cv.wait_for(l, std::chrono::milliseconds(1));
          continue;
        }
        const size_t i = runnable[rng() % runnable.size()];
        Copy c = pending[i];
        pending.erase(pending.begin() + i);
        std::memcpy(c.dst, c.src, c.bytes);
        signals[c.signal] = 0;
        bytes_run += c.bytes;
        cv.notify_all();
      }
    });
  }
  // Waits until pred() holds (under mu); false after 60 s (a hang guard,
  // not a verdict on speed).
  template <typename Pred>
  bool WaitFor(Pred pred) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(60), pred);
  }
  void Hold(uint64_t agent) {
    {
      std::lock_guard<std::mutex> l(mu);
      held_agent = agent;
    }
    cv.notify_all();
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }
};
FakeHsa* fake = nullptr;

hsa_status_t Create(hsa_signal_value_t v, uint32_t, const hsa_agent_t*, hsa_signal_t* s) {
  std::lock_guard<std::mutex> l(fake->mu);
  s->handle = fake->next++;
  fake->signals[s->handle] = v;
  return HSA_STATUS_SUCCESS;
}
hsa_status_t Destroy(hsa_signal_t s) {
  std::lock_guard<std::mutex> l(fake->mu);
  return fake->signals.erase(s.handle) ? HSA_STATUS_SUCCESS : HSA_STATUS_ERROR;
}
void Store(hsa_signal_t s, hsa_signal_value_t v) {
  std::lock_guard<std::mutex> l(fake->mu);
  fake->signals[s.handle] = v;
}
hsa_signal_value_t Load(hsa_signal_t s) {
  hsa_signal_value_t v;
  {
    std::lock_guard<std::mutex> l(fake->mu);
    ++fake->loads;
    v = fake->signals.at(s.handle);
  }
  fake->cv.notify_all();
  return v;
}
hsa_status_t Enqueue(void* dst, hsa_agent_t da, const void* src, hsa_agent_t sa, size_t bytes, uint32_t n,
                     const hsa_signal_t* deps, hsa_signal_t done, uint32_t engine) {
  FakeHsa::Copy c{dst, src, bytes, sa.handle, da.handle, engine, {}, done.handle};
  for (uint32_t i = 0; i < n; ++i) c.deps.push_back(deps[i].handle);
  {
    std::lock_guard<std::mutex> l(fake->mu);
    fake->pending.push_back(c);
    fake->issued.push_back(c);
  }
  fake->cv.notify_all();
  return HSA_STATUS_SUCCESS;
}
hsa_status_t AsyncCopy(void* dst, hsa_agent_t da, const void* src, hsa_agent_t sa, size_t bytes, uint32_t n,
                       const hsa_signal_t* deps, hsa_signal_t done) {
  return Enqueue(dst, da, src, sa, bytes, n, deps, done, 0);
}
hsa_status_t OnEngine(void* dst, hsa_agent_t da, const void* src, hsa_agent_t sa, size_t bytes, uint32_t n,
                      const hsa_signal_t* deps, hsa_signal_t done, uint32_t engine, bool) {
  return Enqueue(dst, da, src, sa, bytes, n, deps, done, engine);
}

// The fake runtime with its streams, events and copies replaced by
// HsaStreams, as the hip runtime does when it owns the engines.
class HsaFakeRuntime : public FakeRuntime {
 public:
  HsaFakeRuntime(const Options& o, const HsaCopyApi* api, SdmaEnginePlan plan)
      : FakeRuntime(o), hs_(api, std::move(plan), Agents(o.devices)) {}
  static std::vector<hsa_agent_t> Agents(int n) {
    std::vector<hsa_agent_t> a(n);
    for (int d = 0; d < n; ++d) a[d].handle = 100 + d;
    return a;
  }
  absl::StatusOr<GpuStream> CreateStream(int device) override {
    return static_cast<GpuStream>(hs_.CreateStream(device));
  }
  void DestroyStream(int, GpuStream s) override { hs_.DestroyStream(static_cast<HsaStreams::Stream*>(s)); }
  absl::StatusOr<GpuEvent> CreateEvent(int) override { return static_cast<GpuEvent>(hs_.CreateEvent()); }
  void DestroyEvent(int, GpuEvent e) override { hs_.DestroyEvent(static_cast<HsaStreams::Event*>(e)); }
  absl::Status Copy(int, GpuStream s, const CopyCmd* chunks, size_t n, bool) override {
    return hs_.Copy(static_cast<HsaStreams::Stream*>(s), chunks, n);
  }
  absl::Status RecordEvent(GpuEvent e, GpuStream s) override {
    return hs_.Record(static_cast<HsaStreams::Event*>(e), static_cast<HsaStreams::Stream*>(s));
  }
  absl::Status StreamWaitEvent(GpuStream s, GpuEvent e) override {
    return hs_.Wait(static_cast<HsaStreams::Stream*>(s), static_cast<HsaStreams::Event*>(e));
  }
  absl::StatusOr<bool> QueryEvent(GpuEvent e) override { return hs_.Query(static_cast<HsaStreams::Event*>(e)); }
  std::vector<CopyEngineBytes> CopyEngineCounters() const override { return hs_.Counters(); }
  const SdmaEnginePlan& plan() const { return hs_.plan(); }

 private:
  HsaStreams hs_;
};

class HsaEngineTest : public GpuEngineTest {
 protected:
  void SetUp() override {
    fake = &hsa_;
    api_ = HsaCopyApi{Create, Destroy, Store, Load, AsyncCopy, OnEngine};
    hsa_.Start();
  }
  void TearDown() override {
    engine_.reset();
    hsa_.Stop();
    fake = nullptr;
  }
  void StartOnHsa(int devices, const SdmaEnginePlan::EngineStatus& status, uint32_t skip, int streams) {
    FakeRuntime::Options fo;
    fo.devices = devices;
    fo.device_waits = false;          // Gated on the CPU, as hip.
    fo.max_transfer_bytes = 1 << 16;  // Several chunks per copy.
    fo.default_chunk_bytes = 1 << 16;
    auto rt = std::make_unique<HsaFakeRuntime>(fo, &api_, SdmaEnginePlan::Build(devices, status, skip));
    fake_ = rt.get();
    hrt_ = rt.get();
    GpuEngine::Options eo;
    eo.streams_per_device = streams;
    auto e = GpuEngine::Create(std::move(rt), eo);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = *std::move(e);
  }

  FakeHsa hsa_;
  HsaCopyApi api_;
  HsaFakeRuntime* hrt_ = nullptr;
};

TEST_P(HsaEngineTest, OneRankPerGpuGathersBitExactWithEachLinkOnItsEngine) {
  const int n = 4;
  // Every link may use engines 0..7 except that the driver reports engine 0
  // unusable into device 3.
  StartOnHsa(
      n, [](int dst, int) { return uint32_t{dst == 3 ? 0xFEu : 0xFFu}; }, 0, 4);
  auto job = MakeJob({0, 1, 2, 3}, 200000);  // Not a multiple of the chunk.
  ASSERT_NE(job, nullptr);
  for (uint32_t seq = 1; seq <= 3; ++seq) {
    ASSERT_TRUE(RunOp(*job, seq).ok());
    EXPECT_EQ(job->Wrong(seq), 0u) << "op " << seq;
  }
  // Every copy took its link's engine; none took engine 0 into device 3.
  std::map<std::pair<int, int>, uint64_t> expected;  // (src device, engine) -> bytes.
  {
    std::lock_guard<std::mutex> l(hsa_.mu);
    ASSERT_FALSE(hsa_.issued.empty());
    for (const FakeHsa::Copy& c : hsa_.issued) {
      const int dst = static_cast<int>(c.dst_agent - 100), src = static_cast<int>(c.src_agent - 100);
      ASSERT_NE(dst, src);  // One rank per GPU: every copy crosses GPUs.
      EXPECT_EQ(c.engine, hrt_->plan().EngineFor(dst, src)) << dst << "<-" << src;
      EXPECT_NE(c.engine, 0u);
      if (dst == 3) {
        EXPECT_NE(c.engine, 0x1u);
      }
      expected[{src, __builtin_ctz(c.engine)}] += c.bytes;
    }
  }
  // The engine's stats: bytes per source device and engine.
  const EngineStats s = engine_->stats();
  std::map<std::pair<int, int>, uint64_t> got;
  uint64_t total = 0;
  for (const CopyEngineBytes& c : s.copy_engines) {
    got[{c.device, c.engine}] += c.bytes;
    total += c.bytes;
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(total, 3ull * n * (n - 1) * 200000);
}

TEST_P(HsaEngineTest, LinksWithoutAnEngineGoToRocrsChoiceAndStillGather) {
  const int n = 3;
  // Nothing usable out of device 2: its links are ROCr's choice.
  StartOnHsa(
      n, [](int, int src) { return uint32_t{src == 2 ? 0u : 0x3u}; }, 0, 2);
  auto job = MakeJob({0, 1, 2}, 70000);
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(RunOp(*job, 1).ok());
  EXPECT_EQ(job->Wrong(1), 0u);
  bool rocr_seen = false;
  {
    std::lock_guard<std::mutex> l(hsa_.mu);
    for (const FakeHsa::Copy& c : hsa_.issued) {
      const bool from2 = c.src_agent == 102;
      EXPECT_EQ(c.engine == 0, from2);
      rocr_seen |= from2;
    }
  }
  EXPECT_TRUE(rocr_seen);
  uint64_t rocr_bytes = 0;
  for (const CopyEngineBytes& c : engine_->stats().copy_engines) {
    if (c.engine == -1) {
      EXPECT_EQ(c.device, 2);
      rocr_bytes += c.bytes;
    }
  }
  EXPECT_EQ(rocr_bytes, 2u * 70000);
}

TEST_P(HsaEngineTest, AnOpStaysIncompleteWhileCopiesIntoOneDeviceArePending) {
  const int n = 3;
  const uint64_t shard = 150000;
  StartOnHsa(
      n, [](int, int) { return uint32_t{0xF}; }, 0, 2);
  auto job = MakeJob({0, 1, 2}, shard);
  ASSERT_NE(job, nullptr);
  job->Fill(1);
  TestOp op(&log_, 0);
  job->Plan(&op, 1);
  hsa_.Hold(100);  // Copies into device 0 wait.
  job->SetReady(1);
  engine_->Execute(&op);
  // Everything else ran: every byte not bound for device 0.
  ASSERT_TRUE(hsa_.WaitFor([&] { return hsa_.bytes_run == uint64_t(n - 1) * (n - 1) * shard; }));
  // The engine keeps polling the op's end; it must not call it done.
  uint64_t loads = 0;
  {
    std::lock_guard<std::mutex> l(hsa_.mu);
    loads = hsa_.loads;
  }
  ASSERT_TRUE(hsa_.WaitFor([&] { return hsa_.loads >= loads + 50; }));
  EXPECT_FALSE(op.Done());
  // Device 0's output still holds the poison where its peers' shards go.
  uint64_t poisoned = 0;
  for (uint64_t i = shard; i < uint64_t(n) * shard; ++i) poisoned += job->ranks[0]->recv[i] == static_cast<char>(0xEE);
  EXPECT_EQ(poisoned, uint64_t(n - 1) * shard);
  hsa_.Hold(0);
  ASSERT_TRUE(op.Wait());
  EXPECT_TRUE(op.result.ok()) << op.result;
  EXPECT_EQ(job->Wrong(1), 0u);
}

INSTANTIATE_TEST_SUITE_P(Hip, HsaEngineTest, ::testing::Values(kHipLike),
                         [](const ::testing::TestParamInfo<enginetest::Flavor>& i) {
                           return std::string(i.param.name);
                         });

}  // namespace
}  // namespace dmagather::server::engines::gpu::hip
