// dmagatherctl against a real daemon: the counters it shows are the ops and
// bytes the ranks actually ran, errors are counted by code, and the
// Prometheus text agrees.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
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

// A free TCP port on 127.0.0.1 (bound and released: the daemon takes it next).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

// One HTTP/1.0 GET over a real TCP connection; the whole response, or "".
std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != ssize_t(req.size())) {
    close(fd);
    return "";
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

// --metrics_listen: GET /metrics over TCP is the text `dmagatherctl metrics`
// prints, with the ops and bytes of a job this test ran.
TEST(TelemetryTest, MetricsEndpointServesWhatTheRanksRan) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  auto daemon = DaemonProcess::Start({"--metrics_listen=127.0.0.1:" + std::to_string(port)});
  ASSERT_NE(daemon, nullptr);
  std::string before;
  for (int i = 0; i < 6000 && before.empty(); ++i) {  // Listening right after the gRPC socket (60 s at most).
    before = HttpGet(port, "/metrics");
    if (before.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(before.find("HTTP/1.1 200"), std::string::npos) << before;
  EXPECT_NE(before.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << before;
  EXPECT_NE(before.find("dmagather_ops_total 0"), std::string::npos) << before;

  const std::string job = UniqueJob("metrics-http");
  const int world = 2, ops = 5;
  const size_t count = 1000;  // float32: 4000-byte shards.
  std::vector<RankReport> reports = RunRanks(world, [&](int rank, const Reporter& rep) {
    Comm comm(daemon->socket().c_str(), job, world, rank);
    if (!comm.ok()) return rep.Say(comm.error()), 2;
    char* buf = static_cast<char*>(comm.Alloc(1 << 20));
    for (int i = 0; i < ops; ++i) {
      if (comm.AllGather(buf + rank * count * 4, buf, count, DMAGATHER_FLOAT32) != DMAGATHER_OK) return 1;
    }
    if (comm.Wait() != DMAGATHER_OK) return rep.Say(comm.error()), 1;
    return 0;
  });
  for (const auto& r : reports) ASSERT_EQ(r.exit_code, 0) << r.message;

  const uint64_t bytes = uint64_t(ops) * count * 4 * world * world;
  std::string prom;
  for (int i = 0; i < 3000; ++i) {  // Node totals include the job once it has ended (60 s at most).
    prom = HttpGet(port, "/metrics");
    if (prom.find(absl::StrCat("dmagather_bytes_total ", bytes)) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(prom.find(absl::StrCat("dmagather_ops_total ", ops, "\n")), std::string::npos) << prom;
  EXPECT_NE(prom.find(absl::StrCat("dmagather_bytes_total ", bytes, "\n")), std::string::npos) << prom;
  // The same text as dmagatherctl metrics.
  int rc = 0;
  std::string ctl = RunProgram({"tools/dmagatherctl", "--socket=" + daemon->socket(), "metrics"}, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(ctl.find(absl::StrCat("dmagather_bytes_total ", bytes, "\n")), std::string::npos) << ctl;
  EXPECT_NE(HttpGet(port, "/nothing").find("HTTP/1.1 404"), std::string::npos);

  // Clients that connect and say nothing hold a connection worker each
  // until the read timeout (2 s): more of them than workers delay a scrape,
  // never stop it or the daemon.
  std::vector<int> silent;
  for (int i = 0; i < 4; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    silent.push_back(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string late = HttpGet(port, "/metrics");
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int fd : silent) close(fd);
  EXPECT_NE(late.find("HTTP/1.1 200"), std::string::npos) << late;
  EXPECT_LT(waited_s, 15.0);

  // A second daemon cannot take the port: it serves anyway, without /metrics.
  auto second = DaemonProcess::Start({"--metrics_listen=127.0.0.1:" + std::to_string(port)});
  ASSERT_NE(second, nullptr);
  const std::string health = RunProgram({"tools/dmagatherctl", "--socket=" + second->socket(), "health"}, &rc);
  EXPECT_EQ(rc, 0) << health;
  EXPECT_EQ(health.find("NOT_SERVING"), std::string::npos) << health;
  second->Stop(SIGTERM);

  daemon->Stop(SIGTERM);
  EXPECT_EQ(HttpGet(port, "/metrics"), "");  // Gone with the daemon.
}

// The CPU's wake-ups: an op that comes after an idle gap finds the ingress
// thread asleep (it spins briefly, then sleeps on the doorbell); `dmagatherctl
// stats` counts the sleeps (and the engine threads' wake-ups) on its `cpu:`
// line. With `after_a_sleep` each rank starts each op only once the count
// has grown since its last op, so N ops cost at least N sleeps whatever the
// machine's load. With --stay_awake_us far longer than the run the thread
// stays awake while the job is active: at most the ops' first finds it
// asleep.
int64_t IngressSleepsOverGappedOps(const std::vector<std::string>& flags, int ops, bool after_a_sleep) {
  auto daemon = DaemonProcess::Start(flags);
  EXPECT_NE(daemon, nullptr);
  if (daemon == nullptr) return -1;
  const std::string sock = "--socket=" + daemon->socket();
  int rc = 0;
  const uint64_t before =
      JsonNumber(RunProgram({"tools/dmagatherctl", sock, "--json", "stats"}, &rc), "ingress_sleeps");
  const std::string job = UniqueJob("wakeups");
  const int world = 2;
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<RankProcess>(r, [&](int rank, const Reporter& rep) {
      Comm comm(daemon->socket().c_str(), job, world, rank);
      if (!comm.ok()) return rep.Say(comm.error()), 2;
      char* buf = static_cast<char*>(comm.Alloc(1 << 20));
      auto slept = [&] {
        int src = 0;
        return JsonNumber(RunProgram({"tools/dmagatherctl", sock, "--json", "stats"}, &src), "ingress_sleeps");
      };
      uint64_t seen = slept();
      for (int i = 0; i < ops; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        for (int t = 0; after_a_sleep && t < 2000; ++t) {
          const uint64_t now = slept();
          if (now != ~0ull && now > seen) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (comm.AllGather(buf + rank * 4096, buf, 1024, DMAGATHER_FLOAT32) != DMAGATHER_OK) return 1;
        if (comm.Wait() != DMAGATHER_OK) return rep.Say(comm.error()), 1;
        seen = slept();
      }
      return 0;
    }));
  }
  for (auto& r : ranks) {
    const RankReport rep = r->Reap();
    EXPECT_EQ(rep.exit_code, 0) << rep.message;
  }
  const std::string json = RunProgram({"tools/dmagatherctl", sock, "--json", "stats"}, &rc);
  EXPECT_EQ(rc, 0) << json;
  const uint64_t after = JsonNumber(json, "ingress_sleeps");
  EXPECT_NE(before, ~0ull) << "no ingress_sleeps in the stats";
  EXPECT_NE(after, ~0ull) << json;
  const std::string table = RunProgram({"tools/dmagatherctl", sock, "stats"}, &rc);
  EXPECT_NE(table.find("cpu: ingress slept "), std::string::npos) << table;
  return before == ~0ull || after == ~0ull ? -1 : int64_t(after - before);
}

TEST(TelemetryTest, StatsCountTheIngressWakeUps) {
  const int ops = 8;
  EXPECT_GE(IngressSleepsOverGappedOps({}, ops, true), ops) << "each op after an idle gap wakes the ingress thread";
}

TEST(TelemetryTest, TheIngressStaysAwakeWhileAJobIsActive) {
  const int ops = 8;
  const int64_t sleeps = IngressSleepsOverGappedOps({"--stay_awake_us=600000000"}, ops, false);
  EXPECT_GE(sleeps, 0);
  // Before the first op the ranks join (the daemon idle until then).
  EXPECT_LE(sleeps, 2) << "the ingress thread slept between the job's ops";
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
  for (int i = 0; i < 6000 && sh->ready < world; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(sh->ready.load(), world);

  int rc = 0;
  const std::string sock = "--socket=" + daemon->socket();
  std::string json = RunProgram({"tools/dmagatherctl", sock, "--json", "stats", "--job=" + job}, &rc);
  ASSERT_EQ(rc, 0) << json;
  EXPECT_EQ(JsonNumber(json, "ops"), uint64_t(ops)) << json;
  EXPECT_EQ(JsonNumber(json, "bytes"), uint64_t(ops) * count * 4 * world * world) << json;
  EXPECT_NE(json.find("\"code\": \"INVALID_ARGUMENT\""), std::string::npos) << json;
  EXPECT_NE(json.find(absl::StrCat("\"registered_bytes\": \"", uint64_t(world) << 20, "\"")), std::string::npos)
      << json;
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
  // The backends the binary has, as the build found the toolkits
  // (build_config.txt: HAS_HIP=True/False, HAS_CUDA=...), in auto's order.
  std::ifstream config("build_config.txt");
  ASSERT_TRUE(config.good()) << "no build_config.txt in the runfiles";
  const std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
  std::string built;
  if (text.find("HAS_HIP=True") != std::string::npos) built += "hip, ";
  if (text.find("HAS_CUDA=True") != std::string::npos) built += "cuda, ";
  built += "host";
  const bool gpu = built != "host";
  EXPECT_NE(health.find("\nbuilt:    " + built + (gpu ? "\n" : " (no GPU backend in this build")), std::string::npos)
      << "expected backends " << built << " in:\n"
      << health;
  std::string health_json = RunProgram({"tools/dmagatherctl", sock, "--json", "health"}, &rc);
  EXPECT_NE(health_json.find("\"built_backends\""), std::string::npos) << health_json;
  EXPECT_NE(health_json.find("\"host\"\n ]"), std::string::npos) << health_json;  // host last.

  sh->release = 1;
  for (auto& r : ranks) EXPECT_EQ(r->Reap(30).exit_code, 0);

  daemon->Stop(SIGTERM);
  std::string down = RunProgram({"tools/dmagatherctl", sock, "health"}, &rc);
  EXPECT_EQ(rc, 3);  // Clear exit code when the daemon is not there.
}

}  // namespace
}  // namespace dmagather::testing
