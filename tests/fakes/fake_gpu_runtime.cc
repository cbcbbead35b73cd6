#include "tests/fakes/fake_gpu_runtime.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dmagather::server::engines::gpu::testing {

// An event: the number of records issued and the number the stream thread
// has reached; the error carried by the last completed record.
struct FakeRuntime::Event {
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
    enum Kind { kWait, kCopy, kRecord, kWaitEvent } kind;
    std::vector<uint64_t> flags;
    uint32_t value = 0;
    std::vector<CopyCmd> chunks;
    Event* event = nullptr;
    uint64_t target = 0;  // kRecord: the record's number; kWaitEvent: the record waited for.
  };

  Stream(FakeRuntime* rt, int device) : rt(rt), device(device), thread([this] { Run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu);
      cancel = true;
    }
    cv.notify_all();
    thread.join();
  }
  void Push(Cmd c) {
    {
      std::lock_guard<std::mutex> lock(mu);
      q.push_back(std::move(c));
    }
    cv.notify_all();
  }
  bool Cancelled() {
    std::lock_guard<std::mutex> lock(mu);
    return cancel;
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
      switch (c.kind) {
        case Cmd::kWait:
          for (uint64_t f : c.flags) {
            const uint32_t* w = reinterpret_cast<const uint32_t*>(f);
            while (static_cast<int32_t>(__atomic_load_n(w, __ATOMIC_ACQUIRE) - c.value) < 0) {
              if (Cancelled()) return;
              usleep(20);
            }
          }
          break;
        case Cmd::kCopy:
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
            usleep(20);
          }
          break;
      }
    }
  }

  FakeRuntime* const rt;
  const int device;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Cmd> q;
  bool cancel = false;
  absl::Status error;  // Stream thread only.
  std::thread thread;  // Last: starts after the members above exist.
};

FakeRuntime::FakeRuntime(const Options& options)
    : options_(options),
      kind_(options.kind),
      ipc_kind_(options.kind + "_ipc"),
      state_(new DeviceState[options.devices > 0 ? options.devices : 1]),
      enabled_(size_t(std::max(options.devices, 1)) * std::max(options.devices, 1), 0) {}

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
  auto s = std::make_unique<Stream>(this, device);
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
  (void)device;
  return static_cast<GpuEvent>(new Event);
}

void FakeRuntime::DestroyEvent(int device, GpuEvent event) {
  (void)device;
  delete static_cast<Event*>(event);
}

absl::StatusOr<uint64_t> FakeRuntime::RegisterFlags(int device, void* pages, uint64_t bytes,
                                                    const uint32_t* ready_word) {
  (void)device;
  (void)pages;
  (void)bytes;
  flags_registered_.fetch_add(1);
  return reinterpret_cast<uint64_t>(ready_word);
}

void FakeRuntime::UnregisterFlags(void* pages) {
  (void)pages;
  flags_registered_.fetch_sub(1);
}

absl::StatusOr<IpcMapping> FakeRuntime::OpenIpc(int device, const std::string& handle) {
  (void)device;
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
  (void)device;
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    owners_.erase(reinterpret_cast<uintptr_t>(base));
  }
  ipc_open_now_.fetch_sub(1);
}

absl::Status FakeRuntime::WaitValues(int device, GpuStream stream, const uint64_t* flags, size_t n, uint32_t value) {
  (void)device;
  if (!options_.device_waits) return absl::FailedPreconditionError("this fake runtime has no device waits");
  wait_calls_.fetch_add(1);
  Stream::Cmd c{Stream::Cmd::kWait};
  c.flags.assign(flags, flags + n);
  c.value = value;
  static_cast<Stream*>(stream)->Push(std::move(c));
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
  static_cast<Stream*>(stream)->Push(std::move(c));
  return absl::OkStatus();
}

absl::Status FakeRuntime::RecordEvent(GpuEvent event, GpuStream stream) {
  Event* e = static_cast<Event*>(event);
  Stream::Cmd c{Stream::Cmd::kRecord};
  c.event = e;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    c.target = ++e->recorded;
  }
  static_cast<Stream*>(stream)->Push(std::move(c));
  return absl::OkStatus();
}

absl::Status FakeRuntime::StreamWaitEvent(GpuStream stream, GpuEvent event) {
  Event* e = static_cast<Event*>(event);
  Stream::Cmd c{Stream::Cmd::kWaitEvent};
  c.event = e;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    c.target = e->recorded;
  }
  static_cast<Stream*>(stream)->Push(std::move(c));
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeRuntime::QueryEvent(GpuEvent event) {
  Event* e = static_cast<Event*>(event);
  std::lock_guard<std::mutex> lock(e->mu);
  if (e->completed < e->recorded) return false;
  if (!e->error.ok()) return e->error;
  return true;
}

}  // namespace dmagather::server::engines::gpu::testing
