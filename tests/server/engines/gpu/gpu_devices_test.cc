// One rank per GPU - the design case - on the fake runtime with N devices:
// the daemon maps a rank's GPU by identity whatever the rank's own
// numbering, routes each copy by the peer table (pull, push, or FALLBACK
// with the reason), issues every device's share from the device's own
// thread at the same time, and gives each peer link its own stream. The
// fake logs which device issued every chunk and the owners of its ends, and
// faults a chunk that touches memory its device cannot reach, as hardware
// would; every test also checks the bytes.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "server/engines/gpu/gpu_engine.h"
#include "tests/fakes/fake_gpu_runtime.h"
#include "tests/server/engines/gpu/engine_fixture.h"

namespace dmagather::server::engines::gpu {
namespace {

using testing::FakeRuntime;

using enginetest::GpuEngineTest;
using enginetest::Job;
using enginetest::kCudaLike;
using enginetest::kHipLike;
using enginetest::TestOp;

// How a rank with one visible GPU names it: ordinal 0, and the device's
// identity.
DeviceRef OnlyVisible(const char* kind, int daemon_device) {
  DeviceRef r{kind, 0};
  r.uuid = FakeRuntime::FakeUuid(daemon_device);
  r.pci_bus_id = FakeRuntime::FakeBusId(daemon_device);
  return r;
}

class GpuDevicesTest : public GpuEngineTest {
 protected:
  FakeRuntime::Options Fake(int devices) {
    FakeRuntime::Options fo;
    fo.devices = devices;
    return fo;
  }
};

// Every rank sees one GPU and calls it 0; the daemon sees four. The ranks
// are on the daemon's devices 2 and 3: every copy must run there (on the
// destination's device, reading the peer), none on device 0, and no copy is
// a same-device copy.
TEST_P(GpuDevicesTest, RanksThatEachSeeOneGpuMapToTheDaemonsDevices) {
  Start(Fake(4));
  auto job = MakeJob(std::vector<DeviceRef>{OnlyVisible(fake_->device_kind(), 2), OnlyVisible(fake_->device_kind(), 3)},
                     100000);
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(RunOp(*job, 1).ok());
  EXPECT_EQ(job->Wrong(1), 0u);
  const EngineStats st = engine_->stats();
  EXPECT_EQ(st.same_device_copies, 0u);
  // Which GPU ran the copies (dmagatherctl stats, "copy engines"): each of
  // devices 2 and 3 pulled its peer's shard; devices 0 and 1 ran nothing.
  ASSERT_EQ(st.copy_engines.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(st.copy_engines[i].device, static_cast<int>(2 + i));
    EXPECT_EQ(st.copy_engines[i].engine, -1);
    EXPECT_EQ(st.copy_engines[i].bytes, 100000u);
  }
  const auto log = fake_->chunk_log();
  ASSERT_FALSE(log.empty());
  for (const auto& c : log) {
    EXPECT_EQ(c.device, c.dst_owner) << "a pull runs on the destination's device";
    EXPECT_TRUE((c.src_owner == 2 && c.dst_owner == 3) || (c.src_owner == 3 && c.dst_owner == 2))
        << "chunk between devices " << c.src_owner << " and " << c.dst_owner << " issued on " << c.device;
  }
}

// A rank whose GPU the daemon does not see is refused at join with the
// reason (a FALLBACK: the framework's collective serves the job); a uuid of
// the wrong size is a bad request; a rank that names only its bus id is
// mapped by it; one that names nothing is trusted by ordinal, and its
// ordinal is still checked.
TEST_P(GpuDevicesTest, AttachMapsByUuidThenBusIdAndRefusesWhatDoesNotMap) {
  Start(Fake(3));
  alignas(4096) static uint32_t page[1024];
  RankAttach a;
  a.flag_pages = page;
  a.flag_bytes = sizeof(page);
  a.ready_word = page;
  a.device = DeviceRef{fake_->device_kind(), 0};
  a.device.uuid = FakeRuntime::FakeUuid(7);
  auto r = engine_->AttachRank(a);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(common::IsFallback(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("is not one of the 3 device(s) dmagatherd sees"), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find(FormatDeviceUuid(FakeRuntime::FakeUuid(7))), std::string::npos) << r.status();

  a.device.uuid = "short";
  EXPECT_EQ(engine_->AttachRank(a).status().code(), absl::StatusCode::kInvalidArgument);

  // By bus id (no uuid): device 2, whatever the rank calls it.
  auto job = MakeJob(std::vector<DeviceRef>{DeviceRef{fake_->device_kind(), 0, "", FakeRuntime::FakeBusId(2)},
                                            DeviceRef{fake_->device_kind(), 0, "", FakeRuntime::FakeBusId(1)}},
                     8192);
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(RunOp(*job, 1).ok());
  EXPECT_EQ(job->Wrong(1), 0u);
  std::set<int> issued_on;
  for (const auto& c : fake_->chunk_log()) issued_on.insert(c.device);
  EXPECT_EQ(issued_on, (std::set<int>{1, 2}));

  a.device = DeviceRef{fake_->device_kind(), 5};  // No identity: the ordinal, checked.
  EXPECT_EQ(engine_->AttachRank(a).status().code(), absl::StatusCode::kInvalidArgument);
}

// Device 0 cannot reach device 1, but 1 reaches 0: copies into rank 0's
// output are pushed from device 1 (a pull on 0 would fault); copies into
// rank 1's output are pulled on 1 as usual.
TEST_P(GpuDevicesTest, APairReachableOneWayIsPushedFromTheSideThatReaches) {
  FakeRuntime::Options fo = Fake(2);
  fo.peer = [](int from, int to) -> absl::StatusOr<bool> { return !(from == 0 && to == 1); };
  Start(fo);
  EXPECT_FALSE(engine_->peers().ok(0, 1));
  EXPECT_TRUE(engine_->peers().ok(1, 0));
  EXPECT_EQ(engine_->IssuingDevice(/*src=*/1, /*dst=*/0), 1);
  EXPECT_EQ(engine_->IssuingDevice(/*src=*/0, /*dst=*/1), 1);
  auto job = MakeJob({0, 1}, 70001);
  ASSERT_NE(job, nullptr);
  for (uint32_t seq = 1; seq <= 2; ++seq) {
    absl::Status st = RunOp(*job, seq);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(job->Wrong(seq), 0u);
  }
  for (const auto& c : fake_->chunk_log()) EXPECT_EQ(c.device, 1) << "device 0 cannot reach device 1's memory";
}

// Neither way (the driver refuses one direction with an error, the other
// has no peer access): the engine still starts, the pair is marked with
// the reason, an op between them is a FALLBACK that names both ranks and
// issues nothing, and ops between other devices go on.
TEST_P(GpuDevicesTest, APairReachableNeitherWayIsAFallbackWithTheReason) {
  FakeRuntime::Options fo = Fake(3);
  fo.peer = [](int from, int to) -> absl::StatusOr<bool> {
    if (from == 0 && to == 1) return absl::InternalError("peer mapping resources exhausted");
    return !(from == 1 && to == 0);
  };
  Start(fo);
  EXPECT_NE(engine_->peers().why(0, 1).find("peer mapping resources exhausted"), std::string::npos);
  EXPECT_EQ(engine_->IssuingDevice(0, 1), -1);
  auto job = MakeJob({0, 1}, 4096);
  ASSERT_NE(job, nullptr);
  absl::Status st = RunOp(*job, 1);
  EXPECT_TRUE(common::IsFallback(st)) << st;
  EXPECT_NE(st.message().find("reach each other neither way"), std::string::npos) << st;
  EXPECT_TRUE(fake_->chunk_log().empty());
  auto other = MakeJob({0, 2}, 4096);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(RunOp(*other, 1).ok());
  EXPECT_EQ(other->Wrong(1), 0u);
}

// A probe copy that fails marks its pair unreachable; two devices with one
// PCI bus id are partitions (MIG) of one GPU and never peers.
TEST_P(GpuDevicesTest, AFailedProbeAndMigPartitionsAreNotPeers) {
  FakeRuntime::Options fo = Fake(4);
  fo.probe = [](int from, int to) {
    return from == 2 && to == 3 ? absl::DataLossError("probe bytes differ") : absl::OkStatus();
  };
  fo.bus_ids[0] = "0000:aa:00.0";
  fo.bus_ids[1] = "0000:AA:00.0";
  Start(fo);
  EXPECT_FALSE(engine_->peers().ok(2, 3));
  EXPECT_NE(engine_->peers().why(2, 3).find("probe bytes differ"), std::string::npos);
  EXPECT_TRUE(engine_->peers().ok(3, 2));
  EXPECT_FALSE(engine_->peers().ok(0, 1));
  EXPECT_FALSE(engine_->peers().ok(1, 0));
  EXPECT_NE(engine_->peers().why(0, 1).find("MIG"), std::string::npos);
  EXPECT_FALSE(fake_->peer_enabled(0, 1)) << "partitions are not even asked";
  auto job = MakeJob({0, 1}, 4096);
  ASSERT_NE(job, nullptr);
  EXPECT_TRUE(common::IsFallback(RunOp(*job, 1)));
}

// Eight devices, one rank each: every device's copy calls come from a
// thread of its own, one thread per device. (No barrier on concurrent first
// calls: calls that touch a common device are serialised by the
// device-order locks, device_order.h, and a chain of such waits around the
// ring can leave a single call running, so any count above one could time
// out under load; seen in a CI run.)
TEST_P(GpuDevicesTest, EightDevicesAreIssuedInParallelEachByItsOwnThread) {
  Start(Fake(8));
  EXPECT_TRUE(engine_->parallel_issue());
  EXPECT_EQ(engine_->streams_per_device(), 7);  // Automatic: one per peer.
  auto job = MakeJob({0, 1, 2, 3, 4, 5, 6, 7}, 50000);
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(RunOp(*job, 1).ok());
  EXPECT_EQ(job->Wrong(1), 0u);
  std::map<int, std::set<std::thread::id>> threads;
  std::set<std::thread::id> all;
  for (const auto& call : fake_->call_log()) {
    threads[call.device].insert(call.thread);
    all.insert(call.thread);
  }
  EXPECT_EQ(threads.size(), 8u);
  for (const auto& [device, ids] : threads) EXPECT_EQ(ids.size(), 1u) << "device " << device;
  EXPECT_EQ(all.size(), 8u);
  // Later ops, many of them, stay bit-exact and in order.
  for (uint32_t seq = 2; seq <= 20; ++seq) {
    ASSERT_TRUE(RunOp(*job, seq).ok());
    EXPECT_EQ(job->Wrong(seq), 0u) << "op " << seq;
  }
}

// A device that pulls from several peers gives each link its own stream
// (copies on one stream, or in a copy graph's chain, run one after
// another), and a link's chunks stay on its stream: 4 devices, each copy cut
// into 4 chunks, 4 streams per device.
TEST_P(GpuDevicesTest, EachPeerLinkGetsItsOwnStream) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 16 << 10;
  Start(Fake(4), eo);
  ASSERT_EQ(engine_->streams_per_device(), 4);
  auto job = MakeJob({0, 1, 2, 3}, 64 << 10);
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(RunOp(*job, 1).ok());
  EXPECT_EQ(job->Wrong(1), 0u);
  std::map<int, std::map<int, std::set<GpuStream>>> streams_by_src;  // device -> source -> streams
  for (const auto& call : fake_->call_log()) {
    for (int src : call.src_owners) streams_by_src[call.device][src].insert(call.stream);
    EXPECT_FALSE(call.sole_stream) << "device " << call.device << ": a call beside other streams said it was alone";
  }
  ASSERT_EQ(streams_by_src.size(), 4u);
  for (const auto& [device, by_src] : streams_by_src) {
    EXPECT_EQ(by_src.size(), 3u) << "device " << device << " pulls from its 3 peers";
    std::set<GpuStream> used;
    for (const auto& [src, streams] : by_src) {
      EXPECT_EQ(streams.size(), 1u) << "device " << device << ": the link from " << src << " spans streams";
      used.insert(streams.begin(), streams.end());
    }
    EXPECT_EQ(used.size(), 3u) << "device " << device << ": links share a stream";
  }
}

// An op whose share of a device goes out on one stream tells the runtime
// so with each copy call (it may then chain them, GpuRuntime::Copy); two
// devices, one link each, a small op.
TEST_P(GpuDevicesTest, ACallOnItsOpsOnlyStreamSaysSo) {
  Start(Fake(2));
  auto job = MakeJob({0, 1}, 4096);
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(RunOp(*job, 1).ok());
  EXPECT_EQ(job->Wrong(1), 0u);
  const auto calls = fake_->call_log();
  ASSERT_FALSE(calls.empty());
  for (const auto& call : calls) EXPECT_TRUE(call.sole_stream) << "device " << call.device;
}

INSTANTIATE_TEST_SUITE_P(Runtimes, GpuDevicesTest, ::testing::Values(kCudaLike, kHipLike),
                         [](const ::testing::TestParamInfo<enginetest::Flavor>& i) {
                           return std::string(i.param.name);
                         });

}  // namespace
}  // namespace dmagather::server::engines::gpu
