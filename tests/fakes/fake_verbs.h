// FakeVerbs: an in-process "HCA" behind the VerbsApi table, for tests of the
// ibverbs transport on machines without RDMA hardware.
//
// What it models: devices with ports (active or not, InfiniBand with LIDs or
// Ethernet/RoCE with a typed GID table), protection domains, memory regions
// with lkey/rkey over real memory, completion queues of bounded size, and RC
// queue pairs that connect by queue-pair number within the process. The
// state machine RESET -> INIT -> RTR -> RTS checks the attribute masks a real
// provider requires, and a send only reaches a peer whose queue pair points
// back at it with matching PSNs and address (LID, or GID on RoCE).
//
// ibv_post_send runs the operation at once, in the caller's thread:
//   RDMA_WRITE(_WITH_IMM): copies the gathered bytes into the remote memory
//     region (rkey, range and REMOTE_WRITE checked); WITH_IMM consumes a
//     posted receive of the peer and completes it (IBV_WC_RECV_RDMA_WITH_IMM,
//     the immediate, byte_len) on the peer's receive CQ;
//   SEND(_WITH_IMM): copies into the peer's posted receive buffers.
//   Signaled sends complete on the local send CQ.
// Failures are those of RC hardware: no posted receive -> RNR retry exceeded
// (counted: rnr_errors()), peer gone or not ready -> retry exceeded, both
// moving the sender's queue pair to the error state; a queue pair in the
// error state flushes its posted receives and every later work request with
// IBV_WC_WR_FLUSH_ERR. A full CQ is counted (cq_overflows()) and errors the
// queue pair.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/transport/verbs_api.h"

namespace dmagather::server::transport::testing {

class FakeVerbs : public VerbsApi {
 public:
  struct DeviceSpec {
    std::string name = "fake_hca0";
    int ports = 1;
    bool port_active = true;
    bool ethernet = false;  // RoCE: link layer Ethernet, GIDs 0..3 (v1, v2, v1 IPv4, v2 IPv4).
    ibv_mtu active_mtu = IBV_MTU_4096;
    int max_qp_wr = 16384;
  };

  FakeVerbs() = default;
  ~FakeVerbs() override;

  void AddDevice(const DeviceSpec& spec);

  // The next send posted on queue pair `qpn` completes with `status` and
  // moves the queue pair to the error state.
  void FailNextSend(uint32_t qpn, ibv_wc_status status);
  // ibv_create_qp on `device` fails (ENOMEM) from now on.
  void FailCreateQp(const std::string& device);
  // Moves queue pair `qpn` to the error state now (its receives flush).
  void SetQpError(uint32_t qpn);
  // Queue-pair numbers alive now on `device` (empty: all), in creation order.
  std::vector<uint32_t> QpNumbers(const std::string& device = "") const;
  // The source GID index queue pair `qpn` was moved to RTR with (-1: none).
  int SgidIndex(uint32_t qpn) const;
  // Contexts, PDs, MRs, CQs and QPs not yet freed.
  int live_objects() const;
  int cq_overflows() const;
  int rnr_errors() const;
  // RDMA writes executed (each a copy into a peer's memory region).
  int64_t writes() const;

  ibv_device** GetDeviceList(int* num_devices) override;
  void FreeDeviceList(ibv_device** list) override;
  const char* GetDeviceName(ibv_device* device) override;
  ibv_context* OpenDevice(ibv_device* device) override;
  int CloseDevice(ibv_context* context) override;
  int QueryDevice(ibv_context* context, ibv_device_attr* attr) override;
  int QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) override;
  int QueryGid(ibv_context* context, uint8_t port, int index, ibv_gid* gid) override;
  int QueryGidEntry(ibv_context* context, uint8_t port, int index, ibv_gid_entry* entry) override;
  ibv_pd* AllocPd(ibv_context* context) override;
  int DeallocPd(ibv_pd* pd) override;
  ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t length, int access) override;
  int DeregMr(ibv_mr* mr) override;
  ibv_cq* CreateCq(ibv_context* context, int cqe) override;
  int DestroyCq(ibv_cq* cq) override;
  ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* attr) override;
  int DestroyQp(ibv_qp* qp) override;
  int ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) override;
  int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) override;
  int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) override;
  int PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc) override;
  const char* WcStatusStr(ibv_wc_status status) override;

 private:
  struct Device {
    std::unique_ptr<ibv_device> dev;
    DeviceSpec spec;
    uint16_t lid = 0;
    int index = 0;
  };
  struct Mr {
    std::unique_ptr<ibv_mr> mr;
    int access = 0;
  };
  struct Cq {
    std::unique_ptr<ibv_cq> cq;
    std::deque<std::pair<ibv_wc, bool /*send*/>> entries;
  };
  struct Recv {
    uint64_t wr_id = 0;
    std::vector<ibv_sge> sges;
  };
  struct Qp {
    std::unique_ptr<ibv_qp> qp;
    Device* device = nullptr;
    int max_send = 0, max_recv = 0;
    int sq_in_use = 0;
    bool sig_all = false;
    std::deque<Recv> rq;
    uint8_t port = 0;
    uint32_t dest_qpn = 0, rq_psn = 0, sq_psn = 0;
    uint16_t dlid = 0;
    bool is_global = false;
    ibv_gid dgid{};
    int sgid_index = 0;
    std::optional<ibv_wc_status> fail_next;
  };

  Device* DeviceOf(ibv_context* ctx);
  ibv_gid GidOf(const Device& d, int index, ibv_gid_type* type) const;
  Mr* FindMr(uint32_t key, bool remote, ibv_pd* pd, uint64_t addr, uint64_t len);
  void Complete(Qp& q, ibv_cq* cq, const ibv_wc& wc, bool send);
  void ToError(Qp& q);
  bool Reaches(const Qp& from, const Qp& to) const;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::map<ibv_context*, Device*> contexts_;
  std::map<ibv_pd*, std::unique_ptr<ibv_pd>> pds_;
  std::map<uint32_t, Mr> mrs_;  // By key (lkey == rkey).
  std::map<ibv_cq*, Cq> cqs_;
  std::map<uint32_t, Qp> qps_;  // By queue-pair number.
  uint32_t next_key_ = 0x1000;
  uint32_t next_qpn_ = 0x40;
  std::string fail_create_qp_;
  int cq_overflows_ = 0;
  int rnr_errors_ = 0;
  int64_t writes_ = 0;
};

}  // namespace dmagather::server::transport::testing
