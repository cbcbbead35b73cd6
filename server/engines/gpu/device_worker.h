// DeviceWorker: one device of the GPU engine and everything that issues its
// shares. It owns the device's lanes (lanes.h: each job's own streams), the
// issuing scratch (the share's copies, chunks, waves, flag addresses), its
// end-event pool (end_events.h), its issuing thread with the FIFO that
// feeds it (with parallel issue; else the routing thread issues here
// itself), and its completion (share_completion.h: the FIFO of shares
// enqueued on the GPU and the thread that sees them end).
//
// A share, Issue: the device's copies of the op (those PeerTable routes to
// it), then - once every share of the op before is enqueued on every device
// (lockstep.h) - on the job's lane: the ready waits (stream 0 waits for
// every rank's ready flag, where the runtime can and the CPU has not seen
// them all), the other streams join stream 0, the copies in chunks and
// waves (wave_plan.h) under the device-order locks of what each call
// touches (device_order.h), the streams join back, the finisher's done
// write (it waits on its stream for every other device's share of the op,
// then writes every rank's done flag), the end event. The share then goes
// to the completion thread and the op's share closes (in_flight_op.h).
//
// Threads: Post on the routing thread (ingress or gate, under the issue
// lock); Issue on the device's issuing thread ("dmag-issue-N"), or on the
// routing thread without parallel issue; Init, Start, Stop* and the
// counters on the engine's thread. Locks, in the order of lock_order.h:
// the issuing FIFO's (kHandoff) for a post or a take; around a copy call or
// a cross-device wait, the device-order locks (kDeviceOrder) of what it
// touches and nothing else; the op's (kOpStatus), the in-flight pool's
// (kOpPool, the last close of a share), the end-event pool's (kEndEvents)
// and the completion FIFO's (kHandoff), each alone.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/latency_histogram.h"
#include "server/engines/copy_engine.h"
#include "server/engines/gpu/device_order.h"
#include "server/engines/gpu/end_events.h"
#include "server/engines/gpu/handoff.h"
#include "server/engines/gpu/in_flight_op.h"
#include "server/engines/gpu/in_flight_pool.h"
#include "server/engines/gpu/issue_watch.h"
#include "server/engines/gpu/lanes.h"
#include "server/engines/gpu/lockstep.h"
#include "server/engines/gpu/peer_table.h"
#include "server/engines/gpu/runtime.h"
#include "server/engines/gpu/share_completion.h"
#include "server/engines/gpu/wave_plan.h"

namespace dmagather::server::engines::gpu {

class DeviceWorker {
 public:
  // Figures every device's worker adds to (the engine's stats and stop line).
  struct Figures {
    std::atomic<uint64_t> chunks{0};
    std::atomic<uint64_t> ready_seen{0};    // Device waits skipped: the CPU saw every flag at the op.
    std::atomic<uint64_t> done_written{0};  // Ops whose done flags a device wrote.
    common::LatencyHistogram memops_ns, copies_ns;
  };
  // What the workers share, owned by the engine (which outlives them).
  struct Shared {
    GpuRuntime* runtime = nullptr;
    DeviceOrder* order = nullptr;
    const PeerTable* peers = nullptr;
    Lockstep* lockstep = nullptr;
    InFlightPool* ops = nullptr;
    IssueWatch* watch = nullptr;
    Figures* figures = nullptr;
    common::Clock* clock = nullptr;
    const std::atomic<bool>* abandon = nullptr;  // Stop gave up waiting for the GPU.
    uint64_t chunk_bytes = 0;
    int streams = 1;     // Per lane.
    int max_batch = 16;  // Chunks per copy call.
    uint64_t awake_ns = 0;
  };
  static constexpr size_t kIssueSlots = 4096;
  static constexpr size_t kLanesKept = 16;
  static constexpr int kEndEvents = 64;

  DeviceWorker(const Shared& shared, int device);
  ~DeviceWorker();
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  // The device's lanes and end events.
  absl::Status Init();
  // Its completion thread, and its issuing thread when `issuing_thread`.
  void Start(bool issuing_thread);
  int device() const { return device_; }

  // Hands the device its share of `t` (its issuing thread, or Issue here).
  void Post(InFlightOp* t);
  // Issues the device's share of `t` and posts it for completion; closes
  // the share the router opened for it.
  void Issue(InFlightOp* t);

  // Shares posted to the issuing thread and not issued yet.
  size_t IssuePending() { return issuer_ != nullptr ? issuer_->Pending() : 0; }
  size_t CompletionPending() { return completion_.Pending(); }
  void StopIssuing();
  void StopCompletion() { completion_.Stop(); }
  uint64_t wakeups() const { return (issuer_ != nullptr ? issuer_->wakeups() : 0) + completion_.wakeups(); }
  bool asleep() { return (issuer_ == nullptr || issuer_->asleep()) && completion_.asleep(); }
  // Bytes this device's streams were given to copy.
  uint64_t issued_bytes() const { return issued_bytes_.load(std::memory_order_relaxed); }

 private:
  // Enqueues the share; *end: its end event when one was recorded (also
  // after an error, so completion waits for what was already enqueued).
  absl::Status Enqueue(InFlightOp* t, GpuEvent* end);
  // The lanes' streams and the waves of the share's copies (into chunks_, batches_).
  void PlanShare(const EngineOp& op);
  // Stream 0 of the lane waits for every rank's ready flag (where it must).
  absl::Status WaitReady(const EngineOp& op);
  // The fan-out, the copy calls and the join back into stream 0.
  absl::Status Copy(const EngineOp& op);
  // A copy call under the device-order locks of what it touches.
  absl::Status CopyInOrder(GpuStream stream, const CopyCmd* chunks, size_t n, bool sole);
  // The finisher's part, on stream 0 before its end event.
  absl::Status WriteDone(InFlightOp* t);
  // Records the share's end event on stream 0 (*end: it).
  absl::Status EndShare(GpuEvent* end);
  void IssuerLoop();

  const Shared s_;
  GpuRuntime& rt_;
  const int device_;
  EndEvents events_;                // Before lanes_: destroyed after them.
  std::unique_ptr<LaneSet> lanes_;  // Each job's streams on this device.
  LaneSet::Lane* lane_ = nullptr;   // The lane of the share being issued.
  // Issuing scratch (whoever issues this device's shares, one at a time).
  std::vector<CopyCmd> copies_;  // This device's copies of the op.
  std::vector<CopyCmd> chunks_;
  std::vector<WaveBatch> batches_;
  std::vector<uint64_t> flags_;
  std::vector<char> stream_used_;
  std::atomic<uint64_t> issued_bytes_{0};
  ShareCompletion completion_;
  // Its issuing thread and the shares handed to it (null without parallel issue).
  std::unique_ptr<Handoff<InFlightOp*>> issuer_;
  std::thread issuer_thread_;
};

}  // namespace dmagather::server::engines::gpu
