// dmagatherd --help, group "engines": which copy backend moves the bytes, how
// its work is cut and issued, and the cuda and hip backends' own settings
// (they were DMAGATHER_CUDA_* and DMAGATHER_HIP_* variables). Declared in server/flags/flags.h; read by
// server/main.cc.
#include "absl/flags/flag.h"
#include "server/flags/flags.h"

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
ABSL_FLAG(int, host_inline_kib, 256,
          "Host backend: ops whose copies total at most this many KiB are copied on the ingress thread "
          "(no worker wake-up); 0 = always hand them to the workers.");
ABSL_FLAG(int, stay_awake_us, -1,
          "While a job is active, the threads on an op's path (ingress; the GPU engine's issuing, gate and "
          "completion threads) keep polling this long after their last work instead of sleeping, so an op after "
          "a gap costs no wake-up; each such thread holds a core meanwhile (yielding it to anything runnable). "
          "-1: the backend's default (cuda, hip 10000; host 0, which polls briefly and sleeps); 0: sleep "
          "after a short spin.");

// The cuda backend (docs/CUDA.md). A/B switches for measurements: leave them
// at their defaults.
ABSL_FLAG(bool, cuda_batch, true,
          "cuda backend: copies go out as cudaMemcpyBatchAsync calls (false: one cudaMemcpyAsync per chunk; a "
          "rank's own shards follow DMAGATHER_CUDA_BATCH, read by the client library).");
ABSL_FLAG(bool, cuda_graphs, true,
          "cuda backend: copy calls that repeat are replayed from CUDA graphs (false: every call is issued as a "
          "batch).");
ABSL_FLAG(int, cuda_graph_max_kib, 1024,
          "cuda backend: the largest chunk (KiB, at least 1) replayed from a graph as one chain; a chain runs its "
          "copies one after another.");
ABSL_FLAG(int, cuda_graph_sole_max_kib, 65536,
          "cuda backend: the same for a call that is its op's only stream on the device (0: as other calls).");
ABSL_FLAG(int, cuda_graph_per_shape, 4,
          "cuda backend: graphs kept per call shape and stream, updated in place at new addresses (0: a graph "
          "serves its exact addresses only).");
ABSL_FLAG(bool, cuda_done_on_device, true,
          "cuda backend: a GPU writes the ranks' done flags after the copies (false: the CPU publishes them after "
          "seeing the op's end event).");

// The hip backend (docs/AMD.md).
ABSL_FLAG(std::string, hip_engines, "own",
          "hip backend: own (dmagatherd assigns an SDMA engine per peer link where the runtime allows, else "
          "leaves the copies to ROCr and logs why) or rocr (every copy left to ROCr's engine choice).");
ABSL_FLAG(std::string, hip_skip_engines, "",
          "hip backend: hex mask of SDMA engines never to use (0x6), on top of those the driver reports "
          "unusable.");
ABSL_FLAG(std::string, hip_lib, "",
          "hip backend: one libamdhip64 file to open instead of the sonames libamdhip64.so.7, .6, .5 (a ROCm "
          "outside the loader's path; ranks: DMAGATHER_HIP_LIB).");
ABSL_FLAG(std::string, hsa_lib, "",
          "hip backend: one libhsa-runtime64 file to open instead of the soname libhsa-runtime64.so.1 (a ROCm "
          "outside the loader's path).");
