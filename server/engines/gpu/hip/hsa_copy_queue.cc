#include "server/engines/gpu/hip/hsa_copy_queue.h"

#include "absl/strings/str_cat.h"

namespace dmagather::server::engines::gpu::hip {

HsaCopyQueue::~HsaCopyQueue() {
  absl::MutexLock l(&mu_);
  for (const Pending& p : pending_) (void)api_->signal_destroy(p.signal);
  for (hsa_signal_t s : free_) (void)api_->signal_destroy(s);
}

absl::StatusOr<hsa_signal_t> HsaCopyQueue::TakeSignal() {
  {
    absl::MutexLock l(&mu_);
    if (!free_.empty()) {
      hsa_signal_t s = free_.back();
      free_.pop_back();
      api_->signal_store_relaxed(s, 1);
      return s;
    }
  }
  hsa_signal_t s{};
  const hsa_status_t st = api_->signal_create(1, 0, nullptr, &s);
  if (st != HSA_STATUS_SUCCESS) return absl::ResourceExhaustedError(absl::StrCat("hsa_signal_create: ", int(st)));
  ++created_;
  return s;
}

absl::Status HsaCopyQueue::Copy(void* dst, hsa_agent_t dst_agent, const void* src, hsa_agent_t src_agent, size_t bytes,
                                uint32_t engine_bit, bool force_sdma) {
  auto signal = TakeSignal();
  if (!signal.ok()) return signal.status();
  const uint32_t deps = has_last_ ? 1 : 0;
  const bool on_engine = engine_bit != 0 && api_->copy_on_engine != nullptr;
  const hsa_status_t st = on_engine ? api_->copy_on_engine(dst, dst_agent, src, src_agent, bytes, deps, &last_, *signal,
                                                           engine_bit, force_sdma)
                                    : api_->async_copy(dst, dst_agent, src, src_agent, bytes, deps, &last_, *signal);
  if (st != HSA_STATUS_SUCCESS) {
    absl::MutexLock l(&mu_);
    free_.push_back(*signal);
    return absl::InternalError(
        absl::StrCat(on_engine ? "hsa_amd_memory_async_copy_on_engine(engine bit 0x" : "hsa_amd_memory_async_copy(",
                     on_engine ? absl::StrCat(absl::Hex(engine_bit), ")") : ")", ": ", int(st)));
  }
  if (on_engine) {
    bytes_[__builtin_ctz(engine_bit) % kEngines].fetch_add(bytes, std::memory_order_relaxed);
  } else {
    bytes_rocr_.fetch_add(bytes, std::memory_order_relaxed);
  }
  absl::MutexLock l(&mu_);
  last_ = *signal;
  has_last_ = true;
  pending_.push_back(Pending{++issued_, *signal, false});
  return absl::OkStatus();
}

absl::StatusOr<bool> HsaCopyQueue::Complete(uint64_t mark) {
  absl::MutexLock l(&mu_);
  bool done = true;
  for (Pending& p : pending_) {
    if (p.seq > mark) break;
    if (p.done) continue;
    const hsa_signal_value_t v = api_->signal_load_scacquire(p.signal);
    if (v < 0) return absl::InternalError(absl::StrCat("SDMA copy ", p.seq, " failed (signal ", int64_t(v), ")"));
    if (v != 0) {
      done = false;  // Later copies wait on this one: they are not done either.
      break;
    }
    p.done = true;
  }
  // Copy k+1 waits on signal k, so signal k is reused only once copy k+1
  // has completed (HSA reads it no more); the newest stays as the next
  // copy's dependency.
  while (pending_.size() >= 2 && pending_[0].done && pending_[1].done) {
    free_.push_back(pending_.front().signal);
    pending_.pop_front();
  }
  return done;
}

}  // namespace dmagather::server::engines::gpu::hip
