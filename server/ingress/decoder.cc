#include "server/ingress/decoder.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "abi/descriptor_v2.h"
#include "abi/graph_v1.h"
#include "absl/strings/str_format.h"
#include "common/api_names.h"

namespace dmagather::server::ingress {
namespace {

static_assert(scheduler::kMaxRecv >= abi::kMaxRanksV1, "a Request holds every recv of a descriptor");

using scheduler::Request;

// The fixed part, identical in v1 and v2 up to `recv`.
template <typename D>
void DecodeHead(const D& d, uint32_t version, Request* out) {
  out->abi_version = version;
  out->seq = d.seq;
  out->raw_op = d.op;
  out->dtype = d.dtype;
  out->count = d.count;
  out->submit_ns = d.submit_ns;
  out->send = {d.send.region_id, d.send.offset};
  out->num_recv = d.num_recv;
}

void DecodeRecv(const abi::BufferRefV1* recv, Request* out) {
  const uint32_t n = std::min(out->num_recv, abi::kMaxRanksV1);
  for (uint32_t i = 0; i < n; ++i) out->recv[i] = {recv[i].region_id, recv[i].offset};
}

void DecodeV2(const abi::DescriptorV1& slot, Request* out) {
  abi::DescriptorV2 d;
  std::memcpy(&d, &slot, offsetof(abi::DescriptorV2, recv));
  DecodeHead(d, 2, out);
  out->items_following = d.items_following;
  if (d.op == abi::kOpRefuse) {
    std::memcpy(&d.refusal, reinterpret_cast<const char*>(&slot) + offsetof(abi::DescriptorV2, refusal),
                sizeof(d.refusal));
    const std::string reason(d.refusal.reason, strnlen(d.refusal.reason, sizeof(d.refusal.reason)));
    const int code = d.refusal.status;
    out->refusal = code == 1 ? common::FallbackError(reason)
                             : absl::InvalidArgumentError(reason.empty() ? "the rank refused the op" : reason);
    out->num_recv = 0;
    return;
  }
  std::memcpy(d.recv, reinterpret_cast<const char*>(&slot) + offsetof(abi::DescriptorV2, recv),
              sizeof(abi::BufferRefV1) * std::min(d.num_recv, abi::kMaxRanksV1));
  DecodeRecv(d.recv, out);
  if (abi::IsAllToAllV2(d.op)) {
    abi::AllToAllV2 a;
    std::memcpy(&a, reinterpret_cast<const char*>(&slot) + offsetof(abi::DescriptorV2, a2a), sizeof(a));
    out->a2a = {a.send_stride, a.recv_stride, (a.flags & abi::kAllToAllSkipSelf) != 0};
  }
  if ((d.op & abi::kOpPersistentBit) != 0) {
    // A persistent (graph-captured) op's definition: the slot rides in the op code.
    out->graph_slot = static_cast<int>((d.op >> abi::kOpPersistentSlotShift) & 0xff);
    out->raw_op = d.op & abi::kOpBaseMask;
  }
}

void DecodeV1(const abi::DescriptorV1& slot, Request* out) {
  abi::DescriptorV1 d;
  std::memcpy(&d, &slot, offsetof(abi::DescriptorV1, recv));
  DecodeHead(d, 1, out);
  out->items_following = 0;
  std::memcpy(d.recv, slot.recv, sizeof(abi::BufferRefV1) * std::min(d.num_recv, abi::kMaxRanksV1));
  DecodeRecv(d.recv, out);
}

}  // namespace

void DecodeDescriptor(const abi::DescriptorV1& slot, Request* out) {
  out->refusal = absl::OkStatus();
  out->graph_slot = -1;
  out->a2a = {};
  const uint32_t stamp = __atomic_load_n(&slot.stamp, __ATOMIC_RELAXED);
  if (stamp == abi::kDescriptorStampV2) return DecodeV2(slot, out);
  if (stamp == abi::kDescriptorStampV1) return DecodeV1(slot, out);
  // Unknown version: still take the sequence number so the op it claims
  // fails on every rank instead of hanging the others.
  out->abi_version = 0;
  out->seq = __atomic_load_n(&slot.seq, __ATOMIC_RELAXED);
  out->items_following = 0;
  out->num_recv = 0;
  out->refusal = absl::InvalidArgumentError(
      absl::StrFormat("descriptor stamp 0x%08x is not v2 (0x%08x) or v1 (0x%08x): client and daemon versions differ",
                      stamp, abi::kDescriptorStampV2, abi::kDescriptorStampV1));
}

}  // namespace dmagather::server::ingress
