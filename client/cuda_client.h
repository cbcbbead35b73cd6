// CudaClient: the CUDA side of a rank on the cuda backend. Owns the
// registration of the rank's completion block with CUDA (so its streams can
// write ready_seq and wait on done_seq), describes device pointers
// (allocation base, size, buffer id, device) for the registration cache,
// exports IPC handles, and enqueues the stream operations of a submit:
// the out-of-place self-shard copy, the ready write and the done wait.
//
// Threads: the rank's submitting thread (CommImpl's caller).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "abi/completion_v1.h"

namespace dmagather::client {

class CudaClient {
 public:
  // The calling thread's current CUDA device, or -1 when CUDA is not
  // usable in this process (no driver, no device).
  static int CurrentDevice();

  // Registers the completion block (`block`, page-aligned, `bytes`) with
  // CUDA as mapped, portable host memory.
  static absl::StatusOr<std::unique_ptr<CudaClient>> Create(int device, abi::CompletionV1* block, uint64_t bytes);
  ~CudaClient();  // Unregisters the block.

  struct Allocation {
    uintptr_t base = 0;
    uint64_t bytes = 0;
    uint64_t buffer_id = 0;
    int device = -1;
  };
  // The device allocation containing ptr (cuMemGetAddressRange + pointer
  // attributes); an error for host, managed or unknown memory.
  absl::StatusOr<Allocation> Describe(const void* ptr) const;
  // CU_POINTER_ATTRIBUTE_BUFFER_ID of the allocation containing ptr (0 on error).
  uint64_t BufferId(const void* ptr) const;
  // cudaIpcGetMemHandle of an allocation base, as bytes.
  absl::StatusOr<std::string> IpcHandle(uintptr_t base) const;

  absl::StatusOr<void*> Malloc(uint64_t bytes);
  absl::Status Free(void* ptr);

  // Stream operations (stream: a cudaStream_t; NULL = legacy default stream).
  absl::Status CopyAsync(void* dst, const void* src, uint64_t bytes, void* stream);
  absl::Status WriteReady(void* stream, uint32_t seq);
  absl::Status WaitDone(void* stream, uint32_t seq);

  int device() const { return device_; }

 private:
  CudaClient(int device, void* block, uint64_t ready_dev, uint64_t done_dev)
      : device_(device), block_(block), ready_dev_(ready_dev), done_dev_(done_dev) {}

  const int device_;
  void* const block_;
  const uint64_t ready_dev_;
  const uint64_t done_dev_;
};

}  // namespace dmagather::client
