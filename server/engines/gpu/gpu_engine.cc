#include "server/engines/gpu/gpu_engine.h"

#include <glog/logging.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/cpu_relax.h"
#include "common/futex.h"
#include "common/status.h"

namespace dmagather::server::engines::gpu {
namespace {

using common::CpuRelax;

// A rank's allocation opened through the runtime's IPC; closed with the
// last reference (which may outlive the engine: it shares the runtime).
class IpcRegion : public ImportedRegion {
 public:
  IpcRegion(std::shared_ptr<GpuRuntime> rt, char* base, uint64_t bytes, int device)
      : rt_(std::move(rt)), base_(base), bytes_(bytes), device_(device) {}
  ~IpcRegion() override { rt_->CloseIpc(device_, base_); }
  char* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  const std::shared_ptr<GpuRuntime> rt_;
  char* const base_;
  const uint64_t bytes_;
  const int device_;
};

// A rank on this engine: its device (the daemon's number, and the rank's
// own), its completion block registered with the runtime (streams read the
// ready flag at `ready_flag`; the CPU gate reads `ready_word`);
// unregistered when the rank is released.
class GpuRank : public EngineRank {
 public:
  GpuRank(std::shared_ptr<GpuRuntime> rt, int device, int rank_ordinal, void* pages, uint64_t ready_flag,
          const uint32_t* ready_word)
      : rt_(std::move(rt)),
        device_(device),
        rank_ordinal_(rank_ordinal),
        pages_(pages),
        ready_flag_(ready_flag),
        ready_word_(ready_word) {}
  ~GpuRank() override { rt_->UnregisterFlags(pages_); }
  int device() const { return device_; }
  int rank_ordinal() const { return rank_ordinal_; }
  uint64_t ready_flag() const { return ready_flag_; }
  const uint32_t* ready_word() const { return ready_word_; }

 private:
  const std::shared_ptr<GpuRuntime> rt_;
  const int device_;
  const int rank_ordinal_;
  void* const pages_;
  const uint64_t ready_flag_;
  const uint32_t* const ready_word_;
};

const GpuRank* AsGpu(const EngineRank* r) { return static_cast<const GpuRank*>(r); }

// The other end of a copy issued on `device` (its link), or `device` itself.
int LinkPeer(const CopyCmd& c, int device) { return c.src_device == device ? c.dst_device : c.src_device; }

// Backs off while polling: spin (latency: a sleep costs ~60 us of timer
// slack), yield after 200 us, sleep between polls only after 5 ms.
void Backoff(uint64_t waited_ns) {
  if (waited_ns < 200'000) {
    for (int i = 0; i < 32; ++i) CpuRelax();
  } else if (waited_ns < 5'000'000) {
    sched_yield();
  } else {
    usleep(50);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuEngine>> GpuEngine::Create(std::unique_ptr<GpuRuntime> runtime,
                                                             const Options& options) {
  if (runtime == nullptr) return absl::InvalidArgumentError("no GPU runtime");
  if (options.streams_per_device < 0 || options.streams_per_device > 64) {
    return absl::InvalidArgumentError(absl::StrCat("streams per device must be 1..64 (0: automatic), got ",
                                                   options.streams_per_device));
  }
  if (options.chunk_bytes != 0 && options.chunk_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat("chunk bytes must be >= 4096, got ", options.chunk_bytes));
  }
  if (runtime->num_devices() < 1) return absl::UnavailableError(absl::StrCat("no ", runtime->label(), " device"));
  auto engine = std::unique_ptr<GpuEngine>(new GpuEngine(std::move(runtime), options));
  DMAG_RETURN_IF_ERROR(engine->Init());
  return engine;
}

GpuEngine::GpuEngine(std::unique_ptr<GpuRuntime> runtime, const Options& options)
    : runtime_(std::move(runtime)),
      options_(options),
      num_devices_(runtime_->num_devices()),
      streams_per_device_(options.streams_per_device > 0 ? options.streams_per_device
                                                         : std::min(64, std::max(4, num_devices_ - 1))),
      parallel_issue_(options.parallel_issue && num_devices_ > 1),
      chunk_bytes_(std::min(options.chunk_bytes != 0 ? options.chunk_bytes : runtime_->default_chunk_bytes(),
                            runtime_->max_transfer_bytes())) {}

absl::Status GpuEngine::Init() {
  GpuRuntime& rt = *runtime_;
  devices_.resize(num_devices_);
  issued_bytes_ = std::make_unique<std::atomic<uint64_t>[]>(num_devices_);
  {
    absl::MutexLock lock(&pool_mu_);
    free_end_.resize(num_devices_);
  }
  for (int d = 0; d < num_devices_; ++d) issued_bytes_[d].store(0, std::memory_order_relaxed);
  const int ns = streams_per_device_;
  for (int d = 0; d < num_devices_; ++d) {
    Device& dev = devices_[d];
    dev.ordinal = d;
    DMAG_RETURN_IF_ERROR(rt.SetDevice(d));
    dev.streams.resize(ns, nullptr);
    dev.joins.resize(ns, nullptr);
    for (int s = 0; s < ns; ++s) {
      DMAG_ASSIGN_OR_RETURN(dev.streams[s], rt.CreateStream(d));
      DMAG_ASSIGN_OR_RETURN(dev.joins[s], rt.CreateEvent(d));
    }
    DMAG_ASSIGN_OR_RETURN(dev.gate, rt.CreateEvent(d));
    for (int i = 0; i < 64; ++i) {
      DMAG_ASSIGN_OR_RETURN(GpuEvent e, rt.CreateEvent(d));
      absl::MutexLock lock(&pool_mu_);
      free_end_[d].push_back(e);
    }
    dev.copies.reserve(64);
    dev.stream_used.resize(ns);
  }
  DMAG_RETURN_IF_ERROR(MapDevices());
  rt.UsePeers(peers_);
  involved_.resize(num_devices_);
  tracks_ = std::vector<OpTrack>(kTracks);
  {
    absl::MutexLock lock(&tracks_mu_);
    for (OpTrack& t : tracks_) free_tracks_.push_back(&t);
  }
  LOG(INFO) << name() << " engine: " << num_devices_ << " device(s), " << ns << " streams each, chunks of "
            << chunk_bytes_ << " bytes (cap " << rt.max_transfer_bytes() << "), " << options_.max_batch
            << " chunks per copy call, ready flags waited on " << (rt.device_waits() ? "the device" : "the CPU")
            << ", " << (parallel_issue_ ? "one issuing thread per device" : "one issuing thread") << "; "
            << rt.Describe();
  for (int d = 0; d < num_devices_; ++d) {
    completions_.push_back(std::make_unique<Completion>());
    absl::MutexLock lock(&completions_.back()->mu);
    completions_.back()->ring.resize(kShareSlots);
  }
  for (int d = 0; d < num_devices_; ++d) completions_[d]->thread = std::thread([this, d] { CompletionLoop(d); });
  if (parallel_issue_) {
    for (Device& dev : devices_) {
      dev.issuer = std::make_unique<Issuer>();
      absl::MutexLock lock(&dev.issuer->mu);
      dev.issuer->ring.resize(kIssueSlots);
    }
    for (int d = 0; d < num_devices_; ++d) devices_[d].issuer->thread = std::thread([this, d] { IssuerLoop(d); });
  }
  if (!rt.device_waits()) {
    {
      absl::MutexLock lock(&issue_mu_);
      gate_ring_.resize(kGateSlots);
    }
    gate_thread_ = std::thread([this] { GateLoop(); });
  }
  return absl::OkStatus();
}

absl::Status GpuEngine::MapDevices() {
  GpuRuntime& rt = *runtime_;
  identities_.assign(num_devices_, DeviceIdentity{});
  for (int d = 0; d < num_devices_; ++d) {
    absl::StatusOr<DeviceIdentity> id = rt.Identify(d);
    if (!id.ok()) {
      LOG(WARNING) << "device " << d << ": no identity (" << id.status().message()
                   << "); ranks that name their GPU cannot be mapped to it";
      continue;
    }
    identities_[d] = *std::move(id);
    LOG(INFO) << "device " << d << ": " << identities_[d].name << " " << FormatDeviceUuid(identities_[d].uuid)
              << " at " << (identities_[d].pci_bus_id.empty() ? "an unknown bus id" : identities_[d].pci_bus_id);
  }
  // Peer access and a probe copy per ordered pair. An error is the pair's
  // alone: it is marked unreachable, and copies between the two take the
  // route the table leaves (IssuingDevice) or fail with the reason.
  peers_ = PeerTable(num_devices_);
  std::vector<std::string> missing;
  for (int a = 0; a < num_devices_; ++a) {
    for (int b = 0; b < num_devices_; ++b) {
      if (a == b) continue;
      std::string why;
      const std::string& bus = identities_[a].pci_bus_id;
      if (!bus.empty() && absl::EqualsIgnoreCase(bus, identities_[b].pci_bus_id)) {
        why = "partitions (MIG) of one GPU, which have no peer access or IPC between them";
      } else if (absl::StatusOr<bool> ok = rt.EnablePeerAccess(a, b); !ok.ok()) {
        why = std::string(ok.status().message());
      } else if (!*ok) {
        why = "the driver reports no peer access";
      } else if (absl::Status probe = rt.ProbePeerCopy(a, b); !probe.ok()) {
        why = absl::StrCat("the probe copy failed: ", probe.message());
      }
      peers_.Set(a, b, why.empty(), why);
      if (!why.empty()) missing.push_back(absl::StrCat(a, "->", b, " (", why, ")"));
    }
  }
  if (num_devices_ > 1) {
    if (missing.empty()) {
      LOG(INFO) << "peer access: every device reaches every other directly (" << num_devices_ * (num_devices_ - 1)
                << " pairs probed)";
    } else {
      LOG(WARNING) << "peer access: " << missing.size() << " of " << num_devices_ * (num_devices_ - 1)
                   << " device pairs cannot reach each other directly: " << absl::StrJoin(missing, "; ")
                   << ". A copy between such a pair is issued on the side that reaches the other; with "
                      "neither, its op is a FALLBACK";
    }
  }
  return absl::OkStatus();
}

int GpuEngine::IssuingDevice(int src, int dst) const {
  if (dst < 0 || dst >= num_devices_) return -1;
  if (src < 0 || src == dst || peers_.ok(dst, src)) return dst;  // src < 0: host memory (ring staging).
  if (peers_.ok(src, dst)) return src;
  return -1;
}

absl::StatusOr<int> GpuEngine::DaemonDevice(const DeviceRef& ref) const {
  auto list = [&] {
    std::vector<std::string> v;
    for (int d = 0; d < num_devices_; ++d) {
      v.push_back(absl::StrCat(d, ": ", FormatDeviceUuid(identities_[d].uuid), " ", identities_[d].pci_bus_id));
    }
    return absl::StrJoin(v, ", ");
  };
  auto pick = [&](auto&& same, const std::string& what) -> absl::StatusOr<int> {
    int found = -1, matches = 0;
    for (int d = 0; d < num_devices_; ++d) {
      if (same(identities_[d])) {
        found = d;
        ++matches;
      }
    }
    if (matches == 1) return found;
    if (matches > 1) {
      return common::FallbackError(absl::StrCat("the rank's ", runtime_->label(), " device ", what,
                                                " matches ", matches, " devices of dmagatherd (", list(), ")"));
    }
    return common::FallbackError(absl::StrCat(
        "the rank's ", runtime_->label(), " device ", ref.ordinal, " (", what, ") is not one of the ", num_devices_,
        " device(s) dmagatherd sees (", list(), "): give dmagatherd every GPU of the node"));
  };
  bool known = false;
  for (const DeviceIdentity& id : identities_) known |= !id.uuid.empty() || !id.pci_bus_id.empty();
  if (!ref.uuid.empty()) {
    if (ref.uuid.size() != 16) {
      return absl::InvalidArgumentError(absl::StrCat("a device uuid has 16 bytes, the rank sent ", ref.uuid.size()));
    }
    if (known) return pick([&](const DeviceIdentity& id) { return id.uuid == ref.uuid; }, FormatDeviceUuid(ref.uuid));
  }
  if (!ref.pci_bus_id.empty() && known) {
    if (ref.pci_bus_id.size() > 64) return absl::InvalidArgumentError("the rank's PCI bus id is too long");
    return pick([&](const DeviceIdentity& id) { return absl::EqualsIgnoreCase(id.pci_bus_id, ref.pci_bus_id); },
                absl::StrCat("bus ", ref.pci_bus_id));
  }
  // No identity on one side (an older client, or a runtime that cannot
  // tell): the rank's ordinal, which is right only when the rank sees the
  // devices the daemon sees.
  std::call_once(ordinal_trusted_logged_, [&] {
    LOG(WARNING) << "a rank named its " << runtime_->label() << " device by ordinal only"
                 << (known ? "" : " (dmagatherd knows no device identities)")
                 << ": trusting it, which is right only if the rank and dmagatherd see the same devices";
  });
  if (ref.ordinal >= num_devices_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the rank's ", runtime_->label(), " device ", ref.ordinal, " is not visible to dmagatherd, which sees ",
        num_devices_, " device(s): run the daemon and the ranks with the same visible devices"));
  }
  return ref.ordinal;
}

GpuEngine::~GpuEngine() {
  Stop();
  for (Device& dev : devices_) {
    runtime_->SetDevice(dev.ordinal).IgnoreError();
    for (GpuStream s : dev.streams) {
      if (s != nullptr) runtime_->DestroyStream(dev.ordinal, s);
    }
    for (GpuEvent e : dev.joins) {
      if (e != nullptr) runtime_->DestroyEvent(dev.ordinal, e);
    }
    for (GpuEvent e : free_end_[dev.ordinal]) runtime_->DestroyEvent(dev.ordinal, e);
    if (dev.gate != nullptr) runtime_->DestroyEvent(dev.ordinal, dev.gate);
  }
}

// The import entry point: a rank's memory, by kind. The runtime's IPC
// handles are opened once and cached by handle; any other kind is the
// runtime's (ImportOther).
absl::StatusOr<std::shared_ptr<ImportedRegion>> GpuEngine::Import(const RegionSpec& spec) {
  if (spec.rank == nullptr) return absl::InvalidArgumentError("import without the owning rank");
  const int device = AsGpu(spec.rank)->device();
  if (spec.kind != runtime_->ipc_memory_kind()) {
    return runtime_->ImportOther(spec, device, AsGpu(spec.rank)->rank_ordinal());
  }
  if (spec.handle.size() != runtime_->ipc_handle_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(runtime_->label(), " IPC handle has ", spec.handle.size(),
                                                   " bytes, expected ", runtime_->ipc_handle_bytes()));
  }
  absl::MutexLock lock(&import_mu_);
  auto it = imports_.find(spec.handle);
  if (it != imports_.end()) {
    if (auto region = it->second.lock(); region != nullptr && region->bytes() >= spec.bytes) return region;
  }
  for (auto i = imports_.begin(); i != imports_.end();) i = i->second.expired() ? imports_.erase(i) : std::next(i);
  DMAG_ASSIGN_OR_RETURN(IpcMapping m, runtime_->OpenIpc(device, spec.handle));
  if (m.bytes < spec.bytes) {
    runtime_->CloseIpc(device, m.base);
    return absl::InvalidArgumentError(absl::StrCat("the client registered ", spec.bytes, " bytes but its ",
                                                   runtime_->label(), " allocation has only ", m.bytes));
  }
  auto region = std::make_shared<IpcRegion>(runtime_, m.base, spec.bytes, device);
  imports_[spec.handle] = region;
  return std::shared_ptr<ImportedRegion>(std::move(region));
}

absl::StatusOr<std::unique_ptr<EngineRank>> GpuEngine::AttachRank(const RankAttach& a) {
  if (a.device.kind != runtime_->device_kind() || a.device.ordinal < 0) {
    return common::FallbackError(absl::StrCat("this dmagatherd runs the ", name(), " backend but the rank has no ",
                                              runtime_->label(), " device (no GPU visible to it, or its libdmagather "
                                              "has no ", runtime_->label(), " support)"));
  }
  DMAG_ASSIGN_OR_RETURN(const int device, DaemonDevice(a.device));
  if (device != a.device.ordinal || !a.device.uuid.empty()) {
    LOG(INFO) << "rank " << a.rank << ": its " << runtime_->label() << " device " << a.device.ordinal << " ("
              << FormatDeviceUuid(a.device.uuid) << ") is dmagatherd's device " << device;
  }
  DMAG_ASSIGN_OR_RETURN(uint64_t flag, runtime_->RegisterFlags(device, a.flag_pages, a.flag_bytes, a.ready_word));
  return std::unique_ptr<EngineRank>(
      new GpuRank(runtime_, device, a.device.ordinal, a.flag_pages, flag, a.ready_word));
}

GpuEvent GpuEngine::TakeEndEvent(Device& dev) {
  {
    absl::MutexLock lock(&pool_mu_);
    std::vector<GpuEvent>& free_end = free_end_[dev.ordinal];
    if (!free_end.empty()) {
      GpuEvent e = free_end.back();
      free_end.pop_back();
      return e;
    }
  }
  auto e = runtime_->CreateEvent(dev.ordinal);
  return e.ok() ? *e : nullptr;
}

bool GpuEngine::RanksReady(const EngineOp& op) {
  if (op.ready_observed) return true;  // A graph replay: the ingress thread saw the flags.
  for (const EngineRank* r : op.ranks) {
    if (r == nullptr) continue;
    const uint32_t* w = AsGpu(r)->ready_word();
    if (w == nullptr) continue;
    const uint32_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    if (static_cast<int32_t>(v - op.seq) < 0) return false;
  }
  return true;
}

absl::Status GpuEngine::WaitReady(Device& dev, const EngineOp& op) {
  if (!runtime_->device_waits()) return absl::OkStatus();  // Gated on the CPU before Issue.
  // Every flag already at the op (a graph replay, or the ranks' streams
  // wrote them before the last descriptor came): the device wait would pass
  // at once; skip the driver call. The flag writes follow the producers'
  // work in the ranks' streams, so the inputs are complete, as for the CPU
  // gate.
  if (RanksReady(op)) {
    ready_seen_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  dev.flags.clear();
  for (const EngineRank* r : op.ranks) {
    const uint64_t addr = r != nullptr ? AsGpu(r)->ready_flag() : 0;
    if (addr != 0) dev.flags.push_back(addr);
  }
  if (dev.flags.empty()) return absl::OkStatus();
  return runtime_->WaitValues(dev.ordinal, dev.streams[0], dev.flags.data(), dev.flags.size(), op.seq);
}

absl::Status GpuEngine::EnqueueDevice(Device& dev, const EngineOp& op, GpuEvent* end) {
  GpuRuntime& rt = *runtime_;
  *end = nullptr;
  DMAG_RETURN_IF_ERROR(rt.SetDevice(dev.ordinal));
  WavePlanOptions wo;
  wo.chunk_bytes = chunk_bytes_;
  // Small ops stay on stream 0 (fewer calls = lower hop latency); a stream
  // is added per chunk_bytes of payload, and one per peer link when the
  // share reads (or writes) several peers, so that every link runs at once
  // (a stream - and a copy graph's chain - runs its copies one after
  // another), up to streams_per_device.
  uint64_t dev_bytes = 0;
  uint64_t peer_mask = 0;  // Devices beyond 64 share bit 63: only the count matters.
  for (const CopyCmd& c : dev.copies) {
    dev_bytes += c.bytes;
    const int peer = LinkPeer(c, dev.ordinal);
    if (peer != dev.ordinal && peer >= 0) peer_mask |= uint64_t{1} << std::min(peer, 63);
  }
  const int links = __builtin_popcountll(peer_mask);
  wo.streams = static_cast<int>(std::min<uint64_t>(
      streams_per_device_, std::max<uint64_t>({1, dev_bytes / wo.chunk_bytes, uint64_t(links)})));
  wo.stream_per_link = links > 1;
  wo.device = dev.ordinal;
  wo.max_batch = options_.max_batch;
  wo.world_size = static_cast<int>(op.ranks.size());
  std::vector<CopyCmd>& chunks = dev.chunks;
  PlanWaves(dev.copies, wo, &chunks, &dev.batches);
  chunks_stat_.fetch_add(chunks.size(), std::memory_order_relaxed);
  GpuStream s0 = dev.streams[0];
  const uint64_t t_plan = common::MonotonicNs();
  absl::Status st = WaitReady(dev, op);
  const uint64_t t_waits = common::MonotonicNs();
  memops_ns_.Record(t_waits - t_plan);
  if (st.ok()) {
    std::vector<char>& used = dev.stream_used;
    std::fill(used.begin(), used.end(), 0);
    for (const WaveBatch& b : dev.batches) used[b.stream] = 1;
    bool fan_out = false;
    for (size_t s = 1; s < used.size(); ++s) fan_out |= used[s] != 0;
    if (fan_out) {
      st.Update(rt.RecordEvent(dev.gate, s0));
      for (size_t s = 1; st.ok() && s < used.size(); ++s) {
        if (used[s]) st.Update(rt.StreamWaitEvent(dev.streams[s], dev.gate));
      }
    }
    const uint64_t t_copies = common::MonotonicNs();
    for (const WaveBatch& b : dev.batches) {
      if (!st.ok()) break;
      st.Update(rt.Copy(dev.ordinal, dev.streams[b.stream], chunks.data() + b.begin, b.end - b.begin));
    }
    copies_ns_.Record(common::MonotonicNs() - t_copies);
    // Join every stream back into stream 0 (also after an error: the end
    // event must follow everything that was enqueued).
    for (size_t s = 1; fan_out && s < used.size(); ++s) {
      if (!used[s]) continue;
      st.Update(rt.RecordEvent(dev.joins[s], dev.streams[s]));
      st.Update(rt.StreamWaitEvent(s0, dev.joins[s]));
    }
  }
  GpuEvent e = TakeEndEvent(dev);
  if (e == nullptr) {
    st.Update(absl::ResourceExhaustedError("no event for the end of an op"));
    return st;
  }
  absl::Status rs = rt.RecordEvent(e, s0);
  if (!rs.ok()) {
    st.Update(rs);
    absl::MutexLock lock(&pool_mu_);
    free_end_[dev.ordinal].push_back(e);
    return st;
  }
  *end = e;
  return st;
}

void GpuEngine::Execute(EngineOp* op) {
  ops_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(op->plan.bytes, std::memory_order_relaxed);
  if (op->plan.copies.empty()) {  // Nothing to move (one rank in place, or count 0).
    op->OnEngineDone(absl::OkStatus());
    return;
  }
  if (runtime_->device_waits()) {
    Issue(op);
    return;
  }
  // CPU gating: issue now when nothing waits before it and its ranks are
  // ready; else queue it for the gate thread (in order).
  {
    absl::MutexLock lock(&issue_mu_);
    if (gate_head_ == gate_tail_ && RanksReady(*op) && !abandon_.load()) {
      Issue(op);
      return;
    }
    // Back-pressure: wait while the gate is full.
    while (gate_tail_ - gate_head_ >= kGateSlots) gate_cv_.Wait(&issue_mu_);
    gate_ring_[gate_tail_ % kGateSlots] = op;
    ++gate_tail_;
  }
  gate_cv_.SignalAll();
}

void GpuEngine::GateLoop() {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  absl::MutexLock lock(&issue_mu_);
  uint64_t t0 = 0;
  for (;;) {
    while (gate_head_ == gate_tail_ && !stopping_.load()) gate_cv_.Wait(&issue_mu_);
    if (gate_head_ == gate_tail_) return;  // Stopping and drained.
    EngineOp* op = gate_ring_[gate_head_ % kGateSlots];
    if (abandon_.load()) {
      ++gate_head_;
      gate_cv_.SignalAll();
      issue_mu_.Unlock();
      op->OnEngineDone(absl::UnavailableError(
          "dmagatherd stopped while the op waited for its ranks' ready flags"));
      issue_mu_.Lock();
      continue;
    }
    if (RanksReady(*op)) {
      ++gate_head_;
      gate_cv_.SignalAll();
      Issue(op);
      t0 = 0;
      continue;
    }
    if (t0 == 0) t0 = common::MonotonicNs();
    issue_mu_.Unlock();
    Backoff(common::MonotonicNs() - t0);
    issue_mu_.Lock();
  }
}

void GpuEngine::Issue(EngineOp* op) {
  const uint64_t t_start = common::MonotonicNs();
  absl::Status st;
  std::fill(involved_.begin(), involved_.end(), 0);
  uint64_t same = 0, pushes = 0;
  const int n = static_cast<int>(op->ranks.size());
  // Route: every copy's devices, and the device that issues it.
  for (CopyCmd& c : op->plan.copies) {
    const int dd = c.dst_rank < n && op->ranks[c.dst_rank] != nullptr ? AsGpu(op->ranks[c.dst_rank])->device() : -1;
    const int sd = c.src_rank < n && op->ranks[c.src_rank] != nullptr ? AsGpu(op->ranks[c.src_rank])->device() : -1;
    if (dd < 0 || dd >= num_devices_) {
      st = absl::InternalError(absl::StrCat("rank ", c.dst_rank, " has no ", runtime_->label(),
                                            " device known to the engine"));
      break;
    }
    c.src_device = sd;
    c.dst_device = dd;
    const int on = IssuingDevice(sd, dd);
    if (on < 0) {
      st = common::FallbackError(absl::StrCat(
          "rank ", c.src_rank, " (device ", sd, ") and rank ", c.dst_rank, " (device ", dd,
          ") are on GPUs that reach each other neither way (", peers_.why(dd, sd), "), so no copy engine can move "
          "bytes between them"));
      break;
    }
    involved_[on] = 1;
    if (sd == dd) {
      ++same;
    } else if (on != dd) {
      ++pushes;
    }
  }
  if (same != 0) {
    same_device_.fetch_add(same, std::memory_order_relaxed);
    std::call_once(same_device_logged_, [] {
      LOG(WARNING) << "ranks share a GPU: their AllGather copies are same-device copies, which the driver runs on "
                      "SMs/CUs (not DMA engines) when issued from dmagatherd; they time-slice with the ranks' "
                      "kernels. Counted as fallback 'same_device_copy_on_sm'. Run one rank per GPU to avoid it.";
    });
  }
  if (pushes != 0) pushes_.fetch_add(pushes, std::memory_order_relaxed);
  // Track the op (back-pressure if completions lag); the caller holds one
  // share of it, and each issuing device one, until its copies are
  // enqueued (then its completion holds it).
  OpTrack* t = TakeTrack();
  t->op = op;
  {
    absl::MutexLock lock(&t->mu);
    t->status = st;
  }
  t->open.store(1, std::memory_order_relaxed);
  if (st.ok()) {
    for (int d = 0; d < num_devices_; ++d) {
      if (involved_[d]) t->open.fetch_add(1, std::memory_order_relaxed);
    }
    for (Device& dev : devices_) {
      if (!involved_[dev.ordinal]) continue;
      if (!parallel_issue_) {
        IssueShare(dev, t);
        continue;
      }
      Issuer& q = *dev.issuer;
      bool wake = false;
      {
        absl::MutexLock lock(&q.mu);
        while (q.tail - q.head >= kIssueSlots) q.space_cv.Wait(&q.mu);
        q.ring[q.tail % kIssueSlots] = t;
        ++q.tail;
        q.posted.store(q.tail, std::memory_order_release);
        wake = q.sleeping;
      }
      if (wake) q.cv.Signal();
    }
  }
  execute_ns_.Record(common::MonotonicNs() - t_start);
  CloseShare(t, absl::OkStatus());  // The caller's own share: may complete the op here.
}

void GpuEngine::IssueShare(Device& dev, OpTrack* t) {
  const EngineOp& op = *t->op;
  dev.copies.clear();
  for (const CopyCmd& c : op.plan.copies) {
    if (IssuingDevice(c.src_device, c.dst_device) == dev.ordinal) dev.copies.push_back(c);
  }
  GpuEvent end = nullptr;
  absl::Status st;
  if (abandon_.load(std::memory_order_relaxed)) {
    st = absl::UnavailableError("dmagatherd stopped before the op's copies were issued");
  } else {
    st = EnqueueDevice(dev, op, &end);
    if (st.ok()) {
      uint64_t bytes = 0;
      for (const CopyCmd& c : dev.copies) bytes += c.bytes;
      issued_bytes_[dev.ordinal].fetch_add(bytes, std::memory_order_relaxed);
    }
  }
  if (end != nullptr) {
    Completion& c = *completions_[dev.ordinal];
    t->open.fetch_add(1, std::memory_order_acq_rel);
    bool wake = false;
    {
      absl::MutexLock lock(&c.mu);
      while (c.tail - c.head >= kShareSlots) c.space_cv.Wait(&c.mu);
      c.ring[c.tail % kShareSlots] = Share{t, end};
      ++c.tail;
      c.posted.store(c.tail, std::memory_order_release);
      wake = c.sleeping;
    }
    if (wake) c.cv.Signal();
  }
  CloseShare(t, st);
}

void GpuEngine::IssuerLoop(int device) {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  runtime_->BindThread(device);
  Device& dev = devices_[device];
  Issuer& q = *dev.issuer;
  uint64_t head = 0;  // q.head, as this thread (its only writer) last set it.
  for (;;) {
    // As CompletionLoop: poll a while before sleeping, so that the router
    // need not wake this thread between the ops of a burst.
    const uint64_t idle_since = common::MonotonicNs();
    while (q.posted.load(std::memory_order_acquire) == head && !stopping_.load(std::memory_order_relaxed) &&
           common::MonotonicNs() - idle_since < kCompletionSpinNs) {
      sched_yield();
    }
    OpTrack* t = nullptr;
    {
      absl::MutexLock lock(&q.mu);
      q.sleeping = true;
      while (q.head == q.tail && !stopping_.load()) q.cv.Wait(&q.mu);
      q.sleeping = false;
      if (q.head == q.tail) return;  // Stopping and drained.
      t = q.ring[q.head % kIssueSlots];
    }
    IssueShare(dev, t);
    {
      absl::MutexLock lock(&q.mu);
      head = ++q.head;
    }
    q.space_cv.Signal();
  }
}

GpuEngine::OpTrack* GpuEngine::TakeTrack() {
  absl::MutexLock lock(&tracks_mu_);
  while (free_tracks_.empty()) tracks_cv_.Wait(&tracks_mu_);
  OpTrack* t = free_tracks_.back();
  free_tracks_.pop_back();
  return t;
}

void GpuEngine::CloseShare(OpTrack* t, const absl::Status& st) {
  if (!st.ok()) {
    absl::MutexLock lock(&t->mu);
    t->status.Update(st);
  }
  if (t->open.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  EngineOp* op = t->op;
  absl::Status status;
  {
    absl::MutexLock lock(&t->mu);
    status = std::move(t->status);
    t->status = absl::OkStatus();
  }
  {
    absl::MutexLock lock(&tracks_mu_);
    free_tracks_.push_back(t);
  }
  tracks_cv_.Signal();
  const uint64_t t_seen = common::MonotonicNs();
  op->OnEngineDone(status);
  complete_ns_.Record(common::MonotonicNs() - t_seen);
}

void GpuEngine::CompletionLoop(int device) {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // 1 us: short sleeps stay short.
  runtime_->BindThread(device);
  Completion& c = *completions_[device];
  uint64_t head = 0;  // c.head, as this thread (its only writer) last set it.
  for (;;) {
    // Ops come in bursts: poll a while for the next share so that the
    // issuer need not wake this thread (kCompletionSpinNs), yielding the
    // core between polls (on a busy machine the copies' own threads, or the
    // ranks, need it more), then sleep.
    const uint64_t idle_since = common::MonotonicNs();
    while (c.posted.load(std::memory_order_acquire) == head && !stopping_.load(std::memory_order_relaxed) &&
           common::MonotonicNs() - idle_since < kCompletionSpinNs) {
      sched_yield();
    }
    Share sh;
    {
      absl::MutexLock lock(&c.mu);
      c.sleeping = true;
      while (c.head == c.tail && !stopping_.load()) c.cv.Wait(&c.mu);
      c.sleeping = false;
      if (c.head == c.tail) return;  // Stopping and drained.
      sh = c.ring[c.head % kShareSlots];
    }
    absl::Status st;
    const uint64_t t0 = common::MonotonicNs();
    for (;;) {
      absl::StatusOr<bool> done = runtime_->QueryEvent(sh.end);
      if (!done.ok()) {
        st = done.status();
        break;
      }
      if (*done) break;
      if (abandon_.load(std::memory_order_relaxed)) {
        st = absl::UnavailableError("dmagatherd stopped while the op's copies were still queued");
        break;
      }
      Backoff(common::MonotonicNs() - t0);
    }
    {
      absl::MutexLock lock(&pool_mu_);
      free_end_[device].push_back(sh.end);
    }
    {
      absl::MutexLock lock(&c.mu);
      head = ++c.head;
    }
    c.space_cv.Signal();
    CloseShare(sh.track, st);
  }
}

void GpuEngine::Stop() {
  if (stopped_.exchange(true)) return;
  if (execute_ns_.Summary().count != 0) {
    auto us = [](const common::LatencyHistogram& h) {
      common::LatencySummaryNs x = h.Summary();
      return absl::StrCat("p50 ", x.p50 / 1e3, " us, p99 ", x.p99 / 1e3, " us");
    };
    // With parallel issue the op's thread only routes the copies and hands
    // each device its share; the issuing itself is in the per-device figures.
    LOG(INFO) << name() << " engine: " << execute_ns_.Summary().count << " ops; "
              << (parallel_issue_ ? "route and hand-off " : "issue ") << us(execute_ns_)
              << "; ready waits (per device) " << us(memops_ns_) << " ("
              << ready_seen_.load(std::memory_order_relaxed) << " skipped: flags already seen)"
              << "; copy calls (per device) " << us(copies_ns_)
              << "; completion: last share seen -> OnEngineDone done " << us(complete_ns_) << "; copy path "
              << runtime_->Describe();
  }
  // Give gated and queued work stop_drain_ms to finish; after that, report
  // it failed.
  const uint64_t deadline = common::MonotonicNs() + options_.stop_drain_ms * 1'000'000ull;
  auto drained = [&](auto&& empty) {
    while (!empty()) {
      if (common::MonotonicNs() > deadline) {
        abandon_.store(true);
        return;
      }
      usleep(1000);
    }
  };
  if (gate_thread_.joinable()) {
    drained([&] {
      absl::MutexLock lock(&issue_mu_);
      return gate_head_ == gate_tail_;
    });
  }
  for (Device& dev : devices_) {
    if (dev.issuer == nullptr || abandon_.load()) continue;
    drained([&] {
      absl::MutexLock lock(&dev.issuer->mu);
      return dev.issuer->head == dev.issuer->tail;
    });
  }
  for (auto& c : completions_) {
    if (abandon_.load()) break;
    drained([&] {
      absl::MutexLock lock(&c->mu);
      return c->head == c->tail;
    });
  }
  stopping_.store(true);
  if (gate_thread_.joinable()) {
    {
      absl::MutexLock lock(&issue_mu_);
    }
    gate_cv_.SignalAll();
    gate_thread_.join();
  }
  for (Device& dev : devices_) {
    if (dev.issuer == nullptr) continue;
    {
      absl::MutexLock lock(&dev.issuer->mu);
    }
    dev.issuer->cv.SignalAll();
    if (dev.issuer->thread.joinable()) dev.issuer->thread.join();
  }
  for (auto& c : completions_) {
    {
      absl::MutexLock lock(&c->mu);
    }
    c->cv.SignalAll();
    if (c->thread.joinable()) c->thread.join();
  }
}

EngineStats GpuEngine::stats() const {
  EngineStats s;
  s.ops = ops_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.chunks = chunks_stat_.load(std::memory_order_relaxed);
  s.same_device_copies = same_device_.load(std::memory_order_relaxed);
  s.copy_engines = runtime_->CopyEngineCounters();
  if (s.copy_engines.empty() && issued_bytes_ != nullptr) {
    // The runtime picks the engine: bytes per issuing GPU (engine -1).
    for (int d = 0; d < num_devices_; ++d) {
      const uint64_t b = issued_bytes_[d].load(std::memory_order_relaxed);
      if (b != 0) s.copy_engines.push_back(CopyEngineBytes{d, -1, b});
    }
  }
  return s;
}

absl::Status GpuEngine::StageOut(void* host, const char* src, uint64_t bytes, const EngineRank* rank) {
  return runtime_->CopySync(AsGpu(rank)->device(), host, src, bytes);
}

absl::Status GpuEngine::WaitRankReady(const EngineRank* rank, uint32_t seq, const std::atomic<bool>& cancel) {
  // The ready flag the rank's stream writes (cuStreamWriteValue32) into its
  // completion block, read from the CPU as the CPU gate does.
  const uint32_t* w = AsGpu(rank)->ready_word();
  common::Backoff backoff;
  while (static_cast<int32_t>(__atomic_load_n(w, __ATOMIC_ACQUIRE) - seq) < 0) {
    if (cancel.load(std::memory_order_acquire)) return absl::CancelledError("the ring stopped");
    if (backoff.Pause()) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      backoff.Reset();
    }
  }
  return absl::OkStatus();
}

absl::Status GpuEngine::StageIn(char* dst, const void* host, uint64_t bytes, const EngineRank* rank) {
  return runtime_->CopySync(AsGpu(rank)->device(), dst, host, bytes);
}

}  // namespace dmagather::server::engines::gpu
