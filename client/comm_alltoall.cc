// CommImpl's all-to-all and reduce-scatter: the descriptor of an all-to-all
// (abi::AllToAllV2) and the entry points. The reduce-scatter's slicing,
// staging and sums are ReduceScatter's (reduce_scatter.h).
#include "abi/descriptor_v2.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/comm.h"
#include "client/reduce_scatter.h"
#include "common/dtype.h"
#include "common/status.h"

namespace dmagather::client {

void DescriptorSpans(const abi::DescriptorV2& d, int world, uint64_t* send_bytes, uint64_t* recv_bytes) {
  const uint64_t bytes = uint64_t(d.count) * common::DtypeSize(d.dtype);
  const uint64_t w = uint64_t(world);
  if (abi::IsAllToAllV2(d.op)) {
    *send_bytes = (w - 1) * d.a2a.send_stride + bytes;
    *recv_bytes = (w - 1) * d.a2a.recv_stride + bytes;
    return;
  }
  *send_bytes = bytes;
  *recv_bytes = d.op == abi::kOpAllGatherListV2 ? bytes : bytes * w;
}

absl::Status CommImpl::PrepareAllToAll(const GatherItem& item, abi::DescriptorV2* d) {
  const int rank = options_.rank;
  if (static_cast<uint32_t>(item.dtype) >= common::kNumDtypes) {
    return absl::InvalidArgumentError(absl::StrCat(Rank(), "unknown dtype ", int(item.dtype)));
  }
  if (item.recvs == nullptr || item.send == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(Rank(), "send or recv is NULL"));
  }
  const uint64_t bytes = uint64_t(item.count) * common::DtypeSize(item.dtype);
  d->op = item.a2a_op;
  d->dtype = item.dtype;
  d->count = item.count;
  d->num_recv = 1;
  d->a2a.send_stride = item.send_stride;
  d->a2a.recv_stride = item.recv_stride;
  d->a2a.reserved = 0;
  uint64_t send_span = 0, recv_span = 0;
  DescriptorSpans(*d, options_.world_size, &send_span, &recv_span);
  const char* s = static_cast<const char*>(item.send);
  char* r = static_cast<char*>(item.recvs[0]);
  if (bytes != 0 && s < r + recv_span && r < s + send_span) {
    return absl::InvalidArgumentError(
        absl::StrCat(Rank(), "send and output buffers of an all-to-all overlap (it is out of place)"));
  }
  bool skip_self = item.skip_self;
  if (!skip_self && backend_->copies_own_shard() && bytes != 0) {
    // As the all-gather's own shard: the caller's stream moves it.
    own_copies_.push_back(
        OwnShardCopy{r + uint64_t(rank) * item.recv_stride, s + uint64_t(rank) * item.send_stride, bytes});
    skip_self = true;
  }
  d->a2a.flags = skip_self ? abi::kAllToAllSkipSelf : 0;
  DMAG_ASSIGN_OR_RETURN(d->a2a.recv, Resolve(r, recv_span, "recv"));
  DMAG_ASSIGN_OR_RETURN(d->send, Resolve(s, send_span, "send"));
  return absl::OkStatus();
}

absl::Status CommImpl::CheckAllToAll(void* stream, const char* what) {
  if (!takes_alltoall_) {
    return common::FallbackError(absl::StrCat(Rank(), "dmagatherd ", daemon_version_, " does not serve ", what,
                                              " (dmagatherd 0.4 or later does)"));
  }
  if (!options_.job_id.empty()) {
    return common::FallbackError(absl::StrCat(Rank(), what, " is served within one node; this job spans nodes"));
  }
  return common::Annotate(backend_->CheckStream(stream), Rank());
}

absl::StatusOr<bool> CommImpl::Capturing(void* stream) const {
  auto capturing = backend_->Capturing(stream);
  if (!capturing.ok()) return common::Annotate(capturing.status(), Rank());
  return *capturing;
}

absl::StatusOr<std::pair<uint32_t, uint64_t>> CommImpl::TakeCapturedWait(uint64_t op) {
  GraphSlots::CapturedOp* captured = graphs_.Find(op);
  if (captured == nullptr || captured->waited) {
    return absl::InternalError(absl::StrCat(Rank(), "op ", op, " is not a captured op still to be waited"));
  }
  captured->waited = true;
  return std::make_pair(captured->slot, graphs_.generation(captured->slot));
}

bool CommImpl::GraphLives(uint32_t slot, uint64_t generation) {
  graphs_.Reclaim();
  return graphs_.Holds(slot, generation);
}

absl::Status CommImpl::Refuse(const absl::Status& why, uint64_t* op) {
  if (op != nullptr) *op = 0;
  DMAG_RETURN_IF_ERROR(CheckHealthy());
  const absl::Status st = absl::StartsWith(why.message(), Rank()) ? why : common::Annotate(why, Rank());
  DMAG_RETURN_IF_ERROR(PublishRefusal(st));
  if (op != nullptr) *op = ops_.submitted();
  return st;
}

absl::StatusOr<bool> CommImpl::OpDone(uint64_t op) {
  DMAG_ASSIGN_OR_RETURN(uint32_t seq, OpSeq(op));
  return done_.Test(seq) != DoneFlag::Poll::kPending;
}

absl::Status CommImpl::AllToAll(const void* send, void* recv, size_t count, dmagather_dtype_t dtype, void* stream,
                                uint64_t* op) {
  if (op != nullptr) *op = 0;
  DMAG_RETURN_IF_ERROR(CheckHealthy());
  absl::Status local = CheckAllToAll(stream, "all-to-all");
  if (!local.ok()) return Refuse(local, op);
  const uint64_t chunk = uint64_t(count) * common::DtypeSize(dtype);
  GatherItem item;
  item.send = send;
  item.recvs = &recv;
  item.count = count;
  item.dtype = dtype;
  item.a2a_op = abi::kOpAllToAllV2;
  item.send_stride = chunk;
  item.recv_stride = chunk;
  return Submit(&item, 1, stream, op);
}

absl::Status CommImpl::ReduceScatterOp(const void* send, void* recv, size_t count, dmagather_dtype_t dtype, int redop,
                                       void* stream, uint64_t* op) {
  if (op != nullptr) *op = 0;
  DMAG_RETURN_IF_ERROR(CheckHealthy());
  if (static_cast<uint32_t>(dtype) >= common::kNumDtypes) {
    return Refuse(absl::InvalidArgumentError(absl::StrCat("unknown dtype ", int(dtype))), op);
  }
  if (reduce_scatter_ == nullptr) {
    reduce_scatter_ = std::make_unique<ReduceScatter>(this, backend_.get(), options_.rank, options_.world_size,
                                                      StagingBoundFromEnv());
  }
  uint64_t handle = 0;
  absl::Status st = reduce_scatter_->Submit(send, recv, count, dtype, redop, stream, &handle);
  if (op != nullptr) *op = handle;
  return st;
}

}  // namespace dmagather::client
