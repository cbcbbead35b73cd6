// VerbsApi: the ibverbs entry points the ibverbs transport uses, as a table
// (a C++ interface) so that the transport can run against libibverbs
// (RealVerbs) or against an in-process fake HCA in tests
// (tests/fakes/fake_verbs.h).
//
// The methods mirror the libibverbs calls one for one and keep their
// conventions: pointers are null on failure (errno set), ints are 0 or an
// errno value. ibv_post_send, ibv_post_recv, ibv_poll_cq and
// ibv_query_gid_ex are static inline in verbs.h (they call through
// ctx->ops); RealVerbs wraps them in real functions.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

namespace dmagather::server::transport {

class VerbsApi {
 public:
  virtual ~VerbsApi() = default;

  // Devices.
  virtual ibv_device** GetDeviceList(int* num_devices) = 0;
  virtual void FreeDeviceList(ibv_device** list) = 0;
  virtual const char* GetDeviceName(ibv_device* device) = 0;
  virtual ibv_context* OpenDevice(ibv_device* device) = 0;
  virtual int CloseDevice(ibv_context* context) = 0;
  virtual int QueryDevice(ibv_context* context, ibv_device_attr* attr) = 0;
  virtual int QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) = 0;
  virtual int QueryGid(ibv_context* context, uint8_t port, int index, ibv_gid* gid) = 0;
  // ibv_query_gid_ex: the GID and its type (IB, RoCE v1, RoCE v2).
  virtual int QueryGidEntry(ibv_context* context, uint8_t port, int index, ibv_gid_entry* entry) = 0;

  // Protection domains and memory regions.
  virtual ibv_pd* AllocPd(ibv_context* context) = 0;
  virtual int DeallocPd(ibv_pd* pd) = 0;
  virtual ibv_mr* RegMr(ibv_pd* pd, void* addr, size_t length, int access) = 0;
  virtual int DeregMr(ibv_mr* mr) = 0;

  // Completion queues and queue pairs.
  virtual ibv_cq* CreateCq(ibv_context* context, int cqe) = 0;
  virtual int DestroyCq(ibv_cq* cq) = 0;
  virtual ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* attr) = 0;
  virtual int DestroyQp(ibv_qp* qp) = 0;
  virtual int ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = 0;

  // The data path.
  virtual int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) = 0;
  virtual int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) = 0;
  // Number of completions written to wc (0..num_entries), or < 0 on error.
  virtual int PollCq(ibv_cq* cq, int num_entries, ibv_wc* wc) = 0;

  virtual const char* WcStatusStr(ibv_wc_status status) = 0;
};

// The table that calls libibverbs (a process-wide singleton).
VerbsApi* RealVerbs();

}  // namespace dmagather::server::transport
