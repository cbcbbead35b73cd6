#include "server/cluster/peer_service.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "glog/logging.h"
#include "server/cluster/peer_io.h"
#include "server/cluster/ring.h"
#include "server/transport/tcp_transport.h"

namespace dmagather::server::cluster {
namespace {

// Waits up to `ms` for `conn` to have bytes to read.
bool Readable(transport::Connection& conn, int ms) {
  pollfd p{conn.fd(), POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

std::string Hostname() {
  char h[256] = {};
  gethostname(h, sizeof(h) - 1);
  return h;
}

// The job's topology as the coordinator's table gives it.
std::shared_ptr<scheduler::Topology> TopologyOf(const v1::NodeTable& table, int world_size) {
  auto topo = std::make_shared<scheduler::Topology>();
  topo->world_size = world_size;
  topo->my_node = table.your_index();
  topo->node_of_rank.assign(world_size, -1);
  for (int n = 0; n < table.nodes_size(); ++n) {
    const v1::NodeEntry& e = table.nodes(n);
    topo->node_ranks.emplace_back(e.ranks().begin(), e.ranks().end());
    topo->node_names.push_back(absl::StrCat(e.hostname(), " ", e.peer_address()));
    for (int r : e.ranks()) {
      if (r >= 0 && r < world_size) topo->node_of_rank[r] = n;
    }
  }
  return topo;
}

}  // namespace

PeerService::PeerService(const PeerOptions& options, engines::CopyEngine* engine)
    : options_(options), engine_(engine) {}

absl::StatusOr<std::unique_ptr<PeerService>> PeerService::Create(const PeerOptions& options,
                                                                 engines::CopyEngine* engine) {
  if (options.links < 1 || options.links > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--peer_links=", options.links, " is outside 1..64"));
  }
  if (options.chunk_bytes < 4096 || options.chunk_bytes > (64u << 20)) {
    return absl::InvalidArgumentError("--ring_chunk_kib must be within 4..65536");
  }
  std::unique_ptr<PeerService> s(new PeerService(options, engine));
  s->tcp_ = transport::MakeTcpTransport();
  DMAG_ASSIGN_OR_RETURN(s->transport_, transport::CreateTransport(options.transport, &s->transport_reason_));
  LOG(INFO) << "peer transport: " << s->transport_->name() << " (" << s->transport_reason_ << ")";
  DMAG_ASSIGN_OR_RETURN(s->listener_, s->tcp_->Listen(options.listen));
  s->address_ = options.advertise.empty() ? s->listener_->address() : options.advertise;
  std::string host;
  int port = 0;
  DMAG_RETURN_IF_ERROR(transport::SplitHostPort(s->address_, &host, &port));
  if (host == "0.0.0.0" || host == "::" || host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--peer_listen=", options.listen,
                                                   " binds every address: give --peer_advertise=HOST:PORT, the "
                                                   "address other nodes' daemons reach this one at"));
  }
  s->accept_thread_ = std::thread(&PeerService::AcceptLoop, s.get());
  LOG(INFO) << "peer listener on " << s->listener_->address() << " (advertised as " << s->address_ << ")";
  return s;
}

PeerService::~PeerService() { Stop(); }

void PeerService::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [tag, p] : pending_) p->cv.SignalAll();
  }
  listener_->Shutdown();
  if (accept_thread_.joinable()) accept_thread_.join();
  absl::MutexLock lock(&mu_);
  while (threads_ != 0) threads_cv_.Wait(&mu_);
}

bool PeerService::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

absl::StatusOr<std::string> PeerService::NewJobId() const { return MakeJobId(address_); }

PeerStats PeerService::stats() const {
  PeerStats st;
  st.address = address_;
  st.transport = transport_->name();
  st.transport_reason = transport_reason_;
  st.auth_failures = auth_failures_.load();
  return st;
}

std::shared_ptr<PeerService::Pending> PeerService::Find(const std::string& tag) const {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(tag);
  return it == pending_.end() ? nullptr : it->second;
}

void PeerService::Forget(const std::shared_ptr<Pending>& p) {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(p->id.tag);
  if (it != pending_.end() && it->second == p) pending_.erase(it);
}

absl::Status PeerService::AddRank(const std::shared_ptr<scheduler::Job>& job, const std::string& job_id,
                                  absl::Duration timeout) {
  DMAG_ASSIGN_OR_RETURN(JobId id, ParseJobId(job_id));
  std::shared_ptr<Pending> p;
  bool start = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("dmagatherd is shutting down");
    auto it = pending_.find(id.tag);
    if (it != pending_.end()) {
      p = it->second;
      if (p->job.lock() != job) {
        return absl::AlreadyExistsError(
            "another job on this daemon is already using that job id (each job needs its own)");
      }
    } else {
      p = std::make_shared<Pending>();
      p->id = id;
      p->job = job;
      p->deadline = options_.clock->Now() + timeout;
      p->coordinator = id.address == address_;
      pending_[id.tag] = p;
      start = true;
      ++threads_;
    }
  }
  {
    absl::MutexLock lock(&p->mu);
    p->changed = true;
  }
  p->cv.SignalAll();
  if (start) std::thread(&PeerService::Bootstrap, this, p).detach();
  return absl::OkStatus();
}

void PeerService::AcceptLoop() {
  for (;;) {
    auto conn = listener_->Accept();
    if (!conn.ok()) {
      if (!absl::IsCancelled(conn.status())) LOG(WARNING) << "peer listener: " << conn.status();
      return;
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    ++threads_;
    std::thread(&PeerService::Handle, this, std::move(*conn)).detach();
  }
}

void PeerService::Handle(std::unique_ptr<transport::Connection> conn) {
  SetRecvTimeout(*conn, options_.handshake_timeout);
  std::string nonce;
  auto hello = ReadHello(*conn, &nonce);
  std::shared_ptr<Pending> p;
  if (hello.ok()) {
    p = Find(hello->job_tag());
    absl::Status st = FinishServerHandshake(*conn, *hello, nonce, p != nullptr ? p->id.secret : "");
    if (!st.ok()) {
      if (absl::IsPermissionDenied(st)) {
        auth_failures_.fetch_add(1);
        LOG(WARNING) << st.message();
      }
      p = nullptr;
    }
  } else {
    VLOG(1) << "peer " << conn->peer() << ": " << hello.status();
  }
  if (p != nullptr && hello->role() == "coord" && p->coordinator) {
    SetRecvTimeout(*conn, absl::ZeroDuration());
    ServeCoordinator(p, *conn);
  } else if (p != nullptr && hello->role() == "ring" && hello->link() >= 0 && hello->link() < options_.links) {
    SetRecvTimeout(*conn, absl::ZeroDuration());
    // The accepting end upgrades here, so no node waits on its own links in a cycle.
    auto link = transport_->Upgrade(std::move(conn), /*initiator=*/false);
    if (!link.ok()) {
      LOG(WARNING) << "ring link from " << hello->node() << ": " << link.status();
    } else {
      absl::MutexLock lock(&p->mu);
      if (p->prev_links.empty()) {
        p->prev_links.resize(options_.links);
        p->prev_from.assign(options_.links, -1);
      }
      if (p->prev_links[hello->link()] == nullptr) {
        p->prev_links[hello->link()] = std::move(*link);
        p->prev_from[hello->link()] = hello->node();
        ++p->prev_count;
      }
      p->cv.SignalAll();
    }
  }
  absl::MutexLock lock(&mu_);
  if (--threads_ == 0) threads_cv_.SignalAll();
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
  int resuming = 0, ready = 0, reported = 0;
  uint32_t start_after = 0;
  for (size_t n = 0; n < p.nodes.size(); ++n) {
    const CoordNode& node = *p.nodes[n];
    if (!node.have) continue;
    ++reported;
    const uint32_t version = std::max<uint32_t>(1, node.update.ring_version());
    if (version != kRingVersion) {
      error = absl::StrCat("node ", node.update.hostname(), " ", node.update.peer_address(), " runs ring version ",
                           version, ", the coordinator ", kRingVersion, ": run one dmagatherd version on every node");
    }
    if (node.update.resuming()) {
      const uint32_t d = node.update.done_seq();
      if (ready == 0 || int32_t(d - start_after) > 0) start_after = d;  // The newest op done anywhere.
      ++resuming;
      ready += node.update.resume_ready();
    }
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
      if (index < 0 && t.error().empty()) t.set_error("this node has no rank of the job");
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

absl::StatusOr<std::unique_ptr<transport::Connection>> PeerService::Dial(const Pending& p, const std::string& address,
                                                                         v1::PeerHello hello) {
  hello.set_job_tag(p.id.tag);
  absl::Status last = absl::DeadlineExceededError("not tried");
  while (options_.clock->Now() < p.deadline) {
    if (stopping()) return absl::UnavailableError("dmagatherd is shutting down");
    auto conn = tcp_->Connect(address, std::min(absl::Seconds(2), p.deadline - options_.clock->Now()));
    if (conn.ok()) {
      SetRecvTimeout(**conn, options_.handshake_timeout);
      bool retry = false;
      last = ClientHandshake(**conn, p.id.secret, hello, &retry);
      if (last.ok()) {
        SetRecvTimeout(**conn, absl::ZeroDuration());
        return std::move(*conn);
      }
      if (!retry) return last;
    } else {
      last = conn.status();
    }
    usleep(100000);
  }
  return absl::DeadlineExceededError(absl::StrCat("could not reach the daemon at ", address, ": ", last.message()));
}

void PeerService::Bootstrap(std::shared_ptr<Pending> p) {
  std::shared_ptr<scheduler::Job> job = p->job.lock();
  if (job != nullptr) {
    absl::Status st = RunBootstrap(*p, job);
    const bool lost = absl::IsAborted(st) || absl::IsDeadlineExceeded(st) || absl::IsUnavailable(st);
    if (!st.ok() && lost && job->resuming() && options_.clock->Now() < p->deadline && !stopping() &&
        job->HandBack(st)) {
      // Taking the job back, a node's daemon went away again (or the
      // coordinator's) before the ring formed: the ranks join once more,
      // and the setup starts over, within their grace period.
      LOG(WARNING) << "job '" << job->key() << "': the ring did not form again (" << st.message()
                   << "); handing the job back to its ranks once more";
      st = absl::OkStatus();
    } else if (!st.ok() && lost && job->resuming()) {
      // Taking the job back, a node that does not come back is a node lost.
      st = absl::AbortedError(absl::StrCat("job '", job->key(), "': the ring did not form again: ", st.message()));
    }
    if (!st.ok()) {
      LOG(WARNING) << "job '" << job->key() << "': multi-node setup failed: " << st.message();
      job->Fail(st, -1);
    }
  }
  Forget(p);
  absl::MutexLock lock(&mu_);
  if (--threads_ == 0) threads_cv_.SignalAll();
}

absl::StatusOr<v1::NodeTable> PeerService::AwaitTable(Pending& p, const std::shared_ptr<scheduler::Job>& job) {
  v1::PeerHello hello;
  hello.set_role("coord");
  DMAG_ASSIGN_OR_RETURN(auto coord, Dial(p, p.id.address, hello));
  v1::NodeTable table;
  bool sent_ready = false;
  for (;;) {
    bool send = false;
    {
      absl::MutexLock lock(&p.mu);
      send = p.changed;
      p.changed = false;
    }
    uint32_t done = 0;
    const bool ready = job->resume_ready(&done);
    send |= ready && !sent_ready;
    if (send) {
      sent_ready = ready;
      v1::NodeUpdate u;
      u.set_job_key(job->key());
      u.set_world_size(job->world_size());
      u.set_peer_address(address_);
      u.set_hostname(Hostname());
      u.set_transport(transport_->name());
      u.set_ring_version(kRingVersion);
      u.set_resuming(job->resuming());
      u.set_resume_ready(ready);
      u.set_done_seq(done);
      for (int r : job->joined_ranks()) u.add_ranks(r);
      DMAG_RETURN_IF_ERROR(WriteMessage(*coord, u));
    }
    if (Readable(*coord, 50)) {
      if (absl::Status got = ReadMessage(*coord, &table); !got.ok()) {
        return absl::AbortedError(absl::StrCat("job '", job->key(), "': node ", p.id.address,
                                               " (the job's coordinator) failed: its daemon went away while the "
                                               "job was being set up (",
                                               got.message(), ")"));
      }
      return table;
    }
    if (job->failed()) return job->failure();
    if (options_.clock->Now() > p.deadline) {
      if (job->resuming()) {
        // Taking the job back: a node (its daemon, or its ranks) did not
        // come back within the ranks' grace period.
        return absl::AbortedError(absl::StrCat("job '", job->key(),
                                               "': the ring did not form again within the grace "
                                               "period (DMAGATHER_RECONNECT_S): ",
                                               p.coordinator
                                                   ? MissingRanks(p, job->world_size())
                                                   : "the coordinator at " + p.id.address + " still waits for a node"));
      }
      return absl::DeadlineExceededError(
          absl::StrCat("job '", job->key(), "': not every rank of the world (", job->world_size(),
                       ") joined some node's daemon before the join timeout (the coordinator at ", p.id.address,
                       " still waits for the others)"));
    }
    if (stopping()) return absl::UnavailableError("dmagatherd is shutting down");
  }
}

absl::Status PeerService::RunBootstrap(Pending& p, const std::shared_ptr<scheduler::Job>& job) {
  // 1. Report this node's ranks to the coordinator until the table comes.
  DMAG_ASSIGN_OR_RETURN(v1::NodeTable table, AwaitTable(p, job));
  if (!table.failed_node().empty()) return absl::AbortedError(absl::StrCat("job '", job->key(), "': ", table.error()));
  if (!table.error().empty())
    return absl::FailedPreconditionError(absl::StrCat("job '", job->key(), "': ", table.error()));

  // 2. The topology.
  std::shared_ptr<scheduler::Topology> topo = TopologyOf(table, job->world_size());
  const int n_nodes = topo->num_nodes();
  if (topo->my_node < 0 || topo->my_node >= n_nodes) {
    return absl::InternalError("the coordinator's table does not name this node");
  }
  // A job taken back starts after the newest op done on any node; the ranks'
  // rings are read from there (Job::StartAfter), before the ring runs.
  if (table.resumed()) job->StartAfter(table.start_after());
  if (n_nodes == 1) return job->SetTopology(topo, nullptr);

  // 3. Links to the next node (this end upgrades them); the previous node's
  //    arrive through the listener.
  const int next = (topo->my_node + 1) % n_nodes, prev = (topo->my_node + n_nodes - 1) % n_nodes;
  std::unique_ptr<transport::Transport>& data = table.transport() == transport_->name() ? transport_ : tcp_;
  std::vector<std::unique_ptr<transport::Connection>> to_next;
  for (int l = 0; l < int(table.links()); ++l) {
    v1::PeerHello h;
    h.set_role("ring");
    h.set_node(topo->my_node);
    h.set_link(l);
    DMAG_ASSIGN_OR_RETURN(auto conn, Dial(p, table.nodes(next).peer_address(), h));
    DMAG_ASSIGN_OR_RETURN(auto link, data->Upgrade(std::move(conn), /*initiator=*/true));
    to_next.push_back(std::move(link));
  }
  std::vector<std::unique_ptr<transport::Connection>> from_prev;
  {
    absl::MutexLock lock(&p.mu);
    const common::Clock& clock = *options_.clock;
    while (p.prev_count != int(table.links()) && clock.Now() < p.deadline) {
      p.cv.WaitWithTimeout(&p.mu, p.deadline - clock.Now());
    }
    if (p.prev_count != int(table.links())) {
      return absl::DeadlineExceededError(absl::StrCat("job '", job->key(), "': only ", p.prev_count, " of ",
                                                      table.links(), " ring links from node ", prev, " (",
                                                      topo->node_names[prev], ") arrived before the join timeout"));
    }
    for (int l = 0; l < int(table.links()); ++l) {
      if (p.prev_from[l] != prev) {
        return absl::FailedPreconditionError(
            absl::StrCat("ring link ", l, " came from node ", p.prev_from[l], ", expected node ", prev));
      }
    }
    from_prev = std::move(p.prev_links);
  }
  RingOptions ro;
  ro.chunk_bytes = table.chunk_bytes();
  ro.engine = engine_;
  ro.transit_bytes = options_.transit_bytes;
  ro.force_staging = options_.force_staging;
  ro.peer_timeout = options_.peer_timeout;
  ro.clock = options_.clock;
  ro.heartbeat_interval = std::max(absl::Milliseconds(10), options_.peer_timeout / 5);
  if (options_.peer_timeout <= absl::ZeroDuration()) ro.heartbeat_interval = absl::ZeroDuration();
  ro.transport = data->name();
  ro.transport_reason =
      data.get() == transport_.get() ? transport_reason_ : absl::StrCat("not every node offers ", transport_->name());
  auto ring = std::make_shared<Ring>(job.get(), topo, std::move(to_next), std::move(from_prev), ro);
  ring->Run();
  absl::Status set = job->SetTopology(topo, ring);
  if (!set.ok()) {
    ring->Close();
    return set;
  }
  LOG(INFO) << "job '" << job->key() << "': ring up: node " << topo->my_node << " of " << n_nodes << ", "
            << table.links() << " " << ro.transport << " link(s) to " << topo->node_names[next];
  return absl::OkStatus();
}

}  // namespace dmagather::server::cluster
