// The cuda runtime's copy graphs (cuda_graphs.h).
#include "server/engines/gpu/cuda_graphs.h"

#include <cuda_runtime_api.h>

#include <cstdlib>

#include "common/cuda/cuda_api.h"
#include "common/status.h"

namespace dmagather::server::engines::gpu {
namespace {

using ::dmagather::common::cuda::CudaStatus;

// A graph of the chunks as memcpy nodes, each after the one before: a
// chain launches in ~1.2-2.3 us whatever its length, where independent
// nodes cost ~1 us each (the driver fans them out over internal streams).
absl::StatusOr<CopyGraphCache::Graph> BuildGraph(const CopyCmd* chunks, size_t n) {
  cudaGraph_t g = nullptr;
  DMAG_CUDA_RETURN_IF_ERROR(cudaGraphCreate(&g, 0));
  cudaGraphNode_t prev = nullptr;
  cudaError_t err = cudaSuccess;
  for (size_t i = 0; i < n && err == cudaSuccess; ++i) {
    cudaGraphNode_t node = nullptr;
    err = cudaGraphAddMemcpyNode1D(&node, g, prev != nullptr ? &prev : nullptr, prev != nullptr ? 1 : 0,
                                   chunks[i].dst, chunks[i].src, chunks[i].bytes, cudaMemcpyDeviceToDevice);
    prev = node;
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
  return o;
}

}  // namespace dmagather::server::engines::gpu
