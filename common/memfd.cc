#include "common/memfd.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dmagather::common {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

int ClientSeals() { return F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL; }

absl::Status CheckSealedMemfd(int fd, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a memory hand-over of 0 bytes");
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus("fstat of the handed-over descriptor");
  struct statfs fs;
  if (!S_ISREG(st.st_mode) || fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
    return absl::InvalidArgumentError(
        "the handed-over descriptor is not a memfd (create memory with memfd_create(MFD_ALLOW_SEALING); "
        "files, hugetlbfs and device memory are not accepted)");
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError("the handed-over memfd is not open read-write");
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the handed-over memfd is not sealed against shrinking (seals 0x", absl::Hex(seals < 0 ? 0 : seals),
        "): create it with MFD_ALLOW_SEALING and add F_SEAL_SHRINK (dmagatherd maps only memory that cannot be "
        "truncated under it)"));
  }
  if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) {
    return absl::InvalidArgumentError("the handed-over memfd is sealed against writes");
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the handed-over memfd has ", st.st_size, " bytes, fewer than the ", bytes, " registered"));
  }
  return absl::OkStatus();
}

MemfdMapping& MemfdMapping::operator=(MemfdMapping&& o) noexcept {
  if (this != &o) {
    Reset();
    data_ = o.data_;
    size_ = o.size_;
    fd_ = std::move(o.fd_);
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

MemfdMapping::~MemfdMapping() { Reset(); }

void MemfdMapping::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  fd_.reset();
}

absl::StatusOr<MemfdMapping> MemfdMapping::Create(const std::string& name, size_t bytes, int seals) {
  if (bytes == 0) return absl::InvalidArgumentError("shared memory of 0 bytes");
  if (seals < 0) seals = ClientSeals();
  UniqueFd fd(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus(absl::StrCat("memfd_create(", name, ")"));
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(absl::StrCat("ftruncate(memfd ", name, ", ", bytes, ")"));
  }
  if (seals != 0 && fcntl(fd.get(), F_ADD_SEALS, seals) != 0) {
    return ErrnoStatus(absl::StrCat("fcntl(memfd ", name, ", F_ADD_SEALS)"));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap(memfd ", name, ", ", bytes, ")"));
  MemfdMapping m;
  m.data_ = p;
  m.size_ = bytes;
  m.fd_ = std::move(fd);
  return m;
}

absl::StatusOr<MemfdMapping> MemfdMapping::Map(int fd, uint64_t bytes) {
  DMAG_RETURN_IF_ERROR(CheckSealedMemfd(fd, bytes));
  if (bytes > static_cast<uint64_t>(SIZE_MAX / 2)) return absl::InvalidArgumentError("mapping too large");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap of ", bytes, " handed-over bytes"));
  MemfdMapping m;
  m.data_ = p;
  m.size_ = bytes;
  return m;
}

}  // namespace dmagather::common
