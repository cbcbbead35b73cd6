// GpuRank: a rank attached to the GPU engine (rank_imports.h makes it), read
// by the router, the device workers and the in-flight ops. Private to the
// engine. Threads: made on a gRPC thread, then read-only; released (its
// flags unregistered under every device-order lock) on whichever thread
// lets go of it last.
#pragma once

#include <cstdint>
#include <memory>

#include "server/engines/copy_engine.h"
#include "server/engines/gpu/device_order.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu {

// A rank on this engine: its device (the daemon's number, and the rank's
// own), its completion block registered with the runtime (streams read the
// ready flag at `ready_flag`; the CPU gate reads `ready_word`; a device
// writes the done flag at `done_flag`);
// unregistered when the rank is released.
class GpuRank : public EngineRank {
 public:
  GpuRank(std::shared_ptr<GpuRuntime> rt, std::shared_ptr<DeviceOrder> order, int device, int rank_ordinal, void* pages,
          uint64_t ready_flag, const uint32_t* ready_word, uint64_t done_flag, const uint32_t* done_word)
      : rt_(std::move(rt)),
        order_(std::move(order)),
        device_(device),
        rank_ordinal_(rank_ordinal),
        pages_(pages),
        ready_flag_(ready_flag),
        ready_word_(ready_word),
        done_flag_(done_flag),
        done_word_(done_word) {}
  ~GpuRank() override {
    DeviceOrder::Hold hold(*order_, order_->all());  // Portable: unregistered from every device.
    rt_->UnregisterFlags(pages_);
  }
  int device() const { return device_; }
  int rank_ordinal() const { return rank_ordinal_; }
  uint64_t ready_flag() const { return ready_flag_; }
  const uint32_t* ready_word() const { return ready_word_; }
  uint64_t done_flag() const { return done_flag_; }  // 0: not known (the engine does not write it).
  const uint32_t* done_word() const { return done_word_; }

 private:
  const std::shared_ptr<GpuRuntime> rt_;
  const std::shared_ptr<DeviceOrder> order_;
  const int device_;
  const int rank_ordinal_;
  void* const pages_;
  const uint64_t ready_flag_;
  const uint32_t* const ready_word_;
  const uint64_t done_flag_;
  const uint32_t* const done_word_;
};

inline const GpuRank* AsGpu(const EngineRank* r) { return static_cast<const GpuRank*>(r); }

// Every rank's ready flag has reached op.seq (read on the CPU).
inline bool RanksReady(const EngineOp& op) {
  if (op.ready_observed) return true;  // A graph replay: the ingress thread saw the flags.
  for (const EngineRank* r : op.ranks) {
    if (r == nullptr) continue;
    const uint32_t* w = AsGpu(r)->ready_word();
    if (w == nullptr) continue;
    if (static_cast<int32_t>(__atomic_load_n(w, __ATOMIC_ACQUIRE) - op.seq) < 0) return false;
  }
  return true;
}

}  // namespace dmagather::server::engines::gpu
