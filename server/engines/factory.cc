#include "server/engines/factory.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engines/engine_registry.h"

namespace dmagather::server::engines {
namespace {

// Every backend dmagather has, and why a build may lack it.
struct KnownBackend {
  const char* name;
  const char* absent_because;
};
constexpr KnownBackend kKnownBackends[] = {
    {"host", "this build has no host backend"},
    {"cuda", "built without the CUDA toolkit"},
    {"hip", "built without HIP: libamdhip64-dev and libhsa-runtime-dev were not found"},
};

const KnownBackend* FindKnown(const std::string& name) {
  for (const KnownBackend& k : kKnownBackends) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

std::string Describe(const EngineBackend& b, const CopyEngine& e) { return b.describe ? b.describe(e) : ""; }

// The options as `backend` gets them: -1 settings resolved.
EngineOptions For(const EngineBackend& backend, EngineOptions o) {
  if (o.stay_awake_ns < 0) o.stay_awake_ns = backend.default_stay_awake_ns;
  return o;
}

}  // namespace

absl::StatusOr<CreatedEngine> CreateEngine(const EngineOptions& options) {
  const std::string& b = options.backend;
  const std::vector<EngineBackend> backends = RegisteredEngines();
  if (b != "auto") {
    for (const EngineBackend& backend : backends) {
      if (backend.name != b) continue;
      const EngineOptions o = For(backend, options);
      auto engine = backend.create(o);
      if (!engine.ok()) {
        // "--backend=cuda: cannot use CUDA: cudaGetDeviceCount: ..."
        return absl::Status(engine.status().code(),
                            absl::StrCat("--backend=", b, ": cannot use ", backend.label.empty() ? b : backend.label,
                                         ": ", engine.status().message()));
      }
      CreatedEngine out;
      const std::string what = Describe(backend, **engine);
      out.reason = absl::StrCat("--backend=", b, what.empty() ? "" : ", ", what);
      out.stay_awake_ns = static_cast<uint64_t>(o.stay_awake_ns);
      out.engine = *std::move(engine);
      return out;
    }
    if (const KnownBackend* k = FindKnown(b)) {
      return absl::UnimplementedError(absl::StrCat("the ", b, " backend is not part of this build (", k->absent_because,
                                                   "); this dmagatherd has: ", RegisteredEngineNames()));
    }
    std::vector<std::string> known;
    for (const KnownBackend& k : kKnownBackends) known.push_back(k.name);
    return absl::InvalidArgumentError(
        absl::StrCat("unknown backend '", b, "' (", absl::StrJoin(known, ", "), " or auto)"));
  }

  // auto: by descending priority; the first that starts wins.
  std::vector<std::string> why_not;
  absl::Status last = absl::NotFoundError("no copy backend is registered in this binary");
  for (const EngineBackend& backend : backends) {
    const EngineOptions o = For(backend, options);
    auto engine = backend.create(o);
    if (!engine.ok()) {
      // "no usable CUDA GPU (cudaGetDeviceCount: cudaErrorNoDevice ...)"
      why_not.push_back(
          absl::StrCat(backend.unusable.empty() ? "no usable " + backend.name + " backend" : backend.unusable, " (",
                       engine.status().message(), ")"));
      last = engine.status();
      continue;
    }
    CreatedEngine out;
    const std::string what = Describe(backend, **engine);
    if (!why_not.empty()) {
      out.reason = absl::StrCat("auto: ", absl::StrJoin(why_not, "; "), ", using ", backend.name);
    } else if (!what.empty()) {
      out.reason = absl::StrCat("auto: ", what, " found");
    } else {
      out.reason = absl::StrCat("auto: using ", backend.name, " (this dmagatherd has: ", RegisteredEngineNames(), ")");
    }
    out.stay_awake_ns = static_cast<uint64_t>(o.stay_awake_ns);
    out.engine = *std::move(engine);
    return out;
  }
  return absl::Status(last.code(), absl::StrCat("auto: no copy backend could start: ",
                                                why_not.empty() ? last.message() : absl::StrJoin(why_not, "; ")));
}

std::vector<std::string> BuiltBackends() {
  std::vector<std::string> names;
  for (const EngineBackend& b : RegisteredEngines()) names.push_back(b.name);
  return names;
}

}  // namespace dmagather::server::engines
