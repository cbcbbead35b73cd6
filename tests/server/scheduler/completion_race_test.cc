// Job::FinishOp from several threads at once: error records are a
// read-modify-write of the rank's error_count, so they must be written
// under the job's completion lock like the done flags. Ops are set up on
// the test thread (SlotFor is ingress-thread-only) in batches of one ring's
// worth, then finished with errors from two threads racing each other.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "abi/completion_v1.h"
#include "abi/ring_v1.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "server/engines/copy_engine.h"
#include "server/scheduler/job.h"
#include "server/scheduler/op.h"
#include "server/scheduler/rank.h"

namespace dmagather::testing {
namespace {

using server::scheduler::Job;
using server::scheduler::Op;
using server::scheduler::Rank;

constexpr int kWorld = 2;
constexpr int kThreads = 2;
constexpr uint32_t kBatch = abi::kRingSlotsV1;  // 256: every slot of the job in use.
constexpr int kBatches = 64;                    // 16384 failed ops.

TEST(CompletionRaceTest, ConcurrentFailedOpsLoseNoErrorRecord) {
  std::vector<std::unique_ptr<abi::CompletionV1>> completions;
  Job job("race", kWorld, 0);
  std::vector<std::shared_ptr<Rank>> ranks;
  for (int r = 0; r < kWorld; ++r) {
    completions.push_back(std::make_unique<abi::CompletionV1>());
    ranks.push_back(std::make_shared<Rank>(r, 1000 + r, 0, completions.back().get(),
                                           std::make_unique<server::engines::EngineRank>()));
    ASSERT_TRUE(job.AddRank(ranks.back()).ok());
  }
  ASSERT_TRUE(job.all_joined());

  uint32_t seq = 0;
  std::vector<Op*> ops(kBatch);
  for (int b = 0; b < kBatches; ++b) {
    // Set up a full ring of ops, as the ingress thread would.
    for (uint32_t i = 0; i < kBatch; ++i) {
      Op* op = job.SlotFor(++seq, common::MonotonicNs());
      ASSERT_NE(op, nullptr) << "slot of seq " << seq << " still busy";
      for (int r = 0; r < kWorld; ++r) {
        op->parts[r].started = true;
        op->parts[r].arrived = true;
        op->parts[r].submit_ns = common::MonotonicNs();
        ranks[r]->inflight.fetch_add(1, std::memory_order_acq_rel);
      }
      op->arrived = kWorld;
      ops[i] = op;
    }
    ASSERT_EQ(job.ops_in_flight(), int(kBatch));
    // Finish them from kThreads threads at once, interleaved, every op failed.
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < kThreads) {
        }
        for (uint32_t i = t; i < kBatch; i += kThreads) {
          job.FinishOp(ops[i], absl::InvalidArgumentError(absl::StrCat("op ", ops[i]->seq, " is bad")), -1);
        }
      });
    }
    for (auto& th : threads) th.join();
    ASSERT_EQ(job.ops_in_flight(), 0);
    for (int r = 0; r < kWorld; ++r) {
      const abi::CompletionV1& c = *completions[r];
      ASSERT_EQ(abi::LoadAcquire(&c.error_count), seq) << "rank " << r << " lost error records in batch " << b;
      ASSERT_EQ(abi::LoadAcquire(&c.done_seq), seq) << "rank " << r << " batch " << b;
      ASSERT_EQ(ranks[r]->inflight.load(), 0u) << "rank " << r << " batch " << b;
    }
  }

  const uint32_t total = kBatch * kBatches;
  for (int r = 0; r < kWorld; ++r) {
    const abi::CompletionV1& c = *completions[r];
    EXPECT_EQ(c.error_count, total) << "rank " << r;
    EXPECT_EQ(c.done_seq, total) << "rank " << r;
    EXPECT_EQ(ranks[r]->counters.errors[2].load(), uint64_t{total}) << "rank " << r;
    EXPECT_EQ(ranks[r]->counters.ops.load(), 0u);
    // The block's last 16 records: each a whole record of a distinct op of
    // the last batch (two threads writing the same slot would repeat one).
    std::set<uint32_t> seqs;
    for (uint32_t i = 0; i < abi::kErrorSlotsV1; ++i) {
      const abi::ErrorRecordV1& rec = c.errors[i];
      EXPECT_EQ(rec.stamp, abi::kErrorRecordStampV1);
      EXPECT_EQ(rec.status, 2);  // INVALID_ARGUMENT
      EXPECT_EQ(rec.failed_rank, -1);
      EXPECT_GT(rec.seq, total - kBatch);
      EXPECT_LE(rec.seq, total);
      EXPECT_EQ(std::string(rec.message), absl::StrCat("op ", rec.seq, " is bad"));
      seqs.insert(rec.seq);
    }
    EXPECT_EQ(seqs.size(), size_t{abi::kErrorSlotsV1}) << "rank " << r << ": a record slot was written twice";
  }
  EXPECT_EQ(job.counters.errors[2].load(), uint64_t{total} * kWorld);  // Counted per rank.
  EXPECT_EQ(job.counters.ops.load(), 0u);
}

}  // namespace
}  // namespace dmagather::testing
