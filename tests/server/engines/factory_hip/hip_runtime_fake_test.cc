// --backend=hip on the fake libamdhip64 (tests/common/hip) answering as one
// ROCm major ($DMAGATHER_FAKE_HIP_VERSION, set per target in BUILD): the
// engine starts, imports a rank's HIP IPC handle with that major's
// hipIpcMemLazyEnablePeerAccess (the fake, like clr >= 5.7, rejects any
// other flag), and refuses to start where ROCm would copy with blit
// kernels (HSA_ENABLE_SDMA=0, GPU_FORCE_BLIT_COPY_SIZE).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/hip/hip_api.h"
#include "common/memory_kinds.h"
#include "server/engines/factory.h"

namespace dmagather::server::engines {
namespace {

absl::StatusOr<CreatedEngine> CreateHip() {
  EngineOptions o;
  o.backend = "hip";
  o.streams_per_device = 1;
  return CreateEngine(o);
}

TEST(HipRuntimeOnFake, ImportsWithThisMajorsIpcFlag) {
  auto api = ::dmagather::common::hip::Hip();
  ASSERT_TRUE(api.ok()) << api.status();
  ASSERT_EQ((*api)->abi.runtime_version, std::atoi(std::getenv("DMAGATHER_FAKE_HIP_VERSION")));
  auto e = CreateHip();
  ASSERT_TRUE(e.ok()) << e.status();

  alignas(4096) static uint32_t flags[1024] = {};
  RankAttach a;
  a.rank = 0;
  a.device = DeviceRef{"hip", 0};
  a.flag_pages = flags;
  a.flag_bytes = sizeof(flags);
  a.ready_word = &flags[16];
  auto rank = e->engine->AttachRank(a);
  ASSERT_TRUE(rank.ok()) << rank.status();

  void* p = nullptr;
  ASSERT_EQ((*api)->hipMalloc(&p, 4096), hipSuccess);
  hipIpcMemHandle_t h;
  ASSERT_EQ((*api)->hipIpcGetMemHandle(&h, p), hipSuccess);
  RegionSpec spec;
  spec.kind = common::kMemoryHipIpc;
  spec.bytes = 4096;
  spec.handle.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  spec.rank = rank->get();
  auto region = e->engine->Import(spec);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->base(), p);

  void* lib = dlopen(std::getenv("DMAGATHER_HIP_LIB"), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr);
  auto last_flags = reinterpret_cast<unsigned int (*)()>(dlsym(lib, "fake_hip_last_ipc_flags"));
  ASSERT_NE(last_flags, nullptr);
  EXPECT_EQ(last_flags(), (*api)->abi.major >= 6 ? 1u : 0u);
  dlclose(lib);

  region->reset();
  rank->reset();
  e->engine.reset();
  EXPECT_EQ((*api)->hipFree(p), hipSuccess);
}

TEST(HipRuntimeOnFake, RefusesWhereRocmWouldCopyWithKernels) {
  setenv("HSA_ENABLE_SDMA", "0", 1);
  auto e = CreateHip();
  unsetenv("HSA_ENABLE_SDMA");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
  EXPECT_NE(e.status().message().find("HSA_ENABLE_SDMA=0"), std::string::npos) << e.status();

  setenv("GPU_FORCE_BLIT_COPY_SIZE", "64", 1);
  e = CreateHip();
  unsetenv("GPU_FORCE_BLIT_COPY_SIZE");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
  EXPECT_NE(e.status().message().find("GPU_FORCE_BLIT_COPY_SIZE=64"), std::string::npos) << e.status();

  setenv("GPU_FORCE_BLIT_COPY_SIZE", "0", 1);  // 0: clr's default, no forced blits.
  e = CreateHip();
  unsetenv("GPU_FORCE_BLIT_COPY_SIZE");
  EXPECT_TRUE(e.ok()) << e.status();
}

}  // namespace
}  // namespace dmagather::server::engines
