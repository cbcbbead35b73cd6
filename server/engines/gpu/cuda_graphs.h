// The cuda runtime's copy graphs (cuda_runtime.cc): how a CopyGraphCache
// (copy_graph_cache.h) builds, launches and destroys CUDA graphs of memcpy
// nodes, and its options (DMAGATHER_CUDA_GRAPH_MAX_KIB). Called on a
// device's issuing thread.
#pragma once

#include "server/engines/gpu/copy_graph_cache.h"

namespace dmagather::server::engines::gpu {

CopyGraphCache::Ops CudaGraphOps();
CopyGraphCache::Options CudaGraphOptions();

}  // namespace dmagather::server::engines::gpu
