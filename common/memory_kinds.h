// Names of the memory kinds a client can hand to the daemon (the control
// plane's RegisterRequest.memory_kind), shared by the client backends and
// the daemon's engines.
#pragma once

namespace dmagather::common {

inline constexpr char kMemoryHostShm[] = "host_shm";  // POSIX shm object, opened by name.
inline constexpr char kMemoryCudaIpc[] = "cuda_ipc";  // cudaIpcMemHandle_t of an allocation base.

}  // namespace dmagather::common
