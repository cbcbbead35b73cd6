#include "server/cluster/peer_service.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "glog/logging.h"
#include "server/cluster/peer_io.h"
#include "server/cluster/ring.h"
#include "server/transport/tcp_transport.h"

namespace dmagather::server::cluster {
namespace {

// Taking a job back: how long after the node table the ring's links may
// take before the setup starts over.
constexpr absl::Duration kResumeLinkTimeout = absl::Seconds(10);

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

absl::StatusOr<std::unique_ptr<transport::Connection>> PeerService::Dial(const Pending& p, const std::string& address,
                                                                         v1::PeerHello hello, absl::Time deadline) {
  hello.set_job_tag(p.id.tag);
  deadline = std::min(deadline, p.deadline);
  absl::Status last = absl::DeadlineExceededError("not tried");
  while (options_.clock->Now() < deadline) {
    if (stopping()) return absl::UnavailableError("dmagatherd is shutting down");
    auto conn = tcp_->Connect(address, std::min(absl::Seconds(2), deadline - options_.clock->Now()));
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

absl::StatusOr<std::vector<std::unique_ptr<transport::Connection>>> PeerService::AwaitPrevLinks(
    Pending& p, const scheduler::Job& job, int links, int prev, const std::string& prev_name, absl::Time deadline) {
  absl::MutexLock lock(&p.mu);
  const common::Clock& clock = *options_.clock;
  while (p.prev_count != links && clock.Now() < deadline && !p.stale) {
    p.cv.WaitWithTimeout(&p.mu, deadline - clock.Now());
  }
  if (p.stale) {
    return absl::AbortedError(absl::StrCat("job '", job.key(),
                                           "': a node's dmagatherd came back after the node table was sent; the "
                                           "setup starts over"));
  }
  if (p.prev_count != links) {
    return absl::DeadlineExceededError(absl::StrCat("job '", job.key(), "': only ", p.prev_count, " of ", links,
                                                    " ring links from node ", prev, " (", prev_name,
                                                    ") arrived before the join timeout"));
  }
  for (int l = 0; l < links; ++l) {
    if (p.prev_from[l] != prev) {
      return absl::FailedPreconditionError(
          absl::StrCat("ring link ", l, " came from node ", p.prev_from[l], ", expected node ", prev));
    }
  }
  return std::move(p.prev_links);
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
  // Taking a job back, the links must come soon after the table: a daemon
  // that died meanwhile never sends them, and the setup then starts over
  // (Bootstrap) instead of waiting out the ranks' whole grace period.
  const absl::Time link_deadline =
      job->resuming() ? std::min(p.deadline, options_.clock->Now() + kResumeLinkTimeout) : p.deadline;
  std::unique_ptr<transport::Transport>& data = table.transport() == transport_->name() ? transport_ : tcp_;
  std::vector<std::unique_ptr<transport::Connection>> to_next;
  for (int l = 0; l < int(table.links()); ++l) {
    v1::PeerHello h;
    h.set_role("ring");
    h.set_node(topo->my_node);
    h.set_link(l);
    DMAG_ASSIGN_OR_RETURN(auto conn, Dial(p, table.nodes(next).peer_address(), h, link_deadline));
    DMAG_ASSIGN_OR_RETURN(auto link, data->Upgrade(std::move(conn), /*initiator=*/true));
    to_next.push_back(std::move(link));
  }
  DMAG_ASSIGN_OR_RETURN(auto from_prev,
                        AwaitPrevLinks(p, *job, int(table.links()), prev, topo->node_names[prev], link_deadline));
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
