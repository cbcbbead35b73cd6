#include "server/service/ticket_table.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "common/status.h"

namespace dmagather::server::service {
namespace {

constexpr size_t kTicketBytes = 16;

}  // namespace

void TicketTable::EraseLocked(Map::iterator it) {
  auto u = per_uid_.find(it->second.handover.uid);
  if (u != per_uid_.end() && --u->second <= 0) per_uid_.erase(u);
  entries_.erase(it);
}

absl::StatusOr<std::string> TicketTable::Issue(Handover h) {
  DMAG_ASSIGN_OR_RETURN(std::string ticket, common::RandomBytes(kTicketBytes));
  std::vector<Handover> expired;  // Closed outside the lock.
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock->Now();
  int& held = per_uid_[h.uid];
  if (held >= options_.max_per_uid) {
    // Expired ones do not count.
    for (auto it = entries_.begin(); it != entries_.end();) {
      auto cur = it++;
      if (cur->second.handover.uid == h.uid && cur->second.expires <= now) {
        expired.push_back(std::move(cur->second.handover));
        --held;  // (per_uid_ entry stays: it is incremented below or checked.)
        entries_.erase(cur);
      }
    }
    if (held >= options_.max_per_uid) {
      return absl::ResourceExhaustedError(absl::StrCat("uid ", h.uid, " already holds ", held,
                                                       " unclaimed descriptor hand-overs (the limit); claim them "
                                                       "with Join/Register or wait ",
                                                       absl::FormatDuration(options_.ttl), " for them to expire"));
    }
  }
  ++held;
  entries_.emplace(ticket, Entry{std::move(h), now + options_.ttl});
  return ticket;
}

absl::StatusOr<Handover> TicketTable::Take(const std::string& ticket, uint32_t kind) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(ticket);
  if (it == entries_.end()) {
    return absl::NotFoundError("unknown ticket (never issued, already used or expired)");
  }
  Entry e = std::move(it->second);
  EraseLocked(it);
  if (e.expires <= options_.clock->Now()) {
    return absl::NotFoundError("unknown ticket (never issued, already used or expired)");
  }
  if (e.handover.kind != kind) {
    return absl::NotFoundError("the ticket is for another kind of hand-over (segment vs buffer)");
  }
  return std::move(e.handover);
}

void TicketTable::Expire() {
  std::vector<Handover> expired;
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock->Now();
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto cur = it++;
    if (cur->second.expires <= now) {
      expired.push_back(std::move(cur->second.handover));
      EraseLocked(cur);
    }
  }
}

size_t TicketTable::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace dmagather::server::service
