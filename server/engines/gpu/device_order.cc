#include "server/engines/gpu/device_order.h"

#include <utility>

namespace dmagather::server::engines::gpu {

DeviceOrder::DeviceOrder(int devices, std::shared_ptr<GpuRuntime> runtime)
    : runtime_(std::move(runtime)),
      all_(devices >= 64 ? ~DeviceSet{0} : (DeviceSet{1} << devices) - 1),
      mu_(new absl::Mutex[64]) {}

void DeviceOrder::Lock(DeviceSet devices) {
  for (int d = 0; d < 64; ++d) {
    if ((devices >> d & 1) == 0) continue;
    mu_[d].Lock();
    runtime_->OnOrderLock(d, true);
  }
}

void DeviceOrder::Unlock(DeviceSet devices) {
  for (int d = 63; d >= 0; --d) {
    if ((devices >> d & 1) == 0) continue;
    runtime_->OnOrderLock(d, false);
    mu_[d].Unlock();
  }
}

DeviceOrder::Hold::Hold(DeviceOrder& order, DeviceSet devices) : order_(order), devices_(devices) {
  order_.Lock(devices_);
}

DeviceOrder::Hold::~Hold() { order_.Unlock(devices_); }

}  // namespace dmagather::server::engines::gpu
