#include "server/engines/host/host_engine.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/memfd.h"
#include "common/status.h"
#include "server/engines/host/stream_copy.h"

namespace dmagather::server::engines::host {
namespace {

class HostRegion : public ImportedRegion {
 public:
  explicit HostRegion(common::MemfdMapping m) : mapping_(std::move(m)) {}
  char* base() const override { return static_cast<char*>(mapping_.data()); }
  uint64_t bytes() const override { return mapping_.size(); }

 private:
  common::MemfdMapping mapping_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HostEngine>> HostEngine::Create(const Options& options) {
  if (options.workers < 1 || options.workers > 256) {
    return absl::InvalidArgumentError(absl::StrCat("worker threads must be 1..256, got ", options.workers));
  }
  if (options.chunk_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("chunk bytes must be >= 4096, got ", options.chunk_bytes));
  }
  return std::unique_ptr<HostEngine>(new HostEngine(options));
}

HostEngine::HostEngine(const Options& options) : options_(options) {
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

HostEngine::~HostEngine() { Stop(); }

absl::StatusOr<std::shared_ptr<ImportedRegion>> HostEngine::Import(const RegionSpec& spec) {
  if (spec.kind != kMemoryHostMemfd) {
    return common::FallbackError(
        absl::StrCat("the host backend imports only sealed memfd buffers, not '", spec.kind, "' memory"));
  }
  if (spec.fd < 0) return absl::InvalidArgumentError("host memory without a descriptor");
  // Maps only the registered bytes of what the client handed over (sealed
  // against shrinking: an access can never fault).
  DMAG_ASSIGN_OR_RETURN(common::MemfdMapping m, common::MemfdMapping::Map(spec.fd, spec.bytes));
  return std::make_shared<HostRegion>(std::move(m));
}

void HostEngine::Execute(EngineOp* op) {
  if (op->plan.bytes <= options_.inline_bytes && !op->plan.copies.empty()) {
    // Small: waking a worker (futex, a context switch on a busy machine)
    // costs more than these copies.
    for (const CopyCmd& c : op->plan.copies) StreamCopy(c.dst, c.src, c.bytes);
    ops_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(op->plan.bytes, std::memory_order_relaxed);
    chunks_.fetch_add(op->plan.copies.size(), std::memory_order_relaxed);
    op->OnEngineDone(absl::OkStatus());
    return;
  }
  op->chunks.clear();
  for (const CopyCmd& c : op->plan.copies) {
    for (uint64_t off = 0; off < c.bytes; off += options_.chunk_bytes) {
      uint64_t n = std::min<uint64_t>(options_.chunk_bytes, c.bytes - off);
      op->chunks.push_back(CopyCmd{c.dst + off, c.src + off, n, c.src_rank, c.dst_rank});
    }
  }
  ops_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(op->plan.bytes, std::memory_order_relaxed);
  chunks_.fetch_add(op->chunks.size(), std::memory_order_relaxed);
  if (op->chunks.empty()) {  // Nothing to move (in place on one rank, or count 0).
    op->OnEngineDone(absl::OkStatus());
    return;
  }
  op->next_chunk.store(0, std::memory_order_relaxed);
  op->chunks_left.store(op->chunks.size(), std::memory_order_relaxed);
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(op);
  }
  if (op->chunks.size() == 1) {
    cv_.Signal();
  } else {
    cv_.SignalAll();
  }
}

void HostEngine::WorkerLoop() {
  for (;;) {
    EngineOp* op = nullptr;
    size_t idx = 0;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping_ and drained.
      op = queue_.front();
      idx = op->next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (idx + 1 >= op->chunks.size()) queue_.pop_front();
    }
    const CopyCmd& c = op->chunks[idx];
    StreamCopy(c.dst, c.src, c.bytes);
    if (op->chunks_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      op->OnEngineDone(absl::OkStatus());
    }
  }
}

void HostEngine::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  cv_.SignalAll();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

EngineStats HostEngine::stats() const {
  EngineStats s;
  s.ops = ops_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.chunks = chunks_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace dmagather::server::engines::host

// ---------------------------------------------------------------------------
// Registration (server/engines/engine_registry.h): --backend=host, and the
// last choice of --backend=auto. Kept apart from the engine above.
#include "server/engines/engine_registry.h"
#include "server/engines/factory.h"

namespace dmagather::server::engines::host {
namespace {

EngineBackend HostBackend() {
  EngineBackend b;
  b.name = "host";
  b.priority = 0;
  b.create = [](const EngineOptions& o) -> absl::StatusOr<std::unique_ptr<CopyEngine>> {
    HostEngine::Options ho;
    ho.workers = o.workers;
    ho.inline_bytes = o.host_inline_bytes;
    if (o.chunk_bytes != 0) ho.chunk_bytes = o.chunk_bytes;
    DMAG_ASSIGN_OR_RETURN(std::unique_ptr<HostEngine> engine, HostEngine::Create(ho));
    return std::unique_ptr<CopyEngine>(std::move(engine));
  };
  return b;
}

const EngineRegistration kHostRegistration(HostBackend());

}  // namespace
}  // namespace dmagather::server::engines::host
