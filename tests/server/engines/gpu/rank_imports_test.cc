// RankImports on the fake runtime: a rank's device found by uuid, by bus id
// or by its ordinal; a device the daemon does not see refused as FALLBACK;
// the import cache opens an allocation once however often it is imported
// and closes it with its last holder; a rank's flags registered once and
// unregistered with the rank.
#include "server/engines/gpu/rank_imports.h"

#include <gtest/gtest.h>

#include "common/status.h"
#include "server/engines/gpu/gpu_rank.h"
#include "tests/server/engines/gpu/objects_fixture.h"

namespace dmagather::server::engines::gpu::objtest {
namespace {

using RankImportsTest = ObjectsTest;

TEST_F(RankImportsTest, ADeviceIsFoundByUuidThenBusIdThenOrdinal) {
  FakeRuntime::Options fo;
  fo.devices = 4;
  Start(fo);
  // The rank sees one GPU (its ordinal 0): the identity names the daemon's.
  DeviceRef by_uuid{fake_->device_kind(), 0, FakeRuntime::FakeUuid(2), ""};
  auto d = imports_->DaemonDevice(by_uuid);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, 2);
  DeviceRef by_bus{fake_->device_kind(), 0, "", FakeRuntime::FakeBusId(3)};
  d = imports_->DaemonDevice(by_bus);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, 3);
  DeviceRef by_ordinal{fake_->device_kind(), 1, "", ""};
  d = imports_->DaemonDevice(by_ordinal);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, 1);
  EXPECT_EQ(imports_->identity(2).uuid, FakeRuntime::FakeUuid(2));
}

TEST_F(RankImportsTest, ADeviceTheDaemonDoesNotSeeIsAFallback) {
  FakeRuntime::Options fo;
  fo.devices = 2;
  Start(fo);
  std::string other(16, '\x42');
  auto d = imports_->DaemonDevice(DeviceRef{fake_->device_kind(), 0, other, ""});
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(common::IsFallback(d.status())) << d.status();
  d = imports_->DaemonDevice(DeviceRef{fake_->device_kind(), 0, "short", ""});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
  d = imports_->DaemonDevice(DeviceRef{fake_->device_kind(), 5, "", ""});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << "ordinal 5 of 2 devices: " << d.status();
  RankAttach a;
  a.device = DeviceRef{"not-" + std::string(fake_->device_kind()), 0};
  EXPECT_TRUE(common::IsFallback(imports_->AttachRank(a).status()));
}

TEST_F(RankImportsTest, AnAllocationIsOpenedOnceAndClosedWithItsLastHolder) {
  FakeRuntime::Options fo;
  fo.devices = 2;
  Start(fo);
  Rank* k = AddRank(1, 4096, 2);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(AsGpu(k->er.get())->device(), 1);
  EXPECT_EQ(fake_->flags_registered(), 1);
  const int opened = fake_->ipc_opens();
  EXPECT_EQ(fake_->ipc_open_now(), 2) << "send and recv";
  auto again = Import(*k, k->send.data(), k->send.size());
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->base(), k->send_region->base());
  EXPECT_EQ(fake_->ipc_opens(), opened) << "the cache answered";
  k->send_region.reset();
  EXPECT_EQ(fake_->ipc_open_now(), 2) << "still held";
  again.reset();
  EXPECT_EQ(fake_->ipc_open_now(), 1) << "closed with its last holder";
  // Opened again (a new open) once it was closed.
  auto third = Import(*k, k->send.data(), k->send.size());
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(fake_->ipc_opens(), opened + 1);
  RegionSpec bad;
  bad.kind = fake_->ipc_memory_kind();
  bad.bytes = 16;
  bad.handle = "too short";
  bad.rank = k->er.get();
  EXPECT_EQ(imports_->Import(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.rank = nullptr;
  EXPECT_EQ(imports_->Import(bad).status().code(), absl::StatusCode::kInvalidArgument);
  third.reset();
  job_.ranks.clear();
  EXPECT_EQ(fake_->flags_registered(), 0) << "unregistered with the rank";
  EXPECT_EQ(fake_->ipc_open_now(), 0);
}

}  // namespace
}  // namespace dmagather::server::engines::gpu::objtest
