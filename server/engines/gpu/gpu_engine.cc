// GpuEngine (gpu_engine.h): set-up, devices, imports and ranks, stop, stats
// and the ring's staging. The per-op path - gate, route, issue, complete -
// is in gpu_engine_issue.cc, its ordering rules in gpu_engine_order.cc.
#include "server/engines/gpu/gpu_engine.h"

#include <glog/logging.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/cpu_relax.h"
#include "common/futex.h"
#include "common/status.h"
#include "server/engines/gpu/gpu_rank.h"

namespace dmagather::server::engines::gpu {
namespace {

// A rank's allocation opened through the runtime's IPC; closed with the
// last reference (which may outlive the engine: it shares the runtime),
// under every device's order lock (the close unmaps it from every peer).
class IpcRegion : public ImportedRegion {
 public:
  IpcRegion(std::shared_ptr<GpuRuntime> rt, std::shared_ptr<DeviceOrder> order, char* base, uint64_t bytes, int device)
      : rt_(std::move(rt)), order_(std::move(order)), base_(base), bytes_(bytes), device_(device) {}
  ~IpcRegion() override {
    DeviceOrder::Hold hold(*order_, order_->all());
    rt_->CloseIpc(device_, base_);
  }
  char* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  const std::shared_ptr<GpuRuntime> rt_;
  const std::shared_ptr<DeviceOrder> order_;
  char* const base_;
  const uint64_t bytes_;
  const int device_;
};

// A region the runtime imported its own way (VMM): released under every
// device's order lock, as an IPC close is.
class OrderedRegion : public ImportedRegion {
 public:
  OrderedRegion(std::shared_ptr<ImportedRegion> inner, std::shared_ptr<DeviceOrder> order)
      : inner_(std::move(inner)), order_(std::move(order)) {}
  ~OrderedRegion() override {
    DeviceOrder::Hold hold(*order_, order_->all());
    inner_.reset();
  }
  char* base() const override { return inner_->base(); }
  uint64_t bytes() const override { return inner_->bytes(); }

 private:
  std::shared_ptr<ImportedRegion> inner_;
  const std::shared_ptr<DeviceOrder> order_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuEngine>> GpuEngine::Create(std::unique_ptr<GpuRuntime> runtime,
                                                             const Options& options) {
  if (runtime == nullptr) return absl::InvalidArgumentError("no GPU runtime");
  if (options.streams_per_device < 0 || options.streams_per_device > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams per device must be 1..64 (0: automatic), got ", options.streams_per_device));
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
      order_(std::make_shared<DeviceOrder>(runtime_->num_devices(), runtime_)),
      options_(options),
      clock_(options.clock != nullptr ? *options.clock : common::RealClock()),
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
    dev.lanes = std::make_unique<LaneSet>(runtime_.get(), d, ns, kLanesKept);
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
  watch_ = std::make_unique<IssueWatch>(num_devices_, clock_, [](const EngineRank* r) {
    const GpuRank* g = AsGpu(r);
    return IssueWatch::Words{g->ready_word(), g->done_word()};
  });
  watch_->StartThread();
  tracks_ = std::vector<OpTrack>(kTracks);
  {
    absl::MutexLock lock(&tracks_mu_);
    for (OpTrack& t : tracks_) free_tracks_.push_back(&t);
  }
  LOG(INFO) << name() << " engine: " << num_devices_ << " device(s), " << ns << " streams each, chunks of "
            << chunk_bytes_ << " bytes (cap " << rt.max_transfer_bytes() << "), " << options_.max_batch
            << " chunks per copy call, ready flags waited on "
            << (!rt.device_waits() ? std::string("the CPU")
                : options_.max_waits_ahead <= 0
                    ? std::string("the device")
                    : absl::StrCat("the device (at most ", options_.max_waits_ahead, " ops ahead, then the CPU)"))
            << ", " << (parallel_issue_ ? "one issuing thread per device" : "one issuing thread") << ", threads awake "
            << awake_ns() / 1000 << " us after their last work; " << rt.Describe();
  for (int d = 0; d < num_devices_; ++d) completions_.push_back(std::make_unique<Completion>(clock_, awake_ns()));
  for (int d = 0; d < num_devices_; ++d) completions_[d]->thread = std::thread([this, d] { CompletionLoop(d); });
  if (parallel_issue_) {
    // As the completion threads: a burst of ops costs the issuers no wake-up.
    for (Device& dev : devices_) dev.issuer = std::make_unique<Handoff<OpTrack*>>(kIssueSlots, clock_, awake_ns());
    for (int d = 0; d < num_devices_; ++d) devices_[d].issuer_thread = std::thread([this, d] { IssuerLoop(d); });
  }
  if (!rt.device_waits() || options_.max_waits_ahead > 0) {
    gate_ = std::make_unique<ReadyGate>(
        clock_, awake_ns(), kGateSlots,
        ReadyGate::Hooks{[this](const EngineOp& op) { return MayIssue(op); }, [this](EngineOp* op) { Issue(op); },
                         [](EngineOp* op, const absl::Status& st) { op->OnEngineDone(st); }});
    gate_->Start();
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
    LOG(INFO) << "device " << d << ": " << identities_[d].name << " " << FormatDeviceUuid(identities_[d].uuid) << " at "
              << (identities_[d].pci_bus_id.empty() ? "an unknown bus id" : identities_[d].pci_bus_id);
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
      return common::FallbackError(absl::StrCat("the rank's ", runtime_->label(), " device ", what, " matches ",
                                                matches, " devices of dmagatherd (", list(), ")"));
    }
    return common::FallbackError(absl::StrCat("the rank's ", runtime_->label(), " device ", ref.ordinal, " (", what,
                                              ") is not one of the ", num_devices_, " device(s) dmagatherd sees (",
                                              list(), "): give dmagatherd every GPU of the node"));
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
    dev.lanes.reset();
    for (GpuEvent e : free_end_[dev.ordinal]) runtime_->DestroyEvent(dev.ordinal, e);
  }
}

// The import entry point: a rank's memory, by kind. The runtime's IPC
// handles are opened once and cached by handle; any other kind is the
// runtime's (ImportOther).
absl::StatusOr<std::shared_ptr<ImportedRegion>> GpuEngine::Import(const RegionSpec& spec) {
  if (spec.rank == nullptr) return absl::InvalidArgumentError("import without the owning rank");
  const int device = AsGpu(spec.rank)->device();
  if (spec.kind != runtime_->ipc_memory_kind()) {
    DeviceOrder::Hold hold(*order_, order_->all());  // Mapped for every device that reaches it.
    DMAG_ASSIGN_OR_RETURN(std::shared_ptr<ImportedRegion> inner,
                          runtime_->ImportOther(spec, device, AsGpu(spec.rank)->rank_ordinal()));
    return std::shared_ptr<ImportedRegion>(std::make_shared<OrderedRegion>(std::move(inner), order_));
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
  // Opened (and closed) under every device's order lock: the mapping is
  // made in (and unmade from) every peer's context.
  std::optional<DeviceOrder::Hold> hold(std::in_place, *order_, order_->all());
  DMAG_ASSIGN_OR_RETURN(IpcMapping m, runtime_->OpenIpc(device, spec.handle));
  if (m.bytes < spec.bytes) {
    runtime_->CloseIpc(device, m.base);
    return absl::InvalidArgumentError(absl::StrCat("the client registered ", spec.bytes, " bytes but its ",
                                                   runtime_->label(), " allocation has only ", m.bytes));
  }
  hold.reset();
  auto region = std::make_shared<IpcRegion>(runtime_, order_, m.base, spec.bytes, device);
  imports_[spec.handle] = region;
  return std::shared_ptr<ImportedRegion>(std::move(region));
}

absl::StatusOr<std::unique_ptr<EngineRank>> GpuEngine::AttachRank(const RankAttach& a) {
  if (a.device.kind != runtime_->device_kind() || a.device.ordinal < 0) {
    return common::FallbackError(absl::StrCat("this dmagatherd runs the ", name(), " backend but the rank has no ",
                                              runtime_->label(),
                                              " device (no GPU visible to it, or its libdmagather "
                                              "has no ",
                                              runtime_->label(), " support)"));
  }
  DMAG_ASSIGN_OR_RETURN(const int device, DaemonDevice(a.device));
  if (device != a.device.ordinal || !a.device.uuid.empty()) {
    LOG(INFO) << "rank " << a.rank << ": its " << runtime_->label() << " device " << a.device.ordinal << " ("
              << FormatDeviceUuid(a.device.uuid) << ") is dmagatherd's device " << device;
  }
  absl::StatusOr<uint64_t> flag;
  {
    DeviceOrder::Hold hold(*order_, order_->all());  // Portable: registered for every device.
    flag = runtime_->RegisterFlags(device, a.flag_pages, a.flag_bytes, a.ready_word);
  }
  DMAG_RETURN_IF_ERROR(flag.status());
  // The done flag: the same registration, at its offset from the ready flag.
  const uint64_t done_flag = a.done_word == nullptr
                                 ? 0
                                 : *flag + static_cast<uint64_t>(reinterpret_cast<const char*>(a.done_word) -
                                                                 reinterpret_cast<const char*>(a.ready_word));
  return std::unique_ptr<EngineRank>(new GpuRank(runtime_, order_, device, a.device.ordinal, a.flag_pages, *flag,
                                                 a.ready_word, done_flag, a.done_word));
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
              << "; ready waits (per device) " << us(memops_ns_) << " (" << ready_seen_.load(std::memory_order_relaxed)
              << " skipped: flags already seen; " << held_ahead_.load(std::memory_order_relaxed)
              << " ops held on the CPU by the waits-ahead bound); done flags written by a GPU for "
              << done_written_.load(std::memory_order_relaxed) << " ops; engine threads woken " << wakeups() << " times"
              << "; copy calls (per device) " << us(copies_ns_) << "; completion: last share seen -> OnEngineDone done "
              << us(complete_ns_) << "; copy path " << runtime_->Describe();
  }
  // Give gated and queued work stop_drain_ms to finish; after that, report
  // it failed.
  const uint64_t deadline = clock_.NowNs() + options_.stop_drain_ms * 1'000'000ull;
  auto drained = [&](auto&& empty) {
    while (!empty()) {
      if (clock_.NowNs() > deadline) {
        abandon_.store(true);
        if (gate_ != nullptr) gate_->Abandon();
        return;
      }
      usleep(1000);
    }
  };
  if (gate_ != nullptr) drained([&] { return gate_->Empty(); });
  for (Device& dev : devices_) {
    if (dev.issuer == nullptr || abandon_.load()) continue;
    drained([&] { return dev.issuer->Pending() == 0; });
  }
  for (auto& c : completions_) {
    if (abandon_.load()) break;
    drained([&] { return c->shares.Pending() == 0; });
  }
  stopping_.store(true);
  if (gate_ != nullptr) gate_->Stop();
  for (Device& dev : devices_) {
    if (dev.issuer == nullptr) continue;
    dev.issuer->Stop();
    if (dev.issuer_thread.joinable()) dev.issuer_thread.join();
  }
  for (auto& c : completions_) {
    c->shares.Stop();
    if (c->thread.joinable()) c->thread.join();
  }
}

uint64_t GpuEngine::wakeups() const {
  uint64_t n = gate_ != nullptr ? gate_->wakeups() : 0;
  for (const Device& dev : devices_) n += dev.issuer != nullptr ? dev.issuer->wakeups() : 0;
  for (const auto& c : completions_) n += c->shares.wakeups();
  return n;
}

bool GpuEngine::ThreadsAsleep() {
  if (gate_ != nullptr && !gate_->asleep()) return false;
  for (Device& dev : devices_) {
    if (dev.issuer != nullptr && !dev.issuer->asleep()) return false;
  }
  for (auto& c : completions_) {
    if (!c->shares.asleep()) return false;
  }
  return true;
}

EngineStats GpuEngine::stats() const {
  EngineStats s;
  s.ops = ops_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.chunks = chunks_stat_.load(std::memory_order_relaxed);
  s.same_device_copies = same_device_.load(std::memory_order_relaxed);
  s.thread_wakeups = wakeups();
  s.held_on_cpu = held_ahead_.load(std::memory_order_relaxed);
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
