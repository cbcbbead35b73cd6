#include "server/engines/gpu/hip/hsa_streams.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dmagather::server::engines::gpu::hip {

struct HsaStreams::Stream {
  Stream(const HsaCopyApi* api, int d) : device(d), queue(api) {}
  const int device;
  HsaCopyQueue queue;
  // Marks of other queues this stream has waited on: every event recorded
  // on it after the wait covers them too.
  std::map<HsaCopyQueue*, uint64_t> waits;
};

struct HsaStreams::Event {
  std::map<HsaCopyQueue*, uint64_t> marks;
};

HsaStreams::HsaStreams(const HsaCopyApi* api, SdmaEnginePlan plan, std::vector<hsa_agent_t> agents)
    : api_(api),
      plan_(std::move(plan)),
      agents_(std::move(agents)),
      bytes_(new std::atomic<uint64_t>[agents_.size() * (HsaCopyQueue::kEngines + 1)]()) {
  const int n = static_cast<int>(agents_.size());
  local_engine_.assign(n, 0);
  for (int src = 0; src < n; ++src) {
    for (int dst = 0; dst < n && local_engine_[src] == 0; ++dst) {
      if (dst != src) local_engine_[src] = plan_.EngineFor(dst, src);
    }
  }
}

HsaStreams::~HsaStreams() = default;

HsaStreams::Stream* HsaStreams::CreateStream(int device) {
  absl::MutexLock l(&mu_);
  streams_.push_back(std::make_unique<Stream>(api_, device));
  return streams_.back().get();
}

void HsaStreams::DestroyStream(Stream* s) {
  absl::MutexLock l(&mu_);
  for (auto it = streams_.begin(); it != streams_.end(); ++it) {
    if (it->get() != s) continue;
    streams_.erase(it);
    return;
  }
}

HsaStreams::Event* HsaStreams::CreateEvent() { return new Event; }

void HsaStreams::DestroyEvent(Event* e) { delete e; }

absl::Status HsaStreams::Copy(Stream* s, const CopyCmd* chunks, size_t n) {
  const int devices = static_cast<int>(agents_.size());
  for (size_t i = 0; i < n; ++i) {
    const CopyCmd& c = chunks[i];
    const int dst = c.dst_device >= 0 ? c.dst_device : s->device;
    const int src = c.src_device >= 0 ? c.src_device : s->device;
    if (dst >= devices || src >= devices) {
      return absl::InvalidArgumentError(
          absl::StrCat("copy between devices ", src, " and ", dst, " of a node with ", devices, " device(s)"));
    }
    const bool local = dst == src;
    const uint32_t engine = local ? local_engine_[src] : plan_.EngineFor(dst, src);
    absl::Status st = s->queue.Copy(c.dst, agents_[dst], c.src, agents_[src], c.bytes, engine, local && engine != 0);
    if (!st.ok()) return st;
    // The queue takes ROCr's choice when the runtime has no copy_on_engine.
    const int index =
        engine != 0 && api_->copy_on_engine != nullptr ? __builtin_ctz(engine) % HsaCopyQueue::kEngines : -1;
    bytes_[src * (HsaCopyQueue::kEngines + 1) + index + 1].fetch_add(c.bytes, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

absl::Status HsaStreams::Record(Event* e, Stream* s) {
  e->marks.clear();
  for (const auto& [q, mark] : s->waits) e->marks[q] = mark;
  e->marks[&s->queue] = s->queue.Mark();
  return absl::OkStatus();
}

absl::Status HsaStreams::Wait(Stream* s, Event* e) {
  for (const auto& [q, mark] : e->marks) {
    if (q == &s->queue) continue;  // The stream's own order covers it.
    uint64_t& w = s->waits[q];
    w = std::max(w, mark);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> HsaStreams::Query(Event* e) {
  bool done = true;
  for (const auto& [q, mark] : e->marks) {
    absl::StatusOr<bool> d = q->Complete(mark);
    if (!d.ok()) return d.status();
    done = done && *d;
  }
  return done;
}

std::vector<CopyEngineBytes> HsaStreams::Counters() const {
  std::vector<CopyEngineBytes> out;
  for (int d = 0; d < static_cast<int>(agents_.size()); ++d) {
    for (int e = -1; e < HsaCopyQueue::kEngines; ++e) {
      const uint64_t b = bytes_[d * (HsaCopyQueue::kEngines + 1) + e + 1].load(std::memory_order_relaxed);
      if (b != 0) out.push_back(CopyEngineBytes{d, e, b});
    }
  }
  return out;
}

}  // namespace dmagather::server::engines::gpu::hip
