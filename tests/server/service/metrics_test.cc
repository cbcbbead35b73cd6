// The Prometheus text carries the same numbers as the Stats reply, in the
// exposition format (HELP/TYPE lines, escaped labels).
#include "server/service/metrics.h"

#include <gtest/gtest.h>

namespace dmagather::server::service {
namespace {

TEST(MetricsTest, RendersCountersPerJobAndRank) {
  v1::HealthReply h;
  h.set_version("0.1.0");
  h.set_backend("host");
  h.set_jobs(1);
  v1::StatsReply s;
  s.set_total_ops(42);
  s.set_total_bytes(4096);
  auto* e = s.add_errors();
  e->set_code("PEER_FAILED");
  e->set_count(3);
  auto* j = s.add_jobs();
  j->set_job_key("train\"x");
  j->set_ops(40);
  j->mutable_latency()->set_p50_us(12.5);
  auto* r = j->add_ranks();
  r->set_rank(1);
  r->set_ops(40);
  r->set_registered_bytes(1 << 20);
  std::string text = RenderPrometheus(h, s);
  EXPECT_NE(text.find("# TYPE dmagather_ops_total counter\ndmagather_ops_total 42\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dmagather_errors_total{code=\"PEER_FAILED\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("dmagather_job_ops_total{job=\"train\\\"x\"} 40\n"), std::string::npos);
  EXPECT_NE(text.find("dmagather_job_latency_microseconds{job=\"train\\\"x\",quantile=\"0.5\"} 12.5\n"),
            std::string::npos);
  EXPECT_NE(text.find("dmagather_rank_registered_bytes{job=\"train\\\"x\",rank=\"1\"} 1048576\n"), std::string::npos);
  EXPECT_NE(text.find("dmagather_up{version=\"0.1.0\",backend=\"host\"} 1\n"), std::string::npos);
}

TEST(MetricsTest, BytesPerCopyEngineOnlyWhereTheDaemonAssignsEngines) {
  v1::HealthReply h;
  h.set_version("0.1.0");
  h.set_backend("hip");
  v1::StatsReply s;
  EXPECT_EQ(RenderPrometheus(h, s).find("dmagather_copy_engine_bytes_total"), std::string::npos);
  auto* e = s.add_copy_engines();
  e->set_device(1);
  e->set_engine(3);
  e->set_bytes(4096);
  e = s.add_copy_engines();
  e->set_device(1);
  e->set_engine(-1);
  e->set_bytes(7);
  const std::string text = RenderPrometheus(h, s);
  EXPECT_NE(text.find("# TYPE dmagather_copy_engine_bytes_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dmagather_copy_engine_bytes_total{device=\"1\",engine=\"3\"} 4096\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("dmagather_copy_engine_bytes_total{device=\"1\",engine=\"runtime\"} 7\n"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace dmagather::server::service
