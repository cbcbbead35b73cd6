#include "tests/fakes/fake_verbs.h"

#include <endian.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace dmagather::server::transport::testing {
namespace {

constexpr int kGidTableLen = 4;
constexpr int kRequiredInit = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kRequiredRtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kRequiredRts =
    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

}  // namespace

FakeVerbs::~FakeVerbs() {
  for (auto& [ctx, dev] : contexts_) delete ctx;
}

void FakeVerbs::AddDevice(const DeviceSpec& spec) {
  std::lock_guard<std::mutex> lk(mu_);
  auto d = std::make_unique<Device>();
  d->dev = std::make_unique<ibv_device>();
  std::memset(d->dev.get(), 0, sizeof(ibv_device));
  std::snprintf(d->dev->name, sizeof(d->dev->name), "%s", spec.name.c_str());
  d->dev->node_type = IBV_NODE_CA;
  d->dev->transport_type = IBV_TRANSPORT_IB;
  d->spec = spec;
  d->index = static_cast<int>(devices_.size());
  d->lid = spec.ethernet ? 0 : static_cast<uint16_t>(1 + devices_.size());
  devices_.push_back(std::move(d));
}

void FakeVerbs::FailNextSend(uint32_t qpn, ibv_wc_status status) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = qps_.find(qpn);
  if (it != qps_.end()) it->second.fail_next = status;
}

void FakeVerbs::FailCreateQp(const std::string& device) {
  std::lock_guard<std::mutex> lk(mu_);
  fail_create_qp_ = device;
}

void FakeVerbs::SetQpError(uint32_t qpn) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = qps_.find(qpn);
  if (it != qps_.end()) ToError(it->second);
}

std::vector<uint32_t> FakeVerbs::QpNumbers(const std::string& device) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<uint32_t> out;
  for (const auto& [qpn, q] : qps_) {
    if (device.empty() || q.device->spec.name == device) out.push_back(qpn);
  }
  return out;
}

int FakeVerbs::SgidIndex(uint32_t qpn) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = qps_.find(qpn);
  return it == qps_.end() ? -1 : it->second.sgid_index;
}

int FakeVerbs::live_objects() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int>(contexts_.size() + pds_.size() + mrs_.size() + cqs_.size() + qps_.size());
}
int FakeVerbs::cq_overflows() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cq_overflows_;
}
int FakeVerbs::rnr_errors() const {
  std::lock_guard<std::mutex> lk(mu_);
  return rnr_errors_;
}
int64_t FakeVerbs::writes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return writes_;
}

ibv_device** FakeVerbs::GetDeviceList(int* num_devices) {
  std::lock_guard<std::mutex> lk(mu_);
  auto** list = new ibv_device*[devices_.size() + 1];
  for (size_t i = 0; i < devices_.size(); ++i) list[i] = devices_[i]->dev.get();
  list[devices_.size()] = nullptr;
  if (num_devices != nullptr) *num_devices = static_cast<int>(devices_.size());
  return list;
}

void FakeVerbs::FreeDeviceList(ibv_device** list) { delete[] list; }

const char* FakeVerbs::GetDeviceName(ibv_device* device) { return device->name; }

ibv_context* FakeVerbs::OpenDevice(ibv_device* device) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& d : devices_) {
    if (d->dev.get() == device) {
      auto* ctx = new ibv_context{};
      ctx->device = device;
      contexts_[ctx] = d.get();
      return ctx;
    }
  }
  errno = ENODEV;
  return nullptr;
}

int FakeVerbs::CloseDevice(ibv_context* context) {
  std::lock_guard<std::mutex> lk(mu_);
  if (contexts_.erase(context) == 0) return EINVAL;
  delete context;
  return 0;
}

FakeVerbs::Device* FakeVerbs::DeviceOf(ibv_context* ctx) {
  auto it = contexts_.find(ctx);
  return it == contexts_.end() ? nullptr : it->second;
}

int FakeVerbs::QueryDevice(ibv_context* context, ibv_device_attr* attr) {
  std::lock_guard<std::mutex> lk(mu_);
  Device* d = DeviceOf(context);
  if (d == nullptr) return EINVAL;
  *attr = ibv_device_attr{};
  std::snprintf(attr->fw_ver, sizeof(attr->fw_ver), "fake");
  attr->phys_port_cnt = static_cast<uint8_t>(d->spec.ports);
  attr->max_qp_wr = d->spec.max_qp_wr;
  attr->max_cqe = 1 << 20;
  attr->max_sge = 1;
  attr->max_qp = 1 << 16;
  attr->max_cq = 1 << 16;
  attr->max_mr = 1 << 16;
  attr->max_pd = 1 << 16;
  return 0;
}

int FakeVerbs::QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  std::lock_guard<std::mutex> lk(mu_);
  Device* d = DeviceOf(context);
  if (d == nullptr || port < 1 || port > d->spec.ports) return EINVAL;
  *attr = ibv_port_attr{};
  attr->state = d->spec.port_active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = d->spec.active_mtu;
  attr->gid_tbl_len = kGidTableLen;
  attr->lid = d->lid;
  attr->link_layer = d->spec.ethernet ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  return 0;
}

ibv_gid FakeVerbs::GidOf(const Device& d, int index, ibv_gid_type* type) const {
  ibv_gid g{};
  if (!d.spec.ethernet) {
    *type = IBV_GID_TYPE_IB;
    if (index != 0) return g;
    g.global.subnet_prefix = htobe64(0xfe80000000000000ULL);
    g.global.interface_id = htobe64(0x0002c90300000000ULL + d.index);
    return g;
  }
  // mlx5 layout: 0 RoCE v1 link-local, 1 RoCE v2 link-local, 2 RoCE v1
  // IPv4-mapped, 3 RoCE v2 IPv4-mapped (10.0.0.<index + 1>).
  *type = (index % 2 == 0) ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2;
  if (index < 2) {
    g.global.subnet_prefix = htobe64(0xfe80000000000000ULL);
    g.global.interface_id = htobe64(0x0202c9fffe000000ULL + d.index);
  } else if (index < kGidTableLen) {
    g.raw[10] = g.raw[11] = 0xff;
    g.raw[12] = 10;
    g.raw[15] = static_cast<uint8_t>(d.index + 1);
  }
  return g;
}

int FakeVerbs::QueryGid(ibv_context* context, uint8_t port, int index, ibv_gid* gid) {
  std::lock_guard<std::mutex> lk(mu_);
  Device* d = DeviceOf(context);
  if (d == nullptr || port < 1 || port > d->spec.ports || index < 0 || index >= kGidTableLen) return EINVAL;
  ibv_gid_type type;
  *gid = GidOf(*d, index, &type);
  return 0;
}

int FakeVerbs::QueryGidEntry(ibv_context* context, uint8_t port, int index, ibv_gid_entry* entry) {
  std::lock_guard<std::mutex> lk(mu_);
  Device* d = DeviceOf(context);
  if (d == nullptr || port < 1 || port > d->spec.ports || index < 0 || index >= kGidTableLen) return EINVAL;
  ibv_gid_type type;
  *entry = ibv_gid_entry{};
  entry->gid = GidOf(*d, index, &type);
  entry->gid_index = static_cast<uint32_t>(index);
  entry->port_num = port;
  entry->gid_type = type;
  return 0;
}

ibv_pd* FakeVerbs::AllocPd(ibv_context* context) {
  std::lock_guard<std::mutex> lk(mu_);
  if (DeviceOf(context) == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  auto pd = std::make_unique<ibv_pd>();
  pd->context = context;
  ibv_pd* p = pd.get();
  pds_[p] = std::move(pd);
  return p;
}

int FakeVerbs::DeallocPd(ibv_pd* pd) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [k, m] : mrs_) {
    if (m.mr->pd == pd) return EBUSY;
  }
  for (const auto& [n, q] : qps_) {
    if (q.qp->pd == pd) return EBUSY;
  }
  return pds_.erase(pd) == 1 ? 0 : EINVAL;
}

ibv_mr* FakeVerbs::RegMr(ibv_pd* pd, void* addr, size_t length, int access) {
  std::lock_guard<std::mutex> lk(mu_);
  if (pds_.count(pd) == 0 || addr == nullptr || length == 0) {
    errno = EINVAL;
    return nullptr;
  }
  Mr m;
  m.mr = std::make_unique<ibv_mr>();
  m.mr->context = pd->context;
  m.mr->pd = pd;
  m.mr->addr = addr;
  m.mr->length = length;
  m.mr->lkey = m.mr->rkey = next_key_++;
  m.access = access;
  ibv_mr* out = m.mr.get();
  mrs_[out->lkey] = std::move(m);
  return out;
}

int FakeVerbs::DeregMr(ibv_mr* mr) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = mrs_.find(mr->lkey);
  if (it == mrs_.end() || it->second.mr.get() != mr) return EINVAL;
  mrs_.erase(it);
  return 0;
}

ibv_cq* FakeVerbs::CreateCq(ibv_context* context, int cqe) {
  std::lock_guard<std::mutex> lk(mu_);
  if (DeviceOf(context) == nullptr || cqe < 1) {
    errno = EINVAL;
    return nullptr;
  }
  Cq c;
  c.cq = std::make_unique<ibv_cq>();
  c.cq->context = context;
  c.cq->cqe = cqe;
  ibv_cq* out = c.cq.get();
  cqs_[out] = std::move(c);
  return out;
}

int FakeVerbs::DestroyCq(ibv_cq* cq) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [n, q] : qps_) {
    if (q.qp->send_cq == cq || q.qp->recv_cq == cq) return EBUSY;
  }
  return cqs_.erase(cq) == 1 ? 0 : EINVAL;
}

ibv_qp* FakeVerbs::CreateQp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  std::lock_guard<std::mutex> lk(mu_);
  if (pds_.count(pd) == 0 || attr->qp_type != IBV_QPT_RC || cqs_.count(attr->send_cq) == 0 ||
      cqs_.count(attr->recv_cq) == 0 || attr->cap.max_send_wr < 1 || attr->cap.max_recv_wr < 1) {
    errno = EINVAL;
    return nullptr;
  }
  Device* d = DeviceOf(pd->context);
  if (d->spec.name == fail_create_qp_) {
    errno = ENOMEM;
    return nullptr;
  }
  if (static_cast<int>(attr->cap.max_send_wr) > d->spec.max_qp_wr ||
      static_cast<int>(attr->cap.max_recv_wr) > d->spec.max_qp_wr) {
    errno = EINVAL;
    return nullptr;
  }
  Qp q;
  q.qp = std::make_unique<ibv_qp>();
  q.qp->context = pd->context;
  q.qp->qp_context = attr->qp_context;
  q.qp->pd = pd;
  q.qp->send_cq = attr->send_cq;
  q.qp->recv_cq = attr->recv_cq;
  q.qp->qp_num = next_qpn_++;
  q.qp->state = IBV_QPS_RESET;
  q.qp->qp_type = IBV_QPT_RC;
  q.device = d;
  q.max_send = static_cast<int>(attr->cap.max_send_wr);
  q.max_recv = static_cast<int>(attr->cap.max_recv_wr);
  q.sig_all = attr->sq_sig_all != 0;
  ibv_qp* out = q.qp.get();
  qps_[out->qp_num] = std::move(q);
  return out;
}

int FakeVerbs::DestroyQp(ibv_qp* qp) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = qps_.find(qp->qp_num);
  if (it == qps_.end() || it->second.qp.get() != qp) return EINVAL;
  // Completions of this queue pair left in its CQs no longer count against it.
  qps_.erase(it);
  return 0;
}

void FakeVerbs::Complete(Qp& q, ibv_cq* cq, const ibv_wc& wc, bool send) {
  Cq& c = cqs_[cq];
  if (static_cast<int>(c.entries.size()) >= c.cq->cqe) {
    ++cq_overflows_;
    q.qp->state = IBV_QPS_ERR;
    return;
  }
  c.entries.emplace_back(wc, send);
  if (send) ++q.sq_in_use;  // Freed when the completion is polled.
}

void FakeVerbs::ToError(Qp& q) {
  q.qp->state = IBV_QPS_ERR;
  while (!q.rq.empty()) {
    ibv_wc wc{};
    wc.wr_id = q.rq.front().wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.qp_num = q.qp->qp_num;
    q.rq.pop_front();
    Complete(q, q.qp->recv_cq, wc, false);
  }
}

int FakeVerbs::ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = qps_.find(qp->qp_num);
  if (it == qps_.end() || !(mask & IBV_QP_STATE)) return EINVAL;
  Qp& q = it->second;
  const ibv_qp_state from = q.qp->state;
  switch (attr->qp_state) {
    case IBV_QPS_INIT:
      if (from != IBV_QPS_RESET || (mask & kRequiredInit) != kRequiredInit) return EINVAL;
      if (attr->port_num < 1 || attr->port_num > q.device->spec.ports) return EINVAL;
      q.port = attr->port_num;
      break;
    case IBV_QPS_RTR:
      if (from != IBV_QPS_INIT || (mask & kRequiredRtr) != kRequiredRtr) return EINVAL;
      if (attr->path_mtu > q.device->spec.active_mtu) return EINVAL;
      if (q.device->spec.ethernet && !attr->ah_attr.is_global) return EINVAL;  // RoCE needs a GRH.
      q.dest_qpn = attr->dest_qp_num;
      q.rq_psn = attr->rq_psn;
      q.dlid = attr->ah_attr.dlid;
      q.is_global = attr->ah_attr.is_global;
      q.dgid = attr->ah_attr.grh.dgid;
      q.sgid_index = attr->ah_attr.grh.sgid_index;
      break;
    case IBV_QPS_RTS:
      if (from != IBV_QPS_RTR || (mask & kRequiredRts) != kRequiredRts) return EINVAL;
      q.sq_psn = attr->sq_psn;
      break;
    case IBV_QPS_ERR:
      ToError(q);
      return 0;
    default:
      return EINVAL;
  }
  q.qp->state = attr->qp_state;
  return 0;
}

bool FakeVerbs::Reaches(const Qp& from, const Qp& to) const {
  if (to.qp->state != IBV_QPS_RTR && to.qp->state != IBV_QPS_RTS) return false;
  if (to.dest_qpn != from.qp->qp_num || to.rq_psn != from.sq_psn) return false;
  if (from.device->spec.ethernet != to.device->spec.ethernet) return false;
  if (from.device->spec.ethernet) {
    ibv_gid_type type;
    const ibv_gid g = GidOf(*to.device, to.sgid_index, &type);
    return from.is_global && std::memcmp(&g, &from.dgid, sizeof(g)) == 0;
  }
  return from.dlid == to.device->lid;
}

FakeVerbs::Mr* FakeVerbs::FindMr(uint32_t key, bool remote, ibv_pd* pd, uint64_t addr, uint64_t len) {
  auto it = mrs_.find(key);
  if (it == mrs_.end()) return nullptr;
  Mr& m = it->second;
  const uint64_t base = reinterpret_cast<uintptr_t>(m.mr->addr);
  if (m.mr->pd != pd || addr < base || addr + len > base + m.mr->length) return nullptr;
  if (remote && !(m.access & IBV_ACCESS_REMOTE_WRITE)) return nullptr;
  return &m;
}

int FakeVerbs::PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = qps_.find(qp->qp_num);
  if (it == qps_.end()) return EINVAL;
  Qp& q = it->second;
  for (; wr != nullptr; wr = wr->next) {
    if (q.qp->state != IBV_QPS_RTS && q.qp->state != IBV_QPS_ERR) {
      *bad_wr = wr;
      return EINVAL;
    }
    if (q.sq_in_use >= q.max_send) {
      *bad_wr = wr;
      return ENOMEM;
    }
    const bool signaled = (wr->send_flags & IBV_SEND_SIGNALED) || q.sig_all;
    ibv_wc wc{};
    wc.wr_id = wr->wr_id;
    wc.qp_num = q.qp->qp_num;
    wc.opcode = (wr->opcode == IBV_WR_SEND || wr->opcode == IBV_WR_SEND_WITH_IMM) ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
    auto fail = [&](ibv_wc_status status) {
      wc.status = status;
      Complete(q, q.qp->send_cq, wc, true);
      if (status != IBV_WC_WR_FLUSH_ERR) ToError(q);
    };
    if (q.qp->state == IBV_QPS_ERR) {
      fail(IBV_WC_WR_FLUSH_ERR);
      continue;
    }
    if (q.fail_next) {
      const ibv_wc_status s = *q.fail_next;
      q.fail_next.reset();
      fail(s);
      continue;
    }
    uint64_t total = 0;
    bool local_ok = true;
    for (int i = 0; i < wr->num_sge; ++i) {
      const ibv_sge& s = wr->sg_list[i];
      if (s.length != 0 && FindMr(s.lkey, false, q.qp->pd, s.addr, s.length) == nullptr) local_ok = false;
      total += s.length;
    }
    if (!local_ok) {
      fail(IBV_WC_LOC_PROT_ERR);
      continue;
    }
    auto peer_it = qps_.find(q.dest_qpn);
    if (peer_it == qps_.end() || !Reaches(q, peer_it->second)) {
      fail(IBV_WC_RETRY_EXC_ERR);  // Nobody answers: the transport retries run out.
      continue;
    }
    Qp& p = peer_it->second;
    const bool write = wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    const bool consumes = wr->opcode != IBV_WR_RDMA_WRITE;
    if (!write && wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM) {
      *bad_wr = wr;
      return EINVAL;  // Only the operations the transport uses are modelled.
    }
    if (consumes && p.rq.empty()) {
      ++rnr_errors_;
      fail(IBV_WC_RNR_RETRY_EXC_ERR);
      continue;
    }
    if (write) {
      if (total != 0 && FindMr(wr->wr.rdma.rkey, true, p.qp->pd, wr->wr.rdma.remote_addr, total) == nullptr) {
        fail(IBV_WC_REM_ACCESS_ERR);
        continue;
      }
      char* dst = reinterpret_cast<char*>(static_cast<uintptr_t>(wr->wr.rdma.remote_addr));
      for (int i = 0; i < wr->num_sge; ++i) {
        const ibv_sge& s = wr->sg_list[i];
        std::memcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(s.addr)), s.length);
        dst += s.length;
      }
      ++writes_;
    }
    if (consumes) {
      Recv r = std::move(p.rq.front());
      p.rq.pop_front();
      ibv_wc rwc{};
      rwc.wr_id = r.wr_id;
      rwc.qp_num = p.qp->qp_num;
      rwc.src_qp = q.qp->qp_num;
      rwc.byte_len = static_cast<uint32_t>(total);
      rwc.status = IBV_WC_SUCCESS;
      if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND_WITH_IMM) {
        rwc.wc_flags = IBV_WC_WITH_IMM;
        rwc.imm_data = wr->imm_data;
      }
      rwc.opcode = write ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
      if (!write) {  // A send lands in the receive's buffers.
        uint64_t room = 0;
        for (const ibv_sge& s : r.sges) room += s.length;
        if (room < total) {
          rwc.status = IBV_WC_LOC_LEN_ERR;
          Complete(p, p.qp->recv_cq, rwc, false);
          ToError(p);
          fail(IBV_WC_REM_INV_REQ_ERR);
          continue;
        }
        size_t ri = 0, roff = 0;
        for (int i = 0; i < wr->num_sge; ++i) {
          const char* src = reinterpret_cast<const char*>(static_cast<uintptr_t>(wr->sg_list[i].addr));
          for (uint32_t left = wr->sg_list[i].length; left > 0;) {
            while (roff == r.sges[ri].length) {
              ++ri;
              roff = 0;
            }
            const uint32_t n = std::min<uint32_t>(left, r.sges[ri].length - roff);
            std::memcpy(reinterpret_cast<char*>(static_cast<uintptr_t>(r.sges[ri].addr)) + roff, src, n);
            src += n;
            left -= n;
            roff += n;
          }
        }
      }
      Complete(p, p.qp->recv_cq, rwc, false);
    }
    if (signaled) {
      wc.status = IBV_WC_SUCCESS;
      wc.byte_len = static_cast<uint32_t>(total);
      Complete(q, q.qp->send_cq, wc, true);
    }
  }
  return 0;
}

int FakeVerbs::PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = qps_.find(qp->qp_num);
  if (it == qps_.end()) return EINVAL;
  Qp& q = it->second;
  for (; wr != nullptr; wr = wr->next) {
    if (q.qp->state == IBV_QPS_RESET) {
      *bad_wr = wr;
      return EINVAL;
    }
    if (static_cast<int>(q.rq.size()) >= q.max_recv) {
      *bad_wr = wr;
      return ENOMEM;
    }
    for (int i = 0; i < wr->num_sge; ++i) {
      const ibv_sge& s = wr->sg_list[i];
      if (s.length != 0 && FindMr(s.lkey, false, q.qp->pd, s.addr, s.length) == nullptr) {
        *bad_wr = wr;
        return EINVAL;
      }
    }
    Recv r;
    r.wr_id = wr->wr_id;
    r.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    q.rq.push_back(std::move(r));
    if (q.qp->state == IBV_QPS_ERR) ToError(q);
  }
  return 0;
}

int FakeVerbs::PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = cqs_.find(cq);
  if (it == cqs_.end()) return -1;
  int n = 0;
  auto& entries = it->second.entries;
  while (n < num_entries && !entries.empty()) {
    auto [e, send] = entries.front();
    entries.pop_front();
    if (send) {
      auto q = qps_.find(e.qp_num);
      if (q != qps_.end()) --q->second.sq_in_use;
    }
    wc[n++] = e;
  }
  return n;
}

const char* FakeVerbs::WcStatusStr(ibv_wc_status status) { return ibv_wc_status_str(status); }

}  // namespace dmagather::server::transport::testing
