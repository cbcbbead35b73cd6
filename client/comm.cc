#include "client/comm.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>

#include "abi/descriptor_v2.h"
#include "abi/device_memory_v1.h"
#include "abi/fd_channel_v1.h"
#include "abi/graph_v1.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/api_names.h"
#include "common/clock.h"
#include "common/dtype.h"
#include "common/fd_exchange.h"
#include "common/futex.h"
#include "common/status.h"

namespace dmagather::client {
namespace {

constexpr uint32_t kFatalMask = (1u << DMAGATHER_UNAVAILABLE) | (1u << DMAGATHER_PEER_FAILED) |
                                (1u << DMAGATHER_TIMEOUT);
// Binary error details by which the daemon marks a FAILED_PRECONDITION as FALLBACK.
constexpr char kGrpcFallbackDetails[] = "dmagather.fallback";

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", s.error_message());
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION && s.error_details() == kGrpcFallbackDetails) {
    return common::FallbackError(msg);
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
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

// FALLBACK stays FALLBACK; anything else a rank finds wrong before submit
// is INVALID_ARGUMENT for the op.
int RefusalCode(const absl::Status& s) { return common::IsFallback(s) ? DMAGATHER_FALLBACK : DMAGATHER_INVALID_ARGUMENT; }

}  // namespace

CommImpl::CommImpl(const CommOptions& options) : options_(options), op_records_(abi::kRingSlotsV1) {
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
  if (const char* y = std::getenv("DMAGATHER_YIELDS"); y != nullptr && std::atoi(y) >= 0) yields_ = std::atoi(y);
  scratch_.resize(DMAGATHER_MAX_COALESCED);
}

absl::StatusOr<std::string> CreateJobId(const std::string& socket_path) {
  const std::string path = ResolveSocket(socket_path);
  if (access(path.c_str(), F_OK) != 0) {
    return absl::UnavailableError(absl::StrCat("no dmagatherd socket at ", path, ": is dmagatherd running?"));
  }
  auto stub = v1::Control::NewStub(grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::CreateJobIdRequest req;
  v1::CreateJobIdReply reply;
  grpc::Status st = stub->CreateJobId(&ctx, req, &reply);
  if (!st.ok()) return FromGrpc(st, "create a job id");
  return reply.job_id();
}

std::string CommImpl::Rank() const { return absl::StrCat("rank ", options_.rank, ": "); }

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
  // The rank segment: a sealed memfd created here, handed to the daemon over
  // its fd channel (which answers a ticket and the doorbell's descriptor),
  // mapped by the daemon at Join. No name anywhere.
  DMAG_ASSIGN_OR_RETURN(segment_, common::MemfdMapping::Create("dmagather-seg", abi::SegmentLayoutV1::kBytes));
  view_ = abi::SegmentViewV1::At(segment_.data());
  std::random_device rd;
  const uint64_t token = (uint64_t(rd()) << 32) | rd();
  abi::InitSegmentV1(segment_.data(), token, abi::kDescriptorStampV2);

  // Connecting to a Unix socket needs write permission on it: say so,
  // rather than "stale socket", when this user lacks it.
  if (access(options_.socket_path.c_str(), R_OK | W_OK) != 0 && (errno == EACCES || errno == EPERM)) {
    struct stat st;
    const std::string who = stat(options_.socket_path.c_str(), &st) == 0
                                ? absl::StrCat(" (owner uid ", st.st_uid, ", gid ", st.st_gid, ", mode ",
                                               absl::StrFormat("%04o", st.st_mode & 07777), ")")
                                : "";
    return absl::PermissionDeniedError(absl::StrCat(
        "permission denied on ", options_.socket_path, who, ": this user (uid ", getuid(),
        ") may not connect to dmagatherd; the operator sets who may with --socket_mode and the socket's group"));
  }
  channel_ = grpc::CreateChannel("unix:" + options_.socket_path, grpc::InsecureChannelCredentials());
  if (!channel_->WaitForConnected(In(1000))) {
    return absl::UnavailableError(absl::StrCat("cannot connect to dmagatherd at ", options_.socket_path,
                                               " within 1 s (stale socket of a daemon that is not running?)"));
  }
  stub_ = v1::Control::NewStub(channel_);
  auto handed = common::ExchangeFd(common::FdChannelPath(options_.socket_path), abi::kFdSegment, segment_.fd(),
                                   abi::SegmentLayoutV1::kBytes);
  if (!handed.ok()) {
    return common::Annotate(handed.status(), absl::StrCat("rank ", options_.rank, " could not hand its segment to dmagatherd: "));
  }
  auto bell = common::MemfdMapping::Map(handed->fd.get(), sizeof(abi::DoorbellV1));
  if (!bell.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot map the daemon's doorbell: ", bell.status().message()));
  }
  doorbell_ = *std::move(bell);
  bell_ = static_cast<abi::DoorbellV1*>(doorbell_.data());
  const ProbedDevice device = ProbeDevice();
  v1::JoinRequest req;
  req.set_job_key(options_.job_key);
  req.set_world_size(options_.world_size);
  req.set_rank(options_.rank);
  req.set_pid(getpid());
  req.set_segment_ticket(handed->ticket);
  req.set_segment_token(token);
  req.set_join_timeout_ms(options_.join_timeout_ms);
  req.mutable_device()->set_kind(device.kind);
  req.mutable_device()->set_ordinal(device.ordinal);
  req.mutable_device()->set_uuid(device.uuid);
  req.mutable_device()->set_pci_bus_id(device.pci_bus_id);
  req.set_abi_version(2);
  req.set_capability_version(1);
  req.set_client_version(DMAGATHER_VERSION_STRING);
  req.set_job_id(options_.job_id);
  join_ctx_ = std::make_unique<grpc::ClientContext>();
  join_stream_ = stub_->Join(join_ctx_.get(), req);
  // The stream lives as long as the session, so it has no deadline; its
  // first event (the reply) must come within the join timeout plus slack,
  // else the call is cancelled: a Join that never reaches the daemon must
  // not hang the rank.
  v1::JoinEvent ev;
  bool got = false;
  bool no_answer = false;
  {
    std::mutex mu;
    std::condition_variable cv;
    bool answered = false;
    std::thread watchdog([&] {
      std::unique_lock<std::mutex> lock(mu);
      if (!cv.wait_for(lock, std::chrono::milliseconds(int64_t{options_.join_timeout_ms} + 10000),
                       [&] { return answered; })) {
        no_answer = true;
        join_ctx_->TryCancel();
      }
    });
    got = join_stream_->Read(&ev);
    {
      std::lock_guard<std::mutex> lock(mu);
      answered = true;
    }
    cv.notify_one();
    watchdog.join();
  }
  auto abandon = [this](const absl::Status& why) {
    join_ctx_->TryCancel();
    join_stream_->Finish();
    join_stream_.reset();
    return why;
  };
  if (!got || !ev.has_joined()) {
    grpc::Status st = join_stream_->Finish();
    join_stream_.reset();
    if (no_answer) {
      return absl::DeadlineExceededError(absl::StrCat("rank ", options_.rank, ": dmagatherd did not answer the join of job '",
                                                      options_.job_key, "' within ", options_.join_timeout_ms + 10000,
                                                      " ms"));
    }
    if (st.ok()) return absl::UnavailableError("dmagatherd closed the join without an answer");
    return FromGrpc(st, absl::StrCat("rank ", options_.rank, " could not join job '", options_.job_key, "'"));
  }
  const v1::JoinReply& reply = ev.joined();
  session_id_ = reply.session_id();
  session_secret_ = reply.session_secret();
  backend_name_ = reply.backend().empty() ? "host" : reply.backend();
  daemon_version_ = reply.daemon_version();
  if (!spin_set_ && reply.has_wait_spin()) spin_ = reply.wait_spin();
  ClientBackendContext ctx;
  ctx.completion = view_.completion;
  ctx.flag_bytes = abi::SegmentLayoutV1::kRingOffset - abi::SegmentLayoutV1::kCompletionOffset;
  ctx.device = device.ordinal;
  auto backend = CreateClientBackend(backend_name_, ctx);
  if (!backend.ok()) return abandon(common::Annotate(backend.status(), Rank()));
  backend_ = *std::move(backend);
  {
    absl::MutexLock lock(&graph_free_->mu);
    graph_free_->ready = abi::GraphFlagsOf(view_.completion)->ready;
  }
  watcher_ = std::thread([this] {
    v1::JoinEvent e;
    std::string reason = absl::StrCat("the connection to dmagatherd at ", options_.socket_path, " was lost");
    while (join_stream_->Read(&e)) {
      if (e.has_shutdown()) reason = absl::StrCat("dmagatherd stopped: ", e.shutdown().reason());
      if (e.has_ended()) reason = absl::StrCat("dmagatherd ended this rank's session: ", e.ended().reason());
    }
    {
      absl::MutexLock lock(&gone_mu_);
      gone_reason_ = reason;
    }
    released_done_ = abi::LoadAcquire(&view_.completion->done_seq);
    daemon_gone_.store(true, std::memory_order_release);
    if (backend_->has_stream_waits()) {
      // No daemon will ever publish done again: release the rank's streams
      // (their done waits pass); the calls report UNAVAILABLE.
      abi::StoreSeqCst(&view_.completion->done_seq, released_done_ + (1u << 30));
      // Captured ops: the permanent release of every graph slot (high word
      // of its done flag), so no replay waits forever.
      abi::GraphFlagsV1* g = abi::GraphFlagsOf(view_.completion);
      for (uint32_t s = 0; s < abi::kGraphSlotsV1; ++s) {
        abi::StoreSeqCst(&g->done[s].hi, 1u);
      }
    }
    common::FutexWakeAll(&view_.completion->done_seq);
  });
  return absl::OkStatus();
}

CommImpl::~CommImpl() { Close().IgnoreError(); }

absl::Status CommImpl::DaemonGone() const {
  absl::MutexLock lock(&gone_mu_);
  return absl::UnavailableError(absl::StrCat(Rank(), gone_reason_));
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
      req.set_session_secret(session_secret_);
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
  regions_.clear();  // Frees what dmagather_alloc made.
  {
    // Graphs destroyed from now on have nobody to tell (the segment goes).
    absl::MutexLock lock(&graph_free_->mu);
    graph_free_->ready = nullptr;
  }
  backend_.reset();
  return st;
}

// --- Registration ---

absl::StatusOr<abi::BufferRefV1> CommImpl::Lookup(const void* ptr, uint64_t bytes, const char* what) const {
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

absl::StatusOr<abi::BufferRefV1> CommImpl::Resolve(const void* ptr, uint64_t bytes, const char* what) {
  if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(Rank(), what, " buffer is NULL"));
  auto ref = Lookup(ptr, bytes, what);
  if (!backend_->registers_on_submit()) return ref;
  if (ref.ok()) {
    // A cached registration is valid only while its allocation lives.
    auto it = --regions_.upper_bound(reinterpret_cast<uintptr_t>(ptr));
    if (Current(it->first, it->second, ptr, bytes)) return ref;
  }
  DMAG_RETURN_IF_ERROR(Register(const_cast<void*>(ptr), bytes));
  return Lookup(ptr, bytes, what);
}

bool CommImpl::Current(uintptr_t base, const Region& r, const void* ptr, uint64_t bytes) const {
  if (!r.chunks.empty()) return backend_->ChunksCurrent(base, r.chunks, ptr, bytes);
  return backend_->BufferId(ptr) == r.buffer_id;
}

bool CommImpl::Stale(uintptr_t base, const Region& r, const MemoryExport& e) const {
  if (!(base < e.base + e.bytes && e.base < base + r.bytes)) return false;  // No overlap.
  if (r.chunks.empty() || e.chunks.empty() || base == e.base) return true;
  // Two VMM registrations over shared chunks are both valid while every
  // shared chunk is the same mapping in both.
  for (const VmmChunk& c : r.chunks) {
    const uintptr_t cb = base + c.offset;
    if (cb + c.bytes <= e.base || cb >= e.base + e.bytes) continue;
    bool same = false;
    for (const VmmChunk& d : e.chunks) {
      if (e.base + d.offset == cb && d.bytes == c.bytes && d.id == c.id) same = true;
    }
    if (!same) return true;
  }
  return false;
}

absl::Status CommImpl::RegisterExport(const MemoryExport& e, std::unique_ptr<OwnedBuffer> owned) {
  auto same = regions_.find(e.base);
  if (same != regions_.end() && same->second.bytes == e.bytes && same->second.buffer_id == e.buffer_id) {
    bool hit = same->second.chunks.size() == e.chunks.size();
    for (size_t i = 0; hit && i < e.chunks.size(); ++i) hit = same->second.chunks[i].id == e.chunks[i].id;
    if (hit) return absl::OkStatus();  // Already registered (the cache hit).
  }
  // Registrations overlapping this allocation belong to memory that was
  // freed and reused (or unmapped and remapped): drop them first (ops in
  // flight may still name them).
  // Besides, VMM registrations whose chunks the allocator has unmapped (or
  // remapped) since: the daemon's import still maps the old physical memory,
  // which the device gets back only when the import goes. Checked here, on
  // every new registration (one pointer attribute per registered chunk).
  auto overlaps = [&](const auto& kv) {
    if (Stale(kv.first, kv.second, e)) return true;
    return !kv.second.chunks.empty() && kv.second.owned == nullptr &&
           !backend_->ChunksCurrent(kv.first, kv.second.chunks, reinterpret_cast<const void*>(kv.first),
                                    kv.second.bytes);
  };
  bool stale = false;
  for (const auto& kv : regions_) stale |= overlaps(kv);
  if (stale) {
    DMAG_RETURN_IF_ERROR(WaitDone(static_cast<uint32_t>(submitted_)));
    for (auto it = regions_.begin(); it != regions_.end();) {
      auto cur = it++;
      if (!overlaps(*cur)) continue;
      DeregisterRegion(cur->second.id).IgnoreError();  // Best effort: the daemon drops it at Leave at the latest.
      dropped_.emplace_back(cur->second.id, cur->first);
      regions_.erase(cur);
    }
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(In(10000));
  v1::RegisterRequest req;
  req.set_session_id(session_id_);
  req.set_session_secret(session_secret_);
  req.set_memory_kind(e.memory_kind);
  req.set_bytes(e.bytes);
  if (e.fd >= 0) {
    // Host memory goes to the daemon as a descriptor; Register names its ticket.
    auto handed = common::ExchangeFd(common::FdChannelPath(options_.socket_path), abi::kFdBuffer, e.fd, e.bytes);
    if (!handed.ok()) {
      return common::Annotate(handed.status(), absl::StrCat(Rank(), "handing a buffer of ", e.bytes,
                                                            " bytes to dmagatherd: "));
    }
    req.set_ticket(handed->ticket);
  }
  if (e.device_fds != nullptr) {
    // Exported device allocations, up to kMaxFdsPerRequestV1 per hand-over;
    // Register names the tickets in chunk order.
    const std::vector<common::UniqueFd>& fds = *e.device_fds;
    for (size_t i = 0; i < fds.size(); i += abi::kMaxFdsPerRequestV1) {
      std::vector<int> batch;
      uint64_t batch_bytes = 0;
      for (size_t j = i; j < fds.size() && j < i + abi::kMaxFdsPerRequestV1; ++j) {
        batch.push_back(fds[j].get());
        batch_bytes += e.chunks[j].bytes;
      }
      auto handed = common::ExchangeFds(common::FdChannelPath(options_.socket_path), abi::kFdDeviceMemory, batch,
                                        batch_bytes);
      if (!handed.ok()) {
        return common::Annotate(handed.status(), absl::StrCat(Rank(), "handing ", fds.size(),
                                                              " device allocations to dmagatherd: "));
      }
      req.add_tickets(handed->ticket);
    }
  }
  req.set_handle(e.handle);
  req.set_client_base(e.base);
  v1::RegisterReply reply;
  grpc::Status st = stub_->Register(&ctx, req, &reply);
  if (owned != nullptr) owned->Registered();
  DMAG_RETURN_IF_ERROR(FromGrpc(st, absl::StrCat(Rank(), "registering ", e.memory_kind, " memory of ", e.bytes,
                                                 " bytes")));
  Region& r = regions_[e.base];
  r.bytes = e.bytes;
  r.id = reply.region_id();
  r.buffer_id = e.buffer_id;
  r.chunks = e.chunks;
  r.owned = std::move(owned);
  return absl::OkStatus();
}

absl::StatusOr<void*> CommImpl::Alloc(size_t bytes) {
  if (closed_) return absl::InvalidArgumentError("the communicator was destroyed");
  if (bytes == 0) return absl::InvalidArgumentError("dmagather_alloc of 0 bytes");
  if (daemon_gone_.load()) return DaemonGone();
  DMAG_ASSIGN_OR_RETURN(std::unique_ptr<OwnedBuffer> buf, backend_->Allocate(bytes));
  void* p = buf->data();
  const MemoryExport e = buf->export_info();
  DMAG_RETURN_IF_ERROR(RegisterExport(e, std::move(buf)));
  return p;
}

absl::Status CommImpl::Register(void* ptr, size_t bytes) {
  if (closed_) return absl::InvalidArgumentError("the communicator was destroyed");
  if (ptr == nullptr || bytes == 0) return absl::InvalidArgumentError("dmagather_register of a null or empty buffer");
  if (daemon_gone_.load()) return DaemonGone();
  auto known = Lookup(ptr, bytes, "registered");
  if (known.ok()) {
    auto it = --regions_.upper_bound(reinterpret_cast<uintptr_t>(ptr));
    if (it->second.owned != nullptr || Current(it->first, it->second, ptr, bytes)) return absl::OkStatus();
  }
  auto e = backend_->Describe(ptr, bytes);
  if (!e.ok()) return common::Annotate(e.status(), Rank());
  return RegisterExport(*e, nullptr);
}

absl::Status CommImpl::DeregisterRegion(uint32_t region_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(10000));
  v1::DeregisterRequest req;
  req.set_session_id(session_id_);
  req.set_session_secret(session_secret_);
  req.set_region_id(region_id);
  v1::DeregisterReply reply;
  return FromGrpc(stub_->Deregister(&ctx, req, &reply), "deregister");
}

absl::Status CommImpl::Deregister(void* ptr) {
  if (closed_) return absl::InvalidArgumentError("the communicator was destroyed");
  auto it = regions_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == regions_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("rank %d: %p is not the start of a registered buffer",
                                                      options_.rank, ptr));
  }
  DMAG_RETURN_IF_ERROR(Wait());  // Outstanding ops may still use it.
  absl::Status st = DeregisterRegion(it->second.id);
  regions_.erase(it);  // Freed here (if the library made it); the daemon's side goes with the Deregister.
  return daemon_gone_.load() ? absl::OkStatus() : st;
}

absl::Status CommImpl::Free(void* ptr) {
  auto it = regions_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == regions_.end() || it->second.owned == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("rank %d: %p was not returned by dmagather_alloc",
                                                      options_.rank, ptr));
  }
  return Deregister(ptr);
}

// --- Completion and errors ---

void CommImpl::ScanErrors() {
  // done_seq first: every record of an op <= done was written before it.
  const uint32_t done = abi::LoadAcquire(&view_.completion->done_seq);
  const uint32_t n = abi::LoadAcquire(&view_.completion->error_count);
  const uint32_t prev_done = scanned_done_;
  scanned_done_ = done;
  if (n == errors_scanned_) return;
  uint32_t first = errors_scanned_;
  if (n - first > abi::kErrorSlotsV1) {
    // Records were overwritten before this rank read them: ops finished
    // since the last scan may have lost their status.
    lost_from_ = prev_done;
    lost_upto_ = done;
    first = n - abi::kErrorSlotsV1;
  }
  for (uint32_t i = first; i != n; ++i) {
    const abi::ErrorRecordV1& rec = view_.completion->errors[i % abi::kErrorSlotsV1];
    OpRecord& o = op_records_[rec.seq % op_records_.size()];
    o.reported = false;
    o.seq = rec.seq;
    o.status = rec.status;
    o.message.assign(rec.message, strnlen(rec.message, sizeof(rec.message)));
  }
  errors_scanned_ = n;
}

absl::Status CommImpl::OpStatus(uint32_t seq) {
  ScanErrors();
  OpRecord& o = op_records_[seq % op_records_.size()];
  if (o.seq == seq && o.status != 0) {
    o.reported = true;  // Returned here: dmagather_wait does not report it again.
    return common::FromApiStatus(o.status, o.message);
  }
  if (lost_upto_ != lost_from_ && abi::SeqGeq(lost_upto_, seq) && !abi::SeqGeq(lost_from_, seq)) {
    return absl::InternalError(absl::StrCat(Rank(), "the status of op ", seq,
                                            " was lost (more than 16 ops failed before it was read)"));
  }
  return absl::OkStatus();
}

absl::Status CommImpl::CollectErrors() {
  ScanErrors();
  const uint32_t n = abi::LoadAcquire(&view_.completion->error_count);
  if (n == errors_seen_) return absl::OkStatus();
  uint32_t first = errors_seen_;
  if (n - first > abi::kErrorSlotsV1) first = n - abi::kErrorSlotsV1;
  // The first failure since the last wait that op_wait/op_test has not
  // already returned; the others are counted in the message.
  const abi::ErrorRecordV1* rec = nullptr;
  uint32_t unreported = n - errors_seen_ - (n - first);  // Records lost to overflow count as unreported.
  for (uint32_t i = first; i != n; ++i) {
    const abi::ErrorRecordV1& r = view_.completion->errors[i % abi::kErrorSlotsV1];
    const OpRecord& o = op_records_[r.seq % op_records_.size()];
    if (o.seq == r.seq && o.reported) continue;
    ++unreported;
    if (rec == nullptr) rec = &r;
  }
  errors_seen_ = n;
  if (rec == nullptr) return absl::OkStatus();
  std::string msg(rec->message, strnlen(rec->message, sizeof(rec->message)));
  if (unreported > 1) {
    absl::StrAppend(&msg, " (and ", unreported - 1, " more failed operation(s) since the last wait)");
  }
  return common::FromApiStatus(rec->status, msg);
}

absl::Status CommImpl::CheckHealthy() {
  if (closed_) return absl::InvalidArgumentError("the communicator was destroyed");
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
  common::Backoff backoff(spin_, yields_);
  for (;;) {
    if (backend_->has_stream_waits() && daemon_gone_.load(std::memory_order_acquire)) {
      // done_seq was moved ahead to release the streams; only ops finished
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

// --- Submit ---

absl::Status CommImpl::PublishSlot(const void* d, size_t bytes) {
  abi::RingV1* ring = view_.ring;
  const uint64_t tail = ring->tail;
  common::Backoff backoff;
  while (tail - abi::LoadAcquire(&ring->head) >= abi::kRingSlotsV1) {
    if (daemon_gone_.load()) return DaemonGone();
    if (backoff.Pause()) usleep(50);
  }
  std::memcpy(&view_.slots[tail % abi::kRingSlotsV1], d, bytes);
  abi::StoreSeqCst(&ring->tail, tail + 1);
  if (abi::LoadSeqCst(&bell_->sleeping) != 0) {
    abi::FetchAdd(&bell_->seq, 1u);
    common::FutexWakeAll(&bell_->seq);
  }
  return absl::OkStatus();
}

absl::Status CommImpl::Publish(abi::DescriptorV2* ds, size_t n) {
  const uint32_t seq = static_cast<uint32_t>(submitted_ + 1);
  // At most kRingSlotsV1 ops outstanding: the daemon's matcher has one slot each.
  DMAG_RETURN_IF_ERROR(WaitDone(seq - abi::kRingSlotsV1));
  const uint64_t now = common::MonotonicNs();
  for (size_t i = 0; i < n; ++i) {
    abi::DescriptorV2& d = ds[i];
    d.stamp = abi::kDescriptorStampV2;
    d.seq = seq;
    d.submit_ns = now;
    d.items_following = static_cast<uint32_t>(n - 1 - i);
    const size_t used = d.op == abi::kOpRefuse
                            ? sizeof(abi::DescriptorV2)
                            : offsetof(abi::DescriptorV2, recv) +
                                  sizeof(abi::BufferRefV1) * std::min(d.num_recv, abi::kMaxRanksV1);
    DMAG_RETURN_IF_ERROR(PublishSlot(&d, used));
  }
  submitted_ = submitted_ + 1;
  return absl::OkStatus();
}

absl::Status CommImpl::PublishRefusal(const absl::Status& why) {
  abi::DescriptorV2& d = scratch_[0];
  std::memset(&d, 0, sizeof(d));
  d.op = abi::kOpRefuse;
  d.refusal.status = RefusalCode(why);
  const size_t len = std::min(why.message().size(), sizeof(d.refusal.reason) - 1);
  std::memcpy(d.refusal.reason, why.message().data(), len);
  d.refusal.reason[len] = '\0';
  // Host readiness is a CPU store; keep ready_seq moving with the ops.
  if (!backend_->has_stream_waits()) backend_->WriteReady(nullptr, static_cast<uint32_t>(submitted_ + 1)).IgnoreError();
  return Publish(&d, 1);
}

absl::Status CommImpl::PrepareItem(const GatherItem& item, void* stream, abi::DescriptorV2* d) {
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
    // it, and the descriptor names the output slot as the (in-place) send.
    char* own = item.list ? static_cast<char*>(item.recvs[rank])
                          : static_cast<char*>(item.recvs[0]) + uint64_t(rank) * bytes;
    if (send == nullptr) return absl::InvalidArgumentError(absl::StrCat(Rank(), "send is NULL"));
    if (!item.list) {
      const char* s = static_cast<const char*>(send);
      const char* r0 = static_cast<const char*>(item.recvs[0]);
      if (s != own && s < r0 + out_bytes && r0 < s + bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            Rank(), "send buffer overlaps the output but is not this rank's own slot of it (in place means send == "
                    "recv + rank*count)"));
      }
    }
    if (send != own) {
      if (defer_copies_) {
        deferred_.push_back(DeferredCopy{own, send, bytes});  // After the capture's verdict.
      } else {
        DMAG_RETURN_IF_ERROR(backend_->CopyAsync(own, send, bytes, stream));
      }
    }
    send = own;
  }
  DMAG_ASSIGN_OR_RETURN(d->send, Resolve(send, bytes, "send"));
  return absl::OkStatus();
}

absl::Status CommImpl::Submit(const GatherItem* items, size_t n, void* stream, uint64_t* op) {
  if (op != nullptr) *op = 0;
  DMAG_RETURN_IF_ERROR(CheckHealthy());
  absl::Status local;
  if (n == 0 || n > DMAGATHER_MAX_COALESCED) {
    local = absl::InvalidArgumentError(absl::StrCat(Rank(), "an op has 1..", DMAGATHER_MAX_COALESCED,
                                                    " items, not ", n));
  } else if (items == nullptr) {
    local = absl::InvalidArgumentError(absl::StrCat(Rank(), "items is NULL"));
  } else {
    local = common::Annotate(backend_->CheckStream(stream), Rank());
  }
  // Under CUDA-graph capture the op becomes a persistent op in a graph slot.
  int slot = -1;
  if (local.ok()) {
    auto capturing = backend_->Capturing(stream);
    if (!capturing.ok()) {
      local = common::Annotate(capturing.status(), Rank());
    } else if (*capturing) {
      slot = TakeGraphSlot();
      if (slot < 0) {
        local = absl::ResourceExhaustedError(absl::StrCat(
            Rank(), "all ", abi::kGraphSlotsV1,
            " graph slots of this communicator hold captured AllGathers of live CUDA graphs; destroy graphs "
            "(and their executable instances) first"));
      }
    }
  }
  defer_copies_ = slot >= 0;
  deferred_.clear();
  dropped_.clear();
  for (size_t i = 0; local.ok() && i < n; ++i) {
    std::memset(&scratch_[i], 0, offsetof(abi::DescriptorV2, recv));
    local = PrepareItem(items[i], stream, &scratch_[i]);
  }
  if (local.ok() && !dropped_.empty()) local = RenameDropped(n);
  defer_copies_ = false;
  if (local.ok() && slot >= 0) return SubmitCaptured(n, stream, static_cast<uint32_t>(slot), op);
  if (slot >= 0) ReleaseGraphSlot(static_cast<uint32_t>(slot));
  if (!local.ok()) {
    // This rank cannot take part: the op still takes its sequence number and
    // fails on every rank with this status, so no rank waits for it.
    DMAG_RETURN_IF_ERROR(PublishRefusal(local));
    if (op != nullptr) *op = submitted_;
    return local;
  }
  DMAG_RETURN_IF_ERROR(backend_->WriteReady(stream, static_cast<uint32_t>(submitted_ + 1)));
  DMAG_RETURN_IF_ERROR(Publish(scratch_.data(), n));
  if (op != nullptr) *op = submitted_;
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
      const uint64_t bytes = uint64_t(d.count) * common::DtypeSize(d.dtype);
      const uint64_t out_bytes = d.op == abi::kOpAllGatherListV2 ? bytes : bytes * uint64_t(options_.world_size);
      auto rename = [&](abi::BufferRefV1* ref, uint64_t len, const char* what) -> absl::Status {
        for (const auto& [id, base] : gone) {
          if (ref->region_id != id) continue;
          DMAG_ASSIGN_OR_RETURN(*ref, Resolve(reinterpret_cast<const void*>(base + ref->offset), len, what));
          break;
        }
        return absl::OkStatus();
      };
      for (uint32_t r = 0; r < d.num_recv; ++r) DMAG_RETURN_IF_ERROR(rename(&d.recv[r], out_bytes, "recv"));
      DMAG_RETURN_IF_ERROR(rename(&d.send, bytes, "send"));
    }
  }
  return absl::OkStatus();
}

int CommImpl::TakeGraphSlot() {
  {
    // Slots whose graphs were destroyed since (the user object's callback).
    absl::MutexLock lock(&graph_free_->mu);
    for (uint32_t s : graph_free_->freed) graph_slots_used_ &= ~(1u << s);
    graph_free_->freed.clear();
  }
  for (uint32_t s = 0; s < abi::kGraphSlotsV1; ++s) {
    if ((graph_slots_used_ & (1u << s)) == 0) {
      graph_slots_used_ |= 1u << s;
      return static_cast<int>(s);
    }
  }
  return -1;
}

void CommImpl::ReleaseGraphSlot(uint32_t slot) { graph_slots_used_ &= ~(1u << slot); }

absl::Status CommImpl::SubmitCaptured(size_t n, void* stream, uint32_t slot, uint64_t* op) {
  // Fresh flag words: the daemon retires any earlier op of this slot when
  // it arms the new one.
  abi::GraphFlagsV1* g = abi::GraphFlagsOf(view_.completion);
  abi::StoreRelease(&g->stamp, abi::kGraphFlagsStampV1);
  abi::StoreRelease(&g->ready[slot], 0u);
  abi::StoreRelease(&g->done[slot].hi, 0u);
  abi::StoreRelease(&g->done[slot].lo, 0u);
  abi::StoreRelease(&g->status[slot], 0);
  for (size_t i = 0; i < n; ++i) scratch_[i].op |= abi::kOpPersistentBit | (slot << abi::kOpPersistentSlotShift);
  // The definition takes a sequence number like any op; ready_seq is not
  // written for it (nothing of it runs until a replay).
  absl::Status st = Publish(scratch_.data(), n);
  if (!st.ok()) {
    ReleaseGraphSlot(slot);
    return st;
  }
  if (op != nullptr) *op = submitted_;
  // The verdict of the definition, on the host, at capture (the ranks
  // capture their graphs together, as any collective's capture): a graph
  // whose op was refused would wait forever at its first replay.
  st = OpWait(submitted_);
  if (st.ok()) {
    for (const DeferredCopy& c : deferred_) {
      st = backend_->CopyAsync(c.dst, c.src, c.bytes, stream);
      if (!st.ok()) break;
    }
  }
  if (st.ok()) st = backend_->WriteGraphReady(stream, slot);
  if (st.ok()) st = backend_->OnGraphSlotTaken(stream, slot, graph_free_);
  if (!st.ok()) {
    ReleaseGraphSlot(slot);
    return common::Annotate(st, absl::StrCat(Rank(), "capturing the AllGather into a CUDA graph: "));
  }
  graph_ops_[submitted_] = GraphOp{slot, false};
  if (graph_ops_.size() > 4 * abi::kGraphSlotsV1) graph_ops_.erase(graph_ops_.begin());
  return absl::OkStatus();
}

absl::Status CommImpl::SubmitFallback(const std::string& reason, uint64_t* op) {
  if (op != nullptr) *op = 0;
  DMAG_RETURN_IF_ERROR(CheckHealthy());
  const absl::Status why = common::FallbackError(absl::StrCat(Rank(), reason.empty() ? "fallback requested" : reason));
  DMAG_RETURN_IF_ERROR(PublishRefusal(why));
  if (op != nullptr) *op = submitted_;
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
  if (op == 0 || op > submitted_) {
    return absl::InvalidArgumentError(absl::StrCat(Rank(), "op ", op, " was not submitted on this communicator (",
                                                   submitted_, " ops so far)"));
  }
  if (submitted_ - op >= (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat(Rank(), "op ", op, " is too old to be waited for"));
  }
  return static_cast<uint32_t>(op);
}

absl::Status CommImpl::OpWait(uint64_t op) {
  DMAG_ASSIGN_OR_RETURN(uint32_t seq, OpSeq(op));
  DMAG_RETURN_IF_ERROR(WaitDone(seq));
  return OpStatus(seq);
}

absl::StatusOr<bool> CommImpl::OpTest(uint64_t op, absl::Status* op_status) {
  DMAG_ASSIGN_OR_RETURN(uint32_t seq, OpSeq(op));
  *op_status = absl::OkStatus();
  if (backend_->has_stream_waits() && daemon_gone_.load(std::memory_order_acquire)) {
    if (!abi::SeqGeq(released_done_, seq)) {
      *op_status = DaemonGone();
      return true;
    }
  } else if (!abi::SeqGeq(abi::LoadAcquire(&view_.completion->done_seq), seq)) {
    if (daemon_gone_.load(std::memory_order_acquire)) {
      *op_status = DaemonGone();
      return true;
    }
    return false;
  }
  *op_status = OpStatus(seq);
  return true;
}

absl::Status CommImpl::OpWaitStream(uint64_t op, void* stream) {
  DMAG_ASSIGN_OR_RETURN(uint32_t seq, OpSeq(op));
  auto captured = graph_ops_.find(op);
  if (captured != graph_ops_.end()) {
    // A captured op: its wait is part of the same graph, once.
    if (captured->second.waited) {
      return absl::InvalidArgumentError(absl::StrCat(
          Rank(), "op ", op, " was captured into a CUDA graph and already waited on a stream; a captured op is "
                  "waited exactly once, in the same capture"));
    }
    DMAG_ASSIGN_OR_RETURN(bool capturing, backend_->Capturing(stream));
    if (!capturing) {
      return absl::InvalidArgumentError(absl::StrCat(
          Rank(), "op ", op, " was captured into a CUDA graph: wait for it on a stream of the same capture"));
    }
    DMAG_RETURN_IF_ERROR(backend_->WaitGraphDone(stream, captured->second.slot));
    captured->second.waited = true;
    return absl::OkStatus();
  }
  if (!backend_->has_stream_waits()) {
    DMAG_RETURN_IF_ERROR(common::Annotate(backend_->CheckStream(stream), Rank()));
    DMAG_RETURN_IF_ERROR(WaitDone(seq));
    return OpStatus(seq);
  }
  return backend_->WaitDoneOnStream(stream, seq);
}

absl::Status CommImpl::SubmitRawForTesting(const abi::DescriptorV1& d) {
  abi::DescriptorV1 copy = d;
  DMAG_RETURN_IF_ERROR(CheckHealthy());
  const uint32_t seq = static_cast<uint32_t>(submitted_ + 1);
  DMAG_RETURN_IF_ERROR(WaitDone(seq - abi::kRingSlotsV1));
  copy.stamp = copy.stamp != 0 ? copy.stamp : abi::kDescriptorStampV1;
  copy.seq = seq;
  copy.submit_ns = common::MonotonicNs();
  backend_->WriteReady(nullptr, seq).IgnoreError();
  DMAG_RETURN_IF_ERROR(PublishSlot(&copy, sizeof(copy)));
  submitted_ = submitted_ + 1;
  return absl::OkStatus();
}

absl::Status CommImpl::Wait() {
  if (closed_) return absl::InvalidArgumentError("the communicator was destroyed");
  absl::Status st = WaitDone(static_cast<uint32_t>(submitted_));
  absl::Status errors = CollectErrors();
  return errors.ok() ? st : errors;
}

}  // namespace dmagather::client
