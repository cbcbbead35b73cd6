// EngineRegistry: the copy backends linked into this binary, by name. Each
// backend registers itself from its own file with a static
// EngineRegistration (its library is `alwayslink = 1`), so which backends a
// dmagatherd has is decided by its BUILD deps (cuda only where the build
// found the CUDA toolkit), not by #ifdefs. CreateEngine (factory.h) picks
// from here.
//
// Threads: RegisterEngine runs during static initialization; the lookups
// after main() starts. Both are safe from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::engines {

struct EngineOptions;  // factory.h

using EngineCreateFn = std::function<absl::StatusOr<std::unique_ptr<CopyEngine>>(const EngineOptions&)>;

struct EngineBackend {
  std::string name;  // The --backend value: "host", "cuda", "hip".
  int priority = 0;  // --backend=auto tries higher first (hip 300 > cuda 200 > host 0).
  EngineCreateFn create;
  std::string label;  // The name in messages ("cannot use CUDA: ..."); default: name.
  // For the reasons CreateEngine reports (optional):
  // what auto says when create fails, before "(<error>)": "no usable CUDA GPU";
  std::string unusable;
  // what the engine found, after "--backend=NAME, " / "auto: ": "2 CUDA GPU(s)".
  std::function<std::string(const CopyEngine&)> describe;
  // EngineOptions::stay_awake_ns where the operator left it at -1.
  int64_t default_stay_awake_ns = 0;
};

// Adds a backend. A name registered twice is a programming error (aborts).
void RegisterEngine(EngineBackend backend);
// The same, for the common case.
void RegisterEngine(std::string name, int priority, EngineCreateFn create);

// The registered backends, highest priority first.
std::vector<EngineBackend> RegisteredEngines();
// Their names, highest priority first: "cuda, host".
std::string RegisteredEngineNames();

// Registers at static-initialization time:
//   const EngineRegistration kRegistration({.name = "host", ...});
class EngineRegistration {
 public:
  explicit EngineRegistration(EngineBackend backend) { RegisterEngine(std::move(backend)); }
};

}  // namespace dmagather::server::engines
