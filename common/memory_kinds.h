// Names of the memory kinds a client can hand to the daemon (the control
// plane's RegisterRequest.memory_kind), shared by the client backends and
// the daemon's engines.
#pragma once

namespace dmagather::common {

inline constexpr char kMemoryHostMemfd[] = "host_memfd";  // Sealed memfd, handed over on the fd channel (a ticket).
inline constexpr char kMemoryCudaIpc[] = "cuda_ipc";      // cudaIpcMemHandle_t of an allocation base.
inline constexpr char kMemoryHipIpc[] = "hip_ipc";        // hipIpcMemHandle_t of an allocation base.
// VMM chunks (cuMemCreate with a POSIX fd handle type) mapped back to back:
// the fds handed over on the fd channel (tickets), the chunk table
// (abi/device_memory_v1.h) in the handle.
inline constexpr char kMemoryCudaVmm[] = "cuda_vmm";

}  // namespace dmagather::common
