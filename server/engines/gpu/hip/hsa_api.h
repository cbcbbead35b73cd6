// The hsa-runtime edge of the hip runtime, for dmagatherd to assign SDMA
// engines itself. libhsa-runtime64 is not linked: it is opened with dlopen
// (libhsa-runtime64.so.1, the soname of ROCm 5.x to 7.x; dmagatherd --hsa_lib
// names one file instead). In a process that already uses HIP, clr has
// loaded and initialized the same library, so the agents, signals and
// IPC-opened memory are those HIP uses.
//
// hsa_amd_memory_async_copy_on_engine and hsa_amd_memory_copy_engine_status
// exist from ROCm 5.7; where either is missing, the table says why and the
// hip runtime leaves every copy to ROCr (hipMemcpyAsync).
//
// OwnSdmaEngines does the set-up on any table (the loaded library's or a
// test's fake): HIP devices matched to HSA GPU agents by PCI address, one
// engine per peer link from what the driver reports usable, minus the
// operator's skip mask (SdmaEnginePlan), and HsaStreams over them.
//
// Threads: LoadHsa and OwnSdmaEngines on the engine's setup thread; the
// table is immutable after.
#pragma once

#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engines/gpu/hip/hsa_copy_queue.h"
#include "server/engines/gpu/hip/hsa_streams.h"
#include "server/engines/gpu/hip/sdma_engines.h"

namespace dmagather::server::engines::gpu::hip {

struct HsaApi {
  hsa_status_t (*init)() = nullptr;
  hsa_status_t (*iterate_agents)(hsa_status_t (*)(hsa_agent_t, void*), void*) = nullptr;
  hsa_status_t (*agent_get_info)(hsa_agent_t, hsa_agent_info_t, void*) = nullptr;
  // hsa_amd_memory_copy_engine_status; null before ROCm 5.7.
  hsa_status_t (*copy_engine_status)(hsa_agent_t dst, hsa_agent_t src, uint32_t* mask) = nullptr;
  // Signals and copies (copy.copy_on_engine null before ROCm 5.7).
  HsaCopyApi copy;
};

// The files tried: `file` alone when not empty (--hsa_lib), else
// libhsa-runtime64.so.1.
std::vector<std::string> HsaLibraryCandidates(const std::string& file);

struct HsaLibrary {
  HsaApi api;
  std::string path;
  // Why dmagatherd cannot choose engines with this library ("" when it
  // can): the calls it lacks.
  std::string no_engine_choice;
};

// Opens the first candidate that loads and resolves the calls; UNAVAILABLE
// when none loads or a call every ROCm has is missing. Does not call
// hsa_init.
absl::StatusOr<std::unique_ptr<HsaLibrary>> LoadHsa(const std::vector<std::string>& candidates);

// "0x6" or "6" (hex): the operator's mask of engines never to use
// (--hip_skip_engines); 0 for "" and an error for anything else.
absl::StatusOr<uint32_t> ParseEngineMask(const std::string& text);

// The set-up described above, for `pci_bus_ids[d]` the PCI bus id HIP
// reports for device d. An error (with the reason to log) when the devices
// cannot be matched to agents or no link has an engine: the caller then
// leaves the copies to ROCr. `api.copy.copy_on_engine` and
// `api.copy_engine_status` must be set.
absl::StatusOr<std::unique_ptr<HsaStreams>> OwnSdmaEngines(const HsaApi* api,
                                                           const std::vector<std::string>& pci_bus_ids,
                                                           uint32_t skip_mask);

}  // namespace dmagather::server::engines::gpu::hip
