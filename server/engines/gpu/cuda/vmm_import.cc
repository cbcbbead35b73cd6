#include "server/engines/gpu/cuda/vmm_import.h"

#include <glog/logging.h>

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dmagather::server::engines::gpu::cuda {
namespace {

using ::dmagather::common::cuda::CuStatus;
using ::dmagather::common::cuda::DriverApi;

// One imported region: the reserved range with every chunk mapped into it.
class VmmRegion : public ImportedRegion {
 public:
  VmmRegion(const DriverApi* api, CUdeviceptr va, uint64_t reserved, uint64_t bytes,
            std::vector<abi::VmmChunkV1> chunks, VmmImporter::ReleaseFn on_release)
      : api_(api),
        va_(va),
        reserved_(reserved),
        bytes_(bytes),
        chunks_(std::move(chunks)),
        on_release_(std::move(on_release)) {}
  ~VmmRegion() override {
    if (on_release_) on_release_(va_, reserved_);
    for (const abi::VmmChunkV1& c : chunks_) {
      CUresult r = api_->cuMemUnmap(va_ + c.offset, c.bytes);
      if (r != CUDA_SUCCESS) LOG(WARNING) << CuStatus("cuMemUnmap(imported VMM chunk)", r).message();
    }
    CUresult r = api_->cuMemAddressFree(va_, reserved_);
    if (r != CUDA_SUCCESS) LOG(WARNING) << CuStatus("cuMemAddressFree(imported VMM region)", r).message();
  }
  char* base() const override { return reinterpret_cast<char*>(va_); }
  uint64_t bytes() const override { return bytes_; }

 private:
  const DriverApi* const api_;
  const CUdeviceptr va_;
  const uint64_t reserved_;
  const uint64_t bytes_;
  const std::vector<abi::VmmChunkV1> chunks_;
  const VmmImporter::ReleaseFn on_release_;
};

}  // namespace

std::string EncodeVmmTable(int device, const std::vector<abi::VmmChunkV1>& chunks) {
  abi::VmmTableHeaderV1 h{};
  h.stamp = abi::kVmmTableStampV1;
  h.chunks = static_cast<uint32_t>(chunks.size());
  h.device = static_cast<uint32_t>(device);
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out.append(reinterpret_cast<const char*>(chunks.data()), chunks.size() * sizeof(abi::VmmChunkV1));
  return out;
}

absl::StatusOr<VmmTable> ParseVmmTable(const std::string& handle, uint64_t bytes, size_t num_fds) {
  abi::VmmTableHeaderV1 h{};
  if (handle.size() < sizeof(h)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_vmm: the chunk table has ", handle.size(), " bytes"));
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  if (h.stamp != abi::kVmmTableStampV1) {
    return absl::InvalidArgumentError(
        "cuda_vmm: the chunk table is not a VmmTableHeaderV1 (client and daemon versions differ)");
  }
  if (h.chunks == 0 || h.chunks > abi::kMaxVmmChunksV1) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_vmm: ", h.chunks, " chunks (1..", abi::kMaxVmmChunksV1, ")"));
  }
  if (handle.size() != sizeof(h) + uint64_t(h.chunks) * sizeof(abi::VmmChunkV1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_vmm: the chunk table has ", handle.size(), " bytes for ", h.chunks, " chunks"));
  }
  if (h.chunks != num_fds) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_vmm: the chunk table names ", h.chunks, " chunks but ",
                                                   num_fds, " allocations were handed over"));
  }
  VmmTable t;
  t.device = static_cast<int>(h.device);
  t.chunks.resize(h.chunks);
  std::memcpy(t.chunks.data(), handle.data() + sizeof(h), h.chunks * sizeof(abi::VmmChunkV1));
  uint64_t at = 0;
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const abi::VmmChunkV1& c = t.chunks[i];
    if (c.offset != at || c.bytes == 0 || c.bytes > bytes - at) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_vmm: chunk ", i, " (", c.bytes, " bytes at ", c.offset,
                                                     ") does not follow the previous one inside the ", bytes,
                                                     " registered bytes"));
    }
    at += c.bytes;
  }
  if (at != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda_vmm: the chunks cover ", at, " bytes, the registration ", bytes));
  }
  return t;
}

VmmImporter::VmmImporter(const DriverApi* api, ReleaseFn on_release) : api_(api), on_release_(std::move(on_release)) {}

void VmmImporter::SetPeers(const PeerTable& peers) {
  absl::MutexLock lock(&mu_);
  peers_ = peers;
}

size_t VmmImporter::live_imports() {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& kv : cache_) n += kv.second.expired() ? 0 : 1;
  return n;
}

absl::StatusOr<std::shared_ptr<ImportedRegion>> VmmImporter::Import(const RegionSpec& spec, int device,
                                                                    int rank_ordinal) {
  DMAG_ASSIGN_OR_RETURN(VmmTable table, ParseVmmTable(spec.handle, spec.bytes, spec.fds.size()));
  if (table.device != rank_ordinal) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_vmm: the memory is on the rank's device ", table.device,
                                                   ", but the rank joined with its device ", rank_ordinal));
  }
  std::string key = absl::StrCat(spec.owner_pid, "/", device, "/");
  key.append(spec.handle);
  absl::MutexLock lock(&mu_);
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    if (auto region = it->second.lock(); region != nullptr) return region;
  }
  for (auto i = cache_.begin(); i != cache_.end();) i = i->second.expired() ? cache_.erase(i) : std::next(i);
  DMAG_ASSIGN_OR_RETURN(std::shared_ptr<ImportedRegion> region, MapRegion(table, device, spec.fds, spec.bytes));
  cache_[key] = region;
  return region;
}

absl::StatusOr<std::shared_ptr<ImportedRegion>> VmmImporter::MapRegion(const VmmTable& table, int device,
                                                                       const std::vector<int>& fds, uint64_t bytes) {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t granularity = 0;
  CUresult r = api_->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS) return CuStatus("cuMemGetAllocationGranularity", r);
  if (granularity == 0) granularity = 2 << 20;
  for (const abi::VmmChunkV1& c : table.chunks) {
    if (c.offset % granularity != 0 || c.bytes % granularity != 0) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_vmm: chunk of ", c.bytes, " bytes at offset ", c.offset,
                                                     " is not a multiple of the allocation granularity (", granularity,
                                                     ")"));
    }
  }
  CUdeviceptr va = 0;
  r = api_->cuMemAddressReserve(&va, bytes, granularity, 0, 0);
  if (r != CUDA_SUCCESS) return CuStatus("cuMemAddressReserve", r);
  // Undo on any failure: unmap what was mapped, free the range.
  size_t mapped = 0;  // Chunks mapped so far.
  auto undo = [&](absl::Status st) {
    for (size_t i = 0; i < mapped; ++i) api_->cuMemUnmap(va + table.chunks[i].offset, table.chunks[i].bytes);
    api_->cuMemAddressFree(va, bytes);
    return st;
  };
  for (size_t i = 0; i < table.chunks.size(); ++i) {
    const abi::VmmChunkV1& c = table.chunks[i];
    CUmemGenericAllocationHandle h = 0;
    r = api_->cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fds[i])),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
      return undo(
          common::Annotate(CuStatus("cuMemImportFromShareableHandle", r), absl::StrCat("cuda_vmm chunk ", i, ": ")));
    }
    r = api_->cuMemMap(va + c.offset, c.bytes, 0, h, 0);
    // The mapping holds the allocation from here on; the handle is not needed.
    api_->cuMemRelease(h);
    if (r != CUDA_SUCCESS)
      return undo(common::Annotate(CuStatus("cuMemMap", r), absl::StrCat("cuda_vmm chunk ", i, ": ")));
    ++mapped;
  }
  // Its own device, then one grant per device that reaches it (each alone,
  // so a refusal names its device).
  auto grant = [&](int d) {
    CUmemAccessDesc a;
    std::memset(&a, 0, sizeof(a));
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = d;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return api_->cuMemSetAccess(va, bytes, &a, 1);
  };
  r = grant(device);
  if (r != CUDA_SUCCESS) return undo(CuStatus("cuMemSetAccess", r));
  for (int d = 0; d < peers_.devices(); ++d) {
    if (d == device || !peers_.ok(d, device)) continue;
    r = grant(d);
    if (r != CUDA_SUCCESS) {
      return undo(common::FallbackError(absl::StrCat("cuda_vmm: ", CuStatus("cuMemSetAccess", r).message(),
                                                     " granting device ", d, " access to memory of device ", device,
                                                     ", which it reaches as a peer; a copy issued there would fault")));
    }
  }
  return std::shared_ptr<ImportedRegion>(
      std::make_shared<VmmRegion>(api_, va, bytes, bytes, table.chunks, on_release_));
}

}  // namespace dmagather::server::engines::gpu::cuda
