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
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/hip/hip_library.h"
#include "server/daemon.h"
#include "server/flags/flags.h"
#include "server/transport/ibverbs_transport.h"

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
  o.engine.host_inline_bytes = uint64_t(std::max(0, absl::GetFlag(FLAGS_host_inline_kib))) << 10;
  o.op_timeout = absl::Seconds(absl::GetFlag(FLAGS_op_timeout_s));
  const int stay_awake_us = absl::GetFlag(FLAGS_stay_awake_us);
  o.engine.stay_awake_ns = stay_awake_us < 0 ? -1 : int64_t(stay_awake_us) * 1000;
  o.engine.cuda.batch = absl::GetFlag(FLAGS_cuda_batch);
  o.engine.cuda.graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.engine.cuda.graph_max_chunk_bytes = uint64_t(std::max(1, absl::GetFlag(FLAGS_cuda_graph_max_kib))) << 10;
  o.engine.cuda.graph_sole_max_chunk_bytes = uint64_t(std::max(0, absl::GetFlag(FLAGS_cuda_graph_sole_max_kib))) << 10;
  o.engine.cuda.graph_per_shape = std::max(0, absl::GetFlag(FLAGS_cuda_graph_per_shape));
  o.engine.cuda.done_on_device = absl::GetFlag(FLAGS_cuda_done_on_device);
  o.engine.hip.engines = absl::GetFlag(FLAGS_hip_engines);
  if (o.engine.hip.engines != "own" && o.engine.hip.engines != "rocr") {
    std::fprintf(stderr, "dmagatherd: --hip_engines=%s: expected own or rocr\n", o.engine.hip.engines.c_str());
    return false;
  }
  o.engine.hip.skip_engines = absl::GetFlag(FLAGS_hip_skip_engines);
  o.engine.hip.hsa_lib = absl::GetFlag(FLAGS_hsa_lib);
  // libamdhip64 is opened by common/hip, which the client library shares
  // (and reads DMAGATHER_HIP_LIB there); the daemon names the file itself.
  dmagather::common::hip::SetHipLibrary(absl::GetFlag(FLAGS_hip_lib));
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
  // The ibverbs transport's options go to it directly: the peer service
  // creates the transport, and PeerOptions does not carry them.
  auto ib = dmagather::server::transport::IbverbsOptionsFromFlags(
      absl::GetFlag(FLAGS_ib_device), absl::GetFlag(FLAGS_ib_gid_index), absl::GetFlag(FLAGS_ib_slots),
      absl::GetFlag(FLAGS_ib_slot_bytes));
  if (!ib.ok()) {
    std::fprintf(stderr, "dmagatherd: %s\n", std::string(ib.status().message()).c_str());
    return false;
  }
  dmagather::server::transport::SetIbverbsOptions(*ib);

  o.max_jobs_per_uid = std::max(0, absl::GetFlag(FLAGS_max_jobs_per_uid));
  o.max_sessions_per_uid = std::max(0, absl::GetFlag(FLAGS_max_sessions_per_uid));
  o.max_regions_per_uid = std::max(0, absl::GetFlag(FLAGS_max_regions_per_uid));
  const int64_t mapped = absl::GetFlag(FLAGS_max_mapped_bytes_per_uid);
  o.max_mapped_bytes_per_uid =
      mapped < 0 ? uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE)) : uint64_t(mapped);
  o.operator_group = absl::GetFlag(FLAGS_operator_group);
  return true;
}

// Settings that earlier releases read from the environment and that are
// flags now: said once at start-up where one is still set (a unit's
// Environment= line from before), so that an operator sees it is ignored.
void NameFormerVariables() {
  static constexpr std::pair<const char*, const char*> kNowFlags[] = {
      {"CUDA_GRAPHS", "--cuda_graphs"},
      {"CUDA_GRAPH_MAX_KIB", "--cuda_graph_max_kib"},
      {"CUDA_GRAPH_SOLE_MAX_KIB", "--cuda_graph_sole_max_kib"},
      {"CUDA_GRAPH_PER_SHAPE", "--cuda_graph_per_shape"},
      {"CUDA_DONE_ON_DEVICE", "--cuda_done_on_device"},
      {"CUDA_CHUNK_MIB", "--chunk_kib"},
      {"HSA_LIB", "--hsa_lib"},
      {"HIP_ENGINES", "--hip_engines"},
      {"HIP_SKIP_ENGINES", "--hip_skip_engines"},
      {"IB_DEVICE", "--ib_device"},
      {"IB_GID_INDEX", "--ib_gid_index"},
      {"IB_SLOTS", "--ib_slots"},
      {"IB_SLOT_BYTES", "--ib_slot_bytes"},
  };
  for (const auto& [name, flag] : kNowFlags) {
    const std::string var = absl::StrCat("DMAGATHER_", name);
    if (std::getenv(var.c_str()) != nullptr) {
      LOG(WARNING) << var << " is set but dmagatherd no longer reads it: give " << flag << " instead";
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Debian builds Abseil with its debug-mode deadlock detector on: every
  // absl::Mutex lock then takes one process-wide spin lock, and one taken
  // while another is held updates a graph of lock order (8 nested
  // device-order locks cost 4-10x as much; bench/mutex_detector), and
  // taking two locks in the reverse of an order it has seen would abort
  // the daemon with every job on the node. The order is checked where it
  // belongs: the unit tests keep the detector on, the driver model checks
  // the issue path (docs/CUDA.md, "Locks and waits"), clang checks the
  // annotations; the daemon does not pay for it on every op.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "dmagatherd --socket=PATH [--backend=host|cuda|hip|auto] [flags]\n"
      "The per-node AllGather daemon: ranks join over the gRPC socket, submit AllGathers through shared-memory "
      "rings, and the daemon moves the bytes (copy engines on GPUs, worker threads on the host backend).\n"
      "Flags come in groups, one file each: service, limits, engines, cluster, diagnostics. Every flag, its "
      "default, who it is for and why: docs/OPERATIONS.md \"Knobs\".");
  absl::FlagsUsageConfig usage;
  // --help: the daemon's flags, one group per file of server/flags/
  // (service, limits, engines, cluster, diagnostics); --helpfull adds absl's.
  usage.contains_help_flags = [](absl::string_view file) { return absl::StrContains(file, "server/flags/"); };
  usage.version_string = [] { return std::string("dmagatherd ") + dmagather::server::Daemon::Version() + "\n"; };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = MinLogLevel(absl::GetFlag(FLAGS_log_level));
  google::InitGoogleLogging(argv[0]);
  NameFormerVariables();

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
