// Handoff: items come out in order and stay pending until the taker is done
// with them; a burst posted while the taker polls costs no wake-up, a post
// to a taker asleep costs one, counted; Stop lets the taker drain, then end.
#include "server/engines/gpu/handoff.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "tests/fakes/fake_clock.h"

namespace dmagather::server::engines::gpu {
namespace {

TEST(HandoffTest, InOrderAndPendingUntilDone) {
  Handoff<int> h(8, common::RealClock(), 0);
  for (int i = 1; i <= 3; ++i) h.Post(i);
  EXPECT_EQ(h.Pending(), 3u);
  ASSERT_TRUE(h.Wait());
  EXPECT_EQ(h.Front(), 1);
  EXPECT_EQ(h.Pending(), 3u) << "the front item is pending until popped";
  h.Pop();
  std::vector<int> in_hand;
  h.Take(&in_hand, 8);
  EXPECT_EQ(in_hand, (std::vector<int>{2, 3}));
  EXPECT_EQ(h.Pending(), 2u) << "taken items are pending until done";
  h.Done();
  h.Done();
  EXPECT_EQ(h.Pending(), 0u);
  h.Post(4);
  h.Stop();
  ASSERT_TRUE(h.Wait()) << "stopped with an item left: it is still handed over";
  EXPECT_EQ(h.Front(), 4);
  h.Pop();
  EXPECT_FALSE(h.Wait());
  EXPECT_EQ(h.wakeups(), 0u) << "nobody slept";
}

// The taker: takes items until stopped; returns what it took.
std::vector<int> Drain(Handoff<int>* h) {
  std::vector<int> got;
  while (h->Wait()) {
    got.push_back(h->Front());
    h->Pop();
  }
  return got;
}

TEST(HandoffTest, ABurstWhileTheTakerPollsCostsNoWakeUp) {
  common::testing::FakeClock clock;  // Never moves: the taker polls until stopped, never sleeps.
  Handoff<int> h(4, clock, /*spin_ns=*/1);
  std::vector<int> got;
  std::thread taker([&] { got = Drain(&h); });
  for (int i = 0; i < 100; ++i) h.Post(i);  // 4 slots: the poster waits for space, the taker never sleeps.
  while (h.Pending() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  h.Stop();
  taker.join();
  ASSERT_EQ(got.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i], i);
  EXPECT_EQ(h.wakeups(), 0u);
}

TEST(HandoffTest, APostToASleepingTakerCountsAWakeUp) {
  Handoff<int> h(4, common::RealClock(), /*spin_ns=*/0);  // Sleeps at once.
  std::vector<int> got;
  std::thread taker([&] { got = Drain(&h); });
  for (int i = 0; i < 5; ++i) {
    while (h.Pending() != 0 || !h.asleep()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    h.Post(i);
  }
  while (h.Pending() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  h.Stop();
  taker.join();
  EXPECT_EQ(got.size(), 5u);
  EXPECT_EQ(h.wakeups(), 5u) << "each post found the taker asleep";
}

}  // namespace
}  // namespace dmagather::server::engines::gpu
