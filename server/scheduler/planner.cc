#include "server/scheduler/planner.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "abi/descriptor_v1.h"
#include "common/dtype.h"

namespace dmagather::server::scheduler {
namespace {

const char* OpName(uint32_t opcode) {
  return opcode == abi::kOpAllGatherList ? "allgather_list" : "allgather";
}

std::string Shape(const RankPart& p) {
  return absl::StrCat(OpName(p.opcode), " count=", p.count, " dtype=", common::DtypeName(p.dtype));
}

}  // namespace

absl::Status CheckAgreement(const Op& op) {
  const RankPart& ref = op.parts[0];
  std::vector<int> differ;
  for (size_t r = 1; r < op.parts.size(); ++r) {
    const RankPart& p = op.parts[r];
    if (p.opcode != ref.opcode || p.count != ref.count || p.dtype != ref.dtype) differ.push_back(int(r));
  }
  if (differ.empty()) return absl::OkStatus();
  std::string detail = absl::StrCat("rank 0 asked for ", Shape(ref));
  for (int r : differ) absl::StrAppend(&detail, ", rank ", r, " for ", Shape(op.parts[r]));
  return absl::InvalidArgumentError(absl::StrCat("allgather #", op.seq, ": ranks disagree (ranks ",
                                                 absl::StrJoin(differ, ","), " differ from rank 0): ",
                                                 detail));
}

void BuildPlan(Op* op) {
  op->plan.Clear();
  const int world = static_cast<int>(op->parts.size());
  const uint64_t bytes = op->parts[0].count * common::DtypeSize(op->parts[0].dtype);
  if (bytes == 0) return;
  const bool list = op->parts[0].opcode == abi::kOpAllGatherList;
  for (int dst = 0; dst < world; ++dst) {
    const RankPart& d = op->parts[dst];
    for (int src = 0; src < world; ++src) {
      char* to = list ? d.recv[src] : d.recv[0] + uint64_t(src) * bytes;
      const char* from = op->parts[src].send;
      if (to == from) continue;  // In place: the shard is already where it belongs.
      op->plan.copies.push_back(engines::CopyCmd{to, from, bytes, src, dst});
      op->plan.bytes += bytes;
    }
  }
}

}  // namespace dmagather::server::scheduler
