#include "client/ring_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/futex.h"

namespace dmagather::client {

uint64_t RingWriter::Retired(uint64_t tail) const {
  const uint32_t first = abi::LoadAcquire(&view_.completion->done_seq) + 1;  // Oldest op not seen done.
  // Read after `tail`: an op not begun by now starts at or after it.
  const uint32_t begun = begun_.load();
  if (begun == 0 || int32_t(begun - first) < 0) return tail;
  return op_start_[first % abi::kRingSlotsV1].load();
}

void RingWriter::BeginOp(uint32_t seq) {
  op_start_[seq % abi::kRingSlotsV1].store(view_.ring->tail);
  begun_.store(seq);
}

void RingWriter::Ring() {
  abi::DoorbellV1* bell = bell_.load();
  if (abi::LoadSeqCst(&bell->sleeping) != 0) {
    abi::FetchAdd(&bell->seq, 1u);
    common::FutexWakeAll(&bell->seq);
  }
}

bool RingWriter::PublishSlot(const void* d, size_t bytes, const std::atomic<bool>& gone) {
  abi::RingV1* ring = view_.ring;
  const uint64_t tail = ring->tail;
  common::Backoff backoff;
  while (tail - Retired(tail) >= abi::kRingSlotsV1) {
    if (gone.load()) return false;
    if (backoff.Pause()) usleep(50);
  }
  std::memcpy(&view_.slots[tail % abi::kRingSlotsV1], d, bytes);
  abi::StoreSeqCst(&ring->tail, tail + 1);
  Ring();
  return true;
}

bool RingWriter::PublishOp(abi::DescriptorV2* ds, size_t n, uint32_t seq, uint64_t now_ns,
                           const std::atomic<bool>& gone) {
  BeginOp(seq);
  for (size_t i = 0; i < n; ++i) {
    abi::DescriptorV2& d = ds[i];
    d.stamp = abi::kDescriptorStampV2;
    d.seq = seq;
    d.submit_ns = now_ns;
    d.items_following = static_cast<uint32_t>(n - 1 - i);
    // The bytes the op's kind uses (a refusal's reason, an all-to-all's
    // arguments, the outputs named).
    size_t used = offsetof(abi::DescriptorV2, recv) + sizeof(abi::BufferRefV1) * std::min(d.num_recv, abi::kMaxRanksV1);
    if (d.op == abi::kOpRefuse) used = sizeof(abi::DescriptorV2);
    if (abi::IsAllToAllV2(d.op)) used = offsetof(abi::DescriptorV2, a2a) + sizeof(abi::AllToAllV2);
    if (!PublishSlot(&d, used, gone)) return false;
  }
  return true;
}

uint32_t RingWriter::Rewind() {
  const uint64_t tail = abi::LoadSeqCst(&view_.ring->tail);
  const uint64_t head = Retired(tail);
  abi::StoreSeqCst(&view_.ring->head, head);
  const uint32_t first = abi::LoadAcquire(&view_.completion->done_seq) + 1;
  const uint32_t begun = begun_.load();
  return begun == 0 || int32_t(begun - first) < 0 ? 0 : begun - first + 1;
}

void RingWriter::FillRefusal(int code, const absl::Status& why, abi::DescriptorV2* d) {
  std::memset(d, 0, sizeof(*d));
  d->op = abi::kOpRefuse;
  d->refusal.status = code;
  const size_t len = std::min(why.message().size(), sizeof(d->refusal.reason) - 1);
  std::memcpy(d->refusal.reason, why.message().data(), len);
  d->refusal.reason[len] = '\0';
}

}  // namespace dmagather::client
