// A mapped POSIX shared-memory object. The client creates segments and host
// buffers (mode 0600, O_EXCL) and unlinks their names once the daemon has
// mapped them, so nothing is left in /dev/shm when either side dies. The
// daemon opens by name and records the object's owner uid, which is how it
// knows whose memory it is (gRPC does not expose SO_PEERCRED).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace dmagather::common {

class ShmMapping {
 public:
  ShmMapping() = default;
  ShmMapping(ShmMapping&& o) noexcept { *this = std::move(o); }
  ShmMapping& operator=(ShmMapping&& o) noexcept;
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping();

  // Creates a new object `name` of `bytes` (zero-filled) and maps it.
  static absl::StatusOr<ShmMapping> Create(const std::string& name, size_t bytes, mode_t mode = 0600);
  // Opens an existing object and maps all of it; fails if it is smaller
  // than min_bytes.
  static absl::StatusOr<ShmMapping> Open(const std::string& name, size_t min_bytes);

  // A unique name: /dmagather-<what>-<pid>-<counter>-<random>.
  static std::string UniqueName(const std::string& what);

  void* data() const { return data_; }
  size_t size() const { return size_; }
  uid_t owner_uid() const { return owner_uid_; }
  const std::string& name() const { return name_; }
  bool valid() const { return data_ != nullptr; }

  // Removes the name (the mapping stays valid).
  void Unlink();

 private:
  void Reset();

  void* data_ = nullptr;
  size_t size_ = 0;
  uid_t owner_uid_ = 0;
  std::string name_;
};

}  // namespace dmagather::common
