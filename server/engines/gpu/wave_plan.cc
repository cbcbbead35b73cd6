#include "server/engines/gpu/wave_plan.h"

#include <algorithm>

namespace dmagather::server::engines::gpu {
namespace {

// Ring step of a copy: 0 for a rank's own shard, s when the source is s
// ranks after the destination.
int StepOf(const CopyCmd& c, int world) {
  const int w = std::max(world, 1);
  return ((c.src_rank - c.dst_rank) % w + w) % w;
}

// 2'. Deal by link: lane = the link's index in order of first appearance,
//     stream = lane % streams; then batches in rounds.
void DealByLink(const std::vector<CopyCmd>& ordered, const WavePlanOptions& options, int streams, uint32_t max_batch,
                std::vector<CopyCmd>* chunks, std::vector<WaveBatch>* batches) {
  thread_local std::vector<int> lanes;  // Peer device of each lane.
  thread_local std::vector<std::vector<CopyCmd>> per_stream;
  lanes.clear();
  if (per_stream.size() < size_t(streams)) per_stream.resize(streams);
  for (int s = 0; s < streams; ++s) per_stream[s].clear();
  for (const CopyCmd& c : ordered) {
    const int peer = c.src_device == options.device ? c.dst_device : c.src_device;
    size_t lane = std::find(lanes.begin(), lanes.end(), peer) - lanes.begin();
    if (lane == lanes.size()) lanes.push_back(peer);
    per_stream[lane % streams].push_back(c);
  }
  for (size_t round = 0;; ++round) {
    bool more = false;
    for (int s = 0; s < streams; ++s) {
      const std::vector<CopyCmd>& q = per_stream[s];
      const size_t b0 = round * max_batch;
      if (b0 >= q.size()) continue;
      more = true;
      const size_t b1 = std::min(q.size(), b0 + max_batch);
      const uint32_t begin = static_cast<uint32_t>(chunks->size());
      chunks->insert(chunks->end(), q.begin() + b0, q.begin() + b1);
      batches->push_back(WaveBatch{s, begin, static_cast<uint32_t>(chunks->size())});
    }
    if (!more) break;
  }
}

}  // namespace

void PlanWaves(const std::vector<CopyCmd>& copies, const WavePlanOptions& options, std::vector<CopyCmd>* chunks,
               std::vector<WaveBatch>* batches) {
  chunks->clear();
  batches->clear();
  if (copies.empty()) return;
  const uint64_t chunk = std::max<uint64_t>(options.chunk_bytes, 4096);
  const int streams = std::max(options.streams, 1);
  const uint32_t max_batch = static_cast<uint32_t>(std::max(options.max_batch, 1));
  const int world = std::max(options.world_size, 1);

  // 1. Chunks in ring order: by chunk index (so each copy progresses), then
  //    by ring step, then by destination, then by position in the plan (a
  //    total order, so std::sort - in place, no allocation, unlike
  //    std::stable_sort - gives a stable result).
  thread_local std::vector<uint32_t> order;
  order.resize(copies.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const int sa = StepOf(copies[a], world), sb = StepOf(copies[b], world);
    if (sa != sb) return sa < sb;
    if (copies[a].dst_rank != copies[b].dst_rank) return copies[a].dst_rank < copies[b].dst_rank;
    return a < b;
  });
  uint64_t max_pieces = 0;
  for (const CopyCmd& c : copies) max_pieces = std::max<uint64_t>(max_pieces, (c.bytes + chunk - 1) / chunk);
  thread_local std::vector<CopyCmd> ordered;
  ordered.clear();
  for (uint64_t k = 0; k < max_pieces; ++k) {
    for (uint32_t i : order) {
      const CopyCmd& c = copies[i];
      const uint64_t off = k * chunk;
      if (off >= c.bytes) continue;
      ordered.push_back(CopyCmd{c.dst + off, c.src + off, std::min(chunk, c.bytes - off), c.src_rank, c.dst_rank,
                                c.src_device, c.dst_device});
    }
  }

  if (options.stream_per_link) {
    DealByLink(ordered, options, streams, max_batch, chunks, batches);
    return;
  }

  // 2. Deal round-robin to streams; emit per wave, per stream, contiguous.
  //    A wave holds up to streams * max_batch chunks.
  const size_t wave = size_t(streams) * max_batch;
  for (size_t w0 = 0; w0 < ordered.size(); w0 += wave) {
    const size_t w1 = std::min(ordered.size(), w0 + wave);
    for (int s = 0; s < streams; ++s) {
      const uint32_t begin = static_cast<uint32_t>(chunks->size());
      for (size_t i = w0 + s; i < w1; i += streams) chunks->push_back(ordered[i]);
      const uint32_t end = static_cast<uint32_t>(chunks->size());
      if (end != begin) batches->push_back(WaveBatch{s, begin, end});
    }
  }
}

}  // namespace dmagather::server::engines::gpu
