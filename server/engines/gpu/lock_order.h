// The GPU engine's lock order, declared for the compiler. Each mutex of the
// engine names its level here (ABSL_ACQUIRED_AFTER / ABSL_ACQUIRED_BEFORE of
// these tags), and the levels form one chain, outermost first:
//
//   kIssue        ReadyGate::mu_          the issue lock: every op passes it, in order
//                                         within its job (ready_gate.h)
//   kLoads        JobLoads::mu_           each job's ops in flight (job_loads.h)
//   kOpPool       InFlightPool::mu_       the free in-flight ops (in_flight_pool.h)
//   kOpStatus     InFlightOp::mu_         one op's first error (in_flight_op.h)
//   kImports      RankImports::mu_        the import cache (rank_imports.h)
//   kDeviceOrder  DeviceOrder::held_      the device-order locks around driver calls
//                                         that touch several devices (device_order.h)
//   kHandoff      Handoff<T>::mu_         a FIFO to an issuing or completion thread (handoff.h)
//   kEndEvents    EndEvents::mu_          a device's free end events (end_events.h)
//
// Clang's thread-safety analysis checks the chain within every function
// body that includes this header (the pragma below turns on its before/after
// check, -Wthread-safety-beta; tools/check_thread_safety.sh makes a warning
// an error): a function that takes a later level and then an earlier one
// does not build. Calls across objects (the gate's lock held while the
// engine issues) are the runtime's to keep; docs/CUDA.md, "Locks and
// waits", says why the order cannot deadlock. The driver's own locks (the
// runtime's calls) come after kDeviceOrder.
//
// Threads: none; nothing here is ever locked.
#pragma once

#include "absl/base/thread_annotations.h"

#ifdef __clang__
#pragma clang diagnostic warning "-Wthread-safety-beta"
#endif

namespace dmagather::server::engines::gpu::lock_order {

// A level of the chain: a tag the mutexes name, never locked itself.
class ABSL_LOCKABLE Level {};

inline Level kIssue;
inline Level kLoads ABSL_ACQUIRED_AFTER(kIssue);
inline Level kOpPool ABSL_ACQUIRED_AFTER(kLoads);
inline Level kOpStatus ABSL_ACQUIRED_AFTER(kOpPool);
inline Level kImports ABSL_ACQUIRED_AFTER(kOpStatus);
inline Level kDeviceOrder ABSL_ACQUIRED_AFTER(kImports);
inline Level kHandoff ABSL_ACQUIRED_AFTER(kDeviceOrder);
inline Level kEndEvents ABSL_ACQUIRED_AFTER(kHandoff);
inline Level kLast ABSL_ACQUIRED_AFTER(kEndEvents);

}  // namespace dmagather::server::engines::gpu::lock_order
