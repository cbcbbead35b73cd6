// The ingress pipeline's test fixture: ranks whose segments are written as
// a client writes them, over fake regions and a fake engine that completes
// ops when the test says (pipeline_test.cc, alltoall_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "abi/descriptor_v2.h"
#include "abi/graph_v1.h"
#include "abi/ring_v1.h"
#include "common/clock.h"
#include "common/memfd.h"
#include "server/ingress/ingress.h"
#include "server/scheduler/job.h"
#include "tests/fakes/fake_copy_engine.h"

namespace dmagather::testing {

using server::engines::testing::FakeCopyEngine;
using server::engines::testing::FakeRegion;
using server::ingress::Ingress;
using server::ingress::JobFeed;
using server::ingress::kPersistentIdlePollNs;
using server::ingress::kPersistentPollNs;
using server::ingress::PersistentPollNs;
using server::ingress::RankInput;
using server::scheduler::Job;
using server::scheduler::Rank;

// A rank as the daemon sees it: a segment written the way a client writes
// it (the scheduler's Rank and the ingress side's RankInput over it), and
// one 64 KiB buffer as region (100 + rank).
struct FakeRank {
  FakeRank(int rank, FakeCopyEngine* engine) {
    seg = *common::MemfdMapping::Create("test-seg", abi::SegmentLayoutV1::kBytes);
    abi::InitSegmentV1(seg.data(), 42 + rank);
    session = std::make_shared<Rank>(rank, 1000 + rank, 0, view().completion,
                                     std::make_unique<server::engines::EngineRank>());
    input = std::make_shared<RankInput>(session, view());
    region = std::make_shared<FakeRegion>(1 << 16);
    input->regions.Add(100 + rank, region);
  }
  abi::SegmentViewV1 view() { return abi::SegmentViewV1::At(seg.data()); }
  // Publishes an in-place flat allgather of `count` uint8 at output offset `out`.
  void Submit(uint64_t count, uint64_t out = 0, uint32_t region_id = 0) {
    abi::DescriptorV1 d{};
    d.stamp = abi::kDescriptorStampV1;
    d.op = abi::kOpAllGather;
    d.seq = ++seq;
    d.dtype = 0;
    d.count = count;
    d.submit_ns = common::MonotonicNs();
    const uint32_t rid = region_id != 0 ? region_id : 100 + session->rank();
    d.send = {rid, 0, out + session->rank() * count};
    d.num_recv = 1;
    d.recv[0] = {rid, 0, out};
    abi::RingV1* ring = view().ring;
    view().slots[ring->tail % abi::kRingSlotsV1] = d;
    abi::StoreRelease(&ring->tail, ring->tail + 1);
  }
  // Publishes one coalesced v2 op: item i is an in-place flat allgather of
  // counts[i] uint8 at output offset outs[i].
  void SubmitCoalesced(const std::vector<uint64_t>& counts, const std::vector<uint64_t>& outs) {
    ++seq;
    const uint32_t rid = 100 + session->rank();
    for (size_t i = 0; i < counts.size(); ++i) {
      abi::DescriptorV2 d{};
      d.stamp = abi::kDescriptorStampV2;
      d.op = abi::kOpAllGatherV2;
      d.seq = seq;
      d.count = counts[i];
      d.items_following = static_cast<uint32_t>(counts.size() - 1 - i);
      d.send = {rid, 0, outs[i] + session->rank() * counts[i]};
      d.num_recv = 1;
      d.recv[0] = {rid, 0, outs[i]};
      Publish(&d);
    }
  }
  // Publishes the definition of a persistent (graph-captured) in-place flat
  // allgather of `count` uint8 in graph slot `slot`.
  void SubmitCaptured(uint64_t count, uint32_t slot) {
    abi::DescriptorV2 d{};
    d.stamp = abi::kDescriptorStampV2;
    d.op = abi::kOpAllGatherV2 | abi::kOpPersistentBit | (slot << abi::kOpPersistentSlotShift);
    d.seq = ++seq;
    d.count = count;
    const uint32_t rid = 100 + session->rank();
    d.send = {rid, 0, session->rank() * count};
    d.num_recv = 1;
    d.recv[0] = {rid, 0, 0};
    Publish(&d);
  }
  // Publishes an all-to-all kind `op` (abi::kOpAllToAllV2 or a
  // reduce-scatter) of `count` elements of `dtype` in the rank's region:
  // send at `send`, output at `recv` (byte offsets), with those strides.
  void SubmitAllToAll(uint32_t op, uint64_t count, uint64_t send, uint64_t recv, uint64_t send_stride,
                      uint64_t recv_stride, uint32_t flags = 0, uint32_t dtype = 0) {
    abi::DescriptorV2 d{};
    d.stamp = abi::kDescriptorStampV2;
    d.op = op;
    d.seq = ++seq;
    d.dtype = dtype;
    d.count = count;
    const uint32_t rid = 100 + session->rank();
    d.send = {rid, 0, send};
    d.num_recv = 1;
    d.a2a.recv = {rid, 0, recv};
    d.a2a.send_stride = send_stride;
    d.a2a.recv_stride = recv_stride;
    d.a2a.flags = flags;
    Publish(&d);
  }
  abi::GraphFlagsV1* graph() { return abi::GraphFlagsOf(view().completion); }
  // Publishes a v2 refusal of the next op with API status `status`.
  void Refuse(int32_t status, const char* reason) {
    abi::DescriptorV2 d{};
    d.stamp = abi::kDescriptorStampV2;
    d.op = abi::kOpRefuse;
    d.seq = ++seq;
    d.refusal.status = status;
    std::snprintf(d.refusal.reason, sizeof(d.refusal.reason), "%s", reason);
    Publish(&d);
  }
  void Publish(const abi::DescriptorV2* d) {
    abi::RingV1* ring = view().ring;
    std::memcpy(&view().slots[ring->tail % abi::kRingSlotsV1], d, sizeof(*d));
    abi::StoreRelease(&ring->tail, ring->tail + 1);
  }
  // As a new daemon takes the rank back from an earlier one: its done flag
  // where that daemon left it, its ring read from where the client rewound
  // head (here: the start), its regions registered again.
  void TakeBack(uint32_t done_seq) {
    abi::StoreRelease(&view().completion->done_seq, done_seq);
    session = std::make_shared<Rank>(session->rank(), 1000 + session->rank(), 0, view().completion,
                                     std::make_unique<server::engines::EngineRank>());
    input = std::make_shared<RankInput>(session, view(), /*resume=*/true);
    input->regions.Add(100 + session->rank(), region);
  }
  uint32_t done() { return abi::LoadAcquire(&view().completion->done_seq); }
  uint32_t errors() { return abi::LoadAcquire(&view().completion->error_count); }
  const abi::ErrorRecordV1& error(uint32_t i) { return view().completion->errors[i % abi::kErrorSlotsV1]; }

  common::MemfdMapping seg;
  std::shared_ptr<Rank> session;
  std::shared_ptr<RankInput> input;
  std::shared_ptr<FakeRegion> region;
  uint32_t seq = 0;
};

class PipelineTest : public ::testing::Test {
 protected:
  void Make(int world, absl::Duration op_timeout = absl::Seconds(60)) {
    job_ = std::make_shared<Job>("job", world, 0);
    for (int r = 0; r < world; ++r) {
      ranks_.push_back(std::make_unique<FakeRank>(r, &engine_));
      ASSERT_TRUE(job_->AddRank(ranks_.back()->session).ok());
    }
    ASSERT_TRUE(job_->all_joined());
    MakeIngress(op_timeout);
  }
  void MakeIngress(absl::Duration op_timeout = absl::Seconds(60)) {
    Ingress::Options o = options_;
    o.op_timeout = op_timeout;
    ingress_ = std::make_unique<Ingress>(o, &engine_, &bell_,
                                         Ingress::Hooks{[] { return uint64_t{1}; },
                                                        [this] {
                                                          JobFeed feed{job_, {}};
                                                          for (auto& r : ranks_) feed.inputs.push_back(r->input);
                                                          return std::vector<JobFeed>{feed};
                                                        }});
  }
  int Poll(bool sweep = false, uint64_t now = 0) {
    return ingress_->PollOnce(now ? now : common::MonotonicNs(), sweep);
  }
  std::string Message(FakeRank& r, uint32_t i) { return r.error(i).message; }

  Ingress::Options options_;
  FakeCopyEngine engine_;
  abi::DoorbellV1 bell_{};
  std::shared_ptr<Job> job_;
  std::vector<std::unique_ptr<FakeRank>> ranks_;
  std::unique_ptr<Ingress> ingress_;
};

}  // namespace dmagather::testing
