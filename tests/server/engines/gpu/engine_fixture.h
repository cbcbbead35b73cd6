// The GPU engine's test fixture on the fake runtime (CPU threads + memcpy):
// ranks with a completion page, inputs and outputs imported through the
// fake's IPC, jobs that fill, plan and check an AllGather byte for byte.
// Shared by gpu_engine_test (the engine's logic), gpu_devices_test (one
// rank per GPU: identities, routing, parallel issue), gpu_deadlock_test,
// hsa_engine_test, and (Rank, Job, NewRank) objects_fixture.h.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/engines/gpu/gpu_engine.h"
#include "tests/fakes/fake_gpu_runtime.h"

namespace dmagather::server::engines::gpu::enginetest {

using testing::FakeRuntime;

struct Flavor {
  const char* name;
  bool device_waits;
  uint64_t cap;
  uint64_t default_chunk;
};
const Flavor kCudaLike{"cuda_like", true, kCudaMaxTransferBytes, kCudaDefaultChunkBytes};
const Flavor kHipLike{"hip_like", false, kHipMaxTransferBytes, kHipDefaultChunkBytes};

// Completion log shared by every op of a test: (tag, seq) in the order
// OnEngineDone ran.
struct Log {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<int, uint32_t>> done;
};

class TestOp : public EngineOp {
 public:
  TestOp(Log* log, int tag) : log_(log), tag_(tag) {}
  void OnEngineDone(absl::Status status) override {
    std::lock_guard<std::mutex> lock(log_->mu);
    ++calls;
    result = std::move(status);
    log_->done.emplace_back(tag_, seq);
    log_->cv.notify_all();
  }
  // Waits (bounded) for the op's completion.
  bool Wait(int ms = 120000) {
    std::unique_lock<std::mutex> lock(log_->mu);
    return log_->cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return calls > 0; });
  }
  bool Done() {
    std::lock_guard<std::mutex> lock(log_->mu);
    return calls > 0;
  }
  int calls = 0;
  absl::Status result;

 private:
  Log* const log_;
  const int tag_;
};

// One rank: its device, completion page (ready word), input shard and
// output (world * shard bytes), imported through the fake's IPC.
struct Rank {
  int device = 0;
  void* page = nullptr;
  uint32_t* ready = nullptr;
  uint32_t* done = nullptr;  // Written by a device where the op asks for it (EngineOp::gpu_done).
  std::vector<char> send, recv;
  std::unique_ptr<EngineRank> er;
  std::shared_ptr<ImportedRegion> send_region, recv_region;
  ~Rank() { std::free(page); }
  void SetReady(uint32_t v) { __atomic_store_n(ready, v, __ATOMIC_RELEASE); }
  uint32_t Done() const { return __atomic_load_n(done, __ATOMIC_ACQUIRE); }
};

// A job: world ranks, shard bytes each, out-of-place inputs, in-place own
// shard (the engine never copies a rank onto itself).
struct Job {
  std::vector<std::unique_ptr<Rank>> ranks;
  uint64_t shard = 0;
  int id = 0;
  bool gpu_done = true;  // Ops ask the engine to write the ranks' done flags (where it can).
  // Every even op is an all-to-all of chunks of shard / world bytes (a
  // reduce-scatter's movement: chunk d of each send to rank d, landing as
  // chunk s of its output), the odd ones all-gathers.
  bool mixed = false;

  bool IsAllToAll(uint32_t seq) const { return mixed && seq % 2 == 0; }
  uint64_t Chunk() const { return shard / ranks.size(); }
  // What rank d's output holds at byte j after op `seq`.
  char Expected(uint32_t seq, int d, uint64_t j) const {
    if (!IsAllToAll(seq)) return Byte(id, seq, static_cast<int>(j / shard), j % shard);
    const uint64_t c = Chunk();
    return Byte(id, seq, static_cast<int>(j / c), d * c + j % c);
  }
  // The bytes of rank d's output op `seq` writes.
  uint64_t OutputBytes(uint32_t seq) const { return IsAllToAll(seq) ? Chunk() * ranks.size() : shard * ranks.size(); }
  // Rank r's own part of the output (its stream copies it, as the client does).
  void CopyOwn(int r, uint32_t seq) {
    Rank& k = *ranks[r];
    const uint64_t c = IsAllToAll(seq) ? Chunk() : shard;
    std::memcpy(k.recv.data() + r * c, k.send.data() + (IsAllToAll(seq) ? r * c : 0), c);
  }

  static char Byte(int job, uint32_t seq, int rank, uint64_t i) {
    return static_cast<char>((job * 131 + seq * 17 + rank * 29 + i * 7 + (i >> 12)) & 0xff);
  }
  // Fresh inputs for op `seq`; outputs poisoned except each rank's own shard.
  void Fill(uint32_t seq) {
    const int w = static_cast<int>(ranks.size());
    for (int r = 0; r < w; ++r) {
      Rank& k = *ranks[r];
      for (uint64_t i = 0; i < shard; ++i) k.send[i] = Byte(id, seq, r, i);
      std::memset(k.recv.data(), 0xEE, k.recv.size());
      std::memcpy(k.recv.data() + r * shard, k.send.data(), shard);
    }
  }
  // The plan the scheduler would build: every rank's shard into every
  // other rank's output.
  void Plan(EngineOp* op, uint32_t seq) {
    const int w = static_cast<int>(ranks.size());
    op->seq = seq;
    op->job_id = static_cast<uint64_t>(id) + 1;
    op->gpu_done = gpu_done;
    op->plan.Clear();
    op->ranks.clear();
    for (auto& r : ranks) op->ranks.push_back(r->er.get());
    const bool a2a = IsAllToAll(seq);
    const uint64_t c = a2a ? Chunk() : shard;
    for (int d = 0; d < w; ++d) {
      for (int s = 0; s < w; ++s) {
        if (s == d) continue;
        op->plan.copies.push_back(
            CopyCmd{ranks[d]->recv_region->base() + s * c, ranks[s]->send_region->base() + (a2a ? d * c : 0), c, s, d});
        op->plan.bytes += c;
      }
    }
  }
  // Number of output bytes that differ from the expected AllGather of op `seq`.
  uint64_t Wrong(uint32_t seq) const {
    const int w = static_cast<int>(ranks.size());
    uint64_t wrong = 0;
    for (int d = 0; d < w; ++d) {
      for (int s = 0; s < w; ++s) {
        for (uint64_t i = 0; i < shard; ++i) wrong += ranks[d]->recv[s * shard + i] != Byte(id, seq, s, i);
      }
    }
    return wrong;
  }
  // Output bytes still poisoned (never written), other than own shards.
  uint64_t Untouched() const {
    const int w = static_cast<int>(ranks.size());
    uint64_t n = 0;
    for (int d = 0; d < w; ++d) {
      for (int s = 0; s < w; ++s) {
        if (s == d) continue;
        for (uint64_t i = 0; i < shard; ++i) n += ranks[d]->recv[s * shard + i] == static_cast<char>(0xEE);
      }
    }
    return n;
  }
  void SetReady(uint32_t v) {
    for (auto& r : ranks) r->SetReady(v);
  }
};

// The spec of `bytes` at `p`, rank k's memory, as the fake's IPC handle.
inline RegionSpec IpcSpec(const Rank& k, const void* p, uint64_t bytes, const std::string& kind) {
  RegionSpec spec;
  spec.kind = kind;
  spec.bytes = bytes;
  spec.handle = FakeRuntime::MakeHandle(p, bytes);
  spec.rank = k.er.get();
  return spec;
}

// Rank r of a world of `world` on the device `ref` names: a completion page
// (ready word, done word on its own cache line, as in the segment), a shard
// to send and an output of world shards, attached with `attach` (RankAttach
// -> StatusOr<unique_ptr<EngineRank>>) and its buffers imported with
// `import` (RegionSpec -> StatusOr<shared_ptr<ImportedRegion>>). Null (and
// a test failure) where either fails.
template <typename Attach, typename ImportFn>
std::unique_ptr<Rank> NewRank(int r, const DeviceRef& ref, uint64_t shard, int world, const std::string& ipc_kind,
                              Attach&& attach, ImportFn&& import) {
  auto k = std::make_unique<Rank>();
  k->device = ref.ordinal;
  k->page = std::aligned_alloc(4096, 4096);
  std::memset(k->page, 0, 4096);
  k->ready = static_cast<uint32_t*>(k->page);
  k->done = k->ready + 16;  // Its own cache line, as in the segment.
  k->send.resize(shard);
  k->recv.resize(shard * world);
  RankAttach a;
  a.rank = r;
  a.device = ref;
  a.flag_pages = k->page;
  a.flag_bytes = 4096;
  a.ready_word = k->ready;
  a.done_word = k->done;
  auto er = attach(a);
  EXPECT_TRUE(er.ok()) << er.status();
  if (!er.ok()) return nullptr;
  k->er = *std::move(er);
  for (auto [region, buf] : {std::pair{&k->send_region, &k->send}, std::pair{&k->recv_region, &k->recv}}) {
    auto imported = import(IpcSpec(*k, buf->data(), buf->size(), ipc_kind));
    EXPECT_TRUE(imported.ok()) << imported.status();
    if (!imported.ok()) return nullptr;
    *region = *std::move(imported);
  }
  return k;
}

class GpuEngineTest : public ::testing::TestWithParam<Flavor> {
 protected:
  void Start(int devices, GpuEngine::Options eo = {}, uint64_t cap = 0) {
    FakeRuntime::Options fo;
    fo.devices = devices;
    Start(fo, eo, cap);
  }
  // With the fake's identities and peer matrix as the test sets them.
  void Start(FakeRuntime::Options fo, GpuEngine::Options eo = {}, uint64_t cap = 0) {
    fo.device_waits = GetParam().device_waits;
    fo.max_transfer_bytes = cap != 0 ? cap : GetParam().cap;
    fo.default_chunk_bytes = GetParam().default_chunk;
    auto rt = std::make_unique<FakeRuntime>(fo);
    fake_ = rt.get();
    auto e = GpuEngine::Create(std::move(rt), eo);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = *std::move(e);
  }
  // Runs op `seq` of `job` to completion (fresh inputs, every rank ready);
  // returns its status.
  absl::Status RunOp(Job& job, uint32_t seq) {
    job.Fill(seq);
    TestOp op(&log_, 0);
    job.Plan(&op, seq);
    job.SetReady(seq);
    engine_->Execute(&op);
    EXPECT_TRUE(op.Wait());
    return op.result;
  }
  // A job of `devices.size()` ranks, rank r on devices[r] (named by ordinal
  // only, as the rank's process and the daemon see the same devices).
  std::unique_ptr<Job> MakeJob(const std::vector<int>& devices, uint64_t shard) {
    std::vector<DeviceRef> refs;
    for (int d : devices) refs.push_back(DeviceRef{fake_->device_kind(), d});
    return MakeJob(refs, shard);
  }
  // A job whose ranks name their devices as given (ordinal as the rank sees
  // it, uuid, bus id).
  std::unique_ptr<Job> MakeJob(const std::vector<DeviceRef>& devices, uint64_t shard) {
    auto job = std::make_unique<Job>();
    job->shard = shard;
    job->id = next_job_++;
    const int w = static_cast<int>(devices.size());
    for (int r = 0; r < w; ++r) {
      auto k = NewRank(
          r, devices[r], shard, w, fake_->ipc_memory_kind(),
          [&](const RankAttach& a) { return engine_->AttachRank(a); },
          [&](const RegionSpec& spec) { return engine_->Import(spec); });
      if (k == nullptr) return nullptr;
      job->ranks.push_back(std::move(k));
    }
    return job;
  }
  std::shared_ptr<ImportedRegion> Import(const Rank& k, const void* p, uint64_t bytes) {
    auto r = engine_->Import(IpcSpec(k, p, bytes, fake_->ipc_memory_kind()));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : nullptr;
  }

  FakeRuntime* fake_ = nullptr;
  std::unique_ptr<GpuEngine> engine_;
  Log log_;
  int next_job_ = 1;
};

}  // namespace dmagather::server::engines::gpu::enginetest
