#include "tests/fakes/fake_gpu_runtime.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace dmagather::server::engines::gpu::testing {

// An event: the number of records issued and the number the stream thread
// has reached; the error carried by the last completed record.
struct FakeRuntime::Event {
  int device = -1;
  std::mutex mu;
  uint64_t recorded = 0;
  uint64_t completed = 0;
  absl::Status error;
};

// A stream: a FIFO of commands and the thread that runs them in order. An
// error in a chunk is held by the stream and handed to the next event it
// records (then cleared: later work proceeds, as after a failed op).
struct FakeRuntime::Stream {
  struct Cmd {
    enum Kind { kWait, kCopy, kRecord, kWaitEvent, kWrite } kind;
    std::vector<uint64_t> flags;
    uint32_t value = 0;
    std::vector<CopyCmd> chunks;
    Event* event = nullptr;
    uint64_t target = 0;  // kRecord: the record's number; kWaitEvent: the record waited for.
  };

  Stream(FakeRuntime* rt, int device, int number)
      : rt(rt),
        device(device),
        name(absl::StrCat("stream ", number, " of device ", device)),
        thread([this] { Run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu);
      cancel = true;
    }
    cv.notify_all();
    space.notify_all();
    thread.join();
  }
  // Queues `c`. With the driver model's queue depth, blocks while the queue
  // is full (the caller holds its call's context locks). False: aborted.
  bool Push(Cmd c) {
    {
      std::unique_lock<std::mutex> lock(mu);
      const size_t depth = rt->options_.driver_model ? size_t(std::max(rt->options_.stream_depth, 0)) : 0;
      if (depth > 0 && q.size() >= depth) {
        rt->locks_.Blocking(absl::StrCat("space on ", name));
        space.wait(lock, [&] { return cancel || rt->aborted_.load() || q.size() < depth; });
        rt->locks_.Unblocked();
      }
      if (cancel || rt->aborted_.load()) return false;
      q.push_back(std::move(c));
    }
    cv.notify_all();
    return true;
  }
  bool Cancelled() {
    std::lock_guard<std::mutex> lock(mu);
    return cancel;
  }
  // Abort: a wait ends with this error, copies are skipped.
  bool Aborted() {
    if (!rt->aborted_.load()) return false;
    if (error.ok()) error = absl::AbortedError("the fake driver was aborted by the test's watchdog");
    return true;
  }
  void Wake() {
    { std::lock_guard<std::mutex> lock(mu); }
    cv.notify_all();
    space.notify_all();
  }
  void Run() {
    for (;;) {
      Cmd c;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return cancel || !q.empty(); });
        if (cancel) return;
        c = std::move(q.front());
        q.pop_front();
      }
      space.notify_all();
      switch (c.kind) {
        case Cmd::kWait:
          for (uint64_t f : c.flags) {
            const uint32_t* w = reinterpret_cast<const uint32_t*>(f);
            {
              std::lock_guard<std::mutex> lock(mu);
              parked_flag = f;
              parked_value = c.value;
            }
            while (static_cast<int32_t>(__atomic_load_n(w, __ATOMIC_ACQUIRE) - c.value) < 0) {
              if (Cancelled()) return;
              if (Aborted()) break;
              usleep(20);
            }
          }
          {
            std::lock_guard<std::mutex> lock(mu);
            parked_flag = 0;
          }
          break;
        case Cmd::kWrite:
          // After failed work nothing is written (a real context is dead by
          // then): the engine's completion reports the error instead.
          if (Aborted() || !error.ok()) break;
          for (uint64_t f : c.flags) __atomic_store_n(reinterpret_cast<uint32_t*>(f), c.value, __ATOMIC_RELEASE);
          break;
        case Cmd::kCopy:
          if (Aborted()) break;
          for (const CopyCmd& k : c.chunks) {
            absl::Status st = rt->RunChunk(device, k);
            if (!st.ok() && error.ok()) error = st;
          }
          break;
        case Cmd::kRecord: {
          std::lock_guard<std::mutex> lock(c.event->mu);
          if (c.target > c.event->completed) {
            c.event->completed = c.target;
            c.event->error = error;
          }
          error = absl::OkStatus();
          break;
        }
        case Cmd::kWaitEvent:
          for (;;) {
            {
              std::lock_guard<std::mutex> lock(c.event->mu);
              if (c.event->completed >= c.target) {
                if (!c.event->error.ok() && error.ok()) error = c.event->error;
                break;
              }
            }
            if (Cancelled()) return;
            if (Aborted()) break;
            usleep(20);
          }
          break;
      }
    }
  }

  FakeRuntime* const rt;
  const int device;
  const std::string name;
  std::mutex mu;
  std::condition_variable cv;
  std::condition_variable space;  // A command left the queue.
  std::deque<Cmd> q;
  bool cancel = false;
  uint64_t parked_flag = 0;  // The flag a device wait is parked on now (0: none).
  uint32_t parked_value = 0;
  absl::Status error;  // Stream thread only.
  std::thread thread;  // Last: starts after the members above exist.
};

// The driver model's locks of one call: the contexts of `devices`, taken
// in that order (each once), released when the call returns.
class FakeRuntime::CallLocks {
 public:
  CallLocks(FakeRuntime* rt, const std::vector<int>& devices, const std::string& what) : rt_(rt) {
    if (!rt->options_.driver_model) return;
    for (int d : devices) {
      if (d < 0 || std::find(taken_.begin(), taken_.end(), d) != taken_.end()) continue;
      if (!rt->locks_.Acquire(absl::StrCat("ctx", d), what)) {
        ok_ = false;
        return;
      }
      taken_.push_back(d);
    }
  }
  ~CallLocks() {
    for (auto it = taken_.rbegin(); it != taken_.rend(); ++it) rt_->locks_.Release(absl::StrCat("ctx", *it));
  }
  bool ok() const { return ok_ && !rt_->aborted_.load(); }
  static absl::Status Aborted() { return absl::AbortedError("the fake driver was aborted by the test's watchdog"); }

 private:
  FakeRuntime* const rt_;
  std::vector<int> taken_;
  bool ok_ = true;
};

FakeRuntime::FakeRuntime(const Options& options)
    : options_(options),
      kind_(options.kind),
      ipc_kind_(options.kind + "_ipc"),
      state_(new DeviceState[options.devices > 0 ? options.devices : 1]),
      enabled_(size_t(std::max(options.devices, 1)) * std::max(options.devices, 1), 0),
      released_(std::max(options.devices, 1)) {}

std::string FakeRuntime::FakeUuid(int device) {
  std::string u(16, '\0');
  u[0] = static_cast<char>(0xfa);
  u[1] = static_cast<char>(0xce);
  u[15] = static_cast<char>(device);
  return u;
}

std::string FakeRuntime::FakeBusId(int device) {
  char b[32];
  snprintf(b, sizeof(b), "0000:%02x:00.0", 0x10 + device);
  return b;
}

absl::StatusOr<DeviceIdentity> FakeRuntime::Identify(int device) {
  DMAG_RETURN_IF_ERROR(SetDevice(device));
  DeviceIdentity id;
  auto u = options_.uuids.find(device);
  id.uuid = u != options_.uuids.end() ? u->second : FakeUuid(device);
  auto b = options_.bus_ids.find(device);
  id.pci_bus_id = b != options_.bus_ids.end() ? b->second : FakeBusId(device);
  id.name = absl::StrCat("fake GPU ", device);
  return id;
}

void FakeRuntime::BarrierOnFirstCopies(int devices, int guard_ms) {
  std::lock_guard<std::mutex> lock(log_mu_);
  barrier_devices_ = devices;
  barrier_guard_ms_ = guard_ms;
  barrier_arrived_.assign(std::max(options_.devices, 1), 0);
}

std::vector<FakeRuntime::ChunkRecord> FakeRuntime::chunk_log() const {
  std::lock_guard<std::mutex> lock(log_mu_);
  return chunk_log_;
}

std::vector<FakeRuntime::CallRecord> FakeRuntime::call_log() const {
  std::lock_guard<std::mutex> lock(log_mu_);
  return call_log_;
}

void FakeRuntime::ClearLogs() {
  std::lock_guard<std::mutex> lock(log_mu_);
  chunk_log_.clear();
  call_log_.clear();
}

bool FakeRuntime::peer_enabled(int from, int to) const {
  std::lock_guard<std::mutex> lock(log_mu_);
  const int n = options_.devices;
  return from >= 0 && to >= 0 && from < n && to < n && enabled_[size_t(from) * n + to] != 0;
}

int FakeRuntime::OwnerOf(const void* p) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(log_mu_);
  auto it = owners_.upper_bound(a);
  if (it == owners_.begin()) return -1;
  --it;
  return a < it->second.first ? it->second.second : -1;
}

FakeRuntime::~FakeRuntime() {
  for (int d = 0; d < options_.devices; ++d) ReleaseDevice(d);
  std::map<Stream*, std::unique_ptr<Stream>> left;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    left.swap(streams_);
  }
  left.clear();
}

std::string FakeRuntime::MakeHandle(const void* base, uint64_t bytes) {
  std::string h(16, '\0');
  const uint64_t p = reinterpret_cast<uint64_t>(base);
  std::memcpy(h.data(), &p, 8);
  std::memcpy(h.data() + 8, &bytes, 8);
  return h;
}

void FakeRuntime::FailCopyCall(int device, int nth, absl::Status st) {
  std::lock_guard<std::mutex> lock(state_[device].mu);
  state_[device].fail_call_at = nth;
  state_[device].fail_call_status = std::move(st);
}

void FakeRuntime::FailChunk(int device, int nth, absl::Status st) {
  std::lock_guard<std::mutex> lock(state_[device].mu);
  state_[device].fail_chunk_at = nth;
  state_[device].fail_chunk_status = std::move(st);
}

void FakeRuntime::SetChunkDelayUs(int device, uint32_t us) {
  std::lock_guard<std::mutex> lock(state_[device].mu);
  state_[device].delay_us = us;
}

void FakeRuntime::HoldDevice(int device) {
  std::lock_guard<std::mutex> lock(state_[device].mu);
  state_[device].held = true;
}

void FakeRuntime::ReleaseDevice(int device) {
  {
    std::lock_guard<std::mutex> lock(state_[device].mu);
    state_[device].held = false;
  }
  state_[device].released.notify_all();
}

int FakeRuntime::live_streams() const {
  std::lock_guard<std::mutex> lock(streams_mu_);
  return static_cast<int>(streams_.size());
}

absl::Status FakeRuntime::RunChunk(int device, const CopyCmd& c) {
  uint32_t delay = 0;
  absl::Status fail;
  {
    DeviceState& s = state_[device];
    std::unique_lock<std::mutex> lock(s.mu);
    s.released.wait(lock, [&] { return !s.held; });
    delay = s.delay_us;
    if (s.fail_chunk_at > 0 && --s.fail_chunk_at == 0) fail = s.fail_chunk_status;
  }
  if (delay != 0) usleep(delay);
  if (!fail.ok()) return fail;
  // A device reaches its own memory, and a peer's only with peer access
  // enabled; anything else is an illegal address.
  const int so = OwnerOf(c.src), dst_owner = OwnerOf(c.dst);
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    chunk_log_.push_back(ChunkRecord{device, so, dst_owner, c.bytes});
  }
  for (int owner : {so, dst_owner}) {
    if (owner >= 0 && owner != device && !peer_enabled(device, owner)) {
      return absl::InternalError(absl::StrCat("illegal address: fake device ", device, " touched memory of device ",
                                              owner, " without peer access"));
    }
  }
  std::memcpy(c.dst, c.src, c.bytes);
  chunks_run_.fetch_add(1);
  uint64_t seen = largest_chunk_.load();
  while (c.bytes > seen && !largest_chunk_.compare_exchange_weak(seen, c.bytes)) {
  }
  return absl::OkStatus();
}

absl::Status FakeRuntime::SetDevice(int device) {
  if (device < 0 || device >= options_.devices) {
    return absl::InvalidArgumentError(absl::StrCat("fake device ", device, " does not exist"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeRuntime::EnablePeerAccess(int from, int to) {
  DMAG_RETURN_IF_ERROR(SetDevice(from));
  DMAG_RETURN_IF_ERROR(SetDevice(to));
  bool ok = true;
  if (options_.peer) {
    DMAG_ASSIGN_OR_RETURN(ok, options_.peer(from, to));
  }
  if (ok) {
    std::lock_guard<std::mutex> lock(log_mu_);
    enabled_[size_t(from) * options_.devices + to] = 1;
  }
  return ok;
}

absl::StatusOr<GpuStream> FakeRuntime::CreateStream(int device) {
  static std::atomic<int> next{0};
  auto s = std::make_unique<Stream>(this, device, next.fetch_add(1));
  Stream* p = s.get();
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_[p] = std::move(s);
  return static_cast<GpuStream>(p);
}

void FakeRuntime::DestroyStream(int device, GpuStream stream) {
  (void)device;
  std::unique_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    auto it = streams_.find(static_cast<Stream*>(stream));
    if (it == streams_.end()) return;
    s = std::move(it->second);
    streams_.erase(it);
  }
  s.reset();  // Cancels and joins.
}

absl::StatusOr<GpuEvent> FakeRuntime::CreateEvent(int device) {
  CallLocks l(this, {device}, absl::StrCat("CreateEvent on device ", device));
  if (!l.ok()) return CallLocks::Aborted();
  auto* e = new Event;
  e->device = device;
  return static_cast<GpuEvent>(e);
}

void FakeRuntime::DestroyEvent(int device, GpuEvent event) {
  CallLocks l(this, {device}, absl::StrCat("DestroyEvent on device ", device));
  delete static_cast<Event*>(event);
}

std::vector<int> FakeRuntime::PeersOf(int device) const {
  std::vector<int> v;
  for (int p = 0; p < options_.devices; ++p) {
    if (p != device && peer_enabled(p, device)) v.push_back(p);
  }
  return v;
}

void FakeRuntime::CallDelay(int device) {
  uint32_t us = 0;
  if (device >= 0 && device < options_.devices) {
    std::lock_guard<std::mutex> lock(state_[device].mu);
    us = state_[device].call_delay_us;
  }
  if (us != 0) usleep(us);
}

bool FakeRuntime::CopyTouchesOthers(int device) const {
  std::lock_guard<std::mutex> lock(log_mu_);
  return options_.driver_model && !released_[device].empty();
}

void FakeRuntime::SetCallDelayUs(int device, uint32_t us) {
  std::lock_guard<std::mutex> lock(state_[device].mu);
  state_[device].call_delay_us = us;
}

void FakeRuntime::DeclareFlagWriter(const uint32_t* word, const std::string& writer) {
  std::lock_guard<std::mutex> lock(log_mu_);
  flag_writers_[reinterpret_cast<uint64_t>(word)] = writer;
}

void FakeRuntime::OnOrderLock(int device, bool held) {
  if (!options_.driver_model) return;
  const std::string name = absl::StrCat("order", device);
  if (held) {
    locks_.Held(name, absl::StrCat("the engine's device-order lock of device ", device));
  } else {
    locks_.Release(name);
  }
}

void FakeRuntime::Abort() {
  aborted_.store(true);
  locks_.Abort();
  std::lock_guard<std::mutex> lock(streams_mu_);
  for (auto& [p, s] : streams_) s->Wake();
}

absl::StatusOr<uint64_t> FakeRuntime::RegisterFlags(int device, void* pages, uint64_t bytes,
                                                    const uint32_t* ready_word) {
  (void)pages;
  (void)bytes;
  std::vector<int> all(options_.devices);
  for (int d = 0; d < options_.devices; ++d) all[d] = d;
  CallLocks l(this, all, absl::StrCat("RegisterFlags (portable: every device) for a rank on device ", device));
  if (!l.ok()) return CallLocks::Aborted();
  flags_registered_.fetch_add(1);
  return reinterpret_cast<uint64_t>(ready_word);
}

void FakeRuntime::UnregisterFlags(void* pages) {
  (void)pages;
  std::vector<int> all(options_.devices);
  for (int d = 0; d < options_.devices; ++d) all[d] = d;
  CallLocks l(this, all, "UnregisterFlags (portable: every device)");
  flags_registered_.fetch_sub(1);
}

absl::StatusOr<IpcMapping> FakeRuntime::OpenIpc(int device, const std::string& handle) {
  if (options_.driver_model) locks_.SetRole("import thread");
  std::vector<int> ctxs{device};
  for (int p : PeersOf(device)) ctxs.push_back(p);
  CallLocks l(this, ctxs, absl::StrCat("OpenIpc on device ", device, " (mapped into its peers)"));
  if (!l.ok()) return CallLocks::Aborted();
  if (handle.size() != 16) return absl::InvalidArgumentError("fake IPC handle must have 16 bytes");
  IpcMapping m;
  uint64_t p = 0;
  std::memcpy(&p, handle.data(), 8);
  std::memcpy(&m.bytes, handle.data() + 8, 8);
  m.base = reinterpret_cast<char*>(p);
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    owners_[p] = {p + m.bytes, device};
  }
  ipc_opens_.fetch_add(1);
  ipc_open_now_.fetch_add(1);
  return m;
}

void FakeRuntime::CloseIpc(int device, char* base) {
  if (options_.driver_model) locks_.SetRole("import thread");
  std::vector<int> ctxs{device};
  for (int p : PeersOf(device)) ctxs.push_back(p);
  CallLocks l(this, ctxs, absl::StrCat("CloseIpc on device ", device, " (unmapped from its peers)"));
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    owners_.erase(reinterpret_cast<uintptr_t>(base));
    // The next Copy on each device destroys the copy graphs that touched it.
    for (auto& r : released_) r.push_back(device);
  }
  ipc_open_now_.fetch_sub(1);
}

absl::Status FakeRuntime::WaitValues(int device, GpuStream stream, const uint64_t* flags, size_t n, uint32_t value) {
  if (!options_.device_waits) return absl::FailedPreconditionError("this fake runtime has no device waits");
  CallDelay(device);
  if (options_.driver_model) locks_.SetRole(absl::StrCat("issuing thread (first call on device ", device, ")"));
  CallLocks l(this, {device}, absl::StrCat("WaitValues on device ", device, ": ", n, " ready flag(s) >= ", value));
  if (!l.ok()) return CallLocks::Aborted();
  wait_calls_.fetch_add(1);
  Stream::Cmd c{Stream::Cmd::kWait};
  c.flags.assign(flags, flags + n);
  c.value = value;
  if (!static_cast<Stream*>(stream)->Push(std::move(c))) return CallLocks::Aborted();
  return absl::OkStatus();
}

absl::Status FakeRuntime::WriteValues(int device, GpuStream stream, const uint64_t* flags, size_t n, uint32_t value) {
  if (!device_writes()) return absl::FailedPreconditionError("this fake runtime has no device writes");
  CallDelay(device);
  CallLocks l(this, {device}, absl::StrCat("WriteValues on device ", device, ": ", n, " done flag(s) = ", value));
  if (!l.ok()) return CallLocks::Aborted();
  write_calls_.fetch_add(1);
  Stream::Cmd c{Stream::Cmd::kWrite};
  c.flags.assign(flags, flags + n);
  c.value = value;
  if (!static_cast<Stream*>(stream)->Push(std::move(c))) return CallLocks::Aborted();
  return absl::OkStatus();
}

absl::Status FakeRuntime::Copy(int device, GpuStream stream, const CopyCmd* chunks, size_t n, bool sole_stream) {
  {
    DeviceState& s = state_[device];
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.fail_call_at > 0 && --s.fail_call_at == 0) return s.fail_call_status;
  }
  for (size_t i = 0; i < n; ++i) {
    if (chunks[i].bytes > options_.max_transfer_bytes) {
      return absl::InternalError(
          absl::StrCat("fake copy of ", chunks[i].bytes, " bytes exceeds the cap of ", options_.max_transfer_bytes));
    }
  }
  CallRecord rec{device, stream, std::this_thread::get_id(), {}, sole_stream};
  for (size_t i = 0; i < n; ++i) rec.src_owners.push_back(OwnerOf(chunks[i].src));
  CallDelay(device);
  // The model's locks: the device's own context, the owners of memory
  // closed since its last call (their graphs are destroyed here), then
  // the other ends' contexts.
  std::vector<int> ctxs{device}, released;
  if (options_.driver_model) {
    locks_.SetRole(absl::StrCat("issuing thread (first call on device ", device, ")"));
    {
      std::lock_guard<std::mutex> lock(log_mu_);
      released.swap(released_[device]);
    }
    ctxs.insert(ctxs.end(), released.begin(), released.end());
    for (size_t i = 0; i < n; ++i) {
      ctxs.push_back(rec.src_owners[i]);
      ctxs.push_back(OwnerOf(chunks[i].dst));
    }
  }
  std::string what = absl::StrCat("Copy on device ", device, " of ", n, " chunk(s)");
  if (options_.driver_model) {
    std::vector<int> peers;
    for (int d : ctxs) {
      if (d >= 0 && d != device && std::find(peers.begin(), peers.end(), d) == peers.end()) peers.push_back(d);
    }
    if (!peers.empty()) absl::StrAppend(&what, " touching memory of device(s) ", absl::StrJoin(peers, ","));
    if (!released.empty()) absl::StrAppend(&what, ", destroying graphs over closed memory");
  }
  CallLocks l(this, ctxs, what);
  if (!l.ok()) return CallLocks::Aborted();
  {
    std::unique_lock<std::mutex> lock(log_mu_);
    call_log_.push_back(std::move(rec));
    if (barrier_devices_ > 0 && device < int(barrier_arrived_.size()) && !barrier_arrived_[device]) {
      barrier_arrived_[device] = 1;
      barrier_cv_.notify_all();
      auto all = [&] {
        if (barrier_devices_ == 0) return true;
        int a = 0;
        for (char c : barrier_arrived_) a += c;
        return a >= barrier_devices_;
      };
      if (!barrier_cv_.wait_for(lock, std::chrono::milliseconds(barrier_guard_ms_), all)) {
        barrier_timed_out_.store(true);
        barrier_devices_ = 0;  // Released for good.
        barrier_cv_.notify_all();
      }
    }
  }
  Stream::Cmd c{Stream::Cmd::kCopy};
  c.chunks.assign(chunks, chunks + n);
  if (!static_cast<Stream*>(stream)->Push(std::move(c))) return CallLocks::Aborted();
  return absl::OkStatus();
}

absl::Status FakeRuntime::RecordEvent(GpuEvent event, GpuStream stream) {
  const int device = static_cast<Stream*>(stream)->device;
  CallLocks l(this, {device}, absl::StrCat("RecordEvent on device ", device));
  if (!l.ok()) return CallLocks::Aborted();
  Event* e = static_cast<Event*>(event);
  Stream::Cmd c{Stream::Cmd::kRecord};
  c.event = e;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    c.target = ++e->recorded;
  }
  if (!static_cast<Stream*>(stream)->Push(std::move(c))) return CallLocks::Aborted();
  return absl::OkStatus();
}

absl::Status FakeRuntime::StreamWaitEvent(GpuStream stream, GpuEvent event) {
  const int device = static_cast<Stream*>(stream)->device;
  CallLocks l(this, {device, static_cast<Event*>(event)->device}, absl::StrCat("StreamWaitEvent on device ", device));
  if (!l.ok()) return CallLocks::Aborted();
  Event* e = static_cast<Event*>(event);
  Stream::Cmd c{Stream::Cmd::kWaitEvent};
  c.event = e;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    c.target = e->recorded;
  }
  if (!static_cast<Stream*>(stream)->Push(std::move(c))) return CallLocks::Aborted();
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeRuntime::QueryEvent(GpuEvent event) {
  Event* e = static_cast<Event*>(event);
  if (options_.driver_model) locks_.SetRole(absl::StrCat("completion thread of device ", e->device));
  CallLocks l(this, {e->device}, absl::StrCat("QueryEvent on device ", e->device));
  if (!l.ok()) return CallLocks::Aborted();
  if (queries_held_.load()) return false;
  std::lock_guard<std::mutex> lock(e->mu);
  if (e->completed < e->recorded) return false;
  if (!e->error.ok()) return e->error;
  return true;
}

// The wait-for report. Follows each waiting thread: a lock leads to its
// holder, space on a stream to the flag the stream is parked on, and that
// flag to its writer. A chain back to a thread on it is a lock cycle (H1a);
// a chain that ends at a device wait whose flag has not come is a cycle
// through the device wait (H1b): the rank writes that flag only after an
// op before it is done, which needs the threads on the chain.
std::string FakeRuntime::Diagnose() const {
  struct Parked {
    uint64_t flag = 0;
    uint32_t value = 0;
    size_t queued = 0;
  };
  std::map<std::string, Parked> streams;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    for (const auto& [p, st] : streams_) {
      std::lock_guard<std::mutex> l(st->mu);
      if (st->parked_flag != 0 || !st->q.empty())
        streams[st->name] = Parked{st->parked_flag, st->parked_value, st->q.size()};
    }
  }
  std::map<uint64_t, std::string> writers;
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    writers = flag_writers_;
  }
  auto flag_text = [&](const Parked& k) {
    const uint32_t now = __atomic_load_n(reinterpret_cast<const uint32_t*>(k.flag), __ATOMIC_ACQUIRE);
    auto w = writers.find(k.flag);
    return absl::StrCat("parked on ready flag 0x", absl::Hex(k.flag), " >= ", k.value, " (now ", now, "), written by ",
                        w != writers.end() ? w->second : "an undeclared writer");
  };
  const std::vector<LockGraph::Waiter> waiters = locks_.waiters();
  std::map<std::string, const LockGraph::Waiter*> by_name;
  for (const auto& w : waiters) by_name[w.thread] = &w;
  std::string verdict;
  for (const auto& start : waiters) {
    std::vector<std::string> chain;
    const LockGraph::Waiter* w = &start;
    for (;;) {
      chain.push_back(
          absl::StrCat("[", w->thread, "] holds [", absl::StrJoin(w->holds, ","), "] and waits for ", w->waits_for));
      if (!w->holder.empty()) {
        chain.back() += absl::StrCat(", held by [", w->holder, "]");
        if (w->holder == start.thread) {
          verdict = absl::StrCat("H1a: lock cycle between threads: ", absl::StrJoin(chain, "; "));
          break;
        }
        auto next = by_name.find(w->holder);
        if (next == by_name.end()) break;
        w = next->second;
        if (chain.size() > by_name.size()) break;
        continue;
      }
      const std::string prefix = "space on ";
      if (w->waits_for.rfind(prefix, 0) == 0) {
        auto st = streams.find(w->waits_for.substr(prefix.size()));
        if (st != streams.end() && st->second.flag != 0) {
          verdict = absl::StrCat("H1b: cycle through a device wait: ", absl::StrJoin(chain, "; "), "; ", st->first,
                                 " (", st->second.queued, " commands queued) is ", flag_text(st->second),
                                 ", which needs an earlier op done, which needs the threads above");
        }
      }
      break;
    }
    if (!verdict.empty()) break;
  }
  std::string r = verdict.empty() ? "no wait-for cycle" : verdict;
  absl::StrAppend(&r, "\nthreads holding or waiting:\n", locks_.Dump(), "busy streams:\n");
  for (const auto& [name, k] : streams) {
    absl::StrAppend(&r, "  ", name, ": ", k.queued, " queued", k.flag != 0 ? ", " + flag_text(k) : "", "\n");
  }
  for (const std::string& c : locks_.cycles()) absl::StrAppend(&r, "lock order: ", c, "\n");
  return r;
}

}  // namespace dmagather::server::engines::gpu::testing
