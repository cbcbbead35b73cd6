#include "server/engines/factory.h"

#include "absl/strings/str_cat.h"
#include "server/engines/cuda/cuda_engine.h"
#include "server/engines/host/host_engine.h"

namespace dmagather::server::engines {

absl::StatusOr<CreatedEngine> CreateEngine(const EngineOptions& options) {
  const std::string& b = options.backend;
  if (b != "host" && b != "auto" && b != "cuda" && b != "hip") {
    return absl::InvalidArgumentError(absl::StrCat("unknown backend '", b, "' (host, cuda, hip or auto)"));
  }
  if (b == "hip") {
    return absl::UnimplementedError(absl::StrCat("the ", b, " backend is not part of this build"));
  }
  std::string why_not_cuda;
  if (b == "cuda" || b == "auto") {
    cuda::CudaEngine::Options co;
    co.streams_per_device = options.streams_per_device;
    co.chunk_bytes = options.cuda_chunk_bytes;
    auto engine = cuda::CudaEngine::Create(co);
    if (engine.ok()) {
      CreatedEngine out;
      const int n = (*engine)->num_devices();
      out.engine = *std::move(engine);
      out.reason = b == "cuda" ? absl::StrCat("--backend=cuda, ", n, " GPU(s)")
                               : absl::StrCat("auto: ", n, " CUDA GPU(s) found");
      return out;
    }
    if (b == "cuda") {
      return absl::Status(engine.status().code(),
                          absl::StrCat("--backend=cuda: cannot use CUDA: ", engine.status().message()));
    }
    why_not_cuda = std::string(engine.status().message());
  }
  host::HostEngine::Options ho;
  ho.workers = options.workers;
  ho.chunk_bytes = options.chunk_bytes;
  auto host = host::HostEngine::Create(ho);
  if (!host.ok()) return host.status();
  CreatedEngine out;
  out.engine = *std::move(host);
  out.reason = b == "host" ? "--backend=host" : absl::StrCat("auto: no usable CUDA GPU (", why_not_cuda, "), using host");
  return out;
}

}  // namespace dmagather::server::engines
