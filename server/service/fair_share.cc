#include "server/service/fair_share.h"

#include "absl/strings/str_cat.h"

namespace dmagather::server::service {

FairShare::Decision FairShare::Decide(uid_t uid) const {
  Decision d;
  const int mine = count(uid);
  if (per_uid_ > 0 && mine >= per_uid_) {
    d.why = absl::StrCat("uid ", uid, " already holds ", mine, " connections, its share");
    return d;
  }
  if (total_ <= 0 || used_ < total_) {
    d.verdict = Verdict::kAdmit;
    return d;
  }
  // Full: the uid holding the most gives up its oldest slot, if it holds
  // more than this uid would.
  uid_t top = 0;
  int most = 0;
  for (const auto& [u, n] : per_uid_count_) {
    if (n > most) {
      most = n;
      top = u;
    }
  }
  if (most > mine + 1) {
    d.verdict = Verdict::kEvict;
    d.evict_uid = top;
    return d;
  }
  d.why = absl::StrCat("all ", total_, " connection slots are taken and no user holds more than uid ", uid, " would");
  return d;
}

void FairShare::Add(uid_t uid) {
  ++per_uid_count_[uid];
  ++used_;
}

void FairShare::Remove(uid_t uid) {
  auto it = per_uid_count_.find(uid);
  if (it == per_uid_count_.end()) return;
  --used_;
  if (--it->second == 0) per_uid_count_.erase(it);
}

int FairShare::count(uid_t uid) const {
  auto it = per_uid_count_.find(uid);
  return it == per_uid_count_.end() ? 0 : it->second;
}

}  // namespace dmagather::server::service
