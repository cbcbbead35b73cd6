// The reaper's pieces: deferred frees wait for a whole ingress pass, the
// heap is trimmed at most once a second of the (fake) clock, and the thread
// runs passes until stopped.
#include "server/service/reaper.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "tests/fakes/fake_clock.h"

namespace dmagather::server::service {
namespace {

class Item : public Retirable {
 public:
  void ReleaseMemory() override {
    ++releases;
    released = true;
  }
  bool memory_released() const override { return released; }
  int releases = 0;
  bool released = false;
};

TEST(DeferredFreesTest, AnItemIsDueTwoEpochsAfterItsRetirement) {
  DeferredFrees frees;
  auto a = std::make_shared<Item>();
  auto b = std::make_shared<Item>();
  frees.Retire(5, a);
  frees.Retire(6, b);
  EXPECT_EQ(frees.size(), 2u);
  EXPECT_TRUE(frees.TakeDue(5, /*gated=*/true).empty());
  EXPECT_TRUE(frees.TakeDue(6, /*gated=*/true).empty()) << "the pass under way may hold a snapshot";
  auto due = frees.TakeDue(7, /*gated=*/true);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0], a);
  EXPECT_EQ(a->releases, 0) << "the caller frees, outside every lock";
  due = frees.TakeDue(9, /*gated=*/true);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0], b);
  EXPECT_TRUE(frees.empty());
}

TEST(DeferredFreesTest, ItemsAreQueuedOnceAndNeverAfterRelease) {
  DeferredFrees frees;
  auto a = std::make_shared<Item>();
  auto gone = std::make_shared<Item>();
  gone->released = true;
  frees.Retire(1, a);
  frees.Retire(4, a);
  frees.Retire(1, gone);
  frees.Retire(1, nullptr);
  EXPECT_EQ(frees.size(), 1u);
  auto due = frees.TakeDue(3, /*gated=*/true);
  ASSERT_EQ(due.size(), 1u) << "the first retirement's epoch counts";
}

TEST(DeferredFreesTest, WithoutAnIngressThreadEverythingIsDueAtOnceOldestFirst) {
  DeferredFrees frees;
  std::vector<std::shared_ptr<Item>> items(3);
  for (int i = 0; i < 3; ++i) {
    items[i] = std::make_shared<Item>();
    frees.Retire(100 + i, items[i]);
  }
  auto due = frees.TakeDue(0, /*gated=*/false);
  ASSERT_EQ(due.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(due[i], items[i]);
  EXPECT_TRUE(frees.empty());
}

TEST(HeapTrimmerTest, TrimsAfterFreesAtMostOncePerPeriod) {
  common::testing::FakeClock clock;
  int trims = 0;
  HeapTrimmer trimmer(
      &clock, [&] { ++trims; }, absl::Seconds(1));
  EXPECT_FALSE(trimmer.AfterPass(0)) << "nothing freed";
  EXPECT_TRUE(trimmer.AfterPass(2)) << "the first frees trim at once";
  EXPECT_EQ(trims, 1);
  EXPECT_FALSE(trimmer.AfterPass(1));
  clock.Advance(absl::Milliseconds(999));
  EXPECT_FALSE(trimmer.AfterPass(0));
  clock.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(trimmer.AfterPass(0)) << "the frees of the earlier pass are still owed a trim";
  EXPECT_EQ(trims, 2);
  clock.Advance(absl::Seconds(5));
  EXPECT_FALSE(trimmer.AfterPass(0)) << "nothing freed since the last trim";
  EXPECT_EQ(trims, 2);
}

TEST(ReaperThreadTest, RunsPassesUntilStopped) {
  absl::Mutex mu;
  absl::CondVar ran;
  int passes = 0;
  ReaperThread thread([&] {
    absl::MutexLock lock(&mu);
    ++passes;
    ran.SignalAll();
    return true;  // Idle.
  });
  thread.Start();
  thread.Wake();
  {
    absl::MutexLock lock(&mu);
    while (passes < 1) ran.Wait(&mu);
  }
  thread.Stop();
  int after_stop;
  {
    absl::MutexLock lock(&mu);
    after_stop = passes;
  }
  thread.Wake();
  thread.Stop();  // Idempotent.
  absl::MutexLock lock(&mu);
  EXPECT_EQ(passes, after_stop) << "no pass after Stop";
}

}  // namespace
}  // namespace dmagather::server::service
