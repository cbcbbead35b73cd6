#include "client/comm.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "abi/descriptor_v2.h"
#include "abi/graph_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/env_check.h"
#include "client/reduce_scatter.h"
#include "common/api_names.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/futex.h"
#include "common/status.h"

namespace dmagather::client {
namespace {

// FALLBACK stays FALLBACK; anything else a rank finds wrong before submit
// is INVALID_ARGUMENT for the op.
int RefusalCode(const absl::Status& s) {
  return common::IsFallback(s) ? DMAGATHER_FALLBACK : DMAGATHER_INVALID_ARGUMENT;
}

}  // namespace

CommImpl::CommImpl(const CommOptions& options)
    : options_(options), done_(options.rank), ops_(options.rank), regions_(options.rank) {
  // Pause iterations before a waiting rank sleeps on the futex: the
  // option, then $DMAGATHER_SPIN, then the daemon's advice in its Join reply
  // (which knows the node's cores and ranks), then 256.
  if (options.spin >= 0) {
    spin_ = options.spin;
    spin_set_ = true;
  } else if (const char* s = std::getenv("DMAGATHER_SPIN"); s != nullptr && std::atoi(s) >= 0) {
    spin_ = std::atoi(s);
    spin_set_ = true;
  }
  scratch_.resize(DMAGATHER_MAX_COALESCED);
}

std::string CommImpl::Rank() const { return absl::StrCat("rank ", options_.rank, ": "); }

absl::StatusOr<std::unique_ptr<CommImpl>> CommImpl::Create(const CommOptions& in) {
  // A DMAGATHER_* variable a few edits from a known one: say so, once.
  WarnUnknownVariablesOnce(environ, stderr);
  CommOptions o = in;
  o.socket_path = ResolveSocket(in.socket_path);
  if (o.job_key.empty()) return absl::InvalidArgumentError("job_key is empty");
  if (o.world_size < 1 || o.world_size > static_cast<int>(abi::kMaxRanksV1)) {
    return absl::InvalidArgumentError(absl::StrCat("world_size ", o.world_size, " is outside 1..", abi::kMaxRanksV1));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", o.rank, " is outside 0..", o.world_size - 1));
  }
  if (access(o.socket_path.c_str(), F_OK) != 0) {
    return absl::UnavailableError(absl::StrCat("no dmagatherd socket at ", o.socket_path,
                                               ": is dmagatherd running? (systemctl status dmagatherd; or set "
                                               "DMAGATHER_SOCKET to the socket of a running daemon)"));
  }
  auto comm = std::unique_ptr<CommImpl>(new CommImpl(o));
  DMAG_RETURN_IF_ERROR(comm->Join());
  return comm;
}

absl::Status CommImpl::Join() {
  // The rank segment: a sealed memfd created here, handed to the daemon over
  // its fd channel (which answers a ticket and the doorbell's descriptor),
  // mapped by the daemon at Join. No name anywhere. The rank keeps it: a
  // daemon that takes the job back after this one gets the same segment.
  DMAG_ASSIGN_OR_RETURN(segment_, common::MemfdMapping::Create("dmagather-seg", abi::SegmentLayoutV1::kBytes));
  view_ = abi::SegmentViewV1::At(segment_.data());
  ops_.Attach(view_.completion);
  std::random_device rd;
  const uint64_t token = (uint64_t(rd()) << 32) | rd();
  abi::InitSegmentV1(segment_.data(), token, abi::kDescriptorStampV2);
  ring_.Attach(view_, nullptr);  // The doorbell comes with the segment's hand-over.
  DaemonLink::Parts parts{&ring_, &regions_, &done_, segment_.fd(), abi::SegmentLayoutV1::kBytes};
  link_ = std::make_unique<DaemonLink>(options_.socket_path, options_.rank, options_.reconnect_s, parts);
  JoinParams p;
  p.job_key = options_.job_key;
  p.world_size = options_.world_size;
  p.rank = options_.rank;
  p.segment_token = token;
  p.join_timeout_ms = options_.join_timeout_ms;
  p.device = ProbeDevice();
  p.job_id = options_.job_id;
  DMAG_ASSIGN_OR_RETURN(JoinAnswer answer, link_->Join(p));
  backend_name_ = answer.backend;
  daemon_version_ = answer.daemon_version;
  takes_alltoall_ = answer.takes_alltoall;
  if (!spin_set_ && answer.wait_spin.has_value()) spin_ = *answer.wait_spin;
  done_.SetSpin(spin_, /*yields=*/0);  // Yielding ranks starve the daemon (PERFORMANCE.md).
  ClientBackendContext ctx;
  ctx.completion = view_.completion;
  ctx.flag_bytes = abi::SegmentLayoutV1::kRingOffset - abi::SegmentLayoutV1::kCompletionOffset;
  ctx.device = p.device.ordinal;
  auto backend = CreateClientBackend(backend_name_, ctx);
  if (!backend.ok()) {
    link_->Close(/*leave=*/false);  // The session is abandoned.
    return common::Annotate(backend.status(), Rank());
  }
  backend_ = *std::move(backend);
  graphs_.SetReadyWords(abi::GraphFlagsOf(view_.completion)->ready);
  done_.Attach(view_.completion, backend_->has_stream_waits());
  // A job can be taken back by a new daemon unless it spans nodes and has
  // ops captured into CUDA graphs (docs/ARCHITECTURE.md, "Daemon restarts").
  link_->Start(
      backend_.get(), [this] { return options_.job_id.empty() || !captured_.load(); },
      [this] { return graphs_.Definitions(); });
  return absl::OkStatus();
}

CommImpl::~CommImpl() { Close().IgnoreError(); }

absl::Status CommImpl::Close() {
  if (closed_) return absl::OkStatus();
  const bool joined = link_ != nullptr && link_->joined();
  absl::Status st = joined ? Wait() : absl::OkStatus();
  if (reduce_scatter_ != nullptr) reduce_scatter_->Release();  // Its staging, while the daemon can be told.
  reduce_scatter_.reset();
  closed_ = true;
  if (link_ != nullptr) link_->Close(/*leave=*/joined);
  regions_.Clear();                // Frees what dmagather_alloc made.
  graphs_.SetReadyWords(nullptr);  // Graphs destroyed from now on have nobody to tell (the segment goes).
  backend_.reset();
  return st;
}

// --- Registration ---

absl::StatusOr<abi::BufferRefV1> CommImpl::Resolve(const void* ptr, uint64_t bytes, const char* what) {
  if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(Rank(), what, " buffer is NULL"));
  auto ref = regions_.Lookup(ptr, bytes, what);
  if (!backend_->registers_on_submit()) return ref;
  // A cached registration is valid only while its allocation lives.
  if (ref.ok() && regions_.Current(ptr, bytes, *backend_)) return ref;
  DMAG_RETURN_IF_ERROR(Register(const_cast<void*>(ptr), bytes));
  return regions_.Lookup(ptr, bytes, what);
}

absl::Status CommImpl::RegisterExport(const MemoryExport& e, std::unique_ptr<OwnedBuffer> owned) {
  if (regions_.Hit(e)) return absl::OkStatus();  // Already registered.
  // Registrations overlapping this allocation belong to memory that was
  // freed and reused (or unmapped and remapped): drop them first (ops in
  // flight may still name them).
  if (regions_.AnyStale(e, *backend_)) {
    DMAG_RETURN_IF_ERROR(done_.Wait(static_cast<uint32_t>(ops_.submitted())));
    link_->DropStale(e, *backend_, &dropped_);
  }
  return link_->Register(e, std::move(owned));
}

absl::StatusOr<void*> CommImpl::Alloc(size_t bytes) {
  if (closed_) return absl::InvalidArgumentError("the communicator was destroyed");
  if (bytes == 0) return absl::InvalidArgumentError("dmagather_alloc of 0 bytes");
  if (done_.gone()) return done_.GoneStatus();
  DMAG_ASSIGN_OR_RETURN(std::unique_ptr<OwnedBuffer> buf, backend_->Allocate(bytes));
  void* p = buf->data();
  const MemoryExport e = buf->export_info();
  DMAG_RETURN_IF_ERROR(RegisterExport(e, std::move(buf)));
  return p;
}

absl::Status CommImpl::Register(void* ptr, size_t bytes) {
  if (closed_) return absl::InvalidArgumentError("the communicator was destroyed");
  if (ptr == nullptr || bytes == 0) return absl::InvalidArgumentError("dmagather_register of a null or empty buffer");
  if (done_.gone()) return done_.GoneStatus();
  if (regions_.Held(ptr, bytes, *backend_)) return absl::OkStatus();
  auto e = backend_->Describe(ptr, bytes);
  if (!e.ok()) return common::Annotate(e.status(), Rank());
  return RegisterExport(*e, nullptr);
}

absl::Status CommImpl::Deregister(void* ptr) {
  if (closed_) return absl::InvalidArgumentError("the communicator was destroyed");
  const RegistrationCache::Region* r = regions_.Find(ptr);
  if (r == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d: %p is not the start of a registered buffer", options_.rank, ptr));
  }
  DMAG_RETURN_IF_ERROR(Wait());  // Outstanding ops may still use it.
  return link_->Deregister(ptr);
}

absl::Status CommImpl::Free(void* ptr) {
  const RegistrationCache::Region* r = regions_.Find(ptr);
  if (r == nullptr || r->owned == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d: %p was not returned by dmagather_alloc", options_.rank, ptr));
  }
  return Deregister(ptr);
}

// --- Completion ---

absl::Status CommImpl::CheckHealthy() {
  if (closed_) return absl::InvalidArgumentError("the communicator was destroyed");
  if (done_.gone()) return done_.GoneStatus();
  // An earlier op's failure is returned here only when it ends the job
  // (peer failed, timeout, daemon stopping); others come back from Wait().
  if (ops_.FatalPending()) return ops_.CollectErrors();
  return absl::OkStatus();
}

// --- Submit ---

absl::Status CommImpl::Publish(abi::DescriptorV2* ds, size_t n) {
  const uint32_t seq = ops_.next_seq();
  // At most kRingSlotsV1 ops outstanding: the daemon's matcher has one slot each.
  DMAG_RETURN_IF_ERROR(done_.Wait(seq - abi::kRingSlotsV1));
  if (!ring_.PublishOp(ds, n, seq, common::MonotonicNs(), done_.gone_flag())) return done_.GoneStatus();
  ops_.CountSubmitted();
  return absl::OkStatus();
}

absl::Status CommImpl::PublishRefusal(const absl::Status& why) {
  RingWriter::FillRefusal(RefusalCode(why), why, &scratch_[0]);
  // Host readiness is a CPU store; keep ready_seq moving with the ops.
  if (!backend_->has_stream_waits()) backend_->WriteReady(nullptr, ops_.next_seq()).IgnoreError();
  return Publish(&scratch_[0], 1);
}

absl::Status CommImpl::PrepareItem(const GatherItem& item, abi::DescriptorV2* d) {
  if (item.a2a_op != 0) return PrepareAllToAll(item, d);
  const int world = options_.world_size, rank = options_.rank;
  if (static_cast<uint32_t>(item.dtype) >= common::kNumDtypes) {
    return absl::InvalidArgumentError(absl::StrCat(Rank(), "unknown dtype ", int(item.dtype)));
  }
  if (item.recvs == nullptr) return absl::InvalidArgumentError(absl::StrCat(Rank(), "recvs is NULL"));
  const uint64_t bytes = uint64_t(item.count) * common::DtypeSize(item.dtype);
  d->op = item.list ? abi::kOpAllGatherListV2 : abi::kOpAllGatherV2;
  d->dtype = item.dtype;
  d->count = item.count;
  d->num_recv = item.list ? static_cast<uint32_t>(world) : 1;
  const uint64_t out_bytes = item.list ? bytes : bytes * uint64_t(world);
  for (uint32_t r = 0; r < d->num_recv; ++r) {
    DMAG_ASSIGN_OR_RETURN(d->recv[r], Resolve(item.recvs[r], out_bytes, "recv"));
  }
  const void* send = item.send;
  if (backend_->copies_own_shard() && bytes != 0) {
    // The daemon never copies a rank's own shard (that would be a
    // same-device copy on SMs): out of place, the caller's stream copies
    // it (Submit: the op's own shards together, on a DMA engine where the
    // runtime allows), and the descriptor names the output slot as the
    // (in-place) send.
    char* own =
        item.list ? static_cast<char*>(item.recvs[rank]) : static_cast<char*>(item.recvs[0]) + uint64_t(rank) * bytes;
    if (send == nullptr) return absl::InvalidArgumentError(absl::StrCat(Rank(), "send is NULL"));
    if (!item.list) {
      const char* s = static_cast<const char*>(send);
      const char* r0 = static_cast<const char*>(item.recvs[0]);
      if (s != own && s < r0 + out_bytes && r0 < s + bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            Rank(),
            "send buffer overlaps the output but is not this rank's own slot of it (in place means send == "
            "recv + rank*count)"));
      }
    }
    if (send != own) own_copies_.push_back(OwnShardCopy{own, send, bytes});
    send = own;
  }
  DMAG_ASSIGN_OR_RETURN(d->send, Resolve(send, bytes, "send"));
  return absl::OkStatus();
}

absl::Status CommImpl::CheckOp(const GatherItem* items, size_t n, void* stream, int* slot) {
  *slot = -1;
  if (n == 0 || n > DMAGATHER_MAX_COALESCED) {
    return absl::InvalidArgumentError(
        absl::StrCat(Rank(), "an op has 1..", DMAGATHER_MAX_COALESCED, " items, not ", n));
  }
  if (items == nullptr) return absl::InvalidArgumentError(absl::StrCat(Rank(), "items is NULL"));
  DMAG_RETURN_IF_ERROR(common::Annotate(backend_->CheckStream(stream), Rank()));
  // Under CUDA-graph capture the op becomes a persistent op in a graph slot.
  auto capturing = backend_->Capturing(stream);
  if (!capturing.ok()) return common::Annotate(capturing.status(), Rank());
  if (!*capturing) return absl::OkStatus();
  *slot = graphs_.Take();
  if (*slot < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Rank(), "all ", abi::kGraphSlotsV1,
                     " graph slots of this communicator hold captured ops of live CUDA graphs; destroy graphs "
                     "(and their executable instances) first"));
  }
  return absl::OkStatus();
}

absl::Status CommImpl::Submit(const GatherItem* items, size_t n, void* stream, uint64_t* op) {
  if (op != nullptr) *op = 0;
  DMAG_RETURN_IF_ERROR(CheckHealthy());
  int slot = -1;
  absl::Status local = CheckOp(items, n, stream, &slot);
  own_copies_.clear();
  dropped_.clear();
  for (size_t i = 0; local.ok() && i < n; ++i) {
    std::memset(&scratch_[i], 0, offsetof(abi::DescriptorV2, recv));
    local = PrepareItem(items[i], &scratch_[i]);
  }
  if (local.ok() && !dropped_.empty()) local = RenameDropped(n);
  if (local.ok() && slot >= 0) return SubmitCaptured(n, stream, static_cast<uint32_t>(slot), op);
  if (local.ok() && !own_copies_.empty()) {
    local = backend_->CopyOwnShards(own_copies_.data(), own_copies_.size(), stream, /*capturing=*/false);
  }
  if (slot >= 0) graphs_.Release(static_cast<uint32_t>(slot));
  if (!local.ok()) {
    // This rank cannot take part: the op still takes its sequence number and
    // fails on every rank with this status, so no rank waits for it.
    DMAG_RETURN_IF_ERROR(PublishRefusal(local));
    if (op != nullptr) *op = ops_.submitted();
    return local;
  }
  DMAG_RETURN_IF_ERROR(backend_->WriteReady(stream, ops_.next_seq()));
  DMAG_RETURN_IF_ERROR(Publish(scratch_.data(), n));
  if (op != nullptr) *op = ops_.submitted();
  return absl::OkStatus();
}

absl::Status CommImpl::RenameDropped(size_t n) {
  // The replacement covers the dropped region's memory that the op names
  // (the same chunks), so each rename is a lookup; a rename that registers
  // and drops again is taken up by the next pass.
  for (int pass = 0; !dropped_.empty(); ++pass) {
    if (pass == 4) return absl::InternalError(absl::StrCat(Rank(), "registrations kept replacing each other"));
    const std::vector<std::pair<uint32_t, uintptr_t>> gone = std::move(dropped_);
    dropped_.clear();
    for (size_t i = 0; i < n; ++i) {
      abi::DescriptorV2& d = scratch_[i];
      uint64_t bytes = 0, out_bytes = 0;
      DescriptorSpans(d, options_.world_size, &bytes, &out_bytes);
      auto rename = [&](abi::BufferRefV1* ref, uint64_t len, const char* what) -> absl::Status {
        for (const auto& [id, base] : gone) {
          if (ref->region_id != id) continue;
          DMAG_ASSIGN_OR_RETURN(*ref, Resolve(reinterpret_cast<const void*>(base + ref->offset), len, what));
          break;
        }
        return absl::OkStatus();
      };
      const uint32_t outputs = abi::IsAllToAllV2(d.op) ? 1 : d.num_recv;  // a2a.recv overlays recv[0].
      for (uint32_t r = 0; r < outputs; ++r) DMAG_RETURN_IF_ERROR(rename(&d.recv[r], out_bytes, "recv"));
      DMAG_RETURN_IF_ERROR(rename(&d.send, bytes, "send"));
    }
  }
  return absl::OkStatus();
}

absl::Status CommImpl::SubmitCaptured(size_t n, void* stream, uint32_t slot, uint64_t* op) {
  // From now on a multi-node job ends with its daemon (DaemonLink).
  captured_.store(true);
  GraphSlots::ResetFlags(view_.completion, slot);
  for (size_t i = 0; i < n; ++i) scratch_[i].op |= abi::kOpPersistentBit | (slot << abi::kOpPersistentSlotShift);
  // The definition takes a sequence number like any op; ready_seq is not
  // written for it (nothing of it runs until a replay). Kept as published,
  // from then on: a daemon that takes the job back arms it again from it,
  // once any rank saw it done (else it reads it from the ring again).
  absl::Status st = Publish(scratch_.data(), n);
  if (!st.ok()) {
    graphs_.Release(slot);
    return st;
  }
  graphs_.Define(slot, scratch_[0].seq, scratch_.data(), n);
  const uint64_t handle = ops_.submitted();
  if (op != nullptr) *op = handle;
  // The verdict of the definition, on the host, at capture (the ranks
  // capture their graphs together, as any collective's capture): a graph
  // whose op was refused would wait forever at its first replay.
  st = OpWait(handle);
  if (st.ok() && !own_copies_.empty()) {
    st = backend_->CopyOwnShards(own_copies_.data(), own_copies_.size(), stream, /*capturing=*/true);
  }
  if (st.ok()) st = backend_->WriteGraphReady(stream, slot);
  if (st.ok()) st = backend_->OnGraphSlotTaken(stream, slot, graphs_.freed());
  if (!st.ok()) {
    graphs_.Release(slot);
    return common::Annotate(st, absl::StrCat(Rank(), "capturing the op into a CUDA graph: "));
  }
  graphs_.Captured(handle, slot);
  return absl::OkStatus();
}

absl::Status CommImpl::SubmitFallback(const std::string& reason, uint64_t* op) {
  if (op != nullptr) *op = 0;
  DMAG_RETURN_IF_ERROR(CheckHealthy());
  const absl::Status why = common::FallbackError(absl::StrCat(Rank(), reason.empty() ? "fallback requested" : reason));
  DMAG_RETURN_IF_ERROR(PublishRefusal(why));
  if (op != nullptr) *op = ops_.submitted();
  return why;
}

absl::Status CommImpl::AllGather(const void* send, void* recv, size_t count, dmagather_dtype_t dtype, void* stream) {
  GatherItem item{false, send, &recv, count, dtype};
  uint64_t op = 0;
  DMAG_RETURN_IF_ERROR(Submit(&item, 1, stream, &op));
  return backend_->has_stream_waits() ? OpWaitStream(op, stream) : absl::OkStatus();
}

absl::Status CommImpl::AllGatherList(const void* send, void* const* recvs, size_t count, dmagather_dtype_t dtype,
                                     void* stream) {
  GatherItem item{true, send, recvs, count, dtype};
  uint64_t op = 0;
  DMAG_RETURN_IF_ERROR(Submit(&item, 1, stream, &op));
  return backend_->has_stream_waits() ? OpWaitStream(op, stream) : absl::OkStatus();
}

absl::StatusOr<uint32_t> CommImpl::OpSeq(uint64_t op) const {
  if (closed_) return absl::InvalidArgumentError("the communicator was destroyed");
  return ops_.Seq(op);
}

absl::Status CommImpl::OpWait(uint64_t op) {
  if (reduce_scatter_ != nullptr && reduce_scatter_->Tracks(op)) return reduce_scatter_->Wait(op);
  return OpWaitNoReduce(op);
}

absl::Status CommImpl::OpWaitNoReduce(uint64_t op) {
  DMAG_ASSIGN_OR_RETURN(uint32_t seq, OpSeq(op));
  DMAG_RETURN_IF_ERROR(done_.Wait(seq));
  return ops_.Status(seq);
}

absl::StatusOr<bool> CommImpl::OpTest(uint64_t op, absl::Status* op_status) {
  if (reduce_scatter_ != nullptr && reduce_scatter_->Tracks(op)) {
    bool done = false;
    *op_status = reduce_scatter_->Test(op, &done);
    return done;
  }
  DMAG_ASSIGN_OR_RETURN(uint32_t seq, OpSeq(op));
  switch (done_.Test(seq)) {
    case DoneFlag::Poll::kPending:
      *op_status = absl::OkStatus();
      return false;
    case DoneFlag::Poll::kGone:
      *op_status = done_.GoneStatus();
      return true;
    case DoneFlag::Poll::kDone:
      break;
  }
  *op_status = ops_.Status(seq);
  return true;
}

absl::Status CommImpl::OpWaitStream(uint64_t op, void* stream) {
  DMAG_ASSIGN_OR_RETURN(uint32_t seq, OpSeq(op));
  if (reduce_scatter_ != nullptr && reduce_scatter_->Tracks(op)) return reduce_scatter_->WaitStream(op, stream);
  if (GraphSlots::CapturedOp* captured = graphs_.Find(op); captured != nullptr) {
    // A captured op: its wait is part of the same graph, once.
    if (captured->waited) {
      return absl::InvalidArgumentError(
          absl::StrCat(Rank(), "op ", op,
                       " was captured into a CUDA graph and already waited on a stream; a captured op is "
                       "waited exactly once, in the same capture"));
    }
    DMAG_ASSIGN_OR_RETURN(bool capturing, backend_->Capturing(stream));
    if (!capturing) {
      return absl::InvalidArgumentError(absl::StrCat(
          Rank(), "op ", op, " was captured into a CUDA graph: wait for it on a stream of the same capture"));
    }
    DMAG_RETURN_IF_ERROR(backend_->WaitGraphDone(stream, captured->slot));
    captured->waited = true;
    return absl::OkStatus();
  }
  if (!backend_->has_stream_waits()) {
    DMAG_RETURN_IF_ERROR(common::Annotate(backend_->CheckStream(stream), Rank()));
    return OpWait(op);
  }
  return backend_->WaitDoneOnStream(stream, seq);
}

absl::Status CommImpl::SubmitRawForTesting(const abi::DescriptorV1& d) {
  abi::DescriptorV1 copy = d;
  DMAG_RETURN_IF_ERROR(CheckHealthy());
  const uint32_t seq = ops_.next_seq();
  DMAG_RETURN_IF_ERROR(done_.Wait(seq - abi::kRingSlotsV1));
  copy.stamp = copy.stamp != 0 ? copy.stamp : abi::kDescriptorStampV1;
  copy.seq = seq;
  copy.submit_ns = common::MonotonicNs();
  backend_->WriteReady(nullptr, seq).IgnoreError();
  ring_.BeginOp(seq);
  if (!ring_.PublishSlot(&copy, sizeof(copy), done_.gone_flag())) return done_.GoneStatus();
  ops_.CountSubmitted();
  return absl::OkStatus();
}

absl::Status CommImpl::Wait() {
  if (closed_) return absl::InvalidArgumentError("the communicator was destroyed");
  absl::Status st = done_.Wait(static_cast<uint32_t>(ops_.submitted()));
  if (st.ok() && reduce_scatter_ != nullptr) st = reduce_scatter_->Finish();
  absl::Status errors = ops_.CollectErrors();
  return errors.ok() ? st : errors;
}

}  // namespace dmagather::client
