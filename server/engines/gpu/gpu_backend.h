// GpuEngineBackend: the EngineBackend (engine_registry.h) of a GPU backend -
// a GpuEngine over the runtime `create_runtime` makes, with the daemon's
// engine options (EngineOptions, factory.h). cuda_runtime.cc and
// hip_runtime.cc register theirs with it:
//
//   const EngineRegistration kReg(GpuEngineBackend({.name = "cuda", ...}));
//
// Called during static initialization; `create` runs on the daemon's main
// thread at start.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/engines/engine_registry.h"
#include "server/engines/factory.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu {

struct GpuBackendSpec {
  std::string name;      // The --backend value: "cuda".
  int priority = 0;      // EngineBackend::priority.
  std::string label;     // In messages: "CUDA".
  std::string unusable;  // What --backend=auto says when it fails: "no usable CUDA GPU".
  std::string devices;   // What the engine has, after its device count: "CUDA GPU(s)".
  // The runtime, with the daemon's engine options (its backend's part:
  // EngineOptions::cuda, EngineOptions::hip).
  std::function<absl::StatusOr<std::unique_ptr<GpuRuntime>>(const EngineOptions&)> create_runtime;
};

EngineBackend GpuEngineBackend(GpuBackendSpec spec);

}  // namespace dmagather::server::engines::gpu
