// RegionLedger: a region stays charged while anything in the daemon holds
// it (a captured op after Deregister, say), and the limits count that.
#include "server/service/region_ledger.h"

#include <gtest/gtest.h>

#include <vector>

namespace dmagather::server::service {
namespace {

class PlainRegion : public engines::ImportedRegion {
 public:
  PlainRegion(uint64_t bytes, int* alive) : bytes_(bytes), alive_(alive) { ++*alive_; }
  ~PlainRegion() override { --*alive_; }
  char* base() const override { return nullptr; }
  uint64_t bytes() const override { return bytes_; }

 private:
  const uint64_t bytes_;
  int* const alive_;
};

TEST(RegionLedgerTest, AChargeLastsAsLongAsTheLastHolder) {
  auto ledger = RegionLedger::Create({/*max_regions_per_uid=*/0, /*max_mapped_bytes_per_uid=*/0});
  int alive = 0;
  auto charge = ledger->Reserve(1000, 1 << 20);
  ASSERT_TRUE(charge.ok()) << charge.status();
  auto raw = std::make_shared<PlainRegion>(1 << 20, &alive);
  PlainRegion* p = raw.get();
  std::shared_ptr<engines::ImportedRegion> table = RegionLedger::Attach(std::move(raw), *std::move(charge));
  EXPECT_EQ(table.get(), p) << "the same region: engines may downcast it";
  std::shared_ptr<engines::ImportedRegion> captured = table;  // A persistent op's hold.
  table.reset();                                              // Deregister.
  EXPECT_EQ(alive, 1);
  EXPECT_EQ(ledger->held(1000).regions, 1) << "still held by the captured op";
  EXPECT_EQ(ledger->held(1000).bytes, uint64_t{1} << 20);
  EXPECT_EQ(ledger->total().bytes, uint64_t{1} << 20);
  captured.reset();
  EXPECT_EQ(alive, 0);
  EXPECT_EQ(ledger->held(1000).regions, 0);
  EXPECT_EQ(ledger->total().bytes, 0u);
}

TEST(RegionLedgerTest, HeldRegionsCountAgainstTheLimits) {
  auto ledger = RegionLedger::Create({/*max_regions_per_uid=*/2, /*max_mapped_bytes_per_uid=*/3 << 20});
  int alive = 0;
  std::vector<std::shared_ptr<engines::ImportedRegion>> holds;
  for (int i = 0; i < 2; ++i) {
    auto c = ledger->Reserve(5, 1 << 20);
    ASSERT_TRUE(c.ok()) << c.status();
    holds.push_back(RegionLedger::Attach(std::make_shared<PlainRegion>(1 << 20, &alive), *std::move(c)));
  }
  auto third = ledger->Reserve(5, 1);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("max_regions_per_uid"), std::string::npos) << third.status();
  EXPECT_TRUE(ledger->Reserve(6, 1).ok()) << "another uid";
  holds.pop_back();
  auto big = ledger->Reserve(5, 3 << 20);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << "1 MiB held + 3 MiB > 3 MiB";
  EXPECT_NE(big.status().message().find("max_mapped_bytes_per_uid"), std::string::npos) << big.status();
  EXPECT_TRUE(ledger->Reserve(5, 2 << 20).ok());
}

TEST(RegionLedgerTest, ARegionFreedAfterTheLedgerOwnerIsGoneIsSafe) {
  int alive = 0;
  std::shared_ptr<engines::ImportedRegion> hold;
  {
    auto ledger = RegionLedger::Create({0, 0});
    auto c = ledger->Reserve(1, 10);
    ASSERT_TRUE(c.ok());
    hold = RegionLedger::Attach(std::make_shared<PlainRegion>(10, &alive), *std::move(c));
  }  // The registry's reference is gone; the charge keeps the ledger.
  hold.reset();
  EXPECT_EQ(alive, 0);
}

}  // namespace
}  // namespace dmagather::server::service
