// HsaStreams: the GPU engine's streams and events (runtime.h) over
// HsaCopyQueue, for the hip runtime when dmagatherd assigns SDMA engines
// itself. Each stream is one in-order HsaCopyQueue on one device; each copy
// goes on the engine SdmaEnginePlan chose for its link (dst_device <-
// src_device), or to ROCr's choice where the plan has none for that link.
//
// Events: an event is a set of marks (queue, copies issued so far) and is
// complete when every queue has completed up to its mark. Recording an
// event on a stream takes the stream's own mark and every mark the stream
// has waited on (StreamWaitEvent), so the engine's joins (every stream into
// stream 0, the end event on stream 0) cover all the op's copies. A wait
// orders completion, not issue: the hip runtime gates ops on the CPU, so an
// op's copies are issued only once every rank is ready and need no
// device-side order between queues (each queue keeps its own order through
// HSA signal dependencies).
//
// A copy within one GPU (ranks sharing a device) has no link: ROCr would do
// it with a blit kernel (its device-to-device path within one agent), so it
// goes on an engine of that GPU's own (the engine of its first outgoing
// link) with force_copy_on_sdma; ROCr's choice only where the GPU has no
// engine assigned.
//
// Bytes are counted per device and engine (CopyEngineCounters).
//
// Threads: as runtime.h - streams and events are created and destroyed on
// the engine's setup thread; Copy/Record/Wait on the issuing thread of the
// stream's device; Query on that device's completion thread; counters from
// any thread.
#pragma once

#include <hsa/hsa.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/engines/copy_engine.h"
#include "server/engines/gpu/hip/hsa_copy_queue.h"
#include "server/engines/gpu/hip/sdma_engines.h"

namespace dmagather::server::engines::gpu::hip {

class HsaStreams {
 public:
  struct Stream;
  struct Event;

  // agents[d]: the HSA GPU agent of device d (matched by PCI address).
  HsaStreams(const HsaCopyApi* api, SdmaEnginePlan plan, std::vector<hsa_agent_t> agents);
  ~HsaStreams();
  HsaStreams(const HsaStreams&) = delete;
  HsaStreams& operator=(const HsaStreams&) = delete;

  Stream* CreateStream(int device);
  void DestroyStream(Stream* s);
  Event* CreateEvent();
  void DestroyEvent(Event* e);

  // Enqueues the chunks on the stream, each on its link's engine. An error
  // for a chunk whose devices are not this node's.
  absl::Status Copy(Stream* s, const CopyCmd* chunks, size_t n);
  absl::Status Record(Event* e, Stream* s);
  absl::Status Wait(Stream* s, Event* e);
  // True when every copy the event covers has completed; an error when one
  // failed.
  absl::StatusOr<bool> Query(Event* e);

  // Bytes per device and engine index (engine -1: ROCr's choice), only the
  // pairs that moved bytes, in (device, engine) order. A copy between GPUs
  // runs on an engine of its source GPU (ROCr's copy agent), so it counts
  // there.
  std::vector<CopyEngineBytes> Counters() const;
  const SdmaEnginePlan& plan() const { return plan_; }

 private:
  const HsaCopyApi* const api_;
  const SdmaEnginePlan plan_;
  const std::vector<hsa_agent_t> agents_;
  std::vector<uint32_t> local_engine_;  // Per device: the engine of copies within it (0: ROCr's choice).
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);  // Setup thread; destroyed with the engine.
  // bytes_[device * (kEngines + 1) + engine + 1]; engine -1: ROCr's choice.
  std::unique_ptr<std::atomic<uint64_t>[]> bytes_;
};

}  // namespace dmagather::server::engines::gpu::hip
