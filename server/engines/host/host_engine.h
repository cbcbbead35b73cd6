// The host CopyEngine: rank buffers are POSIX shm objects mapped into the
// daemon; a pool of worker threads copies them with memcpy, each op cut into
// chunks that all workers claim, so one large op uses every worker.
//
// Threads: Execute() on the ingress thread; workers call OnEngineDone();
// mu_ guards the queue of ops with unclaimed chunks.
#pragma once

#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::engines::host {

class HostEngine : public CopyEngine {
 public:
  struct Options {
    int workers = 4;
    uint64_t chunk_bytes = 1 << 20;
    // Plans of at most this many bytes are copied on the calling thread
    // (the ingress thread): no worker wake-up, no hand-off. 0 = never.
    uint64_t inline_bytes = 256 << 10;
  };
  static absl::StatusOr<std::unique_ptr<HostEngine>> Create(const Options& options);
  ~HostEngine() override;

  const char* name() const override { return "host"; }
  absl::StatusOr<std::shared_ptr<ImportedRegion>> Import(const RegionSpec& spec) override;
  void Execute(EngineOp* op) override ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() override ABSL_LOCKS_EXCLUDED(mu_);
  EngineStats stats() const override;
  bool host_addressable() const override { return true; }
  // The ring stages only when told to (dmagatherd --ring_staging=always):
  // the same path as GPU backends, with memcpy.
  absl::StatusOr<void*> AllocStaging(uint64_t bytes) override { return ::operator new(bytes); }
  void FreeStaging(void* host) override { ::operator delete(host); }
  absl::Status StageOut(void* host, const char* src, uint64_t bytes, const EngineRank*) override {
    std::memcpy(host, src, bytes);
    return absl::OkStatus();
  }
  absl::Status StageIn(char* dst, const void* host, uint64_t bytes, const EngineRank*) override {
    std::memcpy(dst, host, bytes);
    return absl::OkStatus();
  }
  int worker_threads() const override { return options_.workers; }

 private:
  explicit HostEngine(const Options& options);
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  absl::Mutex mu_;
  absl::CondVar cv_;                                  // An op was queued / stopping.
  std::deque<EngineOp*> queue_ ABSL_GUARDED_BY(mu_);  // Ops with unclaimed chunks.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // Started by Create, joined by Stop (one thread).
  std::atomic<uint64_t> ops_{0}, bytes_{0}, chunks_{0};
};

}  // namespace dmagather::server::engines::host
