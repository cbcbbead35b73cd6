#include "common/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dmagather::common {

ShmMapping& ShmMapping::operator=(ShmMapping&& o) noexcept {
  if (this != &o) {
    Reset();
    data_ = o.data_;
    size_ = o.size_;
    owner_uid_ = o.owner_uid_;
    name_ = std::move(o.name_);
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

ShmMapping::~ShmMapping() { Reset(); }

void ShmMapping::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void ShmMapping::Unlink() {
  if (!name_.empty()) shm_unlink(name_.c_str());
}

std::string ShmMapping::UniqueName(const std::string& what) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  return absl::StrCat("/dmagather-", what, "-", getpid(), "-", counter.fetch_add(1), "-",
                      absl::Hex(salt & 0xffffffffffull));
}

absl::StatusOr<ShmMapping> ShmMapping::Create(const std::string& name, size_t bytes, mode_t mode) {
  if (bytes == 0) return absl::InvalidArgumentError("shared memory of 0 bytes");
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoStatus(absl::StrCat("shm_open(", name, ")"));
  // fchmod: the umask must not narrow the mode asked for (the doorbell is 0666).
  if (fchmod(fd, mode) != 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    absl::Status s = ErrnoStatus(absl::StrCat("ftruncate(", name, ", ", bytes, ")"));
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return ErrnoStatus(absl::StrCat("mmap(", name, ", ", bytes, ")"), err);
  }
  ShmMapping m;
  m.data_ = p;
  m.size_ = bytes;
  m.owner_uid_ = geteuid();
  m.name_ = name;
  return m;
}

absl::StatusOr<ShmMapping> ShmMapping::Open(const std::string& name, size_t min_bytes) {
  if (name.empty() || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("bad shared-memory name '", name, "'"));
  }
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(absl::StrCat("shm_open(", name, ")"));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status s = ErrnoStatus(absl::StrCat("fstat(", name, ")"));
    close(fd);
    return s;
  }
  if (static_cast<size_t>(st.st_size) < min_bytes || st.st_size == 0) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shared memory ", name, " has ", st.st_size,
                                                   " bytes, expected at least ", min_bytes));
  }
  void* p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap(", name, ")"), err);
  ShmMapping m;
  m.data_ = p;
  m.size_ = static_cast<size_t>(st.st_size);
  m.owner_uid_ = st.st_uid;
  m.name_ = name;
  return m;
}

}  // namespace dmagather::common
