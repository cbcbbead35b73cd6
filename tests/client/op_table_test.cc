// OpTable over an in-memory completion block written as the daemon writes
// it: op handles, each op's status from its error record (once), the
// failures collected by dmagather_wait, lost records, job-ending failures.
#include "client/op_table.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "abi/ring_v1.h"
#include "common/status.h"
#include "dmagather/dmagather.h"

namespace dmagather::client {
namespace {

class OpTableTest : public ::testing::Test {
 protected:
  OpTableTest() : table_(/*rank=*/2) {
    std::memset(&block_, 0, sizeof(block_));
    table_.Attach(&block_);
  }

  void Submit(int n) {
    for (int i = 0; i < n; ++i) table_.CountSubmitted();
  }
  // The daemon: op `seq` failed with `status`.
  void Fail(uint32_t seq, int32_t status, const std::string& message) {
    abi::ErrorRecordV1& r = block_.errors[block_.error_count % abi::kErrorSlotsV1];
    r.seq = seq;
    r.status = status;
    std::snprintf(r.message, sizeof(r.message), "%s", message.c_str());
    ++block_.error_count;
  }
  void Done(uint32_t seq) { block_.done_seq = seq; }

  abi::CompletionV1 block_;
  OpTable table_;
};

TEST_F(OpTableTest, HandlesNameSubmittedOpsOnly) {
  EXPECT_EQ(table_.next_seq(), 1u);
  EXPECT_EQ(table_.Seq(1).status().code(), absl::StatusCode::kInvalidArgument);
  Submit(3);
  EXPECT_EQ(table_.submitted(), 3u);
  EXPECT_EQ(table_.next_seq(), 4u);
  auto seq = table_.Seq(2);
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(*seq, 2u);
  auto zero = table_.Seq(0);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  auto future = table_.Seq(4);
  EXPECT_NE(future.status().message().find("rank 2: op 4 was not submitted"), std::string::npos) << future.status();
  EXPECT_NE(future.status().message().find("3 ops so far"), std::string::npos) << future.status();
}

TEST_F(OpTableTest, AnOpsStatusComesFromItsRecordAndIsReportedOnce) {
  Submit(3);
  Fail(2, DMAGATHER_INVALID_ARGUMENT, "ranks disagree on count");
  Done(3);
  EXPECT_TRUE(table_.Status(1).ok());
  absl::Status s = table_.Status(2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "ranks disagree on count");
  EXPECT_TRUE(table_.Status(3).ok());
  EXPECT_TRUE(table_.CollectErrors().ok()) << "op_wait returned it already: dmagather_wait does not";
}

TEST_F(OpTableTest, WaitCollectsTheFirstUnreportedFailureAndCountsTheRest) {
  Submit(4);
  Fail(1, DMAGATHER_FALLBACK, "first");
  Fail(3, DMAGATHER_INVALID_ARGUMENT, "second");
  Fail(4, DMAGATHER_INVALID_ARGUMENT, "third");
  Done(4);
  ASSERT_FALSE(table_.Status(3).ok());  // Reported through op_wait.
  absl::Status s = table_.CollectErrors();
  EXPECT_TRUE(common::IsFallback(s)) << s;
  EXPECT_EQ(s.message(), "first (and 1 more failed operation(s) since the last wait)");
  EXPECT_TRUE(table_.CollectErrors().ok()) << "each failure is collected once";
}

TEST_F(OpTableTest, RecordsOverwrittenBeforeTheyWereReadAreReportedLost) {
  Submit(40);
  Done(2);
  EXPECT_TRUE(table_.Status(1).ok());  // Scanned at done 2.
  for (uint32_t seq = 3; seq <= 3 + abi::kErrorSlotsV1; ++seq) Fail(seq, DMAGATHER_INVALID_ARGUMENT, "bad");
  Done(30);
  absl::Status lost = table_.Status(3);  // Its record was overwritten.
  EXPECT_EQ(lost.code(), absl::StatusCode::kInternal) << lost;
  EXPECT_NE(lost.message().find("status of op 3 was lost"), std::string::npos) << lost;
  EXPECT_EQ(table_.Status(10).code(), absl::StatusCode::kInvalidArgument) << "still in the block";
  EXPECT_EQ(table_.Status(25).code(), absl::StatusCode::kInternal)
      << "finished between the two reads without a record left: it may have lost one";
  EXPECT_TRUE(table_.Status(2).ok()) << "finished before the overflow";
  EXPECT_TRUE(table_.Status(31).ok()) << "after the lost range";
}

TEST_F(OpTableTest, JobEndingFailuresArePendingUntilCollected) {
  Submit(2);
  Fail(1, DMAGATHER_INVALID_ARGUMENT, "not fatal");
  EXPECT_FALSE(table_.FatalPending());
  Fail(2, DMAGATHER_PEER_FAILED, "rank 1 died");
  EXPECT_TRUE(table_.FatalPending());
  absl::Status s = table_.CollectErrors();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "the first failure comes first";
  EXPECT_FALSE(table_.FatalPending());
}

}  // namespace
}  // namespace dmagather::client
