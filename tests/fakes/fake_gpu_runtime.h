// FakeRuntime: a GpuRuntime on the CPU, for the GPU engine's unit tests. A
// "device" is a number; its memory is ordinary host memory; each stream is
// a thread that runs the stream's commands in order (wait for flags, memcpy
// of chunks, event records and waits), so the engine's logic - chunking,
// waves, ready gating, ordered completion, failure release, many devices
// and jobs - runs unchanged and its results can be compared byte for byte.
// Tests inject failures (a Copy call refused, or a chunk that fails while
// it runs), delays (per chunk, per device) and holds (a device's chunks wait
// until the test releases it: ordering tests that need no clock).
//
// Devices have identities (FakeUuid, a bus id each) and a peer matrix (the
// `peer` option: which pair the "driver" lets enable peer access, and which
// fails to); memory opened through OpenIpc belongs to the device it was
// opened on, and a chunk issued on a device that has no access to the
// memory of either end fails as an illegal address would. Every chunk is
// logged with the device that issued it and the owners of its ends, and
// every Copy call with its device, stream and thread, so tests assert
// where each copy ran and that devices were issued in parallel.
//
// The IPC handle of an allocation is MakeHandle(base, bytes): the fake
// "opens" it by reading the pointer back.
//
// The driver model (Options::driver_model; for the deadlock tests,
// docs/CUDA.md "Locks and waits: why issue cannot deadlock"): what the real
// driver may do that matters for deadlock, with a checker (lock_graph.h):
//  - every call takes the lock of each device context it touches
//    (LockGraph "ctxN"), its own device's first: WaitValues, RecordEvent,
//    StreamWaitEvent, QueryEvent, CreateEvent, DestroyEvent take their
//    device's; Copy on device D takes D's, then the owner of each chunk's
//    ends that is another device (a peer copy reading IPC-mapped memory),
//    and first the owners of memory closed since its last call (the copy
//    graphs that touched it are destroyed in it, as the cuda runtime does);
//    OpenIpc/CloseIpc on D take D's and then every device with peer access
//    to D (the mapping is made or unmade there, in device order);
//    RegisterFlags/UnregisterFlags (portable host registration) take every
//    device's, in device order;
//  - a stream's queue holds at most Options::stream_depth commands: an
//    enqueue on a full queue blocks the calling thread in the call, holding
//    its locks, until the stream runs a command. A device wait parks its
//    stream until the flag reaches the value, so commands queue behind it;
//  - peer memory: as above, a chunk touches the contexts of both ends.
// Diagnose() writes the wait-for report (who holds and waits for which
// lock, which stream is parked on which flag and who writes that flag) with
// its verdict; Abort() ends every wait so that a test whose watchdog fired
// ends with a failure, not a hang.
//
// Threads: any; every method is thread-safe. Stream threads are joined by
// DestroyStream (a stream blocked on a flag is cancelled) and by the
// destructor for any stream left.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/engines/gpu/runtime.h"
#include "tests/fakes/lock_graph.h"

namespace dmagather::server::engines::gpu::testing {

class FakeRuntime : public GpuRuntime {
 public:
  struct Options {
    int devices = 2;
    bool device_waits = true;   // false: the engine gates ops on the CPU (as with hip).
    bool device_writes = true;  // With device_waits: streams write flags (WriteValues).
    uint64_t max_transfer_bytes = kCudaMaxTransferBytes;
    uint64_t default_chunk_bytes = kCudaDefaultChunkBytes;
    std::string kind = "fake";  // name(), device_kind() and the IPC memory kind's prefix.
    // Whether `from` may enable peer access to `to` (true), cannot (false)
    // or fails to (an error). Null: every pair can.
    std::function<absl::StatusOr<bool>(int from, int to)> peer;
    // The probe copy of a pair (null: passes).
    std::function<absl::Status(int from, int to)> probe;
    // Identities: uuid FakeUuid(d), bus id FakeBusId(d), unless replaced
    // here (by device; "" = the runtime cannot tell).
    std::map<int, std::string> uuids, bus_ids;
    // The driver model above: context locks and blocking enqueues.
    bool driver_model = false;
    // Commands a stream's queue holds (driver model only; 0: no bound).
    int stream_depth = 0;
  };
  // One chunk as it ran: the issuing device and the devices owning its
  // source and destination (-1: memory not opened through OpenIpc).
  struct ChunkRecord {
    int device = -1;
    int src_owner = -1;
    int dst_owner = -1;
    uint64_t bytes = 0;
  };
  // One Copy call.
  struct CallRecord {
    int device = -1;
    GpuStream stream = nullptr;
    std::thread::id thread;
    std::vector<int> src_owners;  // Per chunk.
    bool sole_stream = false;     // As the engine passed it.
  };
  explicit FakeRuntime(const Options& options);
  ~FakeRuntime() override;

  static std::string MakeHandle(const void* base, uint64_t bytes);
  static std::string FakeUuid(int device);
  static std::string FakeBusId(int device);

  // --- Injection (take effect from the next call) ---
  // The nth Copy call (1-based, counted from now) on `device` returns `st`
  // and enqueues nothing.
  void FailCopyCall(int device, int nth, absl::Status st);
  // The nth chunk (1-based, counted from now) that runs on `device` fails
  // with `st` (nothing copied); the end of its op reports it.
  void FailChunk(int device, int nth, absl::Status st);
  // Every chunk on `device` takes at least `us` microseconds.
  void SetChunkDelayUs(int device, uint32_t us);
  // Chunks on `device` wait (before copying) until ReleaseDevice(device).
  // The destructor releases every held device.
  void HoldDevice(int device);
  void ReleaseDevice(int device);
  // The first Copy call of each of `devices` devices waits until every one
  // of them has made its first call - which only happens if they are issued
  // at the same time - or until `guard_ms` passed (a hang guard: then
  // barrier_timed_out() is true).
  void BarrierOnFirstCopies(int devices, int guard_ms = 30000);
  bool barrier_timed_out() const { return barrier_timed_out_.load(); }
  // Every WaitValues and Copy call on `device` first sleeps `us`
  // microseconds (outside any lock): one device's issue lags the others'.
  void SetCallDelayUs(int device, uint32_t us);
  // While held, QueryEvent reports every event not yet complete: the
  // engine's completion threads see nothing end (the ranks' done flags can
  // still move, written by the streams).
  void HoldQueries(bool held) { queries_held_.store(held); }
  // Names the writer of a flag (a rank's ready word) in wait-for reports:
  // e.g. "rank 1 of job 1 (writes ready k once op k-1 is done)".
  void DeclareFlagWriter(const uint32_t* word, const std::string& writer);

  // --- The driver model's checker ---
  LockGraph& locks() { return locks_; }
  // The wait-for report and its verdict: a first line "H1a: ...", "H1b:
  // ..." or "no wait-for cycle", then every waiting thread, held lock and
  // busy stream.
  std::string Diagnose() const;
  // Ends every wait of the model (locks, full queues, device waits); every
  // later call fails. For a watchdog that found no progress.
  void Abort();

  // --- Observations ---
  uint64_t chunks_run() const { return chunks_run_.load(); }
  uint64_t largest_chunk() const { return largest_chunk_.load(); }
  int ipc_opens() const { return ipc_opens_.load(); }
  int ipc_open_now() const { return ipc_open_now_.load(); }
  int flags_registered() const { return flags_registered_.load(); }
  int wait_calls() const { return wait_calls_.load(); }    // WaitValues calls: device waits enqueued.
  int write_calls() const { return write_calls_.load(); }  // WriteValues calls: done writes enqueued.
  int live_streams() const;
  std::vector<ChunkRecord> chunk_log() const;
  std::vector<CallRecord> call_log() const;
  void ClearLogs();
  // Pairs for which EnablePeerAccess succeeded.
  bool peer_enabled(int from, int to) const;

  // --- GpuRuntime ---
  const char* name() const override { return kind_.c_str(); }
  const char* label() const override { return "fake GPU"; }
  const char* device_kind() const override { return kind_.c_str(); }
  const char* ipc_memory_kind() const override { return ipc_kind_.c_str(); }
  size_t ipc_handle_bytes() const override { return 16; }
  int num_devices() const override { return options_.devices; }
  uint64_t max_transfer_bytes() const override { return options_.max_transfer_bytes; }
  uint64_t default_chunk_bytes() const override { return options_.default_chunk_bytes; }
  bool device_waits() const override { return options_.device_waits; }
  bool device_writes() const override { return options_.device_waits && options_.device_writes; }
  absl::Status WriteValues(int device, GpuStream stream, const uint64_t* flags, size_t n, uint32_t value) override;
  std::string Describe() const override { return "fake runtime (CPU threads, memcpy)"; }

  absl::Status SetDevice(int device) override;
  absl::StatusOr<DeviceIdentity> Identify(int device) override;
  absl::StatusOr<bool> EnablePeerAccess(int from, int to) override;
  absl::Status ProbePeerCopy(int from, int to) override {
    return options_.probe ? options_.probe(from, to) : absl::OkStatus();
  }
  absl::StatusOr<GpuStream> CreateStream(int device) override;
  void DestroyStream(int device, GpuStream stream) override;
  absl::StatusOr<GpuEvent> CreateEvent(int device) override;
  void DestroyEvent(int device, GpuEvent event) override;
  absl::StatusOr<uint64_t> RegisterFlags(int device, void* pages, uint64_t bytes, const uint32_t* ready_word) override;
  void UnregisterFlags(void* pages) override;
  absl::StatusOr<IpcMapping> OpenIpc(int device, const std::string& handle) override;
  void CloseIpc(int device, char* base) override;
  absl::Status WaitValues(int device, GpuStream stream, const uint64_t* flags, size_t n, uint32_t value) override;
  absl::Status Copy(int device, GpuStream stream, const CopyCmd* chunks, size_t n, bool sole_stream) override;
  bool CopyTouchesOthers(int device) const override;
  absl::Status RecordEvent(GpuEvent event, GpuStream stream) override;
  absl::Status StreamWaitEvent(GpuStream stream, GpuEvent event) override;
  void BindThread(int device) override { (void)device; }
  void OnOrderLock(int device, bool held) override;
  // Staging: plain host memory and memcpy (the fake's device memory is host memory).
  absl::StatusOr<void*> AllocPinned(uint64_t bytes) override { return ::operator new(bytes); }
  void FreePinned(void* host) override { ::operator delete(host); }
  absl::Status CopySync(int, void* dst, const void* src, uint64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<bool> QueryEvent(GpuEvent event) override;

  struct Stream;
  struct Event;

 private:
  struct DeviceState {
    std::mutex mu;
    int fail_call_at = 0;  // Counts down; 1 = the next call fails.
    absl::Status fail_call_status;
    int fail_chunk_at = 0;
    absl::Status fail_chunk_status;
    uint32_t delay_us = 0;
    uint32_t call_delay_us = 0;
    bool held = false;
    std::condition_variable released;
  };
  // Runs one chunk on `device`: delay, injected failure, access check or memcpy.
  absl::Status RunChunk(int device, const CopyCmd& c);
  // The device whose memory holds `p` (-1: not opened through OpenIpc).
  int OwnerOf(const void* p) const;
  // The driver model: takes the contexts of `devices` in that order for
  // `what` (nothing without the model). Holds them until destroyed.
  class CallLocks;
  // Devices with peer access to `device`, in order (for IPC mappings).
  std::vector<int> PeersOf(int device) const;
  void CallDelay(int device);
  friend struct Stream;

  const Options options_;
  const std::string kind_;
  const std::string ipc_kind_;
  std::unique_ptr<DeviceState[]> state_;
  mutable std::mutex streams_mu_;
  std::map<Stream*, std::unique_ptr<Stream>> streams_;
  std::atomic<uint64_t> chunks_run_{0}, largest_chunk_{0};
  // Opened IPC memory by base: (end, owning device); the logs; peer access.
  mutable std::mutex log_mu_;
  std::map<uintptr_t, std::pair<uintptr_t, int>> owners_;
  std::vector<ChunkRecord> chunk_log_;
  std::vector<CallRecord> call_log_;
  std::vector<char> enabled_;
  // BarrierOnFirstCopies.
  std::condition_variable barrier_cv_;
  int barrier_devices_ = 0;
  int barrier_guard_ms_ = 0;
  std::vector<char> barrier_arrived_;
  std::atomic<bool> barrier_timed_out_{false};
  // The driver model.
  LockGraph locks_;
  std::map<uint64_t, std::string> flag_writers_;  // By flag address; under log_mu_.
  std::vector<std::vector<int>> released_;        // Per device: owners of memory closed since its last Copy.
  std::atomic<bool> aborted_{false};
  std::atomic<int> ipc_opens_{0}, ipc_open_now_{0}, flags_registered_{0}, wait_calls_{0}, write_calls_{0};
  std::atomic<bool> queries_held_{false};
};

}  // namespace dmagather::server::engines::gpu::testing
