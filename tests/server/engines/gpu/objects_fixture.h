// The GPU engine's objects on their own, over the fake runtime (CPU threads
// + memcpy): a FakeRuntime shared as the engine shares it, the device-order
// locks, and one job whose ranks are attached and whose buffers are
// imported through RankImports (rank_imports.h), with the ranks, ops and
// byte-for-byte checks of engine_fixture.h. Shared by the tests of
// rank_imports, router, in_flight_op and device_worker.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <utility>

#include "server/engines/gpu/device_order.h"
#include "server/engines/gpu/rank_imports.h"
#include "tests/fakes/fake_gpu_runtime.h"
#include "tests/server/engines/gpu/engine_fixture.h"

namespace dmagather::server::engines::gpu::objtest {

using enginetest::Job;
using enginetest::Log;
using enginetest::Rank;
using enginetest::TestOp;
using testing::FakeRuntime;

class ObjectsTest : public ::testing::Test {
 protected:
  void Start(FakeRuntime::Options fo) {
    auto rt = std::make_shared<FakeRuntime>(fo);
    fake_ = rt.get();
    runtime_ = rt;
    order_ = std::make_shared<DeviceOrder>(fo.devices, runtime_);
    imports_ = std::make_unique<RankImports>(runtime_, order_);
    imports_->Identify();
  }
  void TearDown() override {
    job_.ranks.clear();
    imports_.reset();
  }
  // A rank of the job on `device` (named by ordinal), with shards of
  // `shard` bytes in a world of `world`.
  Rank* AddRank(int device, uint64_t shard, int world) {
    job_.shard = shard;
    auto k = enginetest::NewRank(
        static_cast<int>(job_.ranks.size()), DeviceRef{fake_->device_kind(), device}, shard, world,
        fake_->ipc_memory_kind(), [&](const RankAttach& a) { return imports_->AttachRank(a); },
        [&](const RegionSpec& spec) { return imports_->Import(spec); });
    if (k == nullptr) return nullptr;
    job_.ranks.push_back(std::move(k));
    return job_.ranks.back().get();
  }
  std::shared_ptr<ImportedRegion> Import(const Rank& k, const void* p, uint64_t bytes) {
    auto r = imports_->Import(enginetest::IpcSpec(k, p, bytes, fake_->ipc_memory_kind()));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : nullptr;
  }
  // Waits (bounded) for the op's end; its status.
  static absl::Status Ended(TestOp& op) {
    return op.Wait() ? op.result : absl::DeadlineExceededError("the op did not end");
  }
  // Op `seq` of the job: fresh inputs, every rank ready, the plan.
  void Plan(TestOp* op, uint32_t seq) {
    job_.Fill(seq);
    job_.Plan(op, seq);
    job_.SetReady(seq);
  }

  FakeRuntime* fake_ = nullptr;
  std::shared_ptr<GpuRuntime> runtime_;
  std::shared_ptr<DeviceOrder> order_;
  std::unique_ptr<RankImports> imports_;
  Log log_;
  Job job_;
};

}  // namespace dmagather::server::engines::gpu::objtest
