#include "server/scheduler/planner.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"

namespace dmagather::server::scheduler {
namespace {

const char* OpName(OpKind kind) { return kind == OpKind::kAllGatherList ? "allgather_list" : "allgather"; }

std::string Shape(const RankPart& p) {
  if (p.items.size() == 1) {
    const Item& it = p.items[0];
    return absl::StrCat(OpName(it.kind), " count=", it.count, " dtype=", common::DtypeName(it.dtype));
  }
  std::vector<std::string> items;
  for (const Item& it : p.items) {
    items.push_back(absl::StrCat(OpName(it.kind), " count=", it.count, " dtype=", common::DtypeName(it.dtype)));
  }
  return absl::StrCat(p.items.size(), " items [", absl::StrJoin(items, "; "), "]");
}

bool SameShape(const RankPart& a, const RankPart& b) {
  if (a.items.size() != b.items.size()) return false;
  for (size_t i = 0; i < a.items.size(); ++i) {
    const Item& x = a.items[i];
    const Item& y = b.items[i];
    if (x.kind != y.kind || x.count != y.count || x.dtype != y.dtype) return false;
  }
  return true;
}

}  // namespace

absl::Status CheckAgreement(const Op& op) {
  const RankPart& ref = op.parts[0];
  std::vector<int> differ;
  for (size_t r = 1; r < op.parts.size(); ++r) {
    if (!SameShape(op.parts[r], ref)) differ.push_back(int(r));
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
  const size_t n_items = op->parts[0].items.size();
  for (size_t i = 0; i < n_items; ++i) {
    const Item& shape = op->parts[0].items[i];
    const uint64_t bytes = shape.count * common::DtypeSize(shape.dtype);
    if (bytes == 0) continue;
    const bool list = shape.kind == OpKind::kAllGatherList;
    for (int dst = 0; dst < world; ++dst) {
      const RankPart& d = op->parts[dst];
      const Item& out = d.items[i];
      for (int src = 0; src < world; ++src) {
        char* to = list ? d.recv[out.recv_begin + src] : d.recv[out.recv_begin] + uint64_t(src) * bytes;
        const char* from = op->parts[src].items[i].send;
        if (to == from) continue;  // In place: the shard is already where it belongs.
        op->plan.copies.push_back(engines::CopyCmd{to, from, bytes, src, dst});
        op->plan.bytes += bytes;
      }
    }
  }
}

}  // namespace dmagather::server::scheduler
