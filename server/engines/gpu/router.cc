// Router: see router.h.
#include "server/engines/gpu/router.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/engines/gpu/gpu_rank.h"

namespace dmagather::server::engines::gpu {

Router::Router(const PeerTable& peers, std::string label)
    : peers_(peers), label_(std::move(label)), involved_(peers_.devices(), 0) {}

int Router::shares() const {
  int n = 0;
  for (char c : involved_) n += c ? 1 : 0;
  return n;
}

void Router::Count(uint64_t same, uint64_t pushes) {
  if (same != 0) {
    same_device_.fetch_add(same, std::memory_order_relaxed);
    std::call_once(same_device_logged_, [] {
      LOG(WARNING) << "ranks share a GPU: their AllGather copies are same-device copies, which the driver runs on "
                      "SMs/CUs (not DMA engines) when issued from dmagatherd; they time-slice with the ranks' "
                      "kernels. Counted as fallback 'same_device_copy_on_sm'. Run one rank per GPU to avoid it.";
    });
  }
  if (pushes != 0) pushes_.fetch_add(pushes, std::memory_order_relaxed);
}

absl::Status Router::Route(EngineOp* op) {
  std::fill(involved_.begin(), involved_.end(), 0);
  const int devices = peers_.devices();
  uint64_t same = 0, pushes = 0;
  absl::Status st;
  const int n = static_cast<int>(op->ranks.size());
  for (CopyCmd& c : op->plan.copies) {
    const int dd = c.dst_rank < n && op->ranks[c.dst_rank] != nullptr ? AsGpu(op->ranks[c.dst_rank])->device() : -1;
    const int sd = c.src_rank < n && op->ranks[c.src_rank] != nullptr ? AsGpu(op->ranks[c.src_rank])->device() : -1;
    if (dd < 0 || dd >= devices) {
      st = absl::InternalError(absl::StrCat("rank ", c.dst_rank, " has no ", label_, " device known to the engine"));
      break;
    }
    c.src_device = sd;
    c.dst_device = dd;
    const int on = peers_.IssuingDevice(sd, dd);
    if (on < 0) {
      st = common::FallbackError(absl::StrCat("rank ", c.src_rank, " (device ", sd, ") and rank ", c.dst_rank,
                                              " (device ", dd, ") are on GPUs that reach each other neither way (",
                                              peers_.why(dd, sd),
                                              "), so no copy engine can move "
                                              "bytes between them"));
      break;
    }
    involved_[on] = 1;
    if (sd == dd) {
      ++same;
    } else if (on != dd) {
      ++pushes;
    }
  }
  Count(same, pushes);
  return st;
}

}  // namespace dmagather::server::engines::gpu
