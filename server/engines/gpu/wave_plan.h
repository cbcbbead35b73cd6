// WavePlan: how the GPU engine cuts one device's share of an op into
// copy-engine work. A pure function (no GPU runtime), so it is tested on CPU-only
// machines.
//
//  - Every copy is cut into chunks of at most chunk_bytes (single copies of
//    256 MiB and more were seen to hang a copy engine; the runtime caps it).
//  - Chunks are ordered in ring steps: step s carries, for every
//    destination rank d, the copy from source (d + s) % world. Consecutive
//    chunks therefore target different peers instead of all copies hitting
//    one peer at once (incast).
//  - The ordered chunks are dealt round-robin to the device's streams, and
//    each stream's share is issued in batches (waves) of at most max_batch
//    chunks, one runtime copy call each (cudaMemcpyBatchAsync on cuda).
//  - With stream_per_link (a share that reads or writes several peer
//    devices), chunks are dealt by link instead: every chunk of the link to
//    one peer goes to one stream (links beyond the stream count share
//    streams round-robin), so the links run side by side rather than one
//    after another in a stream, or in a copy graph's chain. Batches then go
//    out in rounds: each stream's first batch, then each stream's second...
//
// Threads: any (one call at a time per output vectors); the output vectors
// are the caller's scratch and keep their capacity, and the internal
// scratch is per thread (no allocation after warm-up).
#pragma once

#include <cstdint>
#include <vector>

#include "server/engines/copy_engine.h"

namespace dmagather::server::engines::gpu {

struct WavePlanOptions {
  uint64_t chunk_bytes = 8 << 20;
  int streams = 4;
  int max_batch = 16;
  int world_size = 1;  // For the ring order (ranks of the op).
  // One stream per peer link (copies carry src_device/dst_device); the
  // link of a copy is its end that is not `device`.
  bool stream_per_link = false;
  int device = -1;
};

// One cudaMemcpyBatchAsync: chunks[begin, end) on `stream`.
struct WaveBatch {
  int stream = 0;
  uint32_t begin = 0;
  uint32_t end = 0;
};

// Fills `chunks` (ordered so that every batch is contiguous) and `batches`
// (in issue order) from `copies`. Both outputs are cleared first.
void PlanWaves(const std::vector<CopyCmd>& copies, const WavePlanOptions& options, std::vector<CopyCmd>* chunks,
               std::vector<WaveBatch>* batches);

}  // namespace dmagather::server::engines::gpu
