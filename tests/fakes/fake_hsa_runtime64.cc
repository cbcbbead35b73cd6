// A fake libhsa-runtime64 for unit tests on machines without ROCm: the HSA
// calls dmagatherd's hip runtime resolves to assign SDMA engines itself.
// It lists a CPU agent and one GPU agent per fake HIP device
// ($DMAGATHER_FAKE_HIP_DEVICES, default 1), in reverse order, with the PCI
// address the fake libamdhip64 reports for that device (0000:<0x40+d>:00.0),
// so the runtime has to match them by address. Copies are done at once with
// memcpy and their completion signal set to 0.
//
// Built twice: with FAKE_HSA_ENGINE_CALLS it has
// hsa_amd_memory_async_copy_on_engine and hsa_amd_memory_copy_engine_status
// (ROCm >= 5.7; every link reports engines 0 and 1 usable, minus
// $DMAGATHER_FAKE_HSA_UNUSABLE, a hex mask); without, it is a ROCm < 5.7
// runtime. fake_hsa_* (extern "C") let tests read what was asked of it.
//
// Threads: any; a mutex guards the counters.
#include <hsa/hsa.h>
#include <hsa/hsa_ext_amd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace {

// The engine argument's type as the headers declare it (an enum from ROCm
// 5.7; older headers do not declare the call at all).
#ifdef DMAGATHER_HSA_HAS_COPY_ON_ENGINE
using EngineId = hsa_amd_sdma_engine_id_t;
#else
using EngineId = uint32_t;
#endif

std::mutex mu;
std::map<uint32_t, uint64_t> bytes_on;  // Engine bit (0: ROCr's choice) -> bytes.
int forced = 0;                         // Copies with force_copy_on_sdma.

constexpr uint64_t kCpu = 1;
constexpr uint64_t kGpu0 = 10;

int Devices() {
  const char* v = std::getenv("DMAGATHER_FAKE_HIP_DEVICES");
  return v != nullptr ? std::atoi(v) : 1;
}
bool IsGpu(hsa_agent_t a) { return a.handle >= kGpu0 && a.handle < kGpu0 + uint64_t(Devices()); }

std::atomic<hsa_signal_value_t>* Sig(hsa_signal_t s) {
  return reinterpret_cast<std::atomic<hsa_signal_value_t>*>(s.handle);
}

hsa_status_t Copy(void* dst, hsa_agent_t dst_agent, const void* src, hsa_agent_t src_agent, size_t size,
                  uint32_t num_deps, const hsa_signal_t* deps, hsa_signal_t done, uint32_t engine) {
  if (!IsGpu(dst_agent) || !IsGpu(src_agent)) return HSA_STATUS_ERROR_INVALID_AGENT;
  for (uint32_t i = 0; i < num_deps; ++i) {
    if (Sig(deps[i])->load() != 0) return HSA_STATUS_ERROR;  // Copies finish at once: never pending.
  }
  std::memcpy(dst, src, size);
  {
    std::lock_guard<std::mutex> l(mu);
    bytes_on[engine] += size;
  }
  Sig(done)->store(0);
  return HSA_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

uint64_t fake_hsa_bytes_on(uint32_t engine_bit) {
  std::lock_guard<std::mutex> l(mu);
  auto it = bytes_on.find(engine_bit);
  return it != bytes_on.end() ? it->second : 0;
}
int fake_hsa_forced_copies() {
  std::lock_guard<std::mutex> l(mu);
  return forced;
}

hsa_status_t hsa_init() { return HSA_STATUS_SUCCESS; }

hsa_status_t hsa_iterate_agents(hsa_status_t (*callback)(hsa_agent_t, void*), void* data) {
  if (hsa_status_t st = callback(hsa_agent_t{kCpu}, data); st != HSA_STATUS_SUCCESS) return st;
  for (int d = Devices() - 1; d >= 0; --d) {
    if (hsa_status_t st = callback(hsa_agent_t{kGpu0 + uint64_t(d)}, data); st != HSA_STATUS_SUCCESS) return st;
  }
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_agent_get_info(hsa_agent_t agent, hsa_agent_info_t attribute, void* value) {
  if (agent.handle != kCpu && !IsGpu(agent)) return HSA_STATUS_ERROR_INVALID_AGENT;
  const int d = static_cast<int>(agent.handle - kGpu0);
  switch (static_cast<int>(attribute)) {
    case HSA_AGENT_INFO_DEVICE:
      *static_cast<hsa_device_type_t*>(value) = agent.handle == kCpu ? HSA_DEVICE_TYPE_CPU : HSA_DEVICE_TYPE_GPU;
      return HSA_STATUS_SUCCESS;
    case HSA_AMD_AGENT_INFO_DOMAIN:
      *static_cast<uint32_t*>(value) = 0;
      return HSA_STATUS_SUCCESS;
    case HSA_AMD_AGENT_INFO_BDFID:
      *static_cast<uint32_t*>(value) = agent.handle == kCpu ? 0 : uint32_t(0x40 + d) << 8;
      return HSA_STATUS_SUCCESS;
    default:
      return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  }
}

hsa_status_t hsa_signal_create(hsa_signal_value_t initial, uint32_t, const hsa_agent_t*, hsa_signal_t* signal) {
  signal->handle = reinterpret_cast<uint64_t>(new std::atomic<hsa_signal_value_t>(initial));
  return HSA_STATUS_SUCCESS;
}
hsa_status_t hsa_signal_destroy(hsa_signal_t signal) {
  delete Sig(signal);
  return HSA_STATUS_SUCCESS;
}
void hsa_signal_store_relaxed(hsa_signal_t signal, hsa_signal_value_t value) { Sig(signal)->store(value); }
hsa_signal_value_t hsa_signal_load_scacquire(hsa_signal_t signal) { return Sig(signal)->load(); }

hsa_status_t hsa_amd_memory_async_copy(void* dst, hsa_agent_t dst_agent, const void* src, hsa_agent_t src_agent,
                                       size_t size, uint32_t num_dep_signals, const hsa_signal_t* dep_signals,
                                       hsa_signal_t completion_signal) {
  return Copy(dst, dst_agent, src, src_agent, size, num_dep_signals, dep_signals, completion_signal, 0);
}

#ifdef FAKE_HSA_ENGINE_CALLS
hsa_status_t hsa_amd_memory_copy_engine_status(hsa_agent_t dst_agent, hsa_agent_t src_agent,
                                               uint32_t* engine_ids_mask) {
  if (!IsGpu(dst_agent) || !IsGpu(src_agent) || dst_agent.handle == src_agent.handle) {
    return HSA_STATUS_ERROR_INVALID_AGENT;
  }
  const char* unusable = std::getenv("DMAGATHER_FAKE_HSA_UNUSABLE");
  *engine_ids_mask = 0x3u & ~(unusable != nullptr ? uint32_t(std::strtoul(unusable, nullptr, 16)) : 0u);
  return HSA_STATUS_SUCCESS;
}

hsa_status_t hsa_amd_memory_async_copy_on_engine(void* dst, hsa_agent_t dst_agent, const void* src,
                                                 hsa_agent_t src_agent, size_t size, uint32_t num_dep_signals,
                                                 const hsa_signal_t* dep_signals, hsa_signal_t completion_signal,
                                                 EngineId engine, bool force_copy_on_sdma) {
  const uint32_t engine_id = static_cast<uint32_t>(engine);
  // As ROCr: exactly one engine bit.
  if (engine_id == 0 || (engine_id & (engine_id - 1)) != 0) return HSA_STATUS_ERROR_INVALID_ARGUMENT;
  {
    std::lock_guard<std::mutex> l(mu);
    forced += force_copy_on_sdma ? 1 : 0;
  }
  return Copy(dst, dst_agent, src, src_agent, size, num_dep_signals, dep_signals, completion_signal, engine_id);
}
#endif

}  // extern "C"
