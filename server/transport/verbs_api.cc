#include "server/transport/verbs_api.h"

namespace dmagather::server::transport {
namespace {

class LibIbverbs final : public VerbsApi {
 public:
  ibv_device** GetDeviceList(int* n) override { return ibv_get_device_list(n); }
  void FreeDeviceList(ibv_device** list) override { ibv_free_device_list(list); }
  const char* GetDeviceName(ibv_device* d) override { return ibv_get_device_name(d); }
  ibv_context* OpenDevice(ibv_device* d) override { return ibv_open_device(d); }
  int CloseDevice(ibv_context* c) override { return ibv_close_device(c); }
  int QueryDevice(ibv_context* c, ibv_device_attr* a) override { return ibv_query_device(c, a); }
  int QueryPort(ibv_context* c, uint8_t port, ibv_port_attr* a) override { return ibv_query_port(c, port, a); }
  int QueryGid(ibv_context* c, uint8_t port, int index, ibv_gid* gid) override {
    return ibv_query_gid(c, port, index, gid);
  }
  int QueryGidEntry(ibv_context* c, uint8_t port, int index, ibv_gid_entry* e) override {
    return ibv_query_gid_ex(c, port, static_cast<uint32_t>(index), e, 0);
  }
  ibv_pd* AllocPd(ibv_context* c) override { return ibv_alloc_pd(c); }
  int DeallocPd(ibv_pd* pd) override { return ibv_dealloc_pd(pd); }
  ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t len, int access) override { return ibv_reg_mr(pd, addr, len, access); }
  int DeregMr(ibv_mr* mr) override { return ibv_dereg_mr(mr); }
  ibv_cq* CreateCq(ibv_context* c, int cqe) override { return ibv_create_cq(c, cqe, nullptr, nullptr, 0); }
  int DestroyCq(ibv_cq* cq) override { return ibv_destroy_cq(cq); }
  ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* a) override { return ibv_create_qp(pd, a); }
  int DestroyQp(ibv_qp* qp) override { return ibv_destroy_qp(qp); }
  int ModifyQp(ibv_qp* qp, ibv_qp_attr* a, int mask) override { return ibv_modify_qp(qp, a, mask); }
  int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) override { return ibv_post_send(qp, wr, bad); }
  int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) override { return ibv_post_recv(qp, wr, bad); }
  int PollCq(ibv_cq* cq, int n, ibv_wc* wc) override { return ibv_poll_cq(cq, n, wc); }
  const char* WcStatusStr(ibv_wc_status s) override { return ibv_wc_status_str(s); }
};

}  // namespace

VerbsApi* RealVerbs() {
  static LibIbverbs* const api = new LibIbverbs();
  return api;
}

}  // namespace dmagather::server::transport
