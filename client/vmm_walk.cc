#include "client/vmm_walk.h"

#include "absl/strings/str_format.h"
#include "common/status.h"

namespace dmagather::client {

absl::StatusOr<VmmWalk> WalkVmm(const VmmDriver& driver, uintptr_t ptr, uint64_t bytes, bool export_fds) {
  VmmWalk w;
  const uintptr_t end = ptr + (bytes == 0 ? 1 : bytes);
  uintptr_t at = ptr;
  while (at < end) {
    uintptr_t base = 0;
    uint64_t size = 0, id = 0;
    absl::Status st = driver.Mapping(at, &base, &size, &id);
    if (!st.ok() || size == 0 || base > at || at - base >= size) {
      if (at == ptr) return st.ok() ? absl::InvalidArgumentError(absl::StrFormat("no mapping at %#x", at)) : st;
      return absl::InvalidArgumentError(absl::StrFormat(
          "buffer %#x + %u bytes runs past the end of its mapped CUDA memory (nothing mapped at %#x, %u bytes in)", ptr,
          bytes, at, at - ptr));
    }
    if (w.chunks.empty()) {
      w.base = base;
    } else if (base != w.base + w.bytes) {
      return absl::InvalidArgumentError(absl::StrFormat("mapping at %#x does not follow the previous one", base));
    }
    if (w.chunks.size() == kMaxWalkChunks) {
      return absl::InvalidArgumentError(
          absl::StrFormat("buffer %#x + %u bytes spans more than %u mapped chunks", ptr, bytes, kMaxWalkChunks));
    }
    w.chunks.push_back(VmmChunk{base - w.base, size, id});
    w.bytes += size;
    if (export_fds) {
      auto fd = driver.Export(base);
      if (!fd.ok()) return fd.status();
      w.fds.emplace_back(*fd);
    }
    at = base + size;
  }
  return w;
}

bool VmmCurrent(const VmmDriver& driver, uintptr_t base, const std::vector<VmmChunk>& chunks, uintptr_t ptr,
                uint64_t bytes) {
  const uintptr_t end = ptr + (bytes == 0 ? 1 : bytes);
  for (const VmmChunk& c : chunks) {
    const uintptr_t cb = base + c.offset;
    if (cb + c.bytes <= ptr) continue;
    if (cb >= end) break;
    uintptr_t mb = 0;
    uint64_t size = 0, id = 0;
    if (!driver.Mapping(cb, &mb, &size, &id).ok() || mb != cb || size != c.bytes || id != c.id) return false;
  }
  return true;
}

}  // namespace dmagather::client
