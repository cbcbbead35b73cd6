// EndSharesInLaneOrder (share_poll.h): a pass over a device's pending
// shares ends each lane's shares in order, even where a later share's end
// reads done before an earlier one's, and holds back no other lane.
#include "server/engines/gpu/share_poll.h"

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace dmagather::server::engines::gpu {
namespace {

struct FakeShare {
  const char* lane;  // Any pointer serves as a lane.
  std::string name;
};

// Each share's end as the pass reads it: done, not yet, or an error.
struct Script {
  std::map<std::string, absl::StatusOr<bool>> state;
  std::vector<std::string> queried;
  std::vector<std::string> ended;
  std::vector<absl::Status> statuses;

  size_t Pass(std::vector<FakeShare>& pending, std::vector<const void*>& held) {
    return EndSharesInLaneOrder(
        pending, held,
        [&](const FakeShare& s) {
          queried.push_back(s.name);
          return state.at(s.name);
        },
        [&](const FakeShare& s, const absl::Status& st) {
          ended.push_back(s.name);
          statuses.push_back(st);
        });
  }
};

const char kLaneA[] = "A";
const char kLaneB[] = "B";

// The race it exists for: a1's end read not yet, a2's read done a moment
// later (the stream moved between the reads). a2 waits for a1; lane B's
// share, enqueued after both, ends at once.
TEST(ShareOrderTest, ALaterShareOfALaneWaitsForTheEarlierOne) {
  std::vector<FakeShare> pending{{kLaneA, "a1"}, {kLaneA, "a2"}, {kLaneB, "b1"}};
  std::vector<const void*> held;
  Script s;
  s.state = {{"a1", false}, {"a2", true}, {"b1", true}};
  EXPECT_EQ(s.Pass(pending, held), 1u);
  EXPECT_EQ(s.ended, (std::vector<std::string>{"b1"}));
  EXPECT_EQ(s.queried, (std::vector<std::string>{"a1", "b1"})) << "a2 is not even read while a1 is pending";
  ASSERT_EQ(pending.size(), 2u);
  s.state["a1"] = true;
  EXPECT_EQ(s.Pass(pending, held), 2u);
  EXPECT_EQ(s.ended, (std::vector<std::string>{"b1", "a1", "a2"}));
  EXPECT_TRUE(pending.empty());
}

// A lane held in one pass is free in the next: the scratch is per pass.
TEST(ShareOrderTest, EachPassStartsWithNoLaneHeld) {
  std::vector<FakeShare> pending{{kLaneA, "a1"}, {kLaneB, "b1"}, {kLaneB, "b2"}};
  std::vector<const void*> held;
  Script s;
  s.state = {{"a1", true}, {"b1", false}, {"b2", true}};
  EXPECT_EQ(s.Pass(pending, held), 1u);
  s.state["b1"] = true;
  EXPECT_EQ(s.Pass(pending, held), 2u);
  EXPECT_EQ(s.ended, (std::vector<std::string>{"a1", "b1", "b2"}));
}

// A share whose end reads an error is ended with it (its op fails) and is
// no hold: the lane's next share is read in the same pass.
TEST(ShareOrderTest, AnErrorEndsTheShareWithItAndHoldsNothing) {
  std::vector<FakeShare> pending{{kLaneA, "a1"}, {kLaneA, "a2"}};
  std::vector<const void*> held;
  Script s;
  s.state = {{"a1", absl::InternalError("copy failed")}, {"a2", true}};
  EXPECT_EQ(s.Pass(pending, held), 2u);
  EXPECT_EQ(s.ended, (std::vector<std::string>{"a1", "a2"}));
  EXPECT_EQ(s.statuses[0].code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(s.statuses[1].ok());
}

// Nothing done: nothing ended, every lane read once (its first share).
TEST(ShareOrderTest, NothingDoneEndsNothing) {
  std::vector<FakeShare> pending{{kLaneA, "a1"}, {kLaneB, "b1"}, {kLaneA, "a2"}, {kLaneB, "b2"}};
  std::vector<const void*> held;
  Script s;
  s.state = {{"a1", false}, {"a2", true}, {"b1", false}, {"b2", true}};
  EXPECT_EQ(s.Pass(pending, held), 0u);
  EXPECT_TRUE(s.ended.empty());
  EXPECT_EQ(s.queried, (std::vector<std::string>{"a1", "b1"}));
  EXPECT_EQ(pending.size(), 4u);
}

}  // namespace
}  // namespace dmagather::server::engines::gpu
