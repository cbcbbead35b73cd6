// The host (CPU) client backend: buffers are memfds created by
// dmagather_alloc, sealed against shrinking and growing, handed to the
// daemon over its fd channel and mapped by it; readiness is a CPU store into
// the completion block; there are no streams (the host waits).
#include <cstring>

#include "abi/abi_v1.h"
#include "absl/strings/str_format.h"
#include "client/backend.h"
#include "common/memfd.h"
#include "common/memory_kinds.h"
#include "common/reduce.h"
#include "common/status.h"

namespace dmagather::client {
namespace {

// The memfd stays open while the buffer lives (a hand-over needs it; the
// seals make it harmless).
class MemfdBuffer : public OwnedBuffer {
 public:
  explicit MemfdBuffer(common::MemfdMapping m) : mapping_(std::move(m)) {
    exp_.base = reinterpret_cast<uintptr_t>(mapping_.data());
    exp_.bytes = mapping_.size();
    exp_.memory_kind = common::kMemoryHostMemfd;
    exp_.fd = mapping_.fd();
  }
  void* data() const override { return mapping_.data(); }
  const MemoryExport& export_info() const override { return exp_; }

 private:
  common::MemfdMapping mapping_;
  MemoryExport exp_;
};

class HostBackend : public ClientBackend {
 public:
  explicit HostBackend(abi::CompletionV1* completion) : completion_(completion) {}

  const char* name() const override { return "host"; }

  absl::StatusOr<std::unique_ptr<OwnedBuffer>> Allocate(uint64_t bytes) override {
    const uint64_t rounded = (bytes + 4095) & ~uint64_t{4095};
    DMAG_ASSIGN_OR_RETURN(common::MemfdMapping m, common::MemfdMapping::Create("dmagather-buf", rounded));
    return std::unique_ptr<OwnedBuffer>(new MemfdBuffer(std::move(m)));
  }
  absl::StatusOr<MemoryExport> Describe(const void* ptr, uint64_t bytes) const override {
    return common::FallbackError(absl::StrFormat(
        "the host backend reaches only memory from dmagather_alloc; %p (%u bytes) is private to this process", ptr,
        bytes));
  }
  uint64_t BufferId(const void*) const override { return 0; }
  bool registers_on_submit() const override { return false; }

  absl::Status CheckStream(void* stream) const override {
    if (stream == nullptr) return absl::OkStatus();
    return absl::InvalidArgumentError("the host backend takes no stream (pass NULL)");
  }
  bool copies_own_shard() const override { return false; }
  absl::Status CopyOwnShards(const OwnShardCopy* copies, size_t n, void*, bool) override {
    for (size_t i = 0; i < n; ++i) std::memcpy(copies[i].dst, copies[i].src, copies[i].bytes);
    return absl::OkStatus();
  }
  absl::Status WriteReady(void*, uint32_t seq) override {
    abi::StoreRelease(&completion_->ready_seq, seq);
    return absl::OkStatus();
  }
  bool has_stream_waits() const override { return false; }
  absl::Status WaitDoneOnStream(void*, uint32_t) override { return absl::OkStatus(); }
  absl::Status CanReduce() const override { return absl::OkStatus(); }
  absl::Status Reduce(const ReduceArgs& a, void*) override {
    common::ReduceChunks(a.chunks, a.n, a.count, a.dtype, a.redop, a.out);
    return absl::OkStatus();
  }

 private:
  abi::CompletionV1* const completion_;
};

const bool kRegistered = RegisterClientBackend(ClientBackendEntry{
    "host", 0, nullptr, "cpu", [](const ClientBackendContext& ctx) -> absl::StatusOr<std::unique_ptr<ClientBackend>> {
      return std::unique_ptr<ClientBackend>(new HostBackend(ctx.completion));
    }});

}  // namespace
}  // namespace dmagather::client
