#include "client/graph_slots.h"

#include <algorithm>

#include "abi/graph_v1.h"

namespace dmagather::client {

void GraphSlots::SetReadyWords(uint32_t* ready) {
  absl::MutexLock lock(&freed_->mu);
  freed_->ready = ready;
}

int GraphSlots::Take() {
  Reclaim();
  for (uint32_t s = 0; s < abi::kGraphSlotsV1; ++s) {
    if ((used_ & (1u << s)) == 0) {
      used_ |= 1u << s;
      ++generation_[s];
      return static_cast<int>(s);
    }
  }
  return -1;
}

void GraphSlots::Reclaim() {
  std::vector<uint32_t> reclaimed;
  {
    // Slots whose graphs were destroyed since (the user object's callback).
    absl::MutexLock lock(&freed_->mu);
    reclaimed.swap(freed_->freed);
  }
  for (uint32_t s : reclaimed) Release(s);
}

void GraphSlots::Release(uint32_t slot) {
  used_ &= ~(1u << slot);
  Undefine(slot);
}

void GraphSlots::Define(uint32_t slot, uint32_t seq, const abi::DescriptorV2* ds, size_t n) {
  absl::MutexLock lock(&defs_mu_);
  defs_[slot] = CapturedDefinition{seq, slot, std::string(reinterpret_cast<const char*>(ds), n * sizeof(*ds))};
}

void GraphSlots::Undefine(uint32_t slot) {
  absl::MutexLock lock(&defs_mu_);
  defs_.erase(slot);
}

std::vector<CapturedDefinition> GraphSlots::Definitions() const {
  std::vector<uint32_t> gone;
  {
    absl::MutexLock lock(&freed_->mu);
    gone = freed_->freed;
  }
  std::vector<CapturedDefinition> out;
  absl::MutexLock lock(&defs_mu_);
  for (const auto& [slot, def] : defs_) {
    if (std::find(gone.begin(), gone.end(), slot) == gone.end()) out.push_back(def);
  }
  return out;
}

void GraphSlots::Captured(uint64_t op, uint32_t slot) {
  ops_[op] = CapturedOp{slot, false};
  if (ops_.size() > 4 * abi::kGraphSlotsV1) ops_.erase(ops_.begin());
}

GraphSlots::CapturedOp* GraphSlots::Find(uint64_t op) {
  auto it = ops_.find(op);
  return it == ops_.end() ? nullptr : &it->second;
}

int GraphSlots::used() const { return __builtin_popcount(used_); }

void GraphSlots::ResetFlags(abi::CompletionV1* completion, uint32_t slot) {
  abi::GraphFlagsV1* g = abi::GraphFlagsOf(completion);
  abi::StoreRelease(&g->stamp, abi::kGraphFlagsStampV1);
  abi::StoreRelease(&g->ready[slot], 0u);
  abi::StoreRelease(&g->done[slot].hi, 0u);
  abi::StoreRelease(&g->done[slot].lo, 0u);
  abi::StoreRelease(&g->status[slot], 0);
}

void GraphSlots::ReleaseForever(abi::CompletionV1* completion) {
  abi::GraphFlagsV1* g = abi::GraphFlagsOf(completion);
  for (uint32_t s = 0; s < abi::kGraphSlotsV1; ++s) abi::StoreSeqCst(&g->done[s].hi, 1u);
}

}  // namespace dmagather::client
