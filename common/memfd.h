// Sealed anonymous shared memory (memfd) and the checks the daemon applies
// to a memfd a client hands it. Every piece of host memory the daemon maps
// for a client (rank segments, host buffers) and its own doorbell page is a
// memfd sealed against shrinking (F_SEAL_SHRINK, plus F_SEAL_GROW and
// F_SEAL_SEAL from our own client): nobody can truncate it under a mapping,
// so no access to it can fault (SIGBUS). Nothing is ever named in /dev/shm;
// descriptors travel over the daemon's fd channel (SCM_RIGHTS).
//
// Who: the client creates (Create); the daemon checks (CheckSealedMemfd, on
// its fd-channel thread) and maps (Map, on gRPC threads) only the bytes a
// client registered.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dmagather::common {

// An owned file descriptor (closed on destruction).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// The seals our client puts on everything it hands over.
int ClientSeals();

// OK when `fd` is a memfd (shmem, not hugetlbfs) opened read-write, sealed
// at least against shrinking, and at least `bytes` (> 0) long. The messages
// describe only the caller's own descriptor.
absl::Status CheckSealedMemfd(int fd, uint64_t bytes);

class MemfdMapping {
 public:
  MemfdMapping() = default;
  MemfdMapping(MemfdMapping&& o) noexcept { *this = std::move(o); }
  MemfdMapping& operator=(MemfdMapping&& o) noexcept;
  MemfdMapping(const MemfdMapping&) = delete;
  MemfdMapping& operator=(const MemfdMapping&) = delete;
  ~MemfdMapping();

  // Creates a memfd of `bytes` (zero-filled), seals it with `seals`
  // (F_SEAL_* bits; default: shrink | grow | seal) and maps it. Keeps the
  // descriptor (fd()) for hand-over.
  static absl::StatusOr<MemfdMapping> Create(const std::string& name, size_t bytes, int seals = -1);
  // The daemon side: checks `fd` (CheckSealedMemfd) and maps its first
  // `bytes`. Does not keep the descriptor.
  static absl::StatusOr<MemfdMapping> Map(int fd, uint64_t bytes);

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_.get(); }
  bool valid() const { return data_ != nullptr; }
  // Closes the descriptor (the mapping stays valid).
  void CloseFd() { fd_.reset(); }

 private:
  void Reset();

  void* data_ = nullptr;
  size_t size_ = 0;
  UniqueFd fd_;
};

}  // namespace dmagather::common
