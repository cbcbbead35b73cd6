// Verification kernels, run in the caller's (a rank's, a test's, the
// benchmark's) CUDA context - never in dmagatherd. They fill a buffer with
// the deterministic pattern of tests/support/verify.h (byte for byte the
// same as FillPattern on the CPU) and compare a buffer against it on the
// GPU, so a multi-GiB AllGather result is checked without copying it to the
// host.
//
// All functions enqueue on `stream` (a cudaStream_t; NULL = legacy default
// stream) and return a cudaError_t as int (0 = success).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dmagather::kernels {

// dst[0, bytes) = pattern(seed, rank). Any alignment.
int FillPattern(void* dst, size_t bytes, uint64_t seed, int rank, void* stream);

// Adds to *d_mismatches (device memory, 8 bytes) the number of 8-byte
// pattern words of src[0, bytes) that differ from pattern(seed, rank), and
// lowers *d_first_bad (device memory, 8 bytes; set it to ~0 first) to the
// byte offset of the first differing word.
int ComparePattern(const void* src, size_t bytes, uint64_t seed, int rank, unsigned long long* d_mismatches,
                   unsigned long long* d_first_bad, void* stream);

// The same two with the seed read from device memory when the kernel runs
// (so a captured CUDA graph uses a new seed per replay: see Increment).
int FillPatternDeviceSeed(void* dst, size_t bytes, const unsigned long long* d_seed, int rank, void* stream);
int ComparePatternDeviceSeed(const void* src, size_t bytes, const unsigned long long* d_seed, int rank,
                             unsigned long long* d_mismatches, unsigned long long* d_first_bad, void* stream);
// *d_value += 1 (one thread).
int Increment(unsigned long long* d_value, void* stream);

// Benchmark support: n bfloat16 values uniform in [-1, 1) (no NaN/Inf, not
// zeros, so matrix-product timings are those of real data).
int FillRandomBf16(void* dst, size_t n, uint64_t seed, void* stream);

// Test support: a kernel that spins for `ns` nanoseconds (globaltimer), to
// hold a stream back (e.g. so a ready write comes late).
int Delay(uint64_t ns, void* stream);

}  // namespace dmagather::kernels
