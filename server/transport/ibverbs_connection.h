// IbverbsConnection: one link of the ibverbs transport (ibverbs_transport.h)
// - an RC queue pair whose sender writes each chunk into the peer's
// receive ring with RDMA_WRITE_WITH_IMM (the completion proves it landed)
// and whose receiver returns ring slots as credits. Set up over the
// bootstrap TCP connection it was upgraded from (Setup), then Send/Recv as
// any Connection. Private to the transport.
//
// Threads: one sending thread and one receiving thread (the ring's link
// threads); mu_ guards the queue pair's completions, credits, the arrived
// chunks and the first error (the annotations say which).
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/transport/ibverbs_device.h"
#include "server/transport/ibverbs_transport.h"
#include "server/transport/transport.h"
#include "server/transport/verbs_api.h"

namespace dmagather::server::transport {

struct WireInfo;  // ibverbs_connection.cc: what the two ends exchange at setup.

class IbverbsConnection : public Connection {
 public:
  IbverbsConnection(std::shared_ptr<VerbsDevice> dev, const IbverbsOptions& o, std::unique_ptr<Connection> bootstrap)
      : dev_(std::move(dev)),
        api_(dev_->api),
        bootstrap_(std::move(bootstrap)),
        peer_(bootstrap_->peer()),
        clock_(o.clock),
        slots_(static_cast<uint32_t>(o.slots)),
        slot_bytes_(o.slot_bytes),
        credit_batch_(std::max<uint32_t>(1, slots_ / 4)) {
    const int max_wr = dev_->device_attr.max_qp_wr > 0 ? dev_->device_attr.max_qp_wr : 1 << 14;
    sq_depth_ = std::min(2 * kIbverbsMaxSlots, max_wr);
    rq_depth_ = std::min(static_cast<int>(slots_) + kIbverbsMaxSlots, max_wr);
  }

  ~IbverbsConnection() override {
    if (connected_) Drain();
    bootstrap_.reset();  // Closes the socket: the peer sees EOF.
    if (qp_ != nullptr) api_->DestroyQp(qp_);
    if (scq_ != nullptr) api_->DestroyCq(scq_);
    if (rcq_ != nullptr) api_->DestroyCq(rcq_);
    if (rx_mr_ != nullptr) api_->DeregMr(rx_mr_);
    if (tx_mr_ != nullptr) api_->DeregMr(tx_mr_);
    std::free(rx_base_);
    std::free(tx_base_);
  }

  absl::Status Setup(bool initiator);

  absl::Status Send(const void* header, size_t header_len, const void* payload, size_t len) override;
  absl::Status Recv(void* dst, size_t len) override;
  void Shutdown() override {
    if (!shut_.exchange(true)) bootstrap_->Shutdown();
  }
  const std::string& peer() const override { return peer_; }
  int fd() const override { return bootstrap_->fd(); }

 private:
  absl::Status SetupLocal();
  absl::Status SetupRemote(const WireInfo& theirs);
  absl::Status Exchange(bool initiator, WireInfo* mine, WireInfo* theirs, uint32_t stage);
  absl::Status Modify(ibv_qp_attr* attr, int mask, const char* to);

  void Progress() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleRecv(const ibv_wc& wc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(absl::Status s, bool flush = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CompletionError(const char* what, const ibv_wc& wc) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PostRecv() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushCredits() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PeerGone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Progresses until ready() (both called with mu_ held; mu_ is released
  // between tries), or the connection fails or is shut.
  template <typename Ready, typename Idle>
  absl::Status Wait(Ready ready, Idle idle, bool data_first) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status ShutError() const {
    return absl::UnavailableError(absl::StrCat("connection to ", peer_, " was shut down"));
  }

  const std::shared_ptr<VerbsDevice> dev_;
  VerbsApi* const api_;
  std::unique_ptr<Connection> bootstrap_;
  const std::string peer_;
  const common::Clock* const clock_;  // Drain's deadline.

  // Local receive ring.
  const uint32_t slots_;
  const size_t slot_bytes_;
  const uint32_t credit_batch_;
  int sq_depth_ = 0, rq_depth_ = 0;
  ibv_cq* scq_ = nullptr;
  ibv_cq* rcq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  char* rx_base_ = nullptr;
  ibv_mr* rx_mr_ = nullptr;
  uint32_t psn_ = 0;

  // The peer's ring (and the local send staging that mirrors it).
  uint64_t remote_addr_ = 0;
  uint32_t remote_rkey_ = 0;
  uint32_t remote_slots_ = 0;
  size_t remote_slot_bytes_ = 0;
  char* tx_base_ = nullptr;
  ibv_mr* tx_mr_ = nullptr;
  bool connected_ = false;

  std::atomic<bool> shut_{false};

  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // The first failure (a flush error gives way to its cause).
  bool error_is_flush_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<uint32_t> arrived_ ABSL_GUARDED_BY(mu_);  // Lengths of the chunks landed in rx slots, in order.
  uint32_t tx_credits_ ABSL_GUARDED_BY(mu_) = 0;       // Free slots of the peer's ring.
  uint32_t credits_to_return_ ABSL_GUARDED_BY(mu_) = 0;
  int sq_outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // Posted sends whose completion is not polled yet.

  // Receiver thread only.
  uint64_t rx_head_ = 0;  // Chunks consumed.
  size_t rx_cursor_ = 0;  // Bytes consumed of the current chunk.
  // Sender thread only.
  uint64_t tx_next_ = 0;  // Chunks sent.
};

}  // namespace dmagather::server::transport
