// Picks and creates the CopyEngine named by --backend (host, cuda, hip,
// auto) from the backends registered in this binary (engine_registry.h)
// and says why, for the log and for Health.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::engines {

struct EngineOptions {
  std::string backend = "auto";
  int workers = 4;
  // Copies are cut into chunks of this size so every worker/stream shares a
  // large op. 0: the backend's default (host 1 MiB, cuda 32 MiB, hip 64 MiB; cuda caps
  // it at 64 MiB, hip at 128 MiB).
  uint64_t chunk_bytes = 0;
  // GPU backends: copy streams per device (0: max(4, devices - 1)), and one
  // issuing thread per device (false: one thread issues every device).
  int streams_per_device = 0;
  bool parallel_issue = true;
  // GPU backends with device waits: ops in flight while one issued ahead of
  // its ready flags is (GpuEngine::Options::max_waits_ahead; 0: no bound,
  // which can deadlock).
  int max_waits_ahead = 2;
  // Host backend: plans of at most this many bytes are copied on the
  // calling (ingress) thread - waking workers costs more than the copy.
  uint64_t host_inline_bytes = 256 << 10;
};

struct CreatedEngine {
  std::unique_ptr<CopyEngine> engine;
  std::string reason;
};

// --backend=NAME: that backend, or an error (Unimplemented when it is not
// part of this build, naming those that are). auto: the registered backends
// by descending priority (hip, then cuda, then host); the reason says why the ones
// before the chosen one could not be used.
absl::StatusOr<CreatedEngine> CreateEngine(const EngineOptions& options);

// The backends this binary has (its build found their toolkits), in the
// order --backend=auto tries them: {"cuda", "host"}.
std::vector<std::string> BuiltBackends();

}  // namespace dmagather::server::engines
