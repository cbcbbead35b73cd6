// The run-time choice of HIP values per ROCm major (common/hip HipAbi), on
// the fake libamdhip64 (fake_amdhip64.cc) answering as ROCm 5.x, 6.0, 6.1,
// 6.3, 7.0 (built without hipStreamGetId, as 7.0's library), 7.1 and 7.2:
// the library is found by soname newest first, its version picks the
// values, the fake accepts what the real runtime of that major would, and
// an unknown major is refused with the reason. Built
// against whatever HIP headers the build uses (5.2 in CI, 6.x/7.x in
// tools/check_hip_build.sh): the answers must not depend on them.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/hip/hip_api.h"

namespace dmagather::common::hip {
namespace {

// The fake; libfake_amdhip64_rocm70.so lacks hipStreamGetId, as ROCm 7.0's library.
std::string FakeLib(const std::string& name = "libfake_amdhip64.so") {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir != nullptr ? srcdir : ".") + "/dmagather/tests/fakes/" + name;
}

// Loads the fake as the runtime of `version`.
std::unique_ptr<HipLibrary> LoadAs(int version, const std::string& path = FakeLib()) {
  setenv("DMAGATHER_FAKE_HIP_VERSION", std::to_string(version).c_str(), 1);
  auto lib = LoadHip({path});
  EXPECT_TRUE(lib.ok()) << lib.status();
  return lib.ok() ? *std::move(lib) : nullptr;
}

// What the fake (as that runtime) says of the values the loader chose.
struct Seen {
  unsigned int memory_type = 0;
  hipError_t ipc_open = hipErrorUnknown;
  int memcpy_kind = -1;
};
Seen Exercise(const HipApi& a, const std::string& path = FakeLib()) {
  Seen seen;
  void* p = nullptr;
  EXPECT_EQ(a.hipMalloc(&p, 256), hipSuccess);
  EXPECT_EQ(a.hipPointerGetAttribute(&seen.memory_type, HIP_POINTER_ATTRIBUTE_MEMORY_TYPE, p), hipSuccess);
  hipIpcMemHandle_t h;
  EXPECT_EQ(a.hipIpcGetMemHandle(&h, p), hipSuccess);
  void* opened = nullptr;
  seen.ipc_open = a.hipIpcOpenMemHandle(&opened, h, a.abi.ipc_lazy_enable_peer_access);
  char src[8] = "abcdefg", dst[8] = {};
  EXPECT_EQ(a.hipMemcpyAsync(dst, src, sizeof(src), static_cast<hipMemcpyKind>(a.abi.d2d_kind), nullptr), hipSuccess);
  EXPECT_STREQ(dst, "abcdefg");
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  auto kind = reinterpret_cast<int (*)()>(dlsym(lib, "fake_hip_last_memcpy_kind"));
  seen.memcpy_kind = kind != nullptr ? kind() : -2;
  dlclose(lib);
  EXPECT_EQ(a.hipFree(p), hipSuccess);
  return seen;
}

TEST(HipAbi, Rocm5) {
  auto lib = LoadAs(50221153);  // 5.2.3 (Debian 12).
  ASSERT_NE(lib, nullptr);
  const HipAbi& abi = lib->api.abi;
  EXPECT_EQ(abi.major, 5);
  EXPECT_EQ(abi.minor, 2);
  EXPECT_EQ(abi.memory_type_device, 1u);
  EXPECT_EQ(abi.ipc_lazy_enable_peer_access, 0u);
  EXPECT_EQ(abi.d2d_kind, 3);
  EXPECT_STREQ(abi.d2d_kind_name, "hipMemcpyDeviceToDevice");
  EXPECT_EQ(abi.stream_check, StreamCheck::kGetFlags);
  EXPECT_EQ(lib->api.hipStreamGetId, nullptr);
  EXPECT_EQ(lib->description, "libfake_amdhip64.so (HIP runtime 50221153, ROCm 5.2)");
  const Seen seen = Exercise(lib->api);
  EXPECT_EQ(seen.memory_type, abi.memory_type_device);
  EXPECT_EQ(seen.ipc_open, hipSuccess);
  EXPECT_EQ(seen.memcpy_kind, 3);
}

TEST(HipAbi, Rocm6_0HasNoNoCuKind) {
  auto lib = LoadAs(60032830);  // 6.0.0: hipMemoryType renumbered, no NoCU yet.
  ASSERT_NE(lib, nullptr);
  const HipAbi& abi = lib->api.abi;
  EXPECT_EQ(abi.memory_type_device, 2u);
  EXPECT_EQ(abi.ipc_lazy_enable_peer_access, 1u);
  EXPECT_EQ(abi.d2d_kind, 3);
  EXPECT_STREQ(abi.d2d_kind_name, "hipMemcpyDeviceToDevice");
  EXPECT_EQ(abi.stream_check, StreamCheck::kGetFlags);
  const Seen seen = Exercise(lib->api);
  EXPECT_EQ(seen.memory_type, 2u);
  EXPECT_EQ(seen.ipc_open, hipSuccess);
  EXPECT_EQ(seen.memcpy_kind, 3);
}

TEST(HipAbi, Rocm6) {
  for (int version : {60140091, 60342131}) {  // 6.1.0, 6.3.0.
    SCOPED_TRACE(version);
    auto lib = LoadAs(version);
    ASSERT_NE(lib, nullptr);
    const HipAbi& abi = lib->api.abi;
    EXPECT_EQ(abi.major, 6);
    EXPECT_EQ(abi.memory_type_device, 2u);
    EXPECT_EQ(abi.ipc_lazy_enable_peer_access, 1u);
    EXPECT_EQ(abi.d2d_kind, 1024);
    EXPECT_STREQ(abi.d2d_kind_name, "hipMemcpyDeviceToDeviceNoCU");
    EXPECT_EQ(abi.stream_check, StreamCheck::kGetFlags);
    const Seen seen = Exercise(lib->api);
    EXPECT_EQ(seen.memory_type, 2u);
    EXPECT_EQ(seen.ipc_open, hipSuccess);
    EXPECT_EQ(seen.memcpy_kind, 1024);
  }
}

// ROCm 7.0's library has no hipStreamGetId (new in 7.1) and its
// hipStreamGetFlags no longer checks the handle: streams are checked with
// hipStreamGetDevice, and a library without hipStreamGetId loads.
TEST(HipAbi, Rocm7_0ChecksStreamsWithGetDevice) {
  const std::string path = FakeLib("libfake_amdhip64_rocm70.so");
  for (int version : {70025000, 70051831}) {  // 7.0 (two build numbers).
    SCOPED_TRACE(version);
    auto lib = LoadAs(version, path);
    ASSERT_NE(lib, nullptr);
    const HipAbi& abi = lib->api.abi;
    EXPECT_EQ(abi.major, 7);
    EXPECT_EQ(abi.minor, 0);
    EXPECT_EQ(abi.memory_type_device, 2u);
    EXPECT_EQ(abi.ipc_lazy_enable_peer_access, 1u);
    EXPECT_EQ(abi.d2d_kind, 1024);
    EXPECT_EQ(abi.stream_check, StreamCheck::kGetDevice);
    EXPECT_EQ(lib->api.hipStreamGetId, nullptr);
    ASSERT_NE(lib->api.hipStreamGetDevice, nullptr);
    hipDevice_t device = -1;
    EXPECT_EQ(lib->api.hipStreamGetDevice(reinterpret_cast<hipStream_t>(0x1234), &device), hipErrorContextIsDestroyed);
    EXPECT_EQ(lib->api.hipStreamGetDevice(nullptr, &device), hipSuccess);
    const Seen seen = Exercise(lib->api, path);
    EXPECT_EQ(seen.memory_type, 2u);
    EXPECT_EQ(seen.ipc_open, hipSuccess);
    EXPECT_EQ(seen.memcpy_kind, 1024);
  }
}

TEST(HipAbi, Rocm7_1ChecksStreamsWithGetId) {
  for (int version : {70125830, 70200000}) {  // 7.1, 7.2.
    SCOPED_TRACE(version);
    auto lib = LoadAs(version);
    ASSERT_NE(lib, nullptr);
    const HipAbi& abi = lib->api.abi;
    EXPECT_EQ(abi.major, 7);
    EXPECT_EQ(abi.memory_type_device, 2u);
    EXPECT_EQ(abi.ipc_lazy_enable_peer_access, 1u);
    EXPECT_EQ(abi.d2d_kind, 1024);
    EXPECT_EQ(abi.stream_check, StreamCheck::kGetId);
    EXPECT_EQ(lib->api.hipStreamGetDevice, nullptr);
    ASSERT_NE(lib->api.hipStreamGetId, nullptr);
    unsigned long long id = 0;
    EXPECT_EQ(lib->api.hipStreamGetId(reinterpret_cast<hipStream_t>(0x1234), &id), hipErrorInvalidResourceHandle);
    const Seen seen = Exercise(lib->api);
    EXPECT_EQ(seen.memory_type, 2u);
    EXPECT_EQ(seen.ipc_open, hipSuccess);
    EXPECT_EQ(seen.memcpy_kind, 1024);
  }
}

// A 7.1 library without hipStreamGetId is refused, naming the call.
TEST(HipAbi, Rocm7_1WithoutGetIdIsRefused) {
  setenv("DMAGATHER_FAKE_HIP_VERSION", "70125830", 1);
  auto lib = LoadHip({FakeLib("libfake_amdhip64_rocm70.so")});
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(lib.status().message().find("lacks hipStreamGetId, which checks streams on ROCm 7.1"), std::string::npos)
      << lib.status();
}

// The values of the wrong major are what broke: 5.x's IPC flag on a 6.x
// runtime fails every import, 5.x's device type on 6.x rejects every buffer.
TEST(HipAbi, TheOtherMajorsValuesAreRejectedByTheFake) {
  auto lib = LoadAs(60342131);
  ASSERT_NE(lib, nullptr);
  HipApi a = lib->api;
  a.abi = *HipAbiFor(50221153);
  const Seen seen = Exercise(a);
  EXPECT_EQ(seen.ipc_open, hipErrorInvalidValue);
  EXPECT_NE(seen.memory_type, a.abi.memory_type_device);
}

TEST(HipAbi, UnknownMajorsAreRefusedWithTheReason) {
  for (int version : {40500000, 80000000, 0, -1}) {
    SCOPED_TRACE(version);
    auto abi = HipAbiFor(version);
    ASSERT_FALSE(abi.ok());
    EXPECT_EQ(abi.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(abi.status().message().find("is not one this build knows (ROCm 5.x to 7.x)"), std::string::npos)
        << abi.status();
  }
  setenv("DMAGATHER_FAKE_HIP_VERSION", "80012345", 1);
  auto lib = LoadHip({FakeLib()});
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(lib.status().message().find("libfake_amdhip64.so: HIP runtime version 80012345 (ROCm 8.0)"),
            std::string::npos)
      << lib.status();
}

TEST(HipAbi, LibraryIsFoundBySonameNewestFirst) {
  unsetenv("DMAGATHER_HIP_LIB");
  EXPECT_EQ(HipLibraryCandidates(),
            (std::vector<std::string>{"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"}));
  setenv("DMAGATHER_HIP_LIB", "/opt/rocm-7.1.0/lib/libamdhip64.so.7", 1);
  EXPECT_EQ(HipLibraryCandidates(), (std::vector<std::string>{"/opt/rocm-7.1.0/lib/libamdhip64.so.7"}));
  unsetenv("DMAGATHER_HIP_LIB");

  // The first candidate that opens is taken.
  setenv("DMAGATHER_FAKE_HIP_VERSION", "70125830", 1);
  auto lib = LoadHip({"/nonexistent/libamdhip64.so.7", FakeLib(), "/nonexistent/libamdhip64.so.5"});
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_EQ((*lib)->path, FakeLib());

  // None opens: every one tried is named.
  auto none = LoadHip({"/nonexistent/libamdhip64.so.7", "/nonexistent/libamdhip64.so.6"});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  const std::string m(none.status().message());
  EXPECT_EQ(m.find("cannot load libamdhip64"), 0u) << m;
  EXPECT_NE(m.find("/nonexistent/libamdhip64.so.7"), std::string::npos) << m;
  EXPECT_NE(m.find("/nonexistent/libamdhip64.so.6"), std::string::npos) << m;
}

}  // namespace
}  // namespace dmagather::common::hip
