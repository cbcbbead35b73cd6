// dmagatherctl: the operator's view of a node's dmagatherd over its gRPC
// control socket.
//
//   dmagatherctl health            SERVING / NOT_SERVING (and why; exit 1), version, backend and why, uptime,
//                                  the backends this binary was built with
//   dmagatherctl jobs              one line per job
//   dmagatherctl stats [--job=K]   per job and per rank: ops, bytes, errors, latency, memory
//   dmagatherctl metrics           Prometheus text (for a textfile collector or a scrape shim)
// stats/jobs/metrics first get a telemetry ticket on the fd channel, so the
// daemon knows (from the kernel) who asks: root and the --operator_group see
// every job, anyone else its own uid's jobs.
// --json prints the reply as JSON instead of a table.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "abi/fd_channel_v1.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fd_exchange.h"
#include "dmagather/v1/control.grpc.pb.h"
#include "dmagather/v1/telemetry.grpc.pb.h"

ABSL_FLAG(std::string, socket, "",
          "dmagatherd socket (default: $DMAGATHER_SOCKET, then /run/dmagather/dmagatherd.sock).");
ABSL_FLAG(bool, json, false, "Print JSON instead of a table.");
ABSL_FLAG(std::string, job, "", "stats: only this job.");
ABSL_FLAG(double, timeout_s, 3.0, "RPC deadline in seconds.");

namespace {

using dmagather::v1::Telemetry;

std::string Socket() {
  std::string s = absl::GetFlag(FLAGS_socket);
  if (!s.empty()) return s;
  const char* env = std::getenv("DMAGATHER_SOCKET");
  return env != nullptr && *env ? env : "/run/dmagather/dmagatherd.sock";
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f %s", b, units[u]) : absl::StrFormat("%.1f %s", b, units[u]);
}

template <typename M>
std::string ErrorsText(const M& errors) {
  std::string s;
  for (const auto& e : errors) s += absl::StrFormat("%s%s=%u", s.empty() ? "" : ",", e.code(), e.count());
  return s.empty() ? "-" : s;
}

template <typename Msg>
int PrintJson(const Msg& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  std::cout << out;
  return 0;
}

// Who we are, proven to the daemon: a telemetry ticket from its fd channel
// (which reads our uid and groups from the kernel). Without one the daemon
// shows only node totals.
std::string TelemetryTicket(const std::string& socket) {
  auto t = dmagather::common::ExchangeFd(dmagather::common::FdChannelPath(socket), dmagather::abi::kFdTelemetry, -1, 0,
                                         1000);
  if (!t.ok()) {
    std::cerr << "dmagatherctl: no telemetry ticket (" << t.status().message() << "): showing node totals only\n";
    return "";
  }
  return t->ticket;
}

int Fail(const grpc::Status& st, const std::string& socket) {
  std::cerr << "dmagatherctl: " << socket << ": " << st.error_message() << "\n";
  if (st.error_code() == grpc::StatusCode::UNAVAILABLE || st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    struct stat sb;
    if (access(socket.c_str(), R_OK | W_OK) != 0 && (errno == EACCES || errno == EPERM) &&
        stat(socket.c_str(), &sb) == 0) {
      std::cerr << "permission denied: this user (uid " << getuid() << ") may not connect to " << socket
                << " (owner uid " << sb.st_uid << ", gid " << sb.st_gid << ", mode " << std::oct << (sb.st_mode & 07777)
                << std::dec << "); the operator sets who may with dmagatherd --socket_mode and the socket's group\n";
      return 4;
    }
    std::cerr << "is dmagatherd running? (systemctl status dmagatherd)\n";
    return 3;
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "dmagatherctl [--socket=PATH] [--json] health|jobs|stats [--job=KEY]|metrics|job-id\n"
      "Reads the telemetry of the node's dmagatherd; job-id prints a new multi-node job id naming it as the "
      "job's coordinator (give it to every rank as DMAGATHER_JOB_ID).");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << "usage: dmagatherctl [--socket=PATH] [--json] health|jobs|stats|metrics|job-id\n";
    return 2;
  }
  const std::string cmd = args[1];
  const std::string socket = Socket();
  auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  auto stub = Telemetry::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(int64_t(absl::GetFlag(FLAGS_timeout_s) * 1000)));
  const bool json = absl::GetFlag(FLAGS_json);
  if (cmd == "job-id") {
    auto control = dmagather::v1::Control::NewStub(channel);
    dmagather::v1::CreateJobIdReply reply;
    grpc::Status st = control->CreateJobId(&ctx, {}, &reply);
    if (!st.ok()) return Fail(st, socket);
    std::printf("%s\n", reply.job_id().c_str());
    return 0;
  }

  if (cmd == "health") {
    dmagather::v1::HealthReply h;
    grpc::Status st = stub->Health(&ctx, {}, &h);
    if (!st.ok()) return Fail(st, socket);
    const int rc = h.status() == "SERVING" ? 0 : 1;  // NOT_SERVING / STOPPING: non-zero for probes.
    if (json) return PrintJson(h) != 0 ? 1 : rc;
    std::printf("status:   %s\n", h.status().c_str());
    if (!h.reason().empty()) std::printf("reason:   %s\n", h.reason().c_str());
    std::printf("version:  %s\nbackend:  %s (%s)\nuptime:   %.1f s\njobs:     %d\nsessions: %d\nworkers:  %d\n",
                h.version().c_str(), h.backend().c_str(), h.backend_reason().c_str(), h.uptime_s(), h.jobs(),
                h.sessions(), h.worker_threads());
    // The backends this binary has (its build's toolkits), in auto's order.
    std::string built;
    bool gpu = false;
    for (const std::string& b : h.built_backends()) {
      absl::StrAppend(&built, built.empty() ? "" : ", ", b);
      gpu |= b != "host";
    }
    if (h.built_backends_size() > 0) {
      std::printf("built:    %s%s\n", built.c_str(),
                  gpu ? "" : " (no GPU backend in this build: every op on GPU memory is served by fallback)");
    }
    if (!h.peer_address().empty()) {
      std::printf("peers:    %s, transport %s (%s), %llu refused peer(s)\n", h.peer_address().c_str(),
                  h.transport().c_str(), h.transport_reason().c_str(), (unsigned long long)h.peer_auth_failures());
    }
    return rc;
  }
  if (cmd == "metrics") {
    dmagather::v1::MetricsRequest req;
    req.set_ticket(TelemetryTicket(socket));
    dmagather::v1::MetricsReply m;
    grpc::Status st = stub->Metrics(&ctx, req, &m);
    if (!st.ok()) return Fail(st, socket);
    std::cout << m.text();
    return 0;
  }
  if (cmd == "jobs" || cmd == "stats") {
    dmagather::v1::StatsRequest req;
    req.set_job_key(absl::GetFlag(FLAGS_job));
    req.set_ticket(TelemetryTicket(socket));
    dmagather::v1::StatsReply s;
    grpc::Status st = stub->Stats(&ctx, req, &s);
    if (!st.ok()) return Fail(st, socket);
    if (json) return PrintJson(s);
    std::printf("%-24s %5s %-8s %10s %11s %10s %10s %10s  %s\n", "JOB", "RANKS", "STATE", "OPS", "BYTES", "p50_us",
                "p99_us", "hop_p50", "ERRORS");
    for (const auto& j : s.jobs()) {
      std::printf("%-24s %5d %-8s %10llu %11s %10.1f %10.1f %10.2f  %s\n", j.job_key().c_str(), j.world_size(),
                  j.state().c_str(), (unsigned long long)j.ops(), HumanBytes(double(j.bytes())).c_str(),
                  j.latency().p50_us(), j.latency().p99_us(), j.hop_latency().p50_us(), ErrorsText(j.errors()).c_str());
      if (cmd != "stats") continue;
      if (j.has_ring()) {
        const auto& g = j.ring();
        std::printf(
            "  ring: node %d of %d, %s x%d (%s); next %s, prev %s; sent %s, received %s, %.2f Gbit/s in "
            "ring, chunk p50 %.0f us p99 %.0f us\n",
            g.node(), g.nodes(), g.transport().c_str(), g.links(), g.transport_reason().c_str(), g.next().c_str(),
            g.prev().c_str(), HumanBytes(double(g.bytes_sent())).c_str(),
            HumanBytes(double(g.bytes_received())).c_str(), g.throughput_gbps(), g.chunk_latency().p50_us(),
            g.chunk_latency().p99_us());
      }
      std::printf("  %4s %8s %-8s %10s %11s %10s %10s %11s  %s\n", "RANK", "PID", "STATE", "OPS", "BYTES", "p50_us",
                  "p99_us", "REGISTERED", "ERRORS");
      for (const auto& r : j.ranks()) {
        std::printf("  %4d %8d %-8s %10llu %11s %10.1f %10.1f %11s  %s\n", r.rank(), r.pid(), r.state().c_str(),
                    (unsigned long long)r.ops(), HumanBytes(double(r.bytes())).c_str(), r.latency().p50_us(),
                    r.latency().p99_us(), HumanBytes(double(r.registered_bytes())).c_str(),
                    ErrorsText(r.errors()).c_str());
      }
    }
    if (cmd == "stats") {
      std::printf("node: %llu ops, %s moved, %s registered, %llu jobs completed, errors %s, fallbacks ",
                  (unsigned long long)s.total_ops(), HumanBytes(double(s.total_bytes())).c_str(),
                  HumanBytes(double(s.registered_bytes())).c_str(), (unsigned long long)s.jobs_completed(),
                  ErrorsText(s.errors()).c_str());
      std::string fb;
      for (const auto& f : s.fallbacks())
        fb += absl::StrFormat("%s%s=%u", fb.empty() ? "" : ",", f.reason(), f.count());
      std::printf("%s\n", fb.empty() ? "-" : fb.c_str());
      if (s.copy_engines_size() > 0) {
        // GPU backends: bytes per device and engine dmagatherd assigned, or
        // per device ("runtime") where the runtime picks the engine.
        std::string ce;
        for (const auto& c : s.copy_engines()) {
          ce += absl::StrFormat(" gpu%u/%s=%s", c.device(),
                                c.engine() < 0 ? std::string("runtime") : absl::StrCat("sdma", c.engine()),
                                HumanBytes(double(c.bytes())));
        }
        std::printf("copy engines:%s\n", ce.c_str());
      }
      uint64_t device_done = 0, before_cpu = 0;
      for (const auto& j : s.jobs()) device_done += j.device_done_ops(), before_cpu += j.done_before_cpu();
      std::printf(
          "cpu: ingress slept %llu times, engine threads woken %llu times; done flags a GPU wrote: %llu ops "
          "(%llu rank-ops before the CPU came to publish); ops held on the CPU for an earlier op: %llu\n",
          (unsigned long long)s.ingress_sleeps(), (unsigned long long)s.engine_wakeups(),
          (unsigned long long)device_done, (unsigned long long)before_cpu, (unsigned long long)s.ops_held_on_cpu());
      std::printf(
          "restarts: %llu jobs taken back from an earlier daemon (%llu ranks, %llu ops handed over); gap without a "
          "daemon p50 %.0f ms, max %.0f ms\n",
          (unsigned long long)s.jobs_taken_over(), (unsigned long long)s.ranks_resumed(),
          (unsigned long long)s.ops_handed_over(), s.handover_gap().p50_us() / 1000, s.handover_gap().max_us() / 1000);
    }
    return 0;
  }
  std::cerr << "dmagatherctl: unknown command '" << cmd << "' (health, jobs, stats, metrics)\n";
  return 2;
}
