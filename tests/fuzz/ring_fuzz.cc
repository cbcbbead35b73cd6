// libFuzzer target: the ingress thread's ring handling (Ingress::PollOnce
// over one job of two fake ranks), with the rings' tails, the slots and
// the engine's completions under the fuzzer's control: a client can publish
// any tail (ahead, behind, wrapped), rewrite slots, coalesce or refuse, and
// ops complete (or fail) in any order. Every copy a plan holds is performed
// (FakeCopyEngine memcpy) between exact heap regions, so AddressSanitizer
// sees any byte outside what the ranks registered. Checked too: done flags
// never go back, and the head the daemon publishes is its own copy.
//
// Input: the initial tails (u8 each), then actions, one byte each (see
// below), some followed by their operands.
#include <cstdint>
#include <memory>
#include <vector>

#include "abi/descriptor_v2.h"
#include "abi/ring_v1.h"
#include "server/ingress/ingress.h"
#include "server/scheduler/job.h"
#include "tests/fakes/fake_copy_engine.h"
#include "tests/fuzz/fuzz_input.h"

namespace dmagather::fuzz {
namespace {

using server::ingress::Ingress;
using server::ingress::JobFeed;
using server::ingress::RankInput;
using server::scheduler::Job;
using server::scheduler::Rank;

constexpr int kWorld = 2;

enum Action : uint8_t {
  kSubmit = 0,    // rank(u8) count(u8) region(u8) out(u8) kind(u8) items_following(u8) seq_delta(u8)
  kRawSlot = 1,   // rank(u8) slot(u8) offset(u16) 16 bytes: written over a slot at any offset
  kSetTail = 2,   // rank(u8) tail(u64)
  kBumpTail = 3,  // rank(u8) delta(u8)
  kPoll = 4,      // sweep(u8)
  kComplete = 5,  // index(u8) fail(u8)
  kAdvance = 6,   // ms(u16): the clock moves on (timeouts)
  kRefuse = 7,    // rank(u8) status(u8)
  kNumActions = 8,
};

struct Segment {
  Segment() : mem(static_cast<char*>(std::aligned_alloc(4096, abi::SegmentLayoutV1::kBytes))) {}
  ~Segment() { std::free(mem); }
  abi::SegmentViewV1 view() const { return abi::SegmentViewV1::At(mem); }
  char* mem;
};

}  // namespace
}  // namespace dmagather::fuzz

namespace dmagather::fuzz {

int FuzzOne(const uint8_t* data, size_t size) {
  static Segment* segs = new Segment[kWorld];
  Input in(data, size);
  server::engines::testing::FakeCopyEngine engine;
  abi::DoorbellV1 bell{};
  auto job = std::make_shared<Job>("fuzz", kWorld, 0);
  std::vector<std::shared_ptr<RankInput>> inputs;
  std::vector<std::vector<std::shared_ptr<ExactRegion>>> regions(kWorld);
  uint32_t seq[kWorld] = {0, 0};
  for (int r = 0; r < kWorld; ++r) {
    std::memset(segs[r].mem, 0, abi::SegmentLayoutV1::kBytes);
    abi::InitSegmentV1(segs[r].mem, 7 + r, abi::kDescriptorStampV2);
    abi::SegmentViewV1 v = segs[r].view();
    v.ring->tail = in.Take<uint8_t>();  // The client may have published before Join.
    auto rank = std::make_shared<Rank>(r, 1000 + r, 0, v.completion, std::make_unique<server::engines::EngineRank>());
    inputs.push_back(std::make_shared<RankInput>(rank, v));
    for (int i = 0; i < kNumRegions; ++i) {
      regions[r].push_back(std::make_shared<ExactRegion>(kRegionBytes[i]));
      inputs.back()->regions.Add(RegionId(r, i), regions[r].back());
    }
    if (!job->AddRank(rank).ok()) __builtin_trap();
  }
  Ingress ingress(Ingress::Options{absl::Milliseconds(100), 0}, &engine, &bell,
                  Ingress::Hooks{[] { return uint64_t{1}; },
                                 [&] {
                                   return std::vector<JobFeed>{{job, inputs}};
                                 }});
  uint64_t now = 1'000'000'000;
  uint32_t last_done[kWorld] = {0, 0};
  auto check_done = [&] {
    for (int r = 0; r < kWorld; ++r) {
      const uint32_t d = abi::LoadAcquire(&segs[r].view().completion->done_seq);
      if (int32_t(d - last_done[r]) < 0) __builtin_trap();  // Done flags never go back.
      last_done[r] = d;
      const RankInput& ri = *inputs[r];
      if (ri.ring->head != ri.ring_head) __builtin_trap();
    }
  };
  for (int steps = 0; !in.empty() && steps < 4096; ++steps) {
    const uint8_t a = in.Take<uint8_t>() % kNumActions;
    switch (a) {
      case kSubmit:
      case kRefuse: {
        const int r = in.Take<uint8_t>() % kWorld;
        abi::DescriptorV2 d{};
        d.stamp = abi::kDescriptorStampV2;
        if (a == kRefuse) {
          d.op = abi::kOpRefuse;
          d.seq = ++seq[r];
          d.refusal.status = in.Take<uint8_t>() % 3;
          std::snprintf(d.refusal.reason, sizeof(d.refusal.reason), "fuzz");
        } else {
          const uint64_t count = in.Take<uint8_t>() % 80;
          const int region = in.Take<uint8_t>() % kNumRegions;
          const uint64_t out = in.Take<uint8_t>() % 128;
          const bool list = in.Take<uint8_t>() & 1;
          d.items_following = in.Take<uint8_t>() % 4;
          d.seq = seq[r] + 1 + (in.Take<uint8_t>() % 3 == 2 ? 1 : 0);
          seq[r] = d.seq;
          d.op = list ? abi::kOpAllGatherListV2 : abi::kOpAllGatherV2;
          d.count = count;
          const uint32_t rid = RegionId(r, region);
          d.num_recv = list ? kWorld : 1;
          d.send = {rid, 0, list ? out : out + r * count};
          for (uint32_t i = 0; i < d.num_recv; ++i) d.recv[i] = {rid, 0, list ? out + i * count : out};
        }
        abi::RingV1* ring = segs[r].view().ring;
        std::memcpy(&segs[r].view().slots[ring->tail % abi::kRingSlotsV1], &d, sizeof(d));
        abi::StoreRelease(&ring->tail, ring->tail + 1);
        break;
      }
      case kRawSlot: {
        const int r = in.Take<uint8_t>() % kWorld;
        const uint32_t slot = in.Take<uint8_t>();
        const uint32_t offset = in.Take<uint16_t>() % (sizeof(abi::DescriptorV1) - 16);
        in.TakeBytes(reinterpret_cast<char*>(&segs[r].view().slots[slot % abi::kRingSlotsV1]) + offset, 16);
        break;
      }
      case kSetTail: {
        const int r = in.Take<uint8_t>() % kWorld;
        abi::StoreRelease(&segs[r].view().ring->tail, in.Take<uint64_t>());
        break;
      }
      case kBumpTail: {
        const int r = in.Take<uint8_t>() % kWorld;
        abi::RingV1* ring = segs[r].view().ring;
        abi::StoreRelease(&ring->tail, ring->tail + in.Take<uint8_t>());
        break;
      }
      case kPoll:
        ingress.PollOnce(now, in.Take<uint8_t>() & 1);
        check_done();
        break;
      case kComplete: {
        if (engine.pending.empty()) break;
        const size_t i = in.Take<uint8_t>() % engine.pending.size();
        engine.Complete(i, (in.Take<uint8_t>() & 1) ? absl::InternalError("fuzz") : absl::OkStatus());
        check_done();
        break;
      }
      case kAdvance:
        now += uint64_t{in.Take<uint16_t>()} * 1'000'000;
        break;
    }
  }
  // Everything the engine holds finishes; the job is torn down as the daemon would.
  ingress.PollOnce(now, true);
  while (!engine.pending.empty()) engine.Complete(0);
  check_done();
  job->Fail(absl::AbortedError("fuzz: end"), -1);
  ingress.PollOnce(now, true);
  while (!engine.pending.empty()) engine.Complete(0);
  return 0;
}

}  // namespace dmagather::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return dmagather::fuzz::FuzzOne(data, size); }
