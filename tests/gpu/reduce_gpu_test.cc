// kernels::ReduceChunks on the GPU against common::ReduceChunks on the
// host, bit-exact: every dtype x redop (AVG for the floating types), n in
// {2, 3, 4, 8}, counts with and without a 16-byte-multiple chunk length,
// `in`/`out` aligned, element-aligned and byte-misaligned (the kernel's
// three paths), and grids capped at 1 and 7 blocks (the result must not
// depend on the launch shape). Inputs are random bits mixed with values of
// close magnitude (rounding ties of the 16-bit types), zeros, subnormals,
// infinities, NaNs with payloads and the largest finite values. Also the
// refusals (AVG on integers, n < 1) and count == 0.
//
//   reduce_gpu_test            prints one line per failure, then
//                              "reduce_gpu_test: N cases, N mismatched" and
//                              "N passed, N failed"; exit 1 on any failure.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/reduce.h"
#include "kernels/reduce.h"

namespace {

using dmagather::common::DtypeName;
using dmagather::common::DtypeSize;

int g_cases = 0, g_failed = 0;

void Fail(const std::string& what) {
  ++g_failed;
  fprintf(stderr, "FAIL: %s\n", what.c_str());
}

// Random input bits for one element of dtype (see the banner).
void FillElement(std::mt19937_64& rng, uint32_t dtype, unsigned char* p) {
  uint64_t r = rng();
  const int kind = int((r >> 56) % 16);
  const size_t size = DtypeSize(dtype);
  if (dtype == 4 || dtype == 5) {
    static const uint16_t kHalf[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x7c00, 0xfc00, 0x7e01, 0xfd00, 0x7bff};
    static const uint16_t kBf[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7fc1, 0xff81, 0x7f7f};
    uint16_t v = uint16_t(r);
    if (kind == 0) v = (dtype == 4 ? kHalf : kBf)[(r >> 20) % 9];
    if (kind >= 8) v = dtype == 4 ? uint16_t((v & 0x83ff) | 0x3c00) : uint16_t((v & 0x807f) | 0x3f80);
    memcpy(p, &v, 2);
  } else if (dtype == 6) {
    static const uint32_t kF[] = {0,           0x80000000u, 1,           0x807fffffu, 0x7f800000u,
                                  0xff800000u, 0x7fc00001u, 0xffa00000u, 0x7f7fffffu};
    uint32_t v = uint32_t(r);
    if (kind == 0) v = kF[(r >> 20) % 9];
    if (kind >= 8) v = (v & 0x807fffffu) | 0x3f800000u;
    memcpy(p, &v, 4);
  } else if (dtype == 7) {
    static const uint64_t kD[] = {
        0, 1ull << 63, 1, 0x7ff0000000000000ull, 0xfff8000000000001ull, 0x7fefffffffffffffull};
    if (kind == 0) r = kD[(r >> 20) % 6];
    if (kind >= 8) r = (r & 0x800fffffffffffffull) | 0x3ff0000000000000ull;
    memcpy(p, &r, 8);
  } else {
    memcpy(p, &r, size);
  }
}

bool Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  Fail(std::string(what) + ": " + cudaGetErrorString(e));
  return false;
}

std::string ToHex(uint64_t v) {
  char buf[20];
  snprintf(buf, sizeof(buf), "%llx", (unsigned long long)v);
  return buf;
}

struct Buffers {
  unsigned char* d_in = nullptr;
  unsigned char* d_out = nullptr;
  size_t in_bytes = 0, out_bytes = 0;
};

// One case: n chunks of `count` elements at d_in + in_off, the result at
// d_out + out_off; max_blocks 0 = the default grid.
void RunCase(Buffers& b, cudaStream_t s, uint32_t dtype, int redop, int n, uint64_t count, size_t in_off,
             size_t out_off, unsigned max_blocks, uint64_t seed) {
  ++g_cases;
  const size_t size = DtypeSize(dtype);
  char label[200];
  snprintf(label, sizeof(label), "%s %s n=%d count=%llu in+%zu out+%zu blocks<=%u", DtypeName(dtype),
           redop == 1 ? "AVG" : "SUM", n, (unsigned long long)count, in_off, out_off, max_blocks);
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> in(n * count * size), want(count * size), got(count * size, 0xa5);
  for (uint64_t i = 0; i < n * count; ++i) FillElement(rng, dtype, &in[i * size]);
  dmagather::common::ReduceChunks(in.data(), n, count, dtype, redop, want.data());
  if (!Cuda(cudaMemcpyAsync(b.d_in + in_off, in.data(), in.size(), cudaMemcpyHostToDevice, s), label) ||
      !Cuda(cudaMemsetAsync(b.d_out + out_off, 0x5a, got.size(), s), label)) {
    return;
  }
  const int e = dmagather::kernels::ReduceChunksOnBlocks(b.d_in + in_off, n, count, dtype, redop, b.d_out + out_off,
                                                         max_blocks, s);
  if (!Cuda(cudaError_t(e), label) ||
      !Cuda(cudaMemcpyAsync(got.data(), b.d_out + out_off, got.size(), cudaMemcpyDeviceToHost, s), label) ||
      !Cuda(cudaStreamSynchronize(s), label)) {
    return;
  }
  if (memcmp(got.data(), want.data(), got.size()) == 0) return;
  uint64_t bad = 0, first = ~0ull;
  for (uint64_t i = 0; i < count; ++i) {
    if (memcmp(&got[i * size], &want[i * size], size) != 0) {
      if (first == ~0ull) first = i;
      ++bad;
    }
  }
  uint64_t g = 0, w = 0;
  memcpy(&g, &got[first * size], size);
  memcpy(&w, &want[first * size], size);
  Fail(std::string(label) + ": " + std::to_string(bad) + " elements differ; first at " + std::to_string(first) +
       ": gpu 0x" + ToHex(g) + ", host 0x" + ToHex(w));
}

void CheckRefusals(Buffers& b, cudaStream_t s) {
  for (uint32_t dtype = 0; dtype < 4; ++dtype) {
    ++g_cases;
    if (dmagather::kernels::ReduceChunks(b.d_in, 2, 16, dtype, 1, b.d_out, s) != int(cudaErrorInvalidValue)) {
      Fail(std::string("AVG on ") + DtypeName(dtype) + " was not refused");
    }
  }
  ++g_cases;
  if (dmagather::kernels::ReduceChunks(b.d_in, 0, 16, 6, 0, b.d_out, s) != int(cudaErrorInvalidValue)) {
    Fail("n = 0 was not refused");
  }
  ++g_cases;
  dmagather::kernels::ReduceGrid grid;
  if (dmagather::kernels::ReduceChunks(b.d_in, 2, 0, 6, 0, b.d_out, s) != 0 ||
      dmagather::kernels::ReduceGridFor(b.d_in, 0, 6, b.d_out, &grid) != 0 || grid.blocks != 0) {
    Fail("count = 0 did not succeed with an empty grid");
  }
}

}  // namespace

int main() {
  const std::vector<uint64_t> counts = {1, 7, 8, 100, 4096, 4097, 65536 + 5, (1ull << 20) + 3, 1ull << 21};
  const int ns[] = {2, 3, 4, 8};
  Buffers b;
  b.in_bytes = 8 * (1ull << 21) * 8 + 64;
  b.out_bytes = (1ull << 21) * 8 + 64;
  cudaStream_t s;
  if (!Cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate") ||
      !Cuda(cudaMalloc(&b.d_in, b.in_bytes), "cudaMalloc") || !Cuda(cudaMalloc(&b.d_out, b.out_bytes), "cudaMalloc")) {
    return 1;
  }
  uint64_t seed = 1;
  for (uint32_t dtype = 0; dtype < uint32_t(dmagather::common::kNumDtypes); ++dtype) {
    const size_t size = DtypeSize(dtype);
    for (int redop : {0, 1}) {
      if (!dmagather::common::ReduceSupported(dtype, redop, nullptr)) continue;
      for (int n : ns) {
        for (uint64_t count : counts) {
          RunCase(b, s, dtype, redop, n, count, 0, 0, 0, ++seed);  // vectorized where count allows
          if (count > (1ull << 20)) continue;
          RunCase(b, s, dtype, redop, n, count, size, 3 * size, 0, ++seed);      // element-aligned only
          if (size > 1) RunCase(b, s, dtype, redop, n, count, 1, 5, 0, ++seed);  // misaligned bytes
          if (count >= 4096) {
            RunCase(b, s, dtype, redop, n, count, 0, 0, 1, ++seed);
            RunCase(b, s, dtype, redop, n, count, 0, 0, 7, ++seed);
          }
        }
      }
    }
  }
  CheckRefusals(b, s);
  dmagather::kernels::ReduceGrid grid;
  if (dmagather::kernels::ReduceGridFor(b.d_in, 1ull << 21, 5, b.d_out, &grid) == 0) {
    printf("reduce_gpu_test: bf16 x 2^21 elements: %u blocks x %u threads on a %d-SM GPU (%s path)\n", grid.blocks,
           grid.threads, grid.sms, grid.vectorized ? "16-byte" : "element");
  }
  cudaFree(b.d_in);
  cudaFree(b.d_out);
  cudaStreamDestroy(s);
  printf("reduce_gpu_test: %d cases, %d mismatched or failed\n", g_cases, g_failed);
  printf("%d passed, %d failed\n", g_cases - g_failed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
