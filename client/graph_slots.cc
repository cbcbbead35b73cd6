#include "client/graph_slots.h"

#include "abi/graph_v1.h"

namespace dmagather::client {

void GraphSlots::SetReadyWords(uint32_t* ready) {
  absl::MutexLock lock(&freed_->mu);
  freed_->ready = ready;
}

int GraphSlots::Take() {
  {
    // Slots whose graphs were destroyed since (the user object's callback).
    absl::MutexLock lock(&freed_->mu);
    for (uint32_t s : freed_->freed) used_ &= ~(1u << s);
    freed_->freed.clear();
  }
  for (uint32_t s = 0; s < abi::kGraphSlotsV1; ++s) {
    if ((used_ & (1u << s)) == 0) {
      used_ |= 1u << s;
      return static_cast<int>(s);
    }
  }
  return -1;
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
