// Picks and creates the CopyEngine named by --backend (host, cuda, hip,
// auto) from the backends registered in this binary (engine_registry.h)
// and says why, for the log and for Health.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::engines {

// The cuda backend's settings (--cuda_* flags; docs/CUDA.md).
struct CudaEngineOptions {
  // Copies go out as cudaMemcpyBatchAsync (--cuda_batch; false: one
  // cudaMemcpyAsync per chunk).
  bool batch = true;
  // Repeated copy calls replayed from CUDA graphs (--cuda_graphs).
  bool graphs = true;
  // Largest chunk replayed from a graph as one chain (--cuda_graph_max_kib),
  // and the same for a call that is its op's sole stream on the device
  // (--cuda_graph_sole_max_kib; 0: as any other call).
  uint64_t graph_max_chunk_bytes = uint64_t{1} << 20;
  uint64_t graph_sole_max_chunk_bytes = uint64_t{64} << 20;
  // Graphs kept per call shape, updated in place at new addresses
  // (--cuda_graph_per_shape; 0: exact addresses only).
  int graph_per_shape = 4;
  // A GPU writes the ranks' done flags (--cuda_done_on_device; false: the
  // CPU publishes them after the op's end event).
  bool done_on_device = true;
};

// The hip backend's settings (--hip_* and --hsa_lib flags; docs/AMD.md).
struct HipEngineOptions {
  // "own": dmagatherd assigns an SDMA engine per peer link; "rocr": every
  // copy is left to ROCr's engine choice (--hip_engines).
  std::string engines = "own";
  // Hex mask of SDMA engines never to use (--hip_skip_engines; "": none).
  std::string skip_engines;
  // One libhsa-runtime64 file to open instead of the soname (--hsa_lib).
  std::string hsa_lib;
};

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
  // How long the threads on an op's path keep polling after their last work
  // (--stay_awake_us); -1: the backend's default (GPU backends
  // kGpuStayAwakeNs, host 0). Resolved by CreateEngine.
  int64_t stay_awake_ns = -1;
  // Host backend: plans of at most this many bytes are copied on the
  // calling (ingress) thread - waking workers costs more than the copy.
  uint64_t host_inline_bytes = 256 << 10;
  CudaEngineOptions cuda;
  HipEngineOptions hip;
};

struct CreatedEngine {
  std::unique_ptr<CopyEngine> engine;
  std::string reason;
  // EngineOptions::stay_awake_ns as resolved for this backend (the ingress
  // thread keeps it too).
  uint64_t stay_awake_ns = 0;
};

// The GPU backends' default for EngineOptions::stay_awake_ns: longer than a
// trainer's compute between two layers' all-gathers (docs/OPERATIONS.md).
inline constexpr int64_t kGpuStayAwakeNs = 10'000'000;

// --backend=NAME: that backend, or an error (Unimplemented when it is not
// part of this build, naming those that are). auto: the registered backends
// by descending priority (hip, then cuda, then host); the reason says why the ones
// before the chosen one could not be used.
absl::StatusOr<CreatedEngine> CreateEngine(const EngineOptions& options);

// The backends this binary has (its build found their toolkits), in the
// order --backend=auto tries them: {"cuda", "host"}.
std::vector<std::string> BuiltBackends();

}  // namespace dmagather::server::engines
