#include "server/scheduler/completion_writer.h"

#include <algorithm>
#include <cstring>

#include "common/futex.h"

namespace dmagather::server::scheduler {

void RecordError(abi::CompletionV1* c, uint32_t seq, int32_t api_status, int32_t failed_rank,
                 absl::string_view message) {
  uint32_t n = c->error_count;  // Only the daemon writes error_count.
  abi::ErrorRecordV1& rec = c->errors[n % abi::kErrorSlotsV1];
  rec.stamp = abi::kErrorRecordStampV1;
  rec.seq = seq;
  rec.status = api_status;
  rec.failed_rank = failed_rank;
  size_t len = std::min(message.size(), sizeof(rec.message) - 1);
  std::memcpy(rec.message, message.data(), len);
  rec.message[len] = '\0';
  abi::StoreRelease(&c->error_count, n + 1);
}

bool PublishDone(abi::CompletionV1* c, uint32_t seq) {
  // Never backwards: a device may have written a later op's seq already.
  uint32_t cur = abi::LoadAcquire(&c->done_seq);
  bool moved = false;
  while (static_cast<int32_t>(seq - cur) > 0) {
    if (__atomic_compare_exchange_n(&c->done_seq, &cur, seq, false, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
      moved = true;
      break;
    }
  }
  if (abi::LoadSeqCst(&c->done_waiters) != 0) common::FutexWakeAll(&c->done_seq);
  return moved;
}

}  // namespace dmagather::server::scheduler
