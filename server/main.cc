// dmagatherd: the node's AllGather daemon. Flags, logging, signals and
// systemd readiness; everything else is in Daemon.
#include <glog/logging.h>
#include <signal.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/daemon.h"

ABSL_FLAG(std::string, socket, "/run/dmagather/dmagatherd.sock",
          "Unix socket of the gRPC control plane. Clients find it through DMAGATHER_SOCKET or this default.");
ABSL_FLAG(std::string, backend, "auto",
          "Copy backend: host (worker threads over shared memory), cuda (copy engines), hip (SDMA), or auto "
          "(hip, then cuda, then host: the first that starts; the choice and its reason are logged).");
ABSL_FLAG(int, workers, 4, "Host backend: copy worker threads.");
ABSL_FLAG(int, chunk_kib, 0,
          "Copies are cut into chunks of this many KiB so every worker (host) or stream (cuda) shares a large op. "
          "0: the backend's default (host 1024, cuda 32768, hip 65536; cuda caps it at 65536, hip at 131072).");
ABSL_FLAG(int, streams, 0,
          "GPU backends (cuda, hip): copy streams per device; 0 = max(4, devices - 1), so that a device pulls from "
          "every peer at once.");
ABSL_FLAG(bool, parallel_issue, true,
          "GPU backends with several devices: each device's copies are issued by its own thread (false: one thread "
          "issues every device in turn).");
ABSL_FLAG(int, max_waits_ahead, 2,
          "GPU backends that wait for ready flags on the device (cuda): while an op issued ahead of its ranks' "
          "ready flags is in flight, at most this many ops are in flight; later ones wait on the CPU until their "
          "flags are seen or the count falls (docs/CUDA.md, \"Locks and waits\"). 0 = no bound, which can "
          "deadlock when a stream's queue fills behind a parked wait.");
ABSL_FLAG(int, host_inline_kib, 256,
          "Host backend: ops whose copies total at most this many KiB are copied on the ingress thread "
          "(no worker wake-up); 0 = always hand them to the workers.");
ABSL_FLAG(int, ingress_spin, 2048,
          "Empty polls of the ranks' rings (each a CPU pause, ~0.05 us) before the ingress thread sleeps until a "
          "rank rings; more: lower latency while ops flow, at the cost of a busy core.");
ABSL_FLAG(double, op_timeout_s, 60.0,
          "An AllGather whose ranks have not all submitted it within this many seconds fails with TIMEOUT on the "
          "ranks that did, and stops the job.");
ABSL_FLAG(double, drain_timeout_s, 10.0, "On SIGTERM, how long in-flight operations may take to finish.");
ABSL_FLAG(std::string, socket_mode, "0660",
          "Permissions of the socket and of the fd channel <socket>.fd (octal); 0666 lets every user connect.");
ABSL_FLAG(int, fd_timeout_ms, 2000,
          "The fd channel (<socket>.fd): a connection that has not sent its one request within this many ms is "
          "closed.");
ABSL_FLAG(int, fd_max_connections_per_uid, 32,
          "The fd channel: connections one uid may have open at once (beyond it a new one is closed at once; when "
          "the channel's 256 slots are full, the user holding the most gives up its oldest). 0: no per-user cap.");
ABSL_FLAG(int, max_connections, 1024, "The control socket: connections open at once, all users together.");
ABSL_FLAG(int, max_connections_per_uid, 64,
          "The control socket: connections one uid may have open at once (a rank holds one); beyond it a new "
          "connection is closed at once. 0: no per-user cap.");
ABSL_FLAG(int, fd_ticket_ttl_ms, 5000,
          "A descriptor handed over on the fd channel must be claimed by its Join/Register within this many ms.");
ABSL_FLAG(int, max_jobs_per_uid, 64, "Per-user limit: jobs one uid may have at once (0: no limit).");
ABSL_FLAG(int, max_sessions_per_uid, 1024,
          "Per-user limit: ranks (Join sessions) one uid may have open (0: no limit).");
ABSL_FLAG(int, max_regions_per_uid, 16384,
          "Per-user limit: registered buffers one uid may hold, over all its ranks (0: no limit).");
ABSL_FLAG(int64_t, max_mapped_bytes_per_uid, -1,
          "Per-user limit: host bytes one uid may have registered (mapped by the daemon). -1: this node's physical "
          "memory; 0: no limit.");
ABSL_FLAG(std::string, operator_group, "",
          "Members of this group see every job in Telemetry.Stats/Metrics (dmagatherctl); others see their own "
          "uid's jobs. Empty: only root sees all.");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus endpoint: GET /metrics over HTTP on HOST:PORT ([::1]:9464 for IPv6, port 0 = any free "
          "port); empty = none. Every job's counters: keep it on loopback or a network only operators reach.");
ABSL_FLAG(std::string, peer_listen, "",
          "Multi-node jobs: HOST:PORT on which peer daemons reach this one (ring links, job coordinator). "
          "Empty: single-node jobs only.");
ABSL_FLAG(std::string, peer_advertise, "",
          "The HOST:PORT other nodes' daemons connect to (default: the bound --peer_listen address).");
ABSL_FLAG(std::string, transport, "auto",
          "Between daemons: tcp, ibverbs, or auto (ibverbs when an RDMA device is usable, else tcp; the "
          "reason is logged and shown by `dmagatherctl health`).");
ABSL_FLAG(int, peer_links, 4, "Multi-node jobs: connections to the next node per job (1..64).");
ABSL_FLAG(int, ring_chunk_kib, 1024, "Multi-node jobs: ring chunk size in KiB (4..65536).");
ABSL_FLAG(int, ring_transit_mib, 4096,
          "Multi-node jobs on GPU backends: pinned host memory one job's ring may hold for staging (MiB); an op "
          "that needs more is answered FALLBACK.");
ABSL_FLAG(std::string, ring_staging, "auto",
          "Multi-node jobs: auto (stage through pinned host memory only where rank memory is device memory) or "
          "always (also on the host backend: exercises the GPU backends' path on a CPU machine).");
ABSL_FLAG(int, peer_timeout_ms, 5000,
          "Multi-node jobs: a next node whose ring heartbeats (sent every fifth of this) stop for this long - "
          "its host lost power, the network between is cut, nothing closed the connection - is failed: every "
          "rank of the job gets PEER_FAILED naming it. 0: no heartbeats (only closed connections and the op "
          "timeout are noticed).");
ABSL_FLAG(std::string, log_level, "info", "Least severe messages logged: info, warning or error.");

namespace {

int MinLogLevel(const std::string& s) {
  if (s == "warning") return google::GLOG_WARNING;
  if (s == "error") return google::GLOG_ERROR;
  return google::GLOG_INFO;
}

// The daemon's options from the flags; false (the reason on stderr) on a
// malformed flag.
bool OptionsFromFlags(dmagather::server::DaemonOptions* options) {
  dmagather::server::DaemonOptions& o = *options;
  o.socket_path = absl::GetFlag(FLAGS_socket);
  const std::string mode = absl::GetFlag(FLAGS_socket_mode);
  char* end = nullptr;
  o.socket_mode = static_cast<unsigned>(std::strtoul(mode.c_str(), &end, 8));
  if (mode.empty() || *end != '\0' || o.socket_mode > 0777) {
    std::cerr << "dmagatherd: --socket_mode must be octal permissions like 0660, got '" << mode << "'\n";
    return false;
  }
  o.engine.backend = absl::GetFlag(FLAGS_backend);
  o.engine.workers = absl::GetFlag(FLAGS_workers);
  o.engine.chunk_bytes = uint64_t(absl::GetFlag(FLAGS_chunk_kib)) << 10;
  o.engine.streams_per_device = absl::GetFlag(FLAGS_streams);
  o.engine.parallel_issue = absl::GetFlag(FLAGS_parallel_issue);
  o.engine.max_waits_ahead = std::max(0, absl::GetFlag(FLAGS_max_waits_ahead));
  o.engine.host_inline_bytes = uint64_t(std::max(0, absl::GetFlag(FLAGS_host_inline_kib))) << 10;
  o.op_timeout = absl::Seconds(absl::GetFlag(FLAGS_op_timeout_s));
  o.ingress_spin = static_cast<uint32_t>(std::max(0, absl::GetFlag(FLAGS_ingress_spin)));
  o.drain_timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  o.fd_timeout = absl::Milliseconds(std::max(10, absl::GetFlag(FLAGS_fd_timeout_ms)));
  o.fd_max_connections_per_uid = std::max(0, absl::GetFlag(FLAGS_fd_max_connections_per_uid));
  o.max_connections = std::max(1, absl::GetFlag(FLAGS_max_connections));
  o.max_connections_per_uid = std::max(0, absl::GetFlag(FLAGS_max_connections_per_uid));
  o.ticket_ttl = absl::Milliseconds(std::max(10, absl::GetFlag(FLAGS_fd_ticket_ttl_ms)));
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.peers.listen = absl::GetFlag(FLAGS_peer_listen);
  o.peers.advertise = absl::GetFlag(FLAGS_peer_advertise);
  o.peers.transport = absl::GetFlag(FLAGS_transport);
  o.peers.links = absl::GetFlag(FLAGS_peer_links);
  o.peers.chunk_bytes = uint64_t(std::max(0, absl::GetFlag(FLAGS_ring_chunk_kib))) << 10;
  o.peers.transit_bytes = uint64_t(std::max(1, absl::GetFlag(FLAGS_ring_transit_mib))) << 20;
  const std::string staging = absl::GetFlag(FLAGS_ring_staging);
  if (staging != "auto" && staging != "always") {
    std::fprintf(stderr, "dmagatherd: --ring_staging=%s: expected auto or always\n", staging.c_str());
    return false;
  }
  o.peers.force_staging = staging == "always";
  o.peers.peer_timeout = absl::Milliseconds(std::max(0, absl::GetFlag(FLAGS_peer_timeout_ms)));

  o.max_jobs_per_uid = std::max(0, absl::GetFlag(FLAGS_max_jobs_per_uid));
  o.max_sessions_per_uid = std::max(0, absl::GetFlag(FLAGS_max_sessions_per_uid));
  o.max_regions_per_uid = std::max(0, absl::GetFlag(FLAGS_max_regions_per_uid));
  const int64_t mapped = absl::GetFlag(FLAGS_max_mapped_bytes_per_uid);
  o.max_mapped_bytes_per_uid =
      mapped < 0 ? uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE)) : uint64_t(mapped);
  o.operator_group = absl::GetFlag(FLAGS_operator_group);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "dmagatherd --socket=PATH [--backend=host|cuda|hip|auto] [flags]\n"
      "The per-node AllGather daemon: ranks join over the gRPC socket, submit AllGathers through shared-memory "
      "rings, and the daemon moves the bytes (copy engines on GPUs, worker threads on the host backend).");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) { return absl::EndsWith(file, "server/main.cc"); };
  usage.version_string = [] { return std::string("dmagatherd ") + dmagather::server::Daemon::Version() + "\n"; };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = MinLogLevel(absl::GetFlag(FLAGS_log_level));
  google::InitGoogleLogging(argv[0]);

  // Signals are taken synchronously by this thread (sigwait).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  dmagather::server::DaemonOptions o;
  if (!OptionsFromFlags(&o)) return 2;
  auto daemon = dmagather::server::Daemon::Create(o);
  if (!daemon.ok()) {
    std::cerr << "dmagatherd: " << daemon.status().message() << "\n";
    return 2;
  }
  absl::Status st = (*daemon)->Start();
  if (!st.ok()) {
    std::cerr << "dmagatherd: " << st.message() << "\n";
    return 1;
  }
  sd_notify(0, "READY=1\nSTATUS=serving");
  int sig = 0;
  sigwait(&sigs, &sig);
  sd_notify(0, "STOPPING=1");
  (*daemon)->Stop(absl::StrCat("signal ", strsignal(sig)));
  return 0;
}
