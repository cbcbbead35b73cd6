// PeerService, the coordinator's side (the daemon a job id names): every
// node's reports of its ranks, the node table once every rank of the world
// is placed (and, for a job coming back, every node's newest op done), and
// a setup that cannot go on (a node's daemon went away before the table, or
// came back after it).
#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "server/cluster/frame.h"
#include "server/cluster/peer_io.h"
#include "server/cluster/peer_service.h"

namespace dmagather::server::cluster {
namespace {

// The nodes' reports, as far as taking a job back goes: how many nodes say
// their ranks come back, how many of those have every rank's Resume, and the
// newest op done on any of them. Also refuses two ring versions in one job.
struct ResumeCount {
  int resuming = 0, ready = 0;
  uint32_t start_after = 0;
  void Add(const v1::NodeUpdate& u, std::string* error) {
    const uint32_t version = std::max<uint32_t>(1, u.ring_version());
    if (version != kRingVersion) {
      *error = absl::StrCat("node ", u.hostname(), " ", u.peer_address(), " runs ring version ", version,
                            ", the coordinator ", kRingVersion, ": run one dmagatherd version on every node");
    }
    if (!u.resuming()) return;
    if (resuming == 0 || int32_t(u.done_seq() - start_after) > 0) start_after = u.done_seq();
    ++resuming;
    ready += u.resume_ready();
  }
};

}  // namespace

void PeerService::ServeCoordinator(const std::shared_ptr<Pending>& p, transport::Connection& conn) {
  auto me = std::make_shared<CoordNode>();
  {
    absl::MutexLock lock(&p->mu);
    p->nodes.push_back(me);
  }
  for (;;) {
    v1::NodeTable t;
    int index = -1;
    bool ready;
    {
      absl::MutexLock lock(&p->mu);
      ready = p->table_ready;
      if (ready) t = p->table;
      for (int i = 0; ready && i < t.nodes_size(); ++i) {
        if (me->have && t.nodes(i).peer_address() == me->update.peer_address()) index = i;
      }
    }
    if (ready) {
      if (index < 0 && t.error().empty()) {
        const auto job = p->job.lock();
        if (job != nullptr && job->resuming()) {
          // A node's daemon came back after the table went out: the ring of
          // this round cannot form (its links were the dead daemon's). Every
          // node starts over (each hands the job back once more).
          t.set_failed_node("a node whose daemon came back after the node table");
          t.set_error("a node's dmagatherd came back after the node table was sent; the setup starts over");
          absl::MutexLock lock(&p->mu);
          p->stale = true;
          p->cv.SignalAll();
        } else {
          t.set_error("this node has no rank of the job");
        }
      }
      t.set_your_index(index);
      (void)WriteMessage(conn, t);
      return;
    }
    if (options_.clock->Now() > p->deadline) return;
    if (stopping()) return;
    if (!Readable(conn, 50)) continue;
    v1::NodeUpdate u;
    if (!ReadMessage(conn, &u).ok()) {
      // The node's daemon went away (its connection closed) before the
      // table: the job cannot start; every node waiting hears it now.
      absl::MutexLock lock(&p->mu);
      FailSetupLocked(*p, me->have ? absl::StrCat(me->update.hostname(), " ", me->update.peer_address())
                                   : std::string("a node not yet reported"));
      return;
    }
    absl::MutexLock lock(&p->mu);
    LOG(INFO) << "job '" << u.job_key() << "': node " << u.hostname() << " " << u.peer_address() << " reported "
              << u.ranks_size() << " of " << u.world_size() << " ranks";
    me->update = std::move(u);
    me->have = true;
    MaybeBuildTableLocked(*p);
  }
}

void PeerService::FailSetupLocked(Pending& p, const std::string& node) {
  if (p.table_ready) return;
  p.table.Clear();
  p.table.set_failed_node(node);
  p.table.set_error(absl::StrCat("node ", node, " failed: its daemon went away while the job was being set up"));
  LOG(WARNING) << "multi-node job cannot start: " << p.table.error();
  p.table_ready = true;
  p.cv.SignalAll();
}

std::string PeerService::MissingRanks(Pending& p, int world_size) {
  std::set<int> placed;
  absl::MutexLock lock(&p.mu);
  for (const auto& node : p.nodes) {
    if (node->have) placed.insert(node->update.ranks().begin(), node->update.ranks().end());
  }
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) {
    if (placed.count(r) == 0) missing.push_back(r);
  }
  if (missing.empty()) return "every rank is back, but not every node's ranks called Resume";
  return absl::StrCat("rank(s) ", absl::StrJoin(missing, ","),
                      " did not come back (their node's dmagatherd, or "
                      "the ranks themselves)");
}

void PeerService::MaybeBuildTableLocked(Pending& p) {
  if (p.table_ready) return;
  int world = -1;
  std::map<int, int> placed;  // rank -> node (index into p.nodes)
  std::string error;
  int reported = 0;
  ResumeCount back;
  for (size_t n = 0; n < p.nodes.size(); ++n) {
    const CoordNode& node = *p.nodes[n];
    if (!node.have) continue;
    ++reported;
    back.Add(node.update, &error);
    if (world < 0) world = node.update.world_size();
    if (node.update.world_size() != world) {
      error = absl::StrCat("nodes disagree on the world size (", world, " vs ", node.update.world_size(), " at ",
                           node.update.peer_address(), ")");
    }
    for (int r : node.update.ranks()) {
      auto [it, fresh] = placed.emplace(r, int(n));
      if (!fresh && it->second != int(n)) {
        error = absl::StrCat("rank ", r, " joined on two nodes (", p.nodes[it->second]->update.peer_address(), " and ",
                             node.update.peer_address(), ")");
      }
    }
  }
  const int resuming = back.resuming, ready = back.ready;
  const uint32_t start_after = back.start_after;
  if (resuming != 0 && resuming != reported) {
    error = "some nodes take the job back from its ranks and others joined it new (a rank process restarted?)";
  }
  if (error.empty() && (world < 0 || int(placed.size()) != world)) return;  // Not everyone yet.
  // Taking a job back: once every node's ranks are back, every node starts
  // after the newest op done on any (ring_state.h: it ended everywhere).
  if (error.empty() && resuming != 0 && ready != resuming) return;
  v1::NodeTable& t = p.table;
  t.set_error(error);
  if (resuming != 0) {
    t.set_resumed(true);
    t.set_start_after(start_after);
  }
  if (error.empty()) {
    std::vector<std::pair<int, int>> by_lowest;  // (lowest rank, node): nodes in the order of their lowest rank.
    for (size_t n = 0; n < p.nodes.size(); ++n) {
      const v1::NodeUpdate& u = p.nodes[n]->update;
      if (p.nodes[n]->have && u.ranks_size() > 0) {
        by_lowest.emplace_back(*std::min_element(u.ranks().begin(), u.ranks().end()), int(n));
      }
    }
    std::sort(by_lowest.begin(), by_lowest.end());
    std::vector<int> order;
    for (const auto& [lowest, n] : by_lowest) order.push_back(n);
    bool all_verbs = true;
    for (int n : order) {
      const v1::NodeUpdate& u = p.nodes[n]->update;
      v1::NodeEntry* e = t.add_nodes();
      e->set_peer_address(u.peer_address());
      e->set_hostname(u.hostname());
      std::vector<int> ranks(u.ranks().begin(), u.ranks().end());
      std::sort(ranks.begin(), ranks.end());
      for (int r : ranks) e->add_ranks(r);
      all_verbs &= u.transport() == "ibverbs";
    }
    t.set_links(options_.links);
    t.set_chunk_bytes(options_.chunk_bytes);
    t.set_transport(all_verbs ? "ibverbs" : "tcp");
    LOG(INFO) << "job '" << p.nodes[order[0]]->update.job_key() << "': all " << world << " ranks placed on "
              << order.size() << " node(s); sending the node table";
  } else {
    LOG(WARNING) << "multi-node job cannot start: " << error;
  }
  p.table_ready = true;
  p.cv.SignalAll();
}

}  // namespace dmagather::server::cluster
