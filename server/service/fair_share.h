// FairShare: who gets a connection slot when local users compete for one
// table (the fd channel's connections, the control socket's connections).
// Pure bookkeeping, no I/O, no lock: the owner calls it from its one thread.
//
// Rules: a uid may hold at most `per_uid` slots; when all `total` slots are
// taken, a newcomer takes the oldest slot of the uid that holds the most,
// if that uid holds more than the newcomer's uid would after admission;
// otherwise the newcomer is refused. So one user's flood can fill at most
// its own share, and can never keep another user out.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

namespace dmagather::server::service {

class FairShare {
 public:
  enum class Verdict { kAdmit, kEvict, kRefuse };
  struct Decision {
    Verdict verdict = Verdict::kRefuse;
    uid_t evict_uid = 0;  // kEvict: whose oldest slot goes.
    std::string why;      // kRefuse: a sentence for the log and the counters.
  };

  FairShare(int total, int per_uid) : total_(total), per_uid_(per_uid) {}

  // What to do with a new connection of `uid` (changes nothing).
  Decision Decide(uid_t uid) const;
  void Add(uid_t uid);
  void Remove(uid_t uid);

  int count(uid_t uid) const;
  int total_used() const { return used_; }
  int uids() const { return static_cast<int>(per_uid_count_.size()); }

 private:
  const int total_;
  const int per_uid_;
  int used_ = 0;
  std::map<uid_t, int> per_uid_count_;
};

}  // namespace dmagather::server::service
