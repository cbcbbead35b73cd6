// The cuda runtime's copy graphs (cuda_graphs.h).
#include "server/engines/gpu/cuda_graphs.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "common/cuda/cuda_api.h"
#include "common/status.h"

namespace dmagather::server::engines::gpu {
namespace {

using ::dmagather::common::cuda::CudaStatus;

// Chains side by side for copy calls with chunks above the chain cap
// (docs/PERFORMANCE.md, "Medium ops"); 0: those calls are issued as a batch.
constexpr size_t kGraphLanes = 0;

// Calls that are their op's sole stream on the device: chains of chunks up to
// this (DMAGATHER_CUDA_GRAPH_SOLE_MAX_KIB; 0: the cap above for them too).
// Measured on one H200, ranks sharing it (docs/PERFORMANCE.md, "Medium ops"):
// ops of 4 MiB x 2-4 ranks and 16 MiB x 2 ranks issued 5-10x faster and ran
// as fast or faster end to end as one chain; ops that fan out over streams
// took +2.1 ms in 10-33% of cases as chains, so those keep the batch path.
constexpr uint64_t kSoleChainMaxBytes = uint64_t{64} << 20;

// A graph of the chunks as memcpy nodes in `lanes` chains, chunk i after
// chunk i - lanes: a chain launches in ~1.2-2.3 us whatever its length,
// where independent nodes cost ~1 us each (the driver fans them out over
// internal streams), so lanes = 1 is cheapest and more lanes let large
// copies overlap.
absl::StatusOr<CopyGraphCache::Graph> BuildGraph(const CopyCmd* chunks, size_t n, size_t lanes) {
  cudaGraph_t g = nullptr;
  DMAG_CUDA_RETURN_IF_ERROR(cudaGraphCreate(&g, 0));
  std::vector<cudaGraphNode_t> nodes(n, nullptr);
  cudaError_t err = cudaSuccess;
  for (size_t i = 0; i < n && err == cudaSuccess; ++i) {
    const cudaGraphNode_t* dep = i >= lanes ? &nodes[i - lanes] : nullptr;
    err = cudaGraphAddMemcpyNode1D(&nodes[i], g, dep, dep != nullptr ? 1 : 0, chunks[i].dst, chunks[i].src,
                                   chunks[i].bytes, cudaMemcpyDeviceToDevice);
  }
  cudaGraphExec_t exec = nullptr;
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus("cudaGraphAddMemcpyNode1D/cudaGraphInstantiate", err);
  }
  return static_cast<CopyGraphCache::Graph>(exec);
}

}  // namespace

CopyGraphCache::Ops CudaGraphOps() {
  CopyGraphCache::Ops ops;
  ops.build = BuildGraph;
  ops.launch = [](CopyGraphCache::Graph g, void* stream) {
    cudaError_t err = cudaGraphLaunch(static_cast<cudaGraphExec_t>(g), static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) cudaGetLastError();
    return CudaStatus("cudaGraphLaunch(copies)", err);
  };
  // A graph still in flight is freed by the driver when it completes.
  ops.destroy = [](CopyGraphCache::Graph g) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g)); };
  return ops;
}

CopyGraphCache::Options CudaGraphOptions() {
  CopyGraphCache::Options o;
  // Largest chunk replayed (DMAGATHER_CUDA_GRAPH_MAX_KIB). Measured on one
  // H200 (ranks sharing it): 4 KiB and 1 MiB copies issued and ran faster
  // from a graph; with 16 MiB shards a chain took 2-3.5x longer end to end
  // and with 64 MiB shards the p99 went from ~1.0 to 2.7 ms (a chain runs
  // its copies one after another). Not yet measured with ranks on several
  // GPUs (peer copies on copy engines).
  if (const char* e = std::getenv("DMAGATHER_CUDA_GRAPH_MAX_KIB"); e != nullptr && std::atoll(e) > 0) {
    o.max_chunk_bytes = uint64_t(std::atoll(e)) << 10;
  }
  o.max_sole_chunk_bytes = kSoleChainMaxBytes;
  if (const char* e = std::getenv("DMAGATHER_CUDA_GRAPH_SOLE_MAX_KIB"); e != nullptr && *e != '\0') {
    o.max_sole_chunk_bytes = uint64_t(std::max(0LL, std::atoll(e))) << 10;
  }
  // Calls with larger chunks: replayed as this many chains side by side
  // (DMAGATHER_CUDA_GRAPH_LANES; 0: issued as a batch, docs/CUDA.md).
  o.lanes = kGraphLanes;
  if (const char* e = std::getenv("DMAGATHER_CUDA_GRAPH_LANES"); e != nullptr && *e != '\0') {
    o.lanes = size_t(std::max(0LL, std::atoll(e)));
  }
  return o;
}

}  // namespace dmagather::server::engines::gpu
