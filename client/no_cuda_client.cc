// CudaClient for builds without the CUDA toolkit (client/BUILD picks this
// file instead of cuda_client.cc): no process has a CUDA device, so a
// dmagatherd on the cuda backend is refused at join with a clear reason.
#include "client/cuda_client.h"

namespace dmagather::client {
namespace {

absl::Status NoCuda() { return absl::FailedPreconditionError("libdmagather was built without CUDA"); }

}  // namespace

int CudaClient::CurrentDevice() { return -1; }

absl::StatusOr<std::unique_ptr<CudaClient>> CudaClient::Create(int, abi::CompletionV1*, uint64_t) {
  return NoCuda();
}

// Never reached: Create never returns a CudaClient.
CudaClient::~CudaClient() = default;
absl::StatusOr<CudaClient::Allocation> CudaClient::Describe(const void*) const { return NoCuda(); }
uint64_t CudaClient::BufferId(const void*) const { return 0; }
absl::StatusOr<std::string> CudaClient::IpcHandle(uintptr_t) const { return NoCuda(); }
absl::StatusOr<void*> CudaClient::Malloc(uint64_t) { return NoCuda(); }
absl::Status CudaClient::Free(void*) { return NoCuda(); }
absl::Status CudaClient::CopyAsync(void*, const void*, uint64_t, void*) { return NoCuda(); }
absl::Status CudaClient::WriteReady(void*, uint32_t) { return NoCuda(); }
absl::Status CudaClient::WaitDone(void*, uint32_t) { return NoCuda(); }

}  // namespace dmagather::client
