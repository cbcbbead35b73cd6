// The GPU engine's objects on their own, over the fake runtime (CPU threads
// + memcpy): a FakeRuntime shared as the engine shares it, the device-order
// locks, ranks attached and their buffers imported through RankImports
// (rank_imports.h), and ops whose plan copies every rank's shard into every
// other rank's output, checked byte for byte. Shared by the tests of
// rank_imports, router, in_flight_op and device_worker.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/engines/gpu/device_order.h"
#include "server/engines/gpu/rank_imports.h"
#include "tests/fakes/fake_gpu_runtime.h"

namespace dmagather::server::engines::gpu::objtest {

using testing::FakeRuntime;

// An op that records its end: how often, and with which status.
class RecordingOp : public EngineOp {
 public:
  void OnEngineDone(absl::Status status) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    result_ = std::move(status);
  }
  // Waits (bounded) until the op ended; its status.
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ > 0; };
    mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(60));
    return calls_ > 0 ? result_ : absl::DeadlineExceededError("the op did not end");
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status result_ ABSL_GUARDED_BY(mu_);
};

// One rank: its completion page (ready and done words), a shard to send and
// an output of world shards, both imported.
struct Rank {
  void* page = nullptr;
  uint32_t* ready = nullptr;
  uint32_t* done = nullptr;
  std::vector<char> send, recv;
  std::unique_ptr<EngineRank> er;
  std::shared_ptr<ImportedRegion> send_region, recv_region;
  ~Rank() {
    send_region.reset();
    recv_region.reset();
    er.reset();
    std::free(page);
  }
};

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
    ranks_.clear();
    imports_.reset();
  }
  // A rank on `device` (named by ordinal) with shards of `shard` bytes in a
  // world of `world`.
  Rank* AddRank(int device, uint64_t shard, int world) {
    auto k = std::make_unique<Rank>();
    k->page = std::aligned_alloc(4096, 4096);
    std::memset(k->page, 0, 4096);
    k->ready = static_cast<uint32_t*>(k->page);
    k->done = k->ready + 16;
    k->send.resize(shard);
    k->recv.assign(shard * world, static_cast<char>(0xEE));
    RankAttach a;
    a.rank = static_cast<int>(ranks_.size());
    a.device = DeviceRef{fake_->device_kind(), device};
    a.flag_pages = k->page;
    a.flag_bytes = 4096;
    a.ready_word = k->ready;
    a.done_word = k->done;
    auto er = imports_->AttachRank(a);
    EXPECT_TRUE(er.ok()) << er.status();
    if (!er.ok()) return nullptr;
    k->er = *std::move(er);
    k->send_region = Import(*k, k->send.data(), k->send.size());
    k->recv_region = Import(*k, k->recv.data(), k->recv.size());
    ranks_.push_back(std::move(k));
    return ranks_.back().get();
  }
  std::shared_ptr<ImportedRegion> Import(const Rank& k, const void* p, uint64_t bytes) {
    RegionSpec spec;
    spec.kind = fake_->ipc_memory_kind();
    spec.bytes = bytes;
    spec.handle = FakeRuntime::MakeHandle(p, bytes);
    spec.rank = k.er.get();
    auto r = imports_->Import(spec);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : nullptr;
  }
  static char Byte(uint32_t seq, int rank, uint64_t i) {
    return static_cast<char>((seq * 17 + rank * 29 + i * 7) & 0xff);
  }
  // Op `seq` of job `job` over every rank: fresh inputs, every shard into
  // every other rank's output, every rank ready.
  void Plan(EngineOp* op, uint64_t job, uint32_t seq) {
    const int w = static_cast<int>(ranks_.size());
    const uint64_t shard = ranks_[0]->send.size();
    op->job_id = job;
    op->seq = seq;
    op->plan.Clear();
    op->ranks.clear();
    for (int r = 0; r < w; ++r) {
      Rank& k = *ranks_[r];
      for (uint64_t i = 0; i < shard; ++i) k.send[i] = Byte(seq, r, i);
      __atomic_store_n(k.ready, seq, __ATOMIC_RELEASE);
      op->ranks.push_back(k.er.get());
    }
    for (int d = 0; d < w; ++d) {
      for (int s = 0; s < w; ++s) {
        if (s == d) continue;
        op->plan.copies.push_back(
            CopyCmd{ranks_[d]->recv_region->base() + s * shard, ranks_[s]->send_region->base(), shard, s, d});
        op->plan.bytes += shard;
      }
    }
  }
  // Output bytes of op `seq` that differ from what the plan copies.
  uint64_t Wrong(uint32_t seq) const {
    const int w = static_cast<int>(ranks_.size());
    const uint64_t shard = ranks_[0]->send.size();
    uint64_t wrong = 0;
    for (int d = 0; d < w; ++d) {
      for (int s = 0; s < w; ++s) {
        if (s == d) continue;
        for (uint64_t i = 0; i < shard; ++i) wrong += ranks_[d]->recv[s * shard + i] != Byte(seq, s, i);
      }
    }
    return wrong;
  }

  FakeRuntime* fake_ = nullptr;
  std::shared_ptr<GpuRuntime> runtime_;
  std::shared_ptr<DeviceOrder> order_;
  std::unique_ptr<RankImports> imports_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace dmagather::server::engines::gpu::objtest
