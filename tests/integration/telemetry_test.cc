// dmagatherctl against a real daemon: the counters it shows are the ops and
// bytes the ranks actually ran, errors are counted by code, and the
// Prometheus text agrees.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "dmagather/client.h"
#include "tests/integration/harness.h"

namespace dmagather::testing {
namespace {

uint64_t JsonNumber(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\": \"?([0-9]+)\"?");
  return std::regex_search(json, m, re) ? std::stoull(m[1]) : ~0ull;
}

TEST(TelemetryTest, CtlShowsWhatTheRanksRan) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  struct Shared {
    std::atomic<int> ready{0};
    std::atomic<int> release{0};
  };
  auto* sh = new (mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)) Shared();
  const std::string job = UniqueJob("telemetry");
  const int world = 2, ops = 7;
  const size_t count = 1000;  // float32: 4000-byte shards.
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<RankProcess>(r, [&](int rank, const Reporter& rep) {
      Comm comm(daemon->socket().c_str(), job, world, rank);
      if (!comm.ok()) return rep.Say(comm.error()), 2;
      char* buf = static_cast<char*>(comm.Alloc(1 << 20));
      for (int i = 0; i < ops; ++i) {
        if (comm.AllGather(buf + rank * count * 4, buf, count, DMAGATHER_FLOAT32) != DMAGATHER_OK) return 1;
      }
      if (comm.Wait() != DMAGATHER_OK) return rep.Say(comm.error()), 1;
      comm.AllGather(buf, buf, count + rank, DMAGATHER_FLOAT32);  // Ranks disagree: one INVALID_ARGUMENT each.
      comm.Wait();
      sh->ready++;
      while (sh->release == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return 0;
    }));
  }
  for (int i = 0; i < 1000 && sh->ready < world; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(sh->ready.load(), world);

  int rc = 0;
  const std::string sock = "--socket=" + daemon->socket();
  std::string json = RunProgram({"tools/dmagatherctl", sock, "--json", "stats", "--job=" + job}, &rc);
  ASSERT_EQ(rc, 0) << json;
  EXPECT_EQ(JsonNumber(json, "ops"), uint64_t(ops)) << json;
  EXPECT_EQ(JsonNumber(json, "bytes"), uint64_t(ops) * count * 4 * world * world) << json;
  EXPECT_NE(json.find("\"code\": \"INVALID_ARGUMENT\""), std::string::npos) << json;
  EXPECT_NE(json.find(absl::StrCat("\"registered_bytes\": \"", uint64_t(world) << 20, "\"")), std::string::npos) << json;
  EXPECT_NE(json.find("\"registered_bytes\": \"1048576\""), std::string::npos) << json;  // Per rank.

  std::string table = RunProgram({"tools/dmagatherctl", sock, "stats"}, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(table.find(job), std::string::npos) << table;
  EXPECT_NE(table.find("running"), std::string::npos) << table;

  std::string prom = RunProgram({"tools/dmagatherctl", sock, "metrics"}, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(prom.find(absl::StrCat("dmagather_job_ops_total{job=\"", job, "\"} ", ops)), std::string::npos) << prom;
  EXPECT_NE(prom.find("dmagather_errors_total{code=\"INVALID_ARGUMENT\"} 2"), std::string::npos) << prom;

  std::string health = RunProgram({"tools/dmagatherctl", sock, "health"}, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(health.find("backend:  host"), std::string::npos) << health;

  sh->release = 1;
  for (auto& r : ranks) EXPECT_EQ(r->Reap(30).exit_code, 0);

  daemon->Stop(SIGTERM);
  std::string down = RunProgram({"tools/dmagatherctl", sock, "health"}, &rc);
  EXPECT_EQ(rc, 3);  // Clear exit code when the daemon is not there.
}

}  // namespace
}  // namespace dmagather::testing
