// CreateEngine over the backend registry, in any build (with or without the
// CUDA toolkit): --backend=NAME for a backend this binary lacks says so and
// lists what it has; auto tries backends by priority and gives the reasons.
#include "server/engines/engine_registry.h"

#include <gtest/gtest.h>

#include <string>

#include "server/engines/factory.h"

namespace dmagather::server::engines {
namespace {

bool Registered(const std::string& name) {
  for (const EngineBackend& b : RegisteredEngines()) {
    if (b.name == name) return true;
  }
  return false;
}

TEST(EngineRegistry, HostIsAlwaysRegisteredAndLast) {
  const auto backends = RegisteredEngines();
  ASSERT_FALSE(backends.empty());
  EXPECT_EQ(backends.back().name, "host");
  for (size_t i = 1; i < backends.size(); ++i) EXPECT_GE(backends[i - 1].priority, backends[i].priority);
}

TEST(EngineRegistry, MissingBackendIsNotPartOfThisBuild) {
  std::string missing;
  for (const char* name : {"hip", "cuda"}) {
    if (!Registered(name)) missing = name;
  }
  if (missing.empty()) GTEST_SKIP() << "this build has every GPU backend";
  EngineOptions o;
  o.backend = missing;
  auto e = CreateEngine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(e.status().message().find("the " + missing + " backend is not part of this build"), std::string::npos)
      << e.status();
  EXPECT_NE(e.status().message().find("this dmagatherd has: "), std::string::npos) << e.status();
  EXPECT_NE(e.status().message().find("host"), std::string::npos) << e.status();
}

TEST(EngineRegistry, CudaWithoutTheToolkit) {
  if (Registered("cuda")) GTEST_SKIP() << "this build has the cuda backend";
  EngineOptions o;
  o.backend = "cuda";
  auto e = CreateEngine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(
      std::string(e.status().message())
          .find("the cuda backend is not part of this build (built without the CUDA toolkit); this dmagatherd has: "),
      0u)
      << e.status();
}

TEST(EngineRegistry, HipWithoutHip) {
  if (Registered("hip")) GTEST_SKIP() << "this build has the hip backend";
  EngineOptions o;
  o.backend = "hip";
  auto e = CreateEngine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(std::string(e.status().message())
                .find("the hip backend is not part of this build (built without HIP: libamdhip64-dev and "
                      "libhsa-runtime-dev were not found)"),
            std::string::npos)
      << e.status();
}

TEST(EngineRegistry, UnknownBackend) {
  EngineOptions o;
  o.backend = "tpu";
  auto e = CreateEngine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("unknown backend 'tpu'"), std::string::npos) << e.status();
}

TEST(EngineRegistry, AutoSkipsAFailingBackendWithItsReason) {
  EngineBackend b;
  b.name = "test_failing";
  b.priority = 1000;  // Tried first.
  b.unusable = "no usable test device";
  b.create = [](const EngineOptions&) -> absl::StatusOr<std::unique_ptr<CopyEngine>> {
    return absl::UnavailableError("none plugged in");
  };
  RegisterEngine(std::move(b));
  EngineOptions o;
  o.backend = "auto";
  auto e = CreateEngine(o);
  ASSERT_TRUE(e.ok()) << e.status();
  if (std::string(e->engine->name()) != "host") GTEST_SKIP() << "a GPU backend started: " << e->reason;
  EXPECT_EQ(e->reason.find("auto: no usable test device (none plugged in)"), 0u) << e->reason;
  EXPECT_NE(e->reason.find(", using host"), std::string::npos) << e->reason;

  o.backend = "test_failing";
  auto f = CreateEngine(o);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(std::string(f.status().message()), "--backend=test_failing: cannot use test_failing: none plugged in");
}

// --stay_awake_us: -1 takes the chosen backend's default (GPU backends
// 10 ms, host 0), any other value is passed as given, and CreateEngine says
// what it resolved to (the daemon's ingress takes the same).
TEST(EngineRegistry, StayAwakeIsTheBackendsDefaultUnlessSet) {
  static int64_t seen = -2;
  EngineBackend b;
  b.name = "test_awake";
  b.default_stay_awake_ns = 7'000'000;
  b.create = [](const EngineOptions& o) -> absl::StatusOr<std::unique_ptr<CopyEngine>> {
    seen = o.stay_awake_ns;
    return absl::UnavailableError("records its options only");
  };
  RegisterEngine(std::move(b));
  EngineOptions o;
  o.backend = "test_awake";
  EXPECT_FALSE(CreateEngine(o).ok());
  EXPECT_EQ(seen, 7'000'000) << "-1: the backend's default";
  o.stay_awake_ns = 0;
  EXPECT_FALSE(CreateEngine(o).ok());
  EXPECT_EQ(seen, 0) << "0 as given";

  o.backend = "host";
  o.stay_awake_ns = -1;
  auto host = CreateEngine(o);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->stay_awake_ns, 0u) << "the host backend sleeps between ops by default";
  o.stay_awake_ns = 5'000;
  host = CreateEngine(o);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->stay_awake_ns, 5'000u);
}

}  // namespace
}  // namespace dmagather::server::engines
