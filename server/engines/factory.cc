#include "server/engines/factory.h"

#include "absl/strings/str_cat.h"
#include "server/engines/host/host_engine.h"

namespace dmagather::server::engines {

absl::StatusOr<CreatedEngine> CreateEngine(const EngineOptions& options) {
  const std::string& b = options.backend;
  if (b != "host" && b != "auto" && b != "cuda" && b != "hip") {
    return absl::InvalidArgumentError(absl::StrCat("unknown backend '", b, "' (host, cuda, hip or auto)"));
  }
  if (b == "cuda" || b == "hip") {
    return absl::UnimplementedError(absl::StrCat("the ", b, " backend is not part of this build"));
  }
  HostEngine::Options ho;
  ho.workers = options.workers;
  ho.chunk_bytes = options.chunk_bytes;
  auto host = HostEngine::Create(ho);
  if (!host.ok()) return host.status();
  CreatedEngine out;
  out.engine = *std::move(host);
  out.reason = b == "host" ? "--backend=host" : "auto: no GPU backend in this build, using host";
  return out;
}

}  // namespace dmagather::server::engines
