#include "server/service/captured_defs.h"

#include <cstring>

#include "abi/descriptor_v2.h"
#include "abi/ring_v1.h"
#include "absl/strings/str_cat.h"
#include "server/ingress/decoder.h"
#include "server/ingress/ingress.h"

namespace dmagather::server::service {

static_assert(sizeof(abi::DescriptorV2) == sizeof(abi::DescriptorV1), "a ring slot holds one descriptor");

absl::StatusOr<scheduler::RankPart> DecodeCaptured(const CapturedDefinition& def, int rank, int world_size,
                                                   const ingress::RegionTable& regions) {
  const std::string what =
      absl::StrCat("rank ", rank, ": captured op #", def.seq, " (graph slot ", def.slot, ") handed back: ");
  const size_t n = def.descriptors.size() / sizeof(abi::DescriptorV1);
  if (n == 0 || n > abi::kMaxItemsPerOpV2 || def.descriptors.size() % sizeof(abi::DescriptorV1) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, def.descriptors.size(), " bytes are not 1 to ", abi::kMaxItemsPerOpV2, " descriptors"));
  }
  scheduler::RankPart part;
  for (size_t i = 0; i < n; ++i) {
    abi::DescriptorV1 slot;
    std::memcpy(&slot, def.descriptors.data() + i * sizeof(slot), sizeof(slot));
    scheduler::Request req;
    ingress::DecodeDescriptor(slot, &req);
    if (req.graph_slot != int(def.slot) || req.items_following != n - 1 - i) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "descriptor ", i, " is not item ", i, " of ", n, " of a captured op in that slot"));
    }
    ingress::Ingress::Validate(req, def.seq, rank, regions, world_size, &part);
    if (!part.status.ok()) return absl::Status(part.status.code(), absl::StrCat(what, part.status.message()));
  }
  return part;
}

}  // namespace dmagather::server::service
