// EndEvents: see end_events.h.
#include "server/engines/gpu/end_events.h"

#include "common/status.h"

namespace dmagather::server::engines::gpu {

EndEvents::~EndEvents() {
  absl::MutexLock lock(&mu_);
  for (GpuEvent e : free_) runtime_.DestroyEvent(device_, e);
}

absl::Status EndEvents::Fill(int n) {
  for (int i = 0; i < n; ++i) {
    DMAG_ASSIGN_OR_RETURN(GpuEvent e, runtime_.CreateEvent(device_));
    Give(e);
  }
  return absl::OkStatus();
}

GpuEvent EndEvents::Take() {
  {
    absl::MutexLock lock(&mu_);
    if (!free_.empty()) {
      GpuEvent e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  absl::StatusOr<GpuEvent> e = runtime_.CreateEvent(device_);
  return e.ok() ? *e : nullptr;
}

void EndEvents::Give(GpuEvent e) {
  absl::MutexLock lock(&mu_);
  free_.push_back(e);
}

size_t EndEvents::free() {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

}  // namespace dmagather::server::engines::gpu
