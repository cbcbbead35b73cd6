#include "client/comm.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dmagather/v1/control.grpc.pb.h"
#include "common/api_names.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/futex.h"
#include "common/status.h"

namespace dmagather::client {
namespace {

constexpr uint32_t kFatalMask = (1u << DMAGATHER_UNAVAILABLE) | (1u << DMAGATHER_PEER_FAILED) |
                                (1u << DMAGATHER_TIMEOUT);

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

std::chrono::system_clock::time_point In(int ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

std::string ResolveSocket(const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  const char* env = std::getenv("DMAGATHER_SOCKET");
  if (env != nullptr && *env != '\0') return env;
  return DMAGATHER_DEFAULT_SOCKET;
}

}  // namespace

CommImpl::CommImpl(const CommOptions& options) : options_(options) {
  // Pause iterations before a waiting rank sleeps on the futex. Short: the
  // daemon's copy threads need the cores more than a spinning rank does.
  if (const char* s = std::getenv("DMAGATHER_SPIN"); s != nullptr && std::atoi(s) >= 0) spin_ = std::atoi(s);
}

absl::StatusOr<std::unique_ptr<CommImpl>> CommImpl::Create(const CommOptions& in) {
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
  // The rank segment: created here (0600), mapped by the daemon at Join,
  // unlinked once both have it mapped.
  DMAG_ASSIGN_OR_RETURN(segment_, common::ShmMapping::Create(common::ShmMapping::UniqueName("seg"), abi::SegmentLayoutV1::kBytes));
  view_ = abi::SegmentViewV1::At(segment_.data());
  std::random_device rd;
  const uint64_t token = (uint64_t(rd()) << 32) | rd();
  abi::InitSegmentV1(segment_.data(), token);

  channel_ = grpc::CreateChannel("unix:" + options_.socket_path, grpc::InsecureChannelCredentials());
  if (!channel_->WaitForConnected(In(1000))) {
    segment_.Unlink();
    return absl::UnavailableError(absl::StrCat("cannot connect to dmagatherd at ", options_.socket_path,
                                               " within 1 s (stale socket of a daemon that is not running?)"));
  }
  stub_ = v1::Control::NewStub(channel_);
  v1::JoinRequest req;
  req.set_job_key(options_.job_key);
  req.set_world_size(options_.world_size);
  req.set_rank(options_.rank);
  req.set_pid(getpid());
  req.set_segment_name(segment_.name());
  req.set_segment_token(token);
  req.set_join_timeout_ms(options_.join_timeout_ms);
  const int cuda_device = CudaClient::CurrentDevice();
  req.set_cuda_device(cuda_device);
  join_ctx_ = std::make_unique<grpc::ClientContext>();
  join_stream_ = stub_->Join(join_ctx_.get(), req);
  v1::JoinEvent ev;
  const bool got = join_stream_->Read(&ev);
  segment_.Unlink();  // Mapped by the daemon now, or never will be.
  if (!got || !ev.has_joined()) {
    grpc::Status st = join_stream_->Finish();
    join_stream_.reset();
    if (st.ok()) return absl::UnavailableError("dmagatherd closed the join without an answer");
    return FromGrpc(st, absl::StrCat("rank ", options_.rank, " could not join job '", options_.job_key, "'"));
  }
  const v1::JoinReply& reply = ev.joined();
  session_id_ = reply.session_id();
  backend_ = reply.backend().empty() ? "host" : reply.backend();
  daemon_version_ = reply.daemon_version();
  auto bell = common::ShmMapping::Open(reply.doorbell_name(), sizeof(abi::DoorbellV1));
  if (!bell.ok()) {
    join_ctx_->TryCancel();
    join_stream_->Finish();
    join_stream_.reset();
    return absl::UnavailableError(absl::StrCat("cannot map the daemon's doorbell: ", bell.status().message()));
  }
  doorbell_ = *std::move(bell);
  bell_ = static_cast<abi::DoorbellV1*>(doorbell_.data());
  if (backend_ == "cuda") {
    // The rank's stream writes ready_seq and waits on done_seq: both live in
    // the completion block, registered with CUDA here and in the daemon.
    auto cuda = cuda_device < 0
                    ? absl::StatusOr<std::unique_ptr<CudaClient>>(absl::FailedPreconditionError(
                          "dmagatherd runs the cuda backend but this process has no usable CUDA device"))
                    : CudaClient::Create(cuda_device, view_.completion,
                                         abi::SegmentLayoutV1::kRingOffset - abi::SegmentLayoutV1::kCompletionOffset);
    if (!cuda.ok()) {
      join_ctx_->TryCancel();
      join_stream_->Finish();
      join_stream_.reset();
      return absl::Status(cuda.status().code(),
                          absl::StrCat("rank ", options_.rank, ": cuda backend: ", cuda.status().message()));
    }
    cuda_ = *std::move(cuda);
  }
  watcher_ = std::thread([this] {
    v1::JoinEvent e;
    std::string reason = absl::StrCat("the connection to dmagatherd at ", options_.socket_path, " was lost");
    while (join_stream_->Read(&e)) {
      if (e.has_shutdown()) reason = absl::StrCat("dmagatherd stopped: ", e.shutdown().reason());
    }
    {
      absl::MutexLock lock(&gone_mu_);
      gone_reason_ = reason;
    }
    released_done_ = abi::LoadAcquire(&view_.completion->done_seq);
    daemon_gone_.store(true, std::memory_order_release);
    if (cuda_ != nullptr) {
      // No daemon will ever publish done again: release the rank's stream
      // (its done waits pass); the calls report UNAVAILABLE.
      abi::StoreSeqCst(&view_.completion->done_seq, released_done_ + (1u << 30));
    }
    common::FutexWakeAll(&view_.completion->done_seq);
  });
  return absl::OkStatus();
}

CommImpl::~CommImpl() { Close().IgnoreError(); }

absl::Status CommImpl::DaemonGone() const {
  absl::MutexLock lock(&gone_mu_);
  return absl::UnavailableError(absl::StrCat("rank ", options_.rank, ": ", gone_reason_));
}

absl::Status CommImpl::Close() {
  if (closed_) return absl::OkStatus();
  absl::Status st = join_stream_ != nullptr ? Wait() : absl::OkStatus();
  closed_ = true;
  if (join_stream_ != nullptr) {
    if (!daemon_gone_.load()) {
      grpc::ClientContext ctx;
      ctx.set_deadline(In(2000));
      v1::LeaveRequest req;
      req.set_session_id(session_id_);
      v1::LeaveReply reply;
      stub_->Leave(&ctx, req, &reply);
    }
    // The daemon ends the stream once it sees the Leave; cancel in case it cannot.
    for (int i = 0; i < 100 && !daemon_gone_.load(); ++i) usleep(2000);
    join_ctx_->TryCancel();
    if (watcher_.joinable()) watcher_.join();
    join_stream_->Finish();
    join_stream_.reset();
  }
  if (cuda_ != nullptr) {
    for (auto& [base, r] : regions_) {
      if (r.device_owned) cuda_->Free(reinterpret_cast<void*>(base)).IgnoreError();
    }
  }
  regions_.clear();
  cuda_.reset();
  return st;
}

absl::StatusOr<abi::BufferRefV1> CommImpl::Resolve(const void* ptr, uint64_t bytes, const char* what) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = regions_.upper_bound(p);
  if (it != regions_.begin()) {
    --it;
    const uint64_t off = p - it->first;
    if (off <= it->second.bytes && bytes <= it->second.bytes - off) {
      abi::BufferRefV1 ref{};
      ref.region_id = it->second.id;
      ref.offset = off;
      return ref;
    }
    if (off < it->second.bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rank %d: %s buffer %p + %u bytes runs past the end of its allocation (%u bytes at %p)", options_.rank,
          what, ptr, bytes, it->second.bytes, reinterpret_cast<void*>(it->first)));
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "rank %d: %s buffer %p is not inside memory from dmagather_alloc or dmagather_register", options_.rank, what,
      ptr));
}

absl::StatusOr<void*> CommImpl::Alloc(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("dmagather_alloc of 0 bytes");
  if (daemon_gone_.load()) return DaemonGone();
  if (cuda_ != nullptr) {
    DMAG_ASSIGN_OR_RETURN(void* p, cuda_->Malloc(bytes));
    absl::Status st = RegisterDevice(p, bytes);
    if (!st.ok()) {
      cuda_->Free(p).IgnoreError();
      return st;
    }
    regions_[reinterpret_cast<uintptr_t>(p)].device_owned = true;
    return p;
  }
  const uint64_t rounded = (uint64_t(bytes) + 4095) & ~uint64_t{4095};
  DMAG_ASSIGN_OR_RETURN(common::ShmMapping m, common::ShmMapping::Create(common::ShmMapping::UniqueName("buf"), rounded));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(10000));
  v1::RegisterRequest req;
  req.set_session_id(session_id_);
  req.set_kind(v1::MEMORY_KIND_HOST_SHM);
  req.set_bytes(rounded);
  req.set_shm_name(m.name());
  req.set_client_base(reinterpret_cast<uintptr_t>(m.data()));
  v1::RegisterReply reply;
  grpc::Status st = stub_->Register(&ctx, req, &reply);
  m.Unlink();
  DMAG_RETURN_IF_ERROR(FromGrpc(st, absl::StrCat("rank ", options_.rank, ": registering ", bytes, " bytes")));
  void* p = m.data();
  Region& r = regions_[reinterpret_cast<uintptr_t>(p)];
  r.bytes = rounded;
  r.id = reply.region_id();
  r.mapping = std::move(m);
  return p;
}

absl::Status CommImpl::Register(void* ptr, size_t bytes) {
  if (ptr == nullptr || bytes == 0) return absl::InvalidArgumentError("dmagather_register of a null or empty buffer");
  if (cuda_ != nullptr) return RegisterDevice(ptr, bytes);
  if (Resolve(ptr, bytes, "registered").ok()) return absl::OkStatus();  // Already reachable.
  return absl::FailedPreconditionError(absl::StrFormat(
      "rank %d: the host backend reaches only memory from dmagather_alloc; %p (%u bytes) is private to this "
      "process",
      options_.rank, ptr, bytes));
}

absl::Status CommImpl::DeregisterRegion(uint32_t region_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(10000));
  v1::DeregisterRequest req;
  req.set_session_id(session_id_);
  req.set_region_id(region_id);
  v1::DeregisterReply reply;
  return FromGrpc(stub_->Deregister(&ctx, req, &reply), "deregister");
}

absl::Status CommImpl::Deregister(void* ptr) {
  auto it = regions_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == regions_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("rank %d: %p is not the start of a registered buffer",
                                                      options_.rank, ptr));
  }
  DMAG_RETURN_IF_ERROR(Wait());  // Outstanding ops may still use it.
  absl::Status st = DeregisterRegion(it->second.id);
  regions_.erase(it);  // Unmapped here; the daemon unmaps its side at the latest when the rank leaves.
  return daemon_gone_.load() ? absl::OkStatus() : st;
}

absl::Status CommImpl::Free(void* ptr) {
  auto it = regions_.find(reinterpret_cast<uintptr_t>(ptr));
  if (cuda_ != nullptr) {
    if (it == regions_.end() || !it->second.device_owned) {
      return absl::InvalidArgumentError(absl::StrFormat("rank %d: %p was not returned by dmagather_alloc",
                                                        options_.rank, ptr));
    }
    absl::Status st = Deregister(ptr);
    absl::Status freed = cuda_->Free(ptr);
    return st.ok() ? freed : st;
  }
  if (it == regions_.end() || !it->second.mapping.valid()) {
    return absl::InvalidArgumentError(absl::StrFormat("rank %d: %p was not returned by dmagather_alloc",
                                                      options_.rank, ptr));
  }
  return Deregister(ptr);
}

absl::Status CommImpl::CollectErrors() {
  const uint32_t n = abi::LoadAcquire(&view_.completion->error_count);
  if (n == errors_seen_) return absl::OkStatus();
  uint32_t first = errors_seen_;
  uint32_t lost = 0;
  if (n - first > abi::kErrorSlotsV1) {
    lost = n - first - abi::kErrorSlotsV1;
    first = n - abi::kErrorSlotsV1;
  }
  const abi::ErrorRecordV1& rec = view_.completion->errors[first % abi::kErrorSlotsV1];
  std::string msg(rec.message, strnlen(rec.message, sizeof(rec.message)));
  const uint32_t more = n - errors_seen_ - 1;
  if (more != 0) absl::StrAppend(&msg, " (and ", more, " more failed operation(s) since the last wait)");
  (void)lost;
  errors_seen_ = n;
  return common::FromApiStatus(rec.status, msg);
}

absl::Status CommImpl::CheckHealthy() {
  if (closed_) return absl::FailedPreconditionError("the communicator was destroyed");
  if (daemon_gone_.load(std::memory_order_acquire)) return DaemonGone();
  // An earlier op's failure is returned here only when it ends the job
  // (peer failed, timeout, daemon stopping); others come back from Wait().
  const uint32_t n = abi::LoadAcquire(&view_.completion->error_count);
  for (uint32_t i = errors_seen_; i != n; ++i) {
    if (n - i > abi::kErrorSlotsV1) continue;
    if (kFatalMask & (1u << view_.completion->errors[i % abi::kErrorSlotsV1].status)) return CollectErrors();
  }
  return absl::OkStatus();
}

absl::Status CommImpl::WaitDone(uint32_t seq) {
  abi::CompletionV1* c = view_.completion;
  common::Backoff backoff(spin_);
  for (;;) {
    if (cuda_ != nullptr && daemon_gone_.load(std::memory_order_acquire)) {
      // done_seq was moved ahead to release the stream; only ops finished
      // before the daemon went away really are done.
      return abi::SeqGeq(released_done_, seq) ? absl::OkStatus() : DaemonGone();
    }
    uint32_t done = abi::LoadAcquire(&c->done_seq);
    if (abi::SeqGeq(done, seq)) return absl::OkStatus();
    if (daemon_gone_.load(std::memory_order_acquire)) return DaemonGone();
    if (!backoff.Pause()) continue;
    abi::FetchAdd(&c->done_waiters, 1u);
    done = abi::LoadSeqCst(&c->done_seq);
    if (!abi::SeqGeq(done, seq) && !daemon_gone_.load()) common::FutexWait(&c->done_seq, done, 50'000'000);
    abi::FetchAdd(&c->done_waiters, ~0u);
  }
}

absl::Status CommImpl::Publish(abi::DescriptorV1* d, bool cpu_ready) {
  const uint32_t seq = submitted_seq_ + 1;
  // At most kRingSlotsV1 ops outstanding: the daemon's matcher has one slot each.
  DMAG_RETURN_IF_ERROR(WaitDone(seq - abi::kRingSlotsV1));
  abi::RingV1* ring = view_.ring;
  const uint64_t tail = ring->tail;
  common::Backoff backoff;
  while (tail - abi::LoadAcquire(&ring->head) >= abi::kRingSlotsV1) {
    if (daemon_gone_.load()) return DaemonGone();
    if (backoff.Pause()) usleep(50);
  }
  d->stamp = d->stamp != 0 ? d->stamp : abi::kDescriptorStampV1;
  d->seq = seq;
  d->submit_ns = common::MonotonicNs();
  const size_t used = offsetof(abi::DescriptorV1, recv) + sizeof(abi::BufferRefV1) * std::min(d->num_recv, abi::kMaxRanksV1);
  std::memcpy(&view_.slots[tail % abi::kRingSlotsV1], d, used);
  if (cpu_ready) abi::StoreRelease(&view_.completion->ready_seq, seq);
  abi::StoreSeqCst(&ring->tail, tail + 1);
  if (abi::LoadSeqCst(&bell_->sleeping) != 0) {
    abi::FetchAdd(&bell_->seq, 1u);
    common::FutexWakeAll(&bell_->seq);
  }
  submitted_seq_ = seq;
  return absl::OkStatus();
}

absl::Status CommImpl::AllGather(const void* send, void* recv, size_t count, dmagather_dtype_t dtype, void* stream) {
  return Submit(abi::kOpAllGather, send, &recv, count, dtype, stream);
}

absl::Status CommImpl::AllGatherList(const void* send, void* const* recvs, size_t count, dmagather_dtype_t dtype,
                                     void* stream) {
  if (recvs == nullptr) return absl::InvalidArgumentError("recvs is NULL");
  return Submit(abi::kOpAllGatherList, send, recvs, count, dtype, stream);
}

absl::Status CommImpl::Submit(uint32_t op, const void* send, void* const* recvs, size_t count,
                              dmagather_dtype_t dtype, void* stream) {
  DMAG_RETURN_IF_ERROR(CheckHealthy());
  if (static_cast<uint32_t>(dtype) >= common::kNumDtypes) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": unknown dtype ", int(dtype)));
  }
  if (cuda_ != nullptr) return SubmitCuda(op, send, recvs, count, dtype, stream);
  if (stream != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options_.rank, ": the ", backend_,
                                                   " backend takes no stream (pass NULL)"));
  }
  const bool list = op == abi::kOpAllGatherList;
  const uint64_t bytes = uint64_t(count) * common::DtypeSize(dtype);
  abi::DescriptorV1 d;
  d.stamp = abi::kDescriptorStampV1;
  d.op = op;
  d.dtype = dtype;
  d.count = count;
  d.num_recv = list ? static_cast<uint32_t>(options_.world_size) : 1;
  d.reserved = 0;
  DMAG_ASSIGN_OR_RETURN(d.send, Resolve(send, bytes, "send"));
  const uint64_t out_bytes = list ? bytes : bytes * uint64_t(options_.world_size);
  for (uint32_t r = 0; r < d.num_recv; ++r) {
    DMAG_ASSIGN_OR_RETURN(d.recv[r], Resolve(recvs[r], out_bytes, "recv"));
  }
  return Publish(&d);
}

// --- cuda backend ---

absl::Status CommImpl::RegisterDevice(const void* ptr, uint64_t bytes) {
  DMAG_ASSIGN_OR_RETURN(CudaClient::Allocation a, cuda_->Describe(ptr));
  if (a.device != cuda_->device()) {
    return absl::InvalidArgumentError(absl::StrFormat("rank %d: buffer %p is on CUDA device %d, but the rank uses device %d",
                                                      options_.rank, ptr, a.device, cuda_->device()));
  }
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (p - a.base > a.bytes || bytes > a.bytes - (p - a.base)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d: buffer %p + %u bytes runs past the end of its CUDA allocation (%u bytes at 0x%x)", options_.rank,
        ptr, bytes, a.bytes, a.base));
  }
  auto same = regions_.find(a.base);
  if (same != regions_.end() && same->second.buffer_id == a.buffer_id && same->second.bytes == a.bytes) {
    return absl::OkStatus();  // Already registered (the cache hit).
  }
  // Registrations overlapping this allocation belong to memory that was
  // freed and reused: drop them first.
  bool stale = false;
  for (auto it = regions_.begin(); it != regions_.end(); ++it) {
    if (it->first < a.base + a.bytes && a.base < it->first + it->second.bytes) stale = true;
  }
  if (stale) {
    DMAG_RETURN_IF_ERROR(WaitDone(submitted_seq_));  // Ops in flight may still name them.
    for (auto it = regions_.begin(); it != regions_.end();) {
      auto cur = it++;
      if (!(cur->first < a.base + a.bytes && a.base < cur->first + cur->second.bytes)) continue;
      DeregisterRegion(cur->second.id).IgnoreError();  // Best effort: the daemon drops it at Leave at the latest.
      regions_.erase(cur);
    }
  }
  DMAG_ASSIGN_OR_RETURN(std::string handle, cuda_->IpcHandle(a.base));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(10000));
  v1::RegisterRequest req;
  req.set_session_id(session_id_);
  req.set_kind(v1::MEMORY_KIND_CUDA_IPC);
  req.set_bytes(a.bytes);
  req.set_ipc_handle(handle);
  req.set_client_base(a.base);
  v1::RegisterReply reply;
  DMAG_RETURN_IF_ERROR(FromGrpc(stub_->Register(&ctx, req, &reply),
                                absl::StrCat("rank ", options_.rank, ": registering CUDA allocation of ", a.bytes,
                                             " bytes")));
  Region& r = regions_[a.base];
  r.bytes = a.bytes;
  r.id = reply.region_id();
  r.buffer_id = a.buffer_id;
  return absl::OkStatus();
}

absl::StatusOr<abi::BufferRefV1> CommImpl::ResolveDevice(const void* ptr, uint64_t bytes, const char* what) {
  auto ref = Resolve(ptr, bytes, what);
  if (ref.ok()) {
    // The cached registration is valid only while its allocation lives.
    auto it = regions_.upper_bound(reinterpret_cast<uintptr_t>(ptr));
    --it;
    if (cuda_->BufferId(ptr) == it->second.buffer_id) return ref;
  }
  DMAG_RETURN_IF_ERROR(RegisterDevice(ptr, bytes));
  return Resolve(ptr, bytes, what);
}

absl::Status CommImpl::SubmitCuda(uint32_t opcode, const void* send, void* const* recvs, size_t count,
                                  dmagather_dtype_t dtype, void* stream) {
  const int world = options_.world_size, rank = options_.rank;
  const uint64_t bytes = uint64_t(count) * common::DtypeSize(dtype);
  abi::DescriptorV1 d;
  d.stamp = abi::kDescriptorStampV1;
  d.op = opcode;
  d.dtype = dtype;
  d.count = count;
  d.reserved = 0;
  char* own = nullptr;
  if (opcode == abi::kOpAllGather) {
    d.num_recv = 1;
    DMAG_ASSIGN_OR_RETURN(d.recv[0], ResolveDevice(recvs[0], bytes * uint64_t(world), "recv"));
    own = static_cast<char*>(recvs[0]) + uint64_t(rank) * bytes;
    const char* s = static_cast<const char*>(send);
    const char* r0 = static_cast<const char*>(recvs[0]);
    if (s != own && bytes != 0 && s < r0 + bytes * world && r0 < s + bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": send buffer overlaps the output but is not this rank's own slot of it (in place "
          "means send == recv + rank*count)"));
    }
  } else {
    d.num_recv = static_cast<uint32_t>(world);
    for (int r = 0; r < world; ++r) {
      DMAG_ASSIGN_OR_RETURN(d.recv[r], ResolveDevice(recvs[r], bytes, "recv"));
    }
    own = static_cast<char*>(recvs[rank]);
  }
  // The daemon never copies a rank's own shard (that would be a same-device
  // copy on SMs): out of place, the caller's stream copies it, and the
  // descriptor names the output slot as the (in-place) send buffer.
  if (send != own && bytes != 0) {
    if (send == nullptr) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": send is NULL"));
    DMAG_RETURN_IF_ERROR(cuda_->CopyAsync(own, send, bytes, stream));
  }
  DMAG_ASSIGN_OR_RETURN(d.send, ResolveDevice(own, bytes, "send"));
  const uint32_t seq = submitted_seq_ + 1;
  DMAG_RETURN_IF_ERROR(cuda_->WriteReady(stream, seq));
  DMAG_RETURN_IF_ERROR(Publish(&d, /*cpu_ready=*/false));
  return cuda_->WaitDone(stream, seq);
}

absl::Status CommImpl::SubmitRawForTesting(const abi::DescriptorV1& d) {
  abi::DescriptorV1 copy = d;
  DMAG_RETURN_IF_ERROR(CheckHealthy());
  return Publish(&copy);
}

absl::Status CommImpl::Wait() {
  if (closed_) return absl::FailedPreconditionError("the communicator was destroyed");
  absl::Status st = WaitDone(submitted_seq_);
  absl::Status errors = CollectErrors();
  return errors.ok() ? st : errors;
}

}  // namespace dmagather::client
