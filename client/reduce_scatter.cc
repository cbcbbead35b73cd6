#include "client/reduce_scatter.h"

#include <algorithm>
#include <cstdlib>

#include "abi/descriptor_v2.h"
#include "absl/strings/str_cat.h"
#include "client/comm.h"
#include "common/dtype.h"
#include "common/reduce.h"
#include "common/status.h"

namespace dmagather::client {
namespace {

constexpr size_t kMaxRecords = 1024;
constexpr uint64_t kMinHalf = uint64_t{1} << 20;

}  // namespace

uint64_t StagingBoundFromEnv() {
  const char* v = std::getenv("DMAGATHER_STAGING_MB");
  const long mb = v != nullptr ? std::atol(v) : 0;
  return uint64_t(mb >= 1 ? mb : 64) << 20;
}

ReduceScatter::ReduceScatter(CommImpl* comm, ClientBackend* backend, int rank, int world, uint64_t staging_bytes)
    : comm_(comm), backend_(backend), rank_(rank), world_(world), bound_(std::max(staging_bytes, 2 * kMinHalf)) {}

ReduceScatter::~ReduceScatter() { Release(); }

void ReduceScatter::Release() {
  for (Half& h : halves_) {
    if (h.mark != nullptr) h.mark->Sync().IgnoreError();
    h.pending = false;
  }
  if (staging_ != nullptr) comm_->Free(staging_).IgnoreError();
  staging_ = nullptr;
  half_bytes_ = 0;
  // Captures: their graphs are destroyed before the communicator (CUDA.md).
  for (auto& [handle, cap] : captured_) comm_->Free(cap.staging).IgnoreError();
  captured_.clear();
  captured_bytes_ = 0;
}

void ReduceScatter::FreeDeadCaptures() {
  for (auto it = captured_.begin(); it != captured_.end();) {
    if (comm_->GraphLives(it->second.slot, it->second.generation)) {
      ++it;
      continue;
    }
    // The graph and its instances are gone, and with them every replay
    // (CUDA releases a graph's user objects after its launches complete).
    comm_->Free(it->second.staging).IgnoreError();
    captured_bytes_ -= it->second.bytes;
    it = captured_.erase(it);
  }
}

absl::Status ReduceScatter::EnsureStaging(uint64_t bytes) {
  const uint64_t want = std::min(bound_ / 2, std::max(kMinHalf, bytes));
  if (half_bytes_ >= want) return absl::OkStatus();
  // Moving the halves: whatever still reads them finishes first (rare: the
  // staging grows a few times at most).
  DMAG_RETURN_IF_ERROR(Finish());
  for (Half& h : halves_) {
    if (h.mark != nullptr) DMAG_RETURN_IF_ERROR(h.mark->Sync());
  }
  uint64_t grown = kMinHalf;
  while (grown < want) grown *= 2;
  grown = std::min(grown, bound_ / 2);
  if (staging_ != nullptr) DMAG_RETURN_IF_ERROR(comm_->Free(staging_));
  staging_ = nullptr;
  half_bytes_ = 0;
  DMAG_ASSIGN_OR_RETURN(void* p, comm_->Alloc(2 * grown));
  staging_ = static_cast<char*>(p);
  half_bytes_ = grown;
  for (Half& h : halves_) {
    if (h.mark == nullptr) {
      DMAG_ASSIGN_OR_RETURN(h.mark, backend_->NewMark());
    }
  }
  return absl::OkStatus();
}

absl::Status ReduceScatter::RunPending(Half* half) {
  if (!half->pending) return absl::OkStatus();
  half->pending = false;
  // The op's own status is reported by its wait; a failed op is not summed.
  absl::Status st = comm_->OpWaitNoReduce(half->handle);
  if (!st.ok()) return st;
  return backend_->Reduce(half->args, nullptr);
}

absl::Status ReduceScatter::TakeHalf(int h, void* stream) {
  Half& half = halves_[h];
  if (half.mark != nullptr) return half.mark->WaitOn(stream);
  // Host: a sum still to run reads this half. Its op's failure is that op's
  // (its wait reports it), not this one's.
  RunPending(&half).IgnoreError();
  return absl::OkStatus();
}

absl::Status ReduceScatter::CheckArgs(const Call& c) {
  std::string why;
  DMAG_RETURN_IF_ERROR(backend_->CanReduce());
  if (!common::ReduceSupported(c.dtype, c.redop, &why)) return absl::InvalidArgumentError(why);
  if (c.send == nullptr || c.recv == nullptr) return absl::InvalidArgumentError("send or recv is NULL");
  DMAG_RETURN_IF_ERROR(comm_->CheckAllToAll(c.stream, "reduce-scatter"));
  const char* own = c.send + uint64_t(rank_) * c.chunk;
  if (c.chunk != 0 && c.recv != own && c.recv < c.send + c.chunk * world_ && c.send < c.recv + c.chunk) {
    return absl::InvalidArgumentError(
        "recv overlaps send but is not this rank's own chunk of it (in place means recv == send + rank*count)");
  }
  return absl::OkStatus();
}

absl::Status ReduceScatter::SubmitSlice(const Call& c, uint64_t off, uint64_t n, Record* rec) {
  const int h = next_half_;
  next_half_ ^= 1;
  char* half = staging_ + uint64_t(h) * half_bytes_;
  DMAG_RETURN_IF_ERROR(TakeHalf(h, c.stream));
  void* dst = half;
  GatherItem item;
  item.send = c.send + off * c.esize;
  item.recvs = &dst;
  item.count = n;
  item.dtype = c.dtype;
  item.a2a_op = c.redop == DMAGATHER_AVG ? abi::kOpReduceScatterAvgV2 : abi::kOpReduceScatterSumV2;
  item.send_stride = c.chunk;
  item.recv_stride = n * c.esize;
  item.skip_self = true;
  uint64_t op = 0;
  absl::Status st = comm_->Submit(&item, 1, c.stream, &op);
  if (op == 0) return st;  // Not submitted at all (the comm is unusable).
  if (rec->first == 0) rec->first = op;
  rec->last = op;
  rec->half = h;
  if (!st.ok() || n == 0) return st;  // A refusal (the op's status on every rank): nothing to sum.
  const ReduceArgs a = SumArgs(c, off, n, half);
  if (backend_->has_stream_waits()) {
    DMAG_RETURN_IF_ERROR(backend_->WaitDoneOnStream(c.stream, static_cast<uint32_t>(op)));
    DMAG_RETURN_IF_ERROR(backend_->Reduce(a, c.stream));
    return halves_[h].mark->Record(c.stream);
  }
  // Host: the sum runs in the op's wait, or when its half is taken again
  // (the next slice but one: its copies overlap this sum).
  halves_[h].pending = true;
  halves_[h].handle = op;
  halves_[h].args = a;
  return absl::OkStatus();
}

ReduceArgs ReduceScatter::SumArgs(const Call& c, uint64_t off, uint64_t n, const char* staging) const {
  ReduceArgs a;
  a.n = world_;
  for (int k = 0; k < world_; ++k) {
    a.chunks[k] = k == rank_ ? static_cast<const void*>(c.send + uint64_t(rank_) * c.chunk + off * c.esize)
                             : staging + uint64_t(k) * n * c.esize;
  }
  a.count = n;
  a.dtype = c.dtype;
  a.redop = c.redop;
  a.out = c.recv + off * c.esize;
  return a;
}

absl::Status ReduceScatter::SubmitCaptured(const Call& c, uint64_t* handle) {
  auto kib = [](uint64_t b) { return absl::StrCat((b + 1023) >> 10, " KiB"); };
  const uint64_t need = std::max<uint64_t>(c.chunk * world_, 256);
  if (captured_bytes_ + need > bound_) {
    return comm_->Refuse(
        common::FallbackError(
            absl::StrCat("a reduce-scatter captured into a CUDA graph has staging of its own while its graph lives (",
                         kib(need), " for this one); live captures hold ", kib(captured_bytes_), " of the ",
                         bound_ >> 20, " MiB DMAGATHER_STAGING_MB allows")),
        handle);
  }
  Captured cap;
  cap.bytes = need;
  auto staging = comm_->Alloc(need);
  if (!staging.ok()) return comm_->Refuse(staging.status(), handle);
  cap.staging = static_cast<char*>(*staging);
  auto mark = backend_->NewMark();
  if (!mark.ok()) {
    comm_->Free(cap.staging).IgnoreError();
    return comm_->Refuse(mark.status(), handle);
  }
  cap.mark = *std::move(mark);
  void* dst = cap.staging;
  GatherItem item;
  item.send = c.send;
  item.recvs = &dst;
  item.count = c.count;
  item.dtype = c.dtype;
  item.a2a_op = c.redop == DMAGATHER_AVG ? abi::kOpReduceScatterAvgV2 : abi::kOpReduceScatterSumV2;
  item.send_stride = c.chunk;
  item.recv_stride = c.chunk;
  item.skip_self = true;
  // Defined (one verdict on every rank, on the host) and its ready write captured.
  absl::Status st = comm_->Submit(&item, 1, c.stream, handle);
  if (!st.ok()) {
    comm_->Free(cap.staging).IgnoreError();
    return st;
  }
  auto slot = comm_->TakeCapturedWait(*handle);
  if (!slot.ok()) {
    comm_->Free(cap.staging).IgnoreError();
    return slot.status();
  }
  cap.slot = slot->first;
  cap.generation = slot->second;
  const ReduceArgs a = SumArgs(c, 0, c.count, cap.staging);
  // Kept from here on whatever happens: the slot is the graph's, and its
  // staging goes when the graph does.
  Captured& kept = captured_.emplace(*handle, std::move(cap)).first->second;
  captured_bytes_ += kept.bytes;
  DMAG_RETURN_IF_ERROR(backend_->WaitGraphDone(c.stream, kept.slot));
  DMAG_RETURN_IF_ERROR(backend_->Reduce(a, c.stream));
  return kept.mark->Record(c.stream);
}

absl::Status ReduceScatter::Submit(const void* send, void* recv, size_t count, dmagather_dtype_t dtype, int redop,
                                   void* stream, uint64_t* handle) {
  *handle = 0;
  Call c{static_cast<const char*>(send), static_cast<char*>(recv), count, dtype, redop, stream};
  c.esize = common::DtypeSize(dtype);
  c.chunk = uint64_t(count) * c.esize;
  FreeDeadCaptures();
  absl::Status local = CheckArgs(c);
  if (local.ok()) {
    auto capturing = comm_->Capturing(stream);
    if (!capturing.ok()) local = capturing.status();
    if (local.ok() && *capturing) return SubmitCaptured(c, handle);
  }
  if (local.ok()) local = EnsureStaging(c.chunk * world_);
  if (!local.ok()) return comm_->Refuse(local, handle);
  // Elements per chunk in one slice: a half holds one slice's chunk of every rank.
  const uint64_t slice = std::max<uint64_t>(1, std::min<uint64_t>(count, half_bytes_ / (c.esize * world_)));
  Record rec;
  absl::Status st;
  uint64_t off = 0;
  do {
    const uint64_t n = std::min<uint64_t>(slice, count - off);
    st = SubmitSlice(c, off, n, &rec);
    off += n;
  } while (st.ok() && off < count);
  if (rec.last == 0) return st;
  records_.push_back(rec);
  while (records_.size() > kMaxRecords) records_.pop_front();
  *handle = rec.last;
  return st;
}

const ReduceScatter::Record* ReduceScatter::Find(uint64_t handle) const {
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    if (it->last == handle) return &*it;
    if (it->last < handle) break;
  }
  return nullptr;
}

bool ReduceScatter::Tracks(uint64_t handle) const { return Find(handle) != nullptr || captured_.count(handle) != 0; }

absl::Status ReduceScatter::SlicesStatus(const Record& r) {
  absl::Status first;
  for (uint64_t op = r.first; op <= r.last; ++op) {
    absl::Status st = comm_->OpWaitNoReduce(op);
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

absl::Status ReduceScatter::Wait(uint64_t handle) {
  const Record* r = Find(handle);
  // A capture's: its definition's verdict (its replays are the graph's).
  if (r == nullptr) return comm_->OpWaitNoReduce(handle);
  const Record rec = *r;
  absl::Status st = SlicesStatus(rec);
  for (Half& half : halves_) {
    // Host: the op's sums still to run (its last two slices at most).
    if (half.pending && half.handle >= rec.first && half.handle <= rec.last) {
      half.pending = false;
      if (st.ok()) DMAG_RETURN_IF_ERROR(backend_->Reduce(half.args, nullptr));
    }
  }
  Half& last = halves_[rec.half];
  if (last.mark != nullptr) DMAG_RETURN_IF_ERROR(last.mark->Sync());
  return st;
}

absl::Status ReduceScatter::Test(uint64_t handle, bool* done) {
  const Record* r = Find(handle);
  *done = true;
  if (r == nullptr) return absl::OkStatus();
  DMAG_ASSIGN_OR_RETURN(bool copied, comm_->OpDone(r->last));
  Half& half = halves_[r->half];
  if (copied && half.mark != nullptr) {
    DMAG_ASSIGN_OR_RETURN(copied, half.mark->Reached());
  }
  *done = copied;
  return copied ? Wait(handle) : absl::OkStatus();
}

absl::Status ReduceScatter::WaitStream(uint64_t handle, void* stream) {
  if (auto it = captured_.find(handle); it != captured_.end()) {
    DMAG_ASSIGN_OR_RETURN(bool capturing, comm_->Capturing(stream));
    if (!capturing) {
      return absl::InvalidArgumentError(
          absl::StrCat("reduce-scatter op ", handle,
                       " was captured into a CUDA graph: wait for it on a stream of the same capture"));
    }
    return it->second.mark->WaitOn(stream);
  }
  const Record* r = Find(handle);
  if (r == nullptr) return absl::OkStatus();
  Half& half = halves_[r->half];
  if (half.mark == nullptr) return Wait(handle);
  return half.mark->WaitOn(stream);
}

absl::Status ReduceScatter::Finish() {
  absl::Status first;
  for (Half& h : halves_) {
    absl::Status st = RunPending(&h);
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

}  // namespace dmagather::client
