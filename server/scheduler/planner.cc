#include "server/scheduler/planner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"

namespace dmagather::server::scheduler {
namespace {

std::string ItemShape(const Item& it) {
  return absl::StrCat(OpKindName(it.kind), " count=", it.count, " dtype=", common::DtypeName(it.dtype));
}

bool SameItem(const Item& x, const Item& y) { return x.kind == y.kind && x.count == y.count && x.dtype == y.dtype; }

// -1 when `a` and `b` agree; else the first item that differs (or the
// shorter item count when only the numbers of items differ).
int FirstDifference(const RankPart& a, const RankPart& b) {
  const size_t n = std::min(a.items.size(), b.items.size());
  for (size_t i = 0; i < n; ++i) {
    if (!SameItem(a.items[i], b.items[i])) return static_cast<int>(i);
  }
  return a.items.size() == b.items.size() ? -1 : static_cast<int>(n);
}

// What rank `p` asked for where it differs from rank 0 (item `i`): the
// difference first, so it survives the error record's 240-byte limit.
std::string ShapeAt(const RankPart& p, int i, bool coalesced) {
  if (!coalesced) return ItemShape(p.items[0]);
  if (static_cast<size_t>(i) >= p.items.size()) return absl::StrCat(p.items.size(), " items");
  return absl::StrCat("item ", i, " ", ItemShape(p.items[i]), " (of ", p.items.size(), ")");
}

}  // namespace

absl::Status CheckAgreement(const Op& op) {
  // The reference is the first rank here (rank 0 unless the job spans nodes).
  size_t ref_rank = 0;
  while (ref_rank + 1 < op.parts.size() && !op.parts[ref_rank].arrived) ++ref_rank;
  const RankPart& ref = op.parts[ref_rank];
  std::vector<int> differ, where;
  bool coalesced = ref.items.size() != 1;
  for (size_t r = ref_rank + 1; r < op.parts.size(); ++r) {
    if (!op.parts[r].arrived) continue;  // On another node: the ring compares nodes.
    const int d = FirstDifference(op.parts[r], ref);
    if (d < 0) continue;
    differ.push_back(int(r));
    where.push_back(d);
    coalesced |= op.parts[r].items.size() != 1;
  }
  if (differ.empty()) return absl::OkStatus();
  std::string detail = absl::StrCat("rank ", ref_rank, " asked for ", ShapeAt(ref, where[0], coalesced));
  for (size_t k = 0; k < differ.size(); ++k) {
    absl::StrAppend(&detail, ", rank ", differ[k], " for ", ShapeAt(op.parts[differ[k]], where[k], coalesced));
  }
  return absl::InvalidArgumentError(absl::StrCat(OpKindName(ref.items[0].kind), " #", op.seq,
                                                 ": ranks disagree (ranks ", absl::StrJoin(differ, ","),
                                                 " differ from rank ", ref_rank, "): ", detail));
}

namespace {

// An all-to-all item: chunk `dst` of every rank's send into chunk `src` of
// rank dst's output.
void PlanAllToAll(Op* op, size_t i, uint64_t bytes) {
  const int world = static_cast<int>(op->parts.size());
  for (int dst = 0; dst < world; ++dst) {
    const RankPart& d = op->parts[dst];
    if (!d.arrived) continue;
    const Item& out = d.items[i];
    for (int src = 0; src < world; ++src) {
      const Item& in = op->parts[src].items[i];
      if (src == dst && in.a2a.skip_self) continue;  // The rank moves or reads its own chunk itself.
      char* to = d.recv[out.recv_begin] + uint64_t(src) * out.a2a.recv_stride;
      const char* from = in.send + uint64_t(dst) * in.a2a.send_stride;
      op->plan.copies.push_back(engines::CopyCmd{to, from, bytes, src, dst});
      op->plan.bytes += bytes;
    }
  }
}

}  // namespace

void BuildPlan(Op* op) {
  op->plan.Clear();
  const int world = static_cast<int>(op->parts.size());
  int ref = 0;
  while (ref + 1 < world && !op->parts[ref].arrived) ++ref;
  const size_t n_items = op->parts[ref].items.size();
  for (size_t i = 0; i < n_items; ++i) {
    const Item& shape = op->parts[ref].items[i];
    const uint64_t bytes = shape.count * common::DtypeSize(shape.dtype);
    if (bytes == 0) continue;
    if (IsAllToAll(shape.kind)) {
      PlanAllToAll(op, i, bytes);  // Within one node: every part arrived.
      continue;
    }
    const bool list = shape.kind == OpKind::kAllGatherList;
    for (int dst = 0; dst < world; ++dst) {
      const RankPart& d = op->parts[dst];
      if (!d.arrived) continue;  // On another node (its shards come over the ring).
      const Item& out = d.items[i];
      for (int src = 0; src < world; ++src) {
        if (!op->parts[src].arrived) continue;
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
