// A resumed rank's captured (CUDA-graph) ops, as its Resume hands them back
// (control.proto CapturedOp): each definition's descriptors, as the rank
// published them to the earlier daemon, read again the way the ingress
// thread reads a ring (decoder, Ingress::Validate) against the regions the
// rank registered again under their old ids.
//
// Threads: the gRPC thread of the Resume (the session's regions are
// thread-safe); pure otherwise.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "server/ingress/region_table.h"
#include "server/scheduler/request.h"

namespace dmagather::server::service {

struct CapturedDefinition {
  uint32_t seq = 0;         // The definition's op.
  uint32_t slot = 0;        // The rank's graph slot.
  std::string descriptors;  // abi::DescriptorV2 each, as published.
};

// The rank's part of the definition: its items resolved, graph_slot set; an
// error naming the rank and the op when the descriptors are not a whole
// captured op of that slot.
absl::StatusOr<scheduler::RankPart> DecodeCaptured(const CapturedDefinition& def, int rank, int world_size,
                                                   const ingress::RegionTable& regions);

}  // namespace dmagather::server::service
