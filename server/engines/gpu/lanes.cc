#include "server/engines/gpu/lanes.h"

#include <utility>

namespace dmagather::server::engines::gpu {

LaneSet::~LaneSet() {
  for (auto& lane : lanes_) Destroy(*lane);
}

absl::StatusOr<LaneSet::Lane*> LaneSet::Take(uint64_t job) {
  if (last_ != nullptr && last_->job == job) return last_;
  Lane* idle = nullptr;
  Lane* own = nullptr;
  for (auto& l : lanes_) {
    if (l->job == job) own = l.get();
    if (idle == nullptr && l->open.load(std::memory_order_acquire) == 0) idle = l.get();
  }
  if (own == nullptr && idle != nullptr) {
    idle->job = job;
    own = idle;
  }
  if (own == nullptr) {
    auto lane = std::make_unique<Lane>();
    lane->job = job;
    lane->streams.assign(streams_, nullptr);
    lane->joins.assign(streams_, nullptr);
    absl::Status st;
    for (int s = 0; s < streams_ && st.ok(); ++s) {
      auto stream = runtime_->CreateStream(device_);
      auto join = runtime_->CreateEvent(device_);
      if (stream.ok()) lane->streams[s] = *stream;
      if (join.ok()) lane->joins[s] = *join;
      st.Update(stream.status());
      st.Update(join.status());
    }
    if (st.ok()) {
      auto gate = runtime_->CreateEvent(device_);
      if (gate.ok()) lane->gate = *gate;
      st.Update(gate.status());
    }
    if (!st.ok()) {
      Destroy(*lane);
      return st;
    }
    lanes_.push_back(std::move(lane));
    own = lanes_.back().get();
  }
  // Idle lanes beyond what is kept go (their streams have nothing queued).
  for (size_t i = 0; lanes_.size() > kept_ && i < lanes_.size();) {
    Lane* l = lanes_[i].get();
    if (l != own && l->open.load(std::memory_order_acquire) == 0) {
      Destroy(*l);
      lanes_.erase(lanes_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  return last_ = own;
}

void LaneSet::Destroy(Lane& lane) {
  for (GpuStream s : lane.streams) {
    if (s != nullptr) runtime_->DestroyStream(device_, s);
  }
  for (GpuEvent e : lane.joins) {
    if (e != nullptr) runtime_->DestroyEvent(device_, e);
  }
  if (lane.gate != nullptr) runtime_->DestroyEvent(device_, lane.gate);
}

}  // namespace dmagather::server::engines::gpu
