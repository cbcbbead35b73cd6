// GpuRuntime: the few GPU calls the GPU engine (gpu_engine.h) makes, behind
// one small interface, so the engine's logic - import cache, chunk and wave
// planning, ready gating, ordered completion, failure release - is written
// once and runs over
//   cuda  (cuda_runtime.cc: CUDA runtime + driver entry points, NVIDIA copy engines),
//   hip   (hip_runtime.cc: HIP through dlopen, AMD SDMA engines),
//   fake  (tests/fakes/fake_gpu_runtime.h: memcpy on CPU threads, for unit tests in CI).
// Each runtime is its own file; nothing here names a vendor.
//
// Handles (streams, events) are opaque pointers the runtime hands out and
// takes back. A runtime either waits for the ranks' ready flags on the
// device (device_waits(): cuda's stream memory operations) or lets the
// engine gate each op on the CPU before any copy is issued (hip: ROCm
// implements stream waits on ordinary memory as a kernel, and the daemon
// launches none).
//
// Threads: setup calls (devices, identities, peers, streams, events) on the
// thread that creates or stops the engine; RegisterFlags/UnregisterFlags/
// OpenIpc/CloseIpc/ImportOther on gRPC threads (the engine serializes
// imports); WaitValues/Copy/RecordEvent/StreamWaitEvent on the issuing
// thread of the device they name - one thread per device, several devices
// at once, so a runtime keeps its issuing state per device; QueryEvent on
// the per-device completion threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/engines/copy_engine.h"
#include "server/engines/gpu/peer_table.h"

namespace dmagather::server::engines::gpu {

using GpuStream = void*;
using GpuEvent = void*;

// Largest single transfer each runtime hands to a DMA engine (chunks are
// cut to this): cuda 64 MiB (single copies of 256 MiB and more were seen to
// hang an H100/H200 copy engine); hip 128 MiB (descriptors of 256 MiB and
// more stalled an MI355X SDMA engine; RCCL caps SDMA transfers at 128 MiB
// with no bandwidth loss).
inline constexpr uint64_t kCudaMaxTransferBytes = uint64_t{64} << 20;
inline constexpr uint64_t kHipMaxTransferBytes = uint64_t{128} << 20;
// Default chunk (--chunk_kib 0): what each runtime starts with.
inline constexpr uint64_t kCudaDefaultChunkBytes = uint64_t{32} << 20;
inline constexpr uint64_t kHipDefaultChunkBytes = uint64_t{64} << 20;

// What names a device whatever the process's visible-device setting: the
// daemon maps a rank's device to its own by these (GpuEngine::AttachRank).
struct DeviceIdentity {
  std::string uuid;        // 16 raw bytes; "" if the runtime cannot tell.
  std::string pci_bus_id;  // "0000:19:00.0"; "" if unknown. Two devices with one
                           // bus id are partitions (MIG) of one GPU.
  std::string name;        // "NVIDIA H200", for logs.
};

// An IPC-opened allocation: its base in the daemon and its size.
struct IpcMapping {
  char* base = nullptr;
  uint64_t bytes = 0;
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (nvidia-smi's form) of a 16-byte
// uuid; "no uuid" for an empty one.
std::string FormatDeviceUuid(const std::string& uuid);

class GpuRuntime {
 public:
  virtual ~GpuRuntime() = default;

  // --- What it is ---
  virtual const char* name() const = 0;             // --backend value: "cuda", "hip", "fake".
  virtual const char* label() const = 0;            // In messages: "CUDA", "HIP".
  virtual const char* device_kind() const = 0;      // The DeviceRef kind its ranks report.
  virtual const char* ipc_memory_kind() const = 0;  // common/memory_kinds.h
  virtual size_t ipc_handle_bytes() const = 0;
  virtual int num_devices() const = 0;
  virtual uint64_t max_transfer_bytes() const = 0;
  virtual uint64_t default_chunk_bytes() const = 0;
  // True: WaitValues gates a stream on the device. False: the engine waits
  // for the ready flags on the CPU and issues the op's copies after.
  virtual bool device_waits() const = 0;
  // One line for the engine's start-up log (copy path, caps, options).
  virtual std::string Describe() const = 0;

  // --- Setup ---
  virtual absl::Status SetDevice(int device) = 0;
  virtual absl::StatusOr<DeviceIdentity> Identify(int device) = 0;
  // Enables `from` to access `to` directly; false when the pair cannot. An
  // error is the pair's alone: the engine marks it unreachable and goes on.
  virtual absl::StatusOr<bool> EnablePeerAccess(int from, int to) = 0;
  // After EnablePeerAccess(from, to): one small copy issued on `from` that
  // reads memory of `to`, checked byte for byte (default: nothing to check).
  // An error marks the pair unreachable.
  virtual absl::Status ProbePeerCopy(int from, int to) {
    (void)from, (void)to;
    return absl::OkStatus();
  }
  // The engine's final reachability, once, before any import: importers
  // that grant access per device (VMM) grant it by this table.
  virtual void UsePeers(const PeerTable& peers) { (void)peers; }
  virtual absl::StatusOr<GpuStream> CreateStream(int device) = 0;
  virtual void DestroyStream(int device, GpuStream stream) = 0;
  virtual absl::StatusOr<GpuEvent> CreateEvent(int device) = 0;
  virtual void DestroyEvent(int device, GpuEvent event) = 0;

  // --- Ranks: the completion block (page-aligned, in the daemon's memory)
  // made readable by the devices; returns the device address of the ready
  // word (used by WaitValues on every device's stream, so one address must
  // do for all of them: a runtime that cannot promise it reports
  // device_waits() false). ---
  virtual absl::StatusOr<uint64_t> RegisterFlags(int device, void* pages, uint64_t bytes,
                                                 const uint32_t* ready_word) = 0;
  virtual void UnregisterFlags(void* pages) = 0;

  // --- Imports ---
  // Opens an IPC handle of a rank's allocation (its base) on `device`.
  virtual absl::StatusOr<IpcMapping> OpenIpc(int device, const std::string& handle) = 0;
  virtual void CloseIpc(int device, char* base) = 0;
  // Memory of any other kind (a runtime that can import more than its IPC
  // handles adds it here). `device`: the owning rank's device (the
  // daemon's number); `rank_ordinal`: the same device as the rank numbers
  // it (what the rank wrote into its export). Default: FALLBACK naming what
  // it imports.
  virtual absl::StatusOr<std::shared_ptr<ImportedRegion>> ImportOther(const RegionSpec& spec, int device,
                                                                      int rank_ordinal);

  // --- Data path (the engine's issuing thread) ---
  // Makes `stream` wait until every flags[i] (device addresses from
  // RegisterFlags) is >= value (32-bit wrapping compare). device_waits() only.
  virtual absl::Status WaitValues(int device, GpuStream stream, const uint64_t* flags, size_t n, uint32_t value) = 0;
  // Makes `stream` write `value` into every flags[i] (device addresses of
  // registered flag pages) once everything before it on the stream is done
  // and visible (a fence first). device_writes() only.
  virtual bool device_writes() const { return false; }
  virtual absl::Status WriteValues(int device, GpuStream stream, const uint64_t* flags, size_t n, uint32_t value) {
    (void)device, (void)stream, (void)flags, (void)n, (void)value;
    return absl::UnimplementedError("this runtime cannot write flags from a stream");
  }
  // Enqueues the chunks (each <= max_transfer_bytes; issued on `device`,
  // which reaches both ends of each: src_device and dst_device) on `stream`.
  // `sole_stream`: every copy of this op on `device` goes out on this one
  // stream, so nothing of the op runs beside these chunks (a runtime may
  // then run them one after another at no loss, e.g. as a graph chain).
  virtual absl::Status Copy(int device, GpuStream stream, const CopyCmd* chunks, size_t n, bool sole_stream) = 0;
  // True when the next Copy on `device` also makes driver calls for memory
  // of devices other than its chunks' ends (the cuda runtime destroys there
  // the copy graphs over memory released since). The engine then holds
  // every device's order lock around that call (device_order.h).
  virtual bool CopyTouchesOthers(int device) const {
    (void)device;
    return false;
  }
  virtual absl::Status RecordEvent(GpuEvent event, GpuStream stream) = 0;
  virtual absl::Status StreamWaitEvent(GpuStream stream, GpuEvent event) = 0;

  // --- Multi-node staging (ring threads; any thread) ---
  // Pinned host memory, and a synchronous copy between it and device
  // memory of `device` on a copy engine. Default: UNIMPLEMENTED.
  virtual absl::StatusOr<void*> AllocPinned(uint64_t bytes);
  virtual void FreePinned(void* host);
  virtual absl::Status CopySync(int device, void* dst, const void* src, uint64_t bytes);
  // --- Completion threads ---
  // Called once by each completion thread before it polls.
  virtual void BindThread(int device) { (void)SetDevice(device); }
  // True when everything before the event's last record has completed;
  // false while pending; an error when the work failed.
  virtual absl::StatusOr<bool> QueryEvent(GpuEvent event) = 0;

  // --- Lock-order checks ---
  // The engine took (held) or let go of its device-order lock of `device`
  // (device_order.h) on the calling thread. A runtime that checks lock
  // order (the test fake) records it; the others ignore it.
  virtual void OnOrderLock(int device, bool held) { (void)device, (void)held; }

  // --- Telemetry (any thread) ---
  // Bytes per device and copy engine, where the runtime assigns engines
  // itself (hip over hsa-runtime); empty otherwise.
  virtual std::vector<CopyEngineBytes> CopyEngineCounters() const { return {}; }
};

}  // namespace dmagather::server::engines::gpu
