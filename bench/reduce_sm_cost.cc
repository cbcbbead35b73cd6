// What the reduce-scatter's reduction kernel (kernels/reduce.h) costs on
// one GPU:
//   1. its time and read bandwidth for bfloat16 and float32, n in {2,4,8},
//      outputs of 1..256 MiB, with the grid it uses (blocks, SMs); as CSV
//      dtype,n,out_mib,us,us_per_out_mib,gb_s_read,blocks,sms
//      (--max_blocks=0,16,... repeats the table with the grid capped at each
//      value; 0 = the kernel's own choice);
//   2. what it costs a concurrent GEMM: a cuBLAS bfloat16 GEMM (--gemm,
//      default 8192^3) timed alone and with reductions running back to back
//      on a second stream the whole time; as CSV
//      gemm,dtype,n,out_mib,gemm_ms_alone,gemm_ms_with,slowdown_pct,reduce_gb_s_with
// cuBLAS is opened with dlopen (the toolkit's or PyTorch's libcublas.so.13
// on LD_LIBRARY_PATH); without it part 2 is skipped with a line saying why.
//
//   reduce_sm_cost [--max_blocks=0] [--gemm=8192] [--gemm_iters=20]
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/reduce.h"

namespace {

constexpr uint32_t kBf16 = 5, kFloat32 = 6;

#define CUDA_OR_DIE(x)                                                                    \
  do {                                                                                    \
    const cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(2);                                                                            \
    }                                                                                     \
  } while (0)

struct Args {
  std::vector<unsigned> max_blocks = {0};
  int gemm = 8192;
  int gemm_iters = 20;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s.rfind("--max_blocks=", 0) == 0) {
      a.max_blocks.clear();
      for (const char* p = s.c_str() + 13; *p != '\0';) {
        char* end = nullptr;
        a.max_blocks.push_back(unsigned(strtoul(p, &end, 10)));
        p = *end == ',' ? end + 1 : end;
      }
    } else if (s.rfind("--gemm=", 0) == 0) {
      a.gemm = atoi(s.c_str() + 7);
    } else if (s.rfind("--gemm_iters=", 0) == 0) {
      a.gemm_iters = atoi(s.c_str() + 13);
    } else {
      fprintf(stderr, "usage: %s [--max_blocks=0,16,...] [--gemm=8192] [--gemm_iters=20]\n", argv[0]);
      exit(2);
    }
  }
  return a;
}

void Reduce(const void* in, int n, size_t count, uint32_t dtype, void* out, unsigned max_blocks, cudaStream_t s) {
  CUDA_OR_DIE(cudaError_t(dmagather::kernels::ReduceChunksOnBlocks(in, n, count, dtype, 0, out, max_blocks, s)));
}

// Microseconds per reduction, averaged over enough calls to read ~8 GiB.
double TimeReduce(const void* in, int n, size_t out_bytes, uint32_t dtype, void* out, unsigned max_blocks,
                  cudaStream_t s) {
  const size_t count = out_bytes / (dtype == kBf16 ? 2 : 4);
  const int iters = int(std::clamp<size_t>((8ull << 30) / (out_bytes * n), 5, 2000));
  for (int i = 0; i < 3; ++i) Reduce(in, n, count, dtype, out, max_blocks, s);
  cudaEvent_t e0, e1;
  CUDA_OR_DIE(cudaEventCreate(&e0));
  CUDA_OR_DIE(cudaEventCreate(&e1));
  CUDA_OR_DIE(cudaEventRecord(e0, s));
  for (int i = 0; i < iters; ++i) Reduce(in, n, count, dtype, out, max_blocks, s);
  CUDA_OR_DIE(cudaEventRecord(e1, s));
  CUDA_OR_DIE(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_OR_DIE(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms * 1e3 / iters;
}

void Table(const Args& a, const void* in, void* out, cudaStream_t s) {
  printf("dtype,n,out_mib,us,us_per_out_mib,gb_s_read,blocks,sms\n");
  for (unsigned cap : a.max_blocks) {
    for (uint32_t dtype : {kBf16, kFloat32}) {
      for (int n : {2, 4, 8}) {
        for (size_t mib : {1, 4, 16, 64, 256}) {
          const size_t bytes = mib << 20, count = bytes / (dtype == kBf16 ? 2 : 4);
          const double us = TimeReduce(in, n, bytes, dtype, out, cap, s);
          dmagather::kernels::ReduceGrid g;
          CUDA_OR_DIE(cudaError_t(dmagather::kernels::ReduceGridFor(in, count, dtype, out, &g, cap)));
          printf("%s,%d,%zu,%.1f,%.2f,%.1f,%u,%d\n", dtype == kBf16 ? "bf16" : "fp32", n, mib, us, us / mib,
                 double(bytes) * n / us / 1e3, g.blocks, g.sms);
          fflush(stdout);
        }
      }
    }
  }
}

// cuBLAS through dlopen: the benchmark links no cuBLAS.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm = nullptr;
  std::string Load() {
    void* h = nullptr;
    for (const char* name : {"libcublas.so.13", "libcublas.so"}) {
      if ((h = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) != nullptr) break;
    }
    if (h == nullptr) return std::string("cannot load cuBLAS: ") + dlerror();
    create = reinterpret_cast<decltype(create)>(dlsym(h, "cublasCreate_v2"));
    set_stream = reinterpret_cast<decltype(set_stream)>(dlsym(h, "cublasSetStream_v2"));
    gemm = reinterpret_cast<decltype(gemm)>(dlsym(h, "cublasGemmEx"));
    return create && set_stream && gemm ? "" : "cuBLAS lacks cublasCreate_v2/cublasSetStream_v2/cublasGemmEx";
  }
};

struct Gemm {
  Cublas lib;
  cublasHandle_t h = nullptr;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  int m = 0;
  void Run(cudaStream_t s) {
    const float one = 1, zero = 0;
    lib.set_stream(h, s);
    if (lib.gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, a, CUDA_R_16BF, m, b, CUDA_R_16BF, m, &zero, c,
                 CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
      fprintf(stderr, "cublasGemmEx failed\n");
      exit(2);
    }
  }
  // Milliseconds per GEMM over `iters` back to back on s.
  double Time(cudaStream_t s, int iters) {
    cudaEvent_t e0, e1;
    CUDA_OR_DIE(cudaEventCreate(&e0));
    CUDA_OR_DIE(cudaEventCreate(&e1));
    CUDA_OR_DIE(cudaEventRecord(e0, s));
    for (int i = 0; i < iters; ++i) Run(s);
    CUDA_OR_DIE(cudaEventRecord(e1, s));
    CUDA_OR_DIE(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_OR_DIE(cudaEventElapsedTime(&ms, e0, e1));
    return ms / iters;
  }
};

// The GEMM alone, then the same GEMMs while stream r runs reductions back to
// back from before the first GEMM until after the last.
void GemmCost(const Args& a, const void* in, void* out, cudaStream_t s) {
  Gemm g;
  if (const std::string why = g.lib.Load(); !why.empty()) {
    printf("# gemm overlap skipped: %s\n", why.c_str());
    return;
  }
  g.m = a.gemm;
  const size_t bytes = size_t(g.m) * g.m * 2;
  CUDA_OR_DIE(cudaMalloc(&g.a, bytes));
  CUDA_OR_DIE(cudaMalloc(&g.b, bytes));
  CUDA_OR_DIE(cudaMalloc(&g.c, bytes));
  CUDA_OR_DIE(cudaMemset(g.a, 0x3c, bytes));  // bfloat16 0x3c3c = 0.0115: finite, not zero
  CUDA_OR_DIE(cudaMemset(g.b, 0x3c, bytes));
  if (g.lib.create(&g.h) != CUBLAS_STATUS_SUCCESS) {
    printf("# gemm overlap skipped: cublasCreate failed\n");
    return;
  }
  cudaStream_t r;
  CUDA_OR_DIE(cudaStreamCreateWithFlags(&r, cudaStreamNonBlocking));
  g.Time(s, 3);  // warm-up (cuBLAS picks its kernel)
  const double alone = g.Time(s, a.gemm_iters);
  printf("gemm,dtype,n,out_mib,gemm_ms_alone,gemm_ms_with,slowdown_pct,reduce_gb_s_with\n");
  for (uint32_t dtype : {kBf16, kFloat32}) {
    for (int n : {2, 4, 8}) {
      const size_t out_mib = 64, out_bytes = out_mib << 20, count = out_bytes / (dtype == kBf16 ? 2 : 4);
      const double us = TimeReduce(in, n, out_bytes, dtype, out, 0, r);
      // Enough reductions to outlast the GEMMs (a quarter of them again as margin).
      const int reps = int(alone * 1e3 * a.gemm_iters * 1.25 / us) + 2;
      cudaEvent_t r0, r1;
      CUDA_OR_DIE(cudaEventCreate(&r0));
      CUDA_OR_DIE(cudaEventCreate(&r1));
      CUDA_OR_DIE(cudaEventRecord(r0, r));
      for (int i = 0; i < reps; ++i) Reduce(in, n, count, dtype, out, 0, r);
      CUDA_OR_DIE(cudaEventRecord(r1, r));
      const double with = g.Time(s, a.gemm_iters);
      CUDA_OR_DIE(cudaEventSynchronize(r1));
      float rms = 0;
      CUDA_OR_DIE(cudaEventElapsedTime(&rms, r0, r1));
      printf("%dx%dx%d,%s,%d,%zu,%.3f,%.3f,%.1f,%.1f\n", g.m, g.m, g.m, dtype == kBf16 ? "bf16" : "fp32", n, out_mib,
             alone, with, (with / alone - 1) * 100, double(out_bytes) * n * reps / (rms * 1e6));
      fflush(stdout);
      cudaEventDestroy(r0);
      cudaEventDestroy(r1);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  cudaDeviceProp prop;
  CUDA_OR_DIE(cudaGetDeviceProperties(&prop, 0));
  printf("# %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const size_t max_out = 256ull << 20;
  void *in = nullptr, *out = nullptr;
  CUDA_OR_DIE(cudaMalloc(&in, 8 * max_out));
  CUDA_OR_DIE(cudaMalloc(&out, max_out));
  CUDA_OR_DIE(cudaMemset(in, 0x3f, 8 * max_out));  // bfloat16 0.746, float32 0.747: finite
  cudaStream_t s;
  CUDA_OR_DIE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Table(a, in, out, s);
  GemmCost(a, in, out, s);
  return 0;
}
