#include "server/engines/gpu/hip/hsa_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/hip/hip_api.h"

namespace dmagather::server::engines::gpu::hip {
namespace {

template <typename Fn>
bool Resolve(void* lib, const char* symbol, Fn* fn, std::string* missing) {
  void* p = dlsym(lib, symbol);
  if (p == nullptr) {
    if (missing != nullptr) absl::StrAppend(missing, missing->empty() ? "" : ", ", symbol);
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
}

struct GpuAgents {
  const HsaApi* api;
  std::vector<hsa_agent_t> agents;
  std::vector<PciAddress> pci;
  hsa_status_t error = HSA_STATUS_SUCCESS;
};

hsa_status_t CollectGpu(hsa_agent_t agent, void* data) {
  auto* g = static_cast<GpuAgents*>(data);
  hsa_device_type_t type = HSA_DEVICE_TYPE_CPU;
  hsa_status_t st = g->api->agent_get_info(agent, HSA_AGENT_INFO_DEVICE, &type);
  if (st != HSA_STATUS_SUCCESS) return g->error = st;
  if (type != HSA_DEVICE_TYPE_GPU) return HSA_STATUS_SUCCESS;
  uint32_t domain = 0, bdf = 0;
  st = g->api->agent_get_info(agent, static_cast<hsa_agent_info_t>(HSA_AMD_AGENT_INFO_DOMAIN), &domain);
  if (st == HSA_STATUS_SUCCESS) {
    st = g->api->agent_get_info(agent, static_cast<hsa_agent_info_t>(HSA_AMD_AGENT_INFO_BDFID), &bdf);
  }
  if (st != HSA_STATUS_SUCCESS) return g->error = st;
  g->agents.push_back(agent);
  g->pci.push_back(PciAddress{domain, bdf});
  return HSA_STATUS_SUCCESS;
}

}  // namespace

std::vector<std::string> HsaLibraryCandidates(const std::string& file) {
  if (!file.empty()) return {file};
  return {"libhsa-runtime64.so.1"};
}

absl::StatusOr<std::unique_ptr<HsaLibrary>> LoadHsa(const std::vector<std::string>& candidates) {
  std::string path, tried;
  void* lib = common::hip::OpenFirstLibrary(candidates, &path, &tried);
  if (lib == nullptr) return absl::UnavailableError(absl::StrCat("cannot load libhsa-runtime64: ", tried));
  auto out = std::make_unique<HsaLibrary>();
  out->path = path;
  HsaApi& a = out->api;
  std::string missing;
  Resolve(lib, "hsa_init", &a.init, &missing);
  Resolve(lib, "hsa_iterate_agents", &a.iterate_agents, &missing);
  Resolve(lib, "hsa_agent_get_info", &a.agent_get_info, &missing);
  Resolve(lib, "hsa_signal_create", &a.copy.signal_create, &missing);
  Resolve(lib, "hsa_signal_destroy", &a.copy.signal_destroy, &missing);
  Resolve(lib, "hsa_signal_store_relaxed", &a.copy.signal_store_relaxed, &missing);
  Resolve(lib, "hsa_signal_load_scacquire", &a.copy.signal_load_scacquire, &missing);
  Resolve(lib, "hsa_amd_memory_async_copy", &a.copy.async_copy, &missing);
  if (!missing.empty()) {
    dlclose(lib);
    return absl::UnavailableError(absl::StrCat(path, " lacks ", missing));
  }
  std::string no_engine;
  Resolve(lib, "hsa_amd_memory_async_copy_on_engine", &a.copy.copy_on_engine, &no_engine);
  Resolve(lib, "hsa_amd_memory_copy_engine_status", &a.copy_engine_status, &no_engine);
  if (!no_engine.empty()) {
    out->no_engine_choice = absl::StrCat(path, " lacks ", no_engine, " (ROCm < 5.7)");
    a.copy.copy_on_engine = nullptr;
    a.copy_engine_status = nullptr;
  }
  // The library stays open for the life of the process (as libamdhip64).
  return out;
}

absl::StatusOr<uint32_t> ParseEngineMask(const std::string& text) {
  if (text.empty()) return 0u;
  absl::string_view v = text;
  if (!absl::ConsumePrefix(&v, "0x")) absl::ConsumePrefix(&v, "0X");
  uint32_t mask = 0;
  if (v.empty() || !absl::SimpleHexAtoi(v, &mask)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a mask of SDMA engines (hex, bit i = engine i): \"", text, "\""));
  }
  return mask;
}

absl::StatusOr<std::unique_ptr<HsaStreams>> OwnSdmaEngines(const HsaApi* api,
                                                           const std::vector<std::string>& pci_bus_ids,
                                                           uint32_t skip_mask) {
  if (api->copy.copy_on_engine == nullptr || api->copy_engine_status == nullptr) {
    return absl::FailedPreconditionError("the HSA runtime cannot copy on a chosen engine (ROCm < 5.7)");
  }
  std::vector<PciAddress> devices;
  for (size_t d = 0; d < pci_bus_ids.size(); ++d) {
    absl::StatusOr<PciAddress> p = ParsePciBusId(pci_bus_ids[d]);
    if (!p.ok()) return absl::FailedPreconditionError(absl::StrCat("HIP device ", d, ": ", p.status().message()));
    devices.push_back(*p);
  }
  GpuAgents g{api, {}, {}};
  const hsa_status_t st = api->iterate_agents(CollectGpu, &g);
  if (st != HSA_STATUS_SUCCESS || g.error != HSA_STATUS_SUCCESS) {
    return absl::FailedPreconditionError(
        absl::StrCat("hsa_iterate_agents: HSA status ", int(st != HSA_STATUS_SUCCESS ? st : g.error)));
  }
  absl::StatusOr<std::vector<int>> agent_of = MatchDevicesToAgents(devices, g.pci);
  if (!agent_of.ok()) return agent_of.status();
  std::vector<hsa_agent_t> agents;
  for (int a : *agent_of) agents.push_back(g.agents[a]);
  const int n = static_cast<int>(agents.size());
  SdmaEnginePlan plan = SdmaEnginePlan::Build(
      n,
      [&](int dst, int src) -> absl::StatusOr<uint32_t> {
        uint32_t mask = 0;
        const hsa_status_t s = api->copy_engine_status(agents[dst], agents[src], &mask);
        if (s != HSA_STATUS_SUCCESS) return absl::InternalError(absl::StrCat("HSA status ", int(s)));
        return mask;
      },
      skip_mask);
  if (n < 2) return absl::FailedPreconditionError("one device: no peer link to give an engine");
  if (plan.assigned_links() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("no peer link has a usable SDMA engine: ", plan.Describe()));
  }
  return std::make_unique<HsaStreams>(&api->copy, std::move(plan), std::move(agents));
}

}  // namespace dmagather::server::engines::gpu::hip
