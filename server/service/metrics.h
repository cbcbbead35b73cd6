// Prometheus text exposition (format 0.0.4) of the daemon's telemetry,
// rendered from the same StatsReply/HealthReply that dmagatherctl shows, so
// the two never disagree.
#pragma once

#include <string>

#include "dmagather/v1/telemetry.pb.h"

namespace dmagather::server::service {

std::string RenderPrometheus(const v1::HealthReply& health, const v1::StatsReply& stats);

}  // namespace dmagather::server::service
