// --backend=hip on the fake libamdhip64 with two devices and a fake
// libhsa-runtime64 (tests/common/hip): the hip runtime's choice between
// SDMA engines it assigns itself and ROCr's choice, end to end through the
// engine. One AllGather of two ranks, one per device; checked: the bytes,
// which engines the fake HSA saw copies on, the engine's bytes per engine,
// and the copy kind where ROCr chooses. What each target expects comes
// from BUILD ($DMAGATHER_TEST_EXPECT: "own" or "rocr";
// $DMAGATHER_FAKE_HSA_UNUSABLE: engines the fake driver reports unusable).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/hip/hip_api.h"
#include "common/memory_kinds.h"
#include "server/engines/factory.h"

namespace dmagather::server::engines {
namespace {

class Op : public EngineOp {
 public:
  void OnEngineDone(absl::Status s) override {
    std::lock_guard<std::mutex> l(mu);
    status = std::move(s);
    done = true;
    cv.notify_all();
  }
  bool Wait() {  // A hang guard, not a verdict on speed.
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(60), [&] { return done; });
  }
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status status;
};

template <typename Fn>
Fn Sym(const char* env, const char* name) {
  void* lib = dlopen(std::getenv(env), RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  auto fn = reinterpret_cast<Fn>(dlsym(lib, name));
  dlclose(lib);
  return fn;
}

TEST(HipEnginesOnFake, AnAllGatherTakesTheEnginesThisRuntimeAllows) {
  const std::string expect = std::getenv("DMAGATHER_TEST_EXPECT");
  const char* unusable_env = std::getenv("DMAGATHER_FAKE_HSA_UNUSABLE");
  const uint32_t unusable = unusable_env != nullptr ? std::strtoul(unusable_env, nullptr, 16) : 0;
  auto api = ::dmagather::common::hip::Hip();
  ASSERT_TRUE(api.ok()) << api.status();
  const ::dmagather::common::hip::HipApi* hip = *api;
  EngineOptions o;
  o.backend = "hip";
  o.streams_per_device = 2;
  // What dmagatherd's --hsa_lib and --hip_engines would pass.
  o.hip.hsa_lib = std::getenv("DMAGATHER_TEST_HSA_LIB");
  o.hip.engines = std::getenv("DMAGATHER_TEST_HIP_ENGINES");
  auto created = CreateEngine(o);
  ASSERT_TRUE(created.ok()) << created.status();
  CopyEngine& engine = *created->engine;

  constexpr int kRanks = 2;
  constexpr uint64_t kShard = 300000;  // Inside the fake's 1 MiB address range.
  alignas(4096) static uint32_t flags[kRanks][1024] = {};
  std::vector<std::unique_ptr<EngineRank>> ranks;
  std::vector<char*> send(kRanks), recv(kRanks);
  std::vector<std::shared_ptr<ImportedRegion>> send_r(kRanks), recv_r(kRanks);
  auto import = [&](char* p, uint64_t bytes, const EngineRank* rank) {
    hipIpcMemHandle_t h;
    EXPECT_EQ(hip->hipIpcGetMemHandle(&h, p), hipSuccess);
    RegionSpec spec;
    spec.kind = common::kMemoryHipIpc;
    spec.bytes = bytes;
    spec.handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
    spec.rank = rank;
    auto r = engine.Import(spec);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : nullptr;
  };
  for (int r = 0; r < kRanks; ++r) {
    RankAttach a;
    a.rank = r;
    a.device = DeviceRef{"hip", r};
    a.flag_pages = flags[r];
    a.flag_bytes = sizeof(flags[r]);
    a.ready_word = &flags[r][16];
    auto er = engine.AttachRank(a);
    ASSERT_TRUE(er.ok()) << er.status();
    ranks.push_back(*std::move(er));
    void* s = nullptr;
    void* v = nullptr;
    ASSERT_EQ(hip->hipMalloc(&s, kShard), hipSuccess);
    ASSERT_EQ(hip->hipMalloc(&v, kShard * kRanks), hipSuccess);
    send[r] = static_cast<char*>(s);
    recv[r] = static_cast<char*>(v);
    for (uint64_t i = 0; i < kShard; ++i) send[r][i] = static_cast<char>((r * 31 + i * 7 + (i >> 9)) & 0xff);
    std::memset(recv[r], 0xEE, kShard * kRanks);
    std::memcpy(recv[r] + r * kShard, send[r], kShard);
    send_r[r] = import(send[r], kShard, ranks.back().get());
    recv_r[r] = import(recv[r], kShard * kRanks, ranks.back().get());
    ASSERT_NE(send_r[r], nullptr);
    ASSERT_NE(recv_r[r], nullptr);
  }

  Op op;
  op.seq = 1;
  for (auto& r : ranks) op.ranks.push_back(r.get());
  for (int d = 0; d < kRanks; ++d) {
    for (int s = 0; s < kRanks; ++s) {
      if (s == d) continue;
      op.plan.copies.push_back(CopyCmd{recv_r[d]->base() + s * kShard, send_r[s]->base(), kShard, s, d});
      op.plan.bytes += kShard;
    }
  }
  for (int r = 0; r < kRanks; ++r) __atomic_store_n(&flags[r][16], 1u, __ATOMIC_RELEASE);
  engine.Execute(&op);
  ASSERT_TRUE(op.Wait());
  ASSERT_TRUE(op.status.ok()) << op.status;
  for (int d = 0; d < kRanks; ++d) {
    for (int s = 0; s < kRanks; ++s) {
      EXPECT_EQ(std::memcmp(recv[d] + s * kShard, send[s], kShard), 0) << d << " from " << s;
    }
  }

  const EngineStats stats = engine.stats();
  auto bytes_on = Sym<uint64_t (*)(uint32_t)>("DMAGATHER_TEST_HSA_LIB", "fake_hsa_bytes_on");
  if (expect == "own") {
    // Every byte on an engine the fake reports usable, none left to ROCr;
    // the stats say the same per source device.
    ASSERT_NE(bytes_on, nullptr);
    const uint32_t usable = 0x3u & ~unusable;
    uint64_t on_engines = 0;
    for (uint32_t bit = 1; bit <= 2; bit <<= 1) {
      if ((usable & bit) == 0) {
        EXPECT_EQ(bytes_on(bit), 0u) << "engine bit " << bit << " is unusable";
      }
      on_engines += bytes_on(bit);
    }
    EXPECT_EQ(on_engines, (kRanks - 1) * kRanks * kShard);
    EXPECT_EQ(bytes_on(0), 0u);
    uint64_t counted = 0;
    for (const CopyEngineBytes& c : stats.copy_engines) {
      EXPECT_GE(c.engine, 0);
      EXPECT_TRUE(usable & (1u << c.engine)) << c.engine;
      counted += c.bytes;
    }
    EXPECT_EQ(counted, (kRanks - 1) * kRanks * kShard);
  } else {
    // ROCr chooses: hipMemcpyAsync with this runtime's copy kind, nothing
    // through HSA; the stats count bytes per issuing GPU only (engine -1).
    uint64_t counted = 0;
    std::set<int> devices;
    for (const CopyEngineBytes& c : stats.copy_engines) {
      EXPECT_EQ(c.engine, -1);
      EXPECT_TRUE(devices.insert(c.device).second) << "device " << c.device << " listed twice";
      counted += c.bytes;
    }
    EXPECT_EQ(counted, (kRanks - 1) * kRanks * kShard);
    if (bytes_on != nullptr) {
      EXPECT_EQ(bytes_on(0) + bytes_on(1) + bytes_on(2), 0u);
    }
    auto kind = Sym<int (*)()>("DMAGATHER_HIP_LIB", "fake_hip_last_memcpy_kind");
    ASSERT_NE(kind, nullptr);
    EXPECT_EQ(kind(), hip->abi.d2d_kind);
  }

  op.plan.Clear();
  send_r.clear();
  recv_r.clear();
  ranks.clear();
  created->engine.reset();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(hip->hipFree(send[r]), hipSuccess);
    EXPECT_EQ(hip->hipFree(recv[r]), hipSuccess);
  }
}

}  // namespace
}  // namespace dmagather::server::engines
