// IbverbsConnection: see ibverbs_connection.h.
#include "server/transport/ibverbs_connection.h"

#include <arpa/inet.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status.h"

namespace dmagather::server::transport {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

// What each end of a link tells the other over the bootstrap connection
// (twice: kInfo with its queue pair and ring, then kReady once its queue pair
// can receive). Host byte order: the fleet is little-endian.
struct WireInfo {
  char magic[8];
  uint32_t version;
  uint32_t stage;   // kInfo, kReady.
  uint32_t failed;  // Nonzero: setup failed on the sender; `reason` says why.
  uint32_t qpn;
  uint32_t psn;
  uint32_t lid;
  uint32_t mtu;  // enum ibv_mtu.
  uint32_t link_layer;
  uint8_t gid[16];
  uint64_t ring_addr;
  uint32_t ring_rkey;
  uint32_t slots;
  uint64_t slot_bytes;
  char reason[176];
};
static_assert(sizeof(WireInfo) == 256, "WireInfo is one 256-byte bootstrap message");
constexpr char kMagic[8] = {'D', 'G', 'I', 'B', 'V', 'E', 'R', 'B'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kInfo = 1, kReady = 2;

// How long a closing link waits for its posted writes to complete.
constexpr absl::Duration kDrainTimeout = absl::Seconds(1);

absl::Status IbverbsConnection::Modify(ibv_qp_attr* attr, int mask, const char* to) {
  if (int rc = api_->ModifyQp(qp_, attr, mask); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("ibv_modify_qp to ", to, " (", dev_->where(), ", link to ", peer_, "): ", strerror(rc)));
  }
  return absl::OkStatus();
}

absl::Status IbverbsConnection::SetupLocal() {
  const int max_cqe = dev_->device_attr.max_cqe > 0 ? dev_->device_attr.max_cqe : 1 << 16;
  scq_ = api_->CreateCq(dev_->ctx, std::min(sq_depth_, max_cqe));
  rcq_ = api_->CreateCq(dev_->ctx, std::min(rq_depth_, max_cqe));
  if (scq_ == nullptr || rcq_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("ibv_create_cq on ", dev_->name, ": ", strerror(errno)));
  }
  ibv_qp_init_attr ia{};
  ia.send_cq = scq_;
  ia.recv_cq = rcq_;
  ia.qp_type = IBV_QPT_RC;
  ia.sq_sig_all = 0;
  ia.cap.max_send_wr = sq_depth_;
  ia.cap.max_recv_wr = rq_depth_;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  qp_ = api_->CreateQp(dev_->pd, &ia);
  if (qp_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("ibv_create_qp (RC) on ", dev_->name, ": ", strerror(errno)));
  }
  const size_t ring = RoundUp(size_t{slots_} * slot_bytes_, 4096);
  rx_base_ = static_cast<char*>(std::aligned_alloc(4096, ring));
  if (rx_base_ == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", ring, "-byte ring"));
  rx_mr_ = api_->RegMr(dev_->pd, rx_base_, ring, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (rx_mr_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("ibv_reg_mr (", ring, " bytes) on ", dev_->name, ": ", strerror(errno)));
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = dev_->port;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  DMAG_RETURN_IF_ERROR(Modify(&a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT"));
  std::random_device rd;
  psn_ = rd() & 0xffffff;
  return absl::OkStatus();
}

absl::Status IbverbsConnection::SetupRemote(const WireInfo& t) {
  if (t.link_layer != dev_->port_attr.link_layer) {
    return absl::UnavailableError(absl::StrCat("link layers differ: ", dev_->where(), " is ",
                                               dev_->ethernet() ? "Ethernet (RoCE)" : "InfiniBand",
                                               ", the peer's is not"));
  }
  if (t.slots == 0 || t.slots > kIbverbsMaxSlots || t.slot_bytes == 0 || t.slot_bytes > kIbverbsMaxSlotBytes) {
    return absl::UnavailableError(
        absl::StrCat("peer's ring of ", t.slots, " x ", t.slot_bytes, " bytes is out of range"));
  }
  if (static_cast<int>(slots_ + t.slots) > rq_depth_) {
    return absl::UnavailableError(
        absl::StrCat("receive queue of ", rq_depth_, " cannot hold ", slots_, " + ", t.slots, " receives"));
  }
  remote_addr_ = t.ring_addr;
  remote_rkey_ = t.ring_rkey;
  remote_slots_ = t.slots;
  remote_slot_bytes_ = t.slot_bytes;
  const size_t ring = RoundUp(size_t{remote_slots_} * remote_slot_bytes_, 4096);
  tx_base_ = static_cast<char*>(std::aligned_alloc(4096, ring));
  if (tx_base_ == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", ring, "-byte ring"));
  tx_mr_ = api_->RegMr(dev_->pd, tx_base_, ring, IBV_ACCESS_LOCAL_WRITE);
  if (tx_mr_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("ibv_reg_mr (", ring, " bytes) on ", dev_->name, ": ", strerror(errno)));
  }
  // Receives: one per chunk that may land (slots_) and one per credit
  // message that may be in flight (at most one per peer slot).
  {
    absl::MutexLock lk(&mu_);
    for (uint32_t i = 0; i < slots_ + remote_slots_; ++i) {
      if (!PostRecv()) return error_;
    }
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<uint32_t>(dev_->port_attr.active_mtu, t.mtu));
  a.dest_qp_num = t.qpn;
  a.rq_psn = t.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = static_cast<uint16_t>(t.lid);
  a.ah_attr.sl = 0;
  a.ah_attr.src_path_bits = 0;
  a.ah_attr.port_num = dev_->port;
  if (dev_->ethernet()) {  // RoCE: addressed by GID (a GRH on every packet).
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, t.gid, sizeof(t.gid));
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev_->gid_index);
    a.ah_attr.grh.hop_limit = 64;
  }
  DMAG_RETURN_IF_ERROR(Modify(&a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                              "RTR"));
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;  // 4.096 us * 2^14 = 67 ms per try.
  a.retry_cnt = 7;
  a.rnr_retry = 7;  // Forever; the credits keep receives posted anyway.
  a.sq_psn = psn_;
  a.max_rd_atomic = 1;
  DMAG_RETURN_IF_ERROR(Modify(
      &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
      "RTS"));
  return absl::OkStatus();
}

absl::Status IbverbsConnection::Exchange(bool initiator, WireInfo* mine, WireInfo* theirs, uint32_t stage) {
  std::memcpy(mine->magic, kMagic, sizeof(kMagic));
  mine->version = kVersion;
  mine->stage = stage;
  auto send = [&] { return bootstrap_->Send(mine, sizeof(*mine), nullptr, 0); };
  auto recv = [&] { return bootstrap_->Recv(theirs, sizeof(*theirs)); };
  const std::string what = absl::StrCat("ibverbs setup with ", peer_, ": ");
  if (initiator || mine->failed) {  // A failed end tells and leaves.
    DMAG_RETURN_IF_ERROR(common::Annotate(send(), what));
    if (mine->failed) return absl::OkStatus();
    DMAG_RETURN_IF_ERROR(common::Annotate(recv(), what));
  } else {
    DMAG_RETURN_IF_ERROR(common::Annotate(recv(), what));
    DMAG_RETURN_IF_ERROR(common::Annotate(send(), what));
  }
  if (std::memcmp(theirs->magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::UnavailableError(absl::StrCat(what, "the peer is not using the ibverbs transport (bad magic)"));
  }
  if (theirs->version != kVersion || theirs->stage != stage) {
    return absl::UnavailableError(
        absl::StrCat(what, "protocol mismatch (version ", theirs->version, " stage ", theirs->stage, ")"));
  }
  if (theirs->failed) {
    theirs->reason[sizeof(theirs->reason) - 1] = '\0';
    return absl::UnavailableError(absl::StrCat(what, "the peer could not set up its end: ", theirs->reason));
  }
  return absl::OkStatus();
}

absl::Status IbverbsConnection::Setup(bool initiator) {
  WireInfo mine{}, theirs{};
  auto tell_failure = [&](const absl::Status& s) {
    mine = WireInfo{};
    mine.failed = 1;
    std::snprintf(mine.reason, sizeof(mine.reason), "%s", std::string(s.message()).c_str());
  };
  absl::Status local = common::Annotate(SetupLocal(), absl::StrCat("ibverbs setup with ", peer_, ": "));
  if (local.ok()) {
    mine.qpn = qp_->qp_num;
    mine.psn = psn_;
    mine.lid = dev_->port_attr.lid;
    mine.mtu = dev_->port_attr.active_mtu;
    mine.link_layer = dev_->port_attr.link_layer;
    std::memcpy(mine.gid, dev_->gid.raw, sizeof(mine.gid));
    mine.ring_addr = reinterpret_cast<uintptr_t>(rx_base_);
    mine.ring_rkey = rx_mr_->rkey;
    mine.slots = slots_;
    mine.slot_bytes = slot_bytes_;
  } else {
    tell_failure(local);
  }
  DMAG_RETURN_IF_ERROR(Exchange(initiator, &mine, &theirs, kInfo));
  if (!local.ok()) return local;
  absl::Status remote = common::Annotate(SetupRemote(theirs), absl::StrCat("ibverbs setup with ", peer_, ": "));
  mine = WireInfo{};
  if (!remote.ok()) tell_failure(remote);
  // Ready: the sender's queue pair is RTR with its receives posted, so the
  // other end may write.
  DMAG_RETURN_IF_ERROR(Exchange(initiator, &mine, &theirs, kReady));
  if (!remote.ok()) return remote;
  absl::MutexLock lk(&mu_);
  tx_credits_ = remote_slots_;
  connected_ = true;
  return absl::OkStatus();
}

void IbverbsConnection::Fail(absl::Status s, bool flush) {
  if (error_.ok() || (error_is_flush_ && !flush)) {
    const bool first = error_.ok();
    error_ = std::move(s);
    error_is_flush_ = flush;
    if (first) bootstrap_->Shutdown();  // The peer notices (EOF on its bootstrap socket).
  }
}

absl::Status IbverbsConnection::CompletionError(const char* what, const ibv_wc& wc) const {
  return absl::UnavailableError(absl::StrCat("ibverbs link to ", peer_, " (", dev_->where(), "): ", what,
                                             " completion failed: ", api_->WcStatusStr(wc.status), " (status ",
                                             static_cast<int>(wc.status), ", vendor error ", wc.vendor_err, ")"));
}

bool IbverbsConnection::PostRecv() {
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = 0;
  wr.num_sge = 0;  // Writes with immediate and zero-byte sends carry no payload here.
  if (int rc = api_->PostRecv(qp_, &wr, &bad); rc != 0) {
    Fail(absl::UnavailableError(absl::StrCat("ibv_post_recv on the link to ", peer_, ": ", strerror(rc))));
    return false;
  }
  return true;
}

void IbverbsConnection::HandleRecv(const ibv_wc& wc) {
  if (wc.status != IBV_WC_SUCCESS) {
    Fail(CompletionError("receive", wc), wc.status == IBV_WC_WR_FLUSH_ERR);
    return;
  }
  const uint32_t imm = ntohl(wc.imm_data);
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    if (imm == 0 || imm > slot_bytes_ || arrived_.size() >= slots_) {
      Fail(absl::UnavailableError(
          absl::StrCat("ibverbs link to ", peer_, ": protocol error (chunk of ", imm, " bytes into a full ring?)")));
      return;
    }
    arrived_.push_back(imm);
  } else if (wc.opcode == IBV_WC_RECV) {
    tx_credits_ += imm;
    if (tx_credits_ > remote_slots_) {
      Fail(absl::UnavailableError(absl::StrCat("ibverbs link to ", peer_, ": protocol error (", tx_credits_,
                                               " credits for ", remote_slots_, " slots)")));
      return;
    }
  } else {
    Fail(absl::UnavailableError(
        absl::StrCat("ibverbs link to ", peer_, ": unexpected completion opcode ", static_cast<int>(wc.opcode))));
    return;
  }
  PostRecv();
}

void IbverbsConnection::Progress() {
  ibv_wc wc[16];
  // Sends first: their error is the cause of any flushed receives.
  for (;;) {
    const int k = api_->PollCq(scq_, 16, wc);
    if (k < 0) {
      Fail(absl::UnavailableError(absl::StrCat("ibv_poll_cq (send) on the link to ", peer_, " failed")));
      break;
    }
    for (int i = 0; i < k; ++i) {
      --sq_outstanding_;
      if (wc[i].status != IBV_WC_SUCCESS) {
        Fail(CompletionError(wc[i].opcode == IBV_WC_SEND ? "credit send" : "RDMA write", wc[i]),
             wc[i].status == IBV_WC_WR_FLUSH_ERR);
      }
    }
    if (k < 16) break;
  }
  for (;;) {
    const int k = api_->PollCq(rcq_, 16, wc);
    if (k < 0) {
      Fail(absl::UnavailableError(absl::StrCat("ibv_poll_cq (receive) on the link to ", peer_, " failed")));
      break;
    }
    for (int i = 0; i < k; ++i) HandleRecv(wc[i]);
    if (k < 16) break;
  }
}

void IbverbsConnection::FlushCredits() {
  if (credits_to_return_ == 0 || !error_.ok() || sq_outstanding_ >= sq_depth_) return;
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.num_sge = 0;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(credits_to_return_);
  if (int rc = api_->PostSend(qp_, &wr, &bad); rc != 0) {
    Fail(absl::UnavailableError(absl::StrCat("ibv_post_send (credits) on the link to ", peer_, ": ", strerror(rc))));
    return;
  }
  ++sq_outstanding_;
  credits_to_return_ = 0;
}

bool IbverbsConnection::PeerGone() const {
  const int fd = bootstrap_->fd();
  if (fd < 0) return false;
  // Nothing is sent on the bootstrap connection after setup: readable
  // means EOF or an error.
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && p.revents != 0;
}

template <typename Ready, typename Idle>
absl::Status IbverbsConnection::Wait(Ready ready, Idle idle, bool data_first) {
  for (int spins = 0;; ++spins) {
    if (shut_.load()) return ShutError();
    Progress();
    if (!data_first && !error_.ok()) return error_;
    if (ready()) return absl::OkStatus();
    if (!error_.ok()) return error_;
    idle();
    if (spins >= 64 && PeerGone()) {
      Fail(absl::UnavailableError(absl::StrCat("connection to ", peer_, " closed by the peer")));
      continue;  // Take what landed before the close.
    }
    mu_.Unlock();
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 5 * (spins - 63))));
    }
    mu_.Lock();
  }
}

absl::Status IbverbsConnection::Send(const void* header, size_t header_len, const void* payload, size_t len) {
  const char* pieces[2] = {static_cast<const char*>(header), static_cast<const char*>(payload)};
  const size_t sizes[2] = {header_len, len};
  int piece = 0;
  size_t off = 0;
  size_t remaining = header_len + len;
  if (shut_.load()) return ShutError();
  while (remaining > 0) {
    const size_t chunk = std::min(remaining, remote_slot_bytes_);
    {
      absl::MutexLock lk(&mu_);
      DMAG_RETURN_IF_ERROR(
          Wait([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return tx_credits_ > 0 && sq_outstanding_ < sq_depth_; },
               [] {}, /*data_first=*/false));
    }
    // The slot is free: its credit came back, so the peer has read it and
    // this side's adapter is done with the staging copy.
    const uint64_t slot = tx_next_ % remote_slots_;
    char* dst = tx_base_ + slot * remote_slot_bytes_;
    for (size_t filled = 0; filled < chunk;) {
      while (off == sizes[piece]) {
        ++piece;
        off = 0;
      }
      const size_t n = std::min(chunk - filled, sizes[piece] - off);
      std::memcpy(dst + filled, pieces[piece] + off, n);
      filled += n;
      off += n;
    }
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(dst);
    sge.length = static_cast<uint32_t>(chunk);
    sge.lkey = tx_mr_->lkey;
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = 0;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(static_cast<uint32_t>(chunk));
    wr.wr.rdma.remote_addr = remote_addr_ + slot * remote_slot_bytes_;
    wr.wr.rdma.rkey = remote_rkey_;
    {
      absl::MutexLock lk(&mu_);
      if (shut_.load()) return ShutError();
      if (!error_.ok()) return error_;
      if (int rc = api_->PostSend(qp_, &wr, &bad); rc != 0) {
        Fail(absl::UnavailableError(
            absl::StrCat("ibv_post_send (RDMA write) on the link to ", peer_, ": ", strerror(rc))));
        return error_;
      }
      --tx_credits_;
      ++sq_outstanding_;
    }
    ++tx_next_;
    remaining -= chunk;
  }
  return absl::OkStatus();
}

absl::Status IbverbsConnection::Recv(void* dst, size_t len) {
  char* out = static_cast<char*>(dst);
  if (shut_.load()) return ShutError();
  while (len > 0) {
    uint32_t chunk;
    {
      absl::MutexLock lk(&mu_);
      DMAG_RETURN_IF_ERROR(Wait([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !arrived_.empty(); },
                                [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { FlushCredits(); },
                                /*data_first=*/true));
      chunk = arrived_.front();
    }
    const char* src = rx_base_ + (rx_head_ % slots_) * slot_bytes_ + rx_cursor_;
    const size_t n = std::min<size_t>(chunk - rx_cursor_, len);
    std::memcpy(out, src, n);
    out += n;
    len -= n;
    rx_cursor_ += n;
    if (rx_cursor_ == chunk) {
      absl::MutexLock lk(&mu_);
      arrived_.pop_front();
      rx_cursor_ = 0;
      ++rx_head_;
      if (++credits_to_return_ >= credit_batch_) FlushCredits();
    }
  }
  return absl::OkStatus();
}

void IbverbsConnection::Drain() {
  absl::MutexLock lk(&mu_);
  const absl::Time deadline = clock_->Now() + kDrainTimeout;
  for (;;) {
    Progress();
    if (sq_outstanding_ == 0 || !error_.ok() || clock_->Now() > deadline) return;
    mu_.Unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    mu_.Lock();
  }
}

}  // namespace dmagather::server::transport
