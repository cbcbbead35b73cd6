// Does a done-wait parked on one stream hold up compute on another stream of
// the same process?  (Issue 33, "The rank's side too".)
//
// One GPU, one process, one context.  A host-mapped flag page (cudaHostRegister
// + cudaHostGetDevicePointer, as client/cuda_backend.cc does) holds the flags.
// Per repetition: a host thread writes the flag T ms after t0, unconditionally;
// meanwhile a wait on that flag is parked on a "gather" stream and N cuBLAS bf16
// GEMMs are enqueued on a "GEMM" stream.  The main thread polls the GEMMs'
// events (never a blocking sync) and stamps, on the host clock, when each one
// completed, so each GEMM is classed as done before or after the flag write.
// GPU events give the GEMM rate of those that ran during the wait.
//
// The hardware-queue count is CUDA_DEVICE_MAX_CONNECTIONS, read once when the
// context is created: run.sh runs this binary once per setting.
//
// Safety: the flag is written at T whatever happens; every host wait polls with
// a deadline; a watchdog thread exits the process (status 3) after
// --watchdog_s seconds (default 20); any error releases every flag first.

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
const Clock::time_point g_start = Clock::now();

double NowMs() { return std::chrono::duration<double, std::milli>(Clock::now() - g_start).count(); }

// ---- flag page ------------------------------------------------------------
constexpr int kFlagWords = 1024;               // one 4 KiB page of 32-bit words
constexpr int kWordOne = 0;                    // always 1: warm-up waits pass at once
constexpr int kWordReady = 2;                  // target of the ready write (arm cw)
constexpr int kWordSpinTimeout = 4;            // set by the spin kernel if it gave up
constexpr int kFirstRepWord = 8;               // rep flags: 8-byte aligned pairs from here
constexpr uint32_t kReleaseAll = 0x3fffffffu;  // satisfies every GEQ wait used here

uint32_t* g_flags = nullptr;  // host view
CUdeviceptr g_flags_dev = 0;  // device view
std::atomic<const char*> g_where{"init"};
std::atomic<bool> g_finished{false};

void ReleaseAllFlags() {
  if (g_flags == nullptr) return;
  for (int i = kFirstRepWord; i < kFlagWords; ++i) __atomic_store_n(&g_flags[i], kReleaseAll, __ATOMIC_SEQ_CST);
}

[[noreturn]] void Die(const char* fmt, ...) {
  ReleaseAllFlags();
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "ERROR: ");
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, " (during %s, t=%.1f ms)\n", g_where.load(), NowMs());
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(2);
}

#define CK(x)                                                                                           \
  do {                                                                                                  \
    cudaError_t e_ = (x);                                                                               \
    if (e_ != cudaSuccess)                                                                              \
      Die("%s:%d %s -> %s (%s)", __FILE__, __LINE__, #x, cudaGetErrorName(e_), cudaGetErrorString(e_)); \
  } while (0)

#define CKD(x)                                                                                                   \
  do {                                                                                                           \
    CUresult r_ = (x);                                                                                           \
    if (r_ != CUDA_SUCCESS) {                                                                                    \
      const char* n_ = nullptr;                                                                                  \
      const char* s_ = nullptr;                                                                                  \
      cuGetErrorName(r_, &n_);                                                                                   \
      cuGetErrorString(r_, &s_);                                                                                 \
      Die("%s:%d %s -> %d %s (%s)", __FILE__, __LINE__, #x, static_cast<int>(r_), n_ ? n_ : "?", s_ ? s_ : "?"); \
    }                                                                                                            \
  } while (0)

#define CKB(x)                                                                                           \
  do {                                                                                                   \
    cublasStatus_t b_ = (x);                                                                             \
    if (b_ != CUBLAS_STATUS_SUCCESS)                                                                     \
      Die("%s:%d %s -> %d %s", __FILE__, __LINE__, #x, static_cast<int>(b_), cublasGetStatusString(b_)); \
  } while (0)

void Watchdog(double limit_s) {
  const double limit_ms = limit_s * 1000.0;
  while (!g_finished.load()) {
    if (NowMs() > limit_ms) {
      ReleaseAllFlags();
      std::fprintf(stderr, "WATCHDOG: probe exceeded %.0f s (during %s); exiting with status 3\n", limit_s,
                   g_where.load());
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Polls an event until it completes; returns the host time (ms) it was seen
// complete.  Never blocks in the driver.
double PollEvent(cudaEvent_t e, double deadline_ms, const char* what) {
  for (;;) {
    cudaError_t r = cudaEventQuery(e);
    if (r == cudaSuccess) return NowMs();
    if (r != cudaErrorNotReady) Die("cudaEventQuery(%s) -> %s", what, cudaGetErrorName(r));
    if (NowMs() > deadline_ms) Die("timed out waiting for %s", what);
  }
}

// ---- device code ------------------------------------------------------------
__global__ void FillBf16(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xffff) / 32768.0f - 1.0f) * 0.05f);
  }
}

__device__ __forceinline__ unsigned long long GlobalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The alternative to a stream wait: one warp polls the flag.  It gives up after
// timeout_ns (GPU clock) and marks *timed_out, so it can never hang the GPU.
__global__ void SpinWait(const volatile uint32_t* flag, uint32_t value, unsigned long long timeout_ns,
                         volatile uint32_t* timed_out) {
  if (threadIdx.x != 0) return;
  const unsigned long long t0 = GlobalTimerNs();
  for (;;) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    if (static_cast<int32_t>(v - value) >= 0) break;
    if (GlobalTimerNs() - t0 > timeout_ns) {
      *timed_out = 1;
      break;
    }
    __nanosleep(2000);
  }
  __threadfence_system();
}

// ---- experiment ---------------------------------------------------------------
enum class Order { kAfter, kBefore, kSplit };  // GEMMs enqueued relative to the wait(s)
enum class WaitKind { kNone, kW32, kW64, kBatch, kSpin };
enum class Prio { kSame, kGatherLow, kGatherHigh };  // kGatherLow: gather lowest, GEMM highest

struct Arm {
  const char* name;
  const char* what;
  Order order;
  WaitKind kind;
  int gathers;       // gather streams, each with its own parked wait
  int tail;          // after the wait on the gather stream: 0 nothing, 1 an event, 2 a 64 KiB copy + an event
  bool ready_write;  // cuStreamWriteValue32(ready) before the wait
  Prio prio;
  bool wrap;  // (connections - 1) filler streams created between gather and GEMM stream
};

struct Options {
  int m = 8192;
  double t_ms = 50.0;
  int n = 0;  // 0: chosen from the alone time
  int reps = 3;
  double watchdog_s = 20.0;
  std::string only;  // comma list of arm names, empty = all
};

struct Gemm {
  cublasHandle_t h = nullptr;
  int m = 0;
  __nv_bfloat16 *a = nullptr, *b = nullptr, *c = nullptr;
  void* workspace = nullptr;
  void Run(cudaStream_t s) {
    const float alpha = 1.0f, beta = 0.0f;
    CKB(cublasSetStream(h, s));
    CKB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &alpha, a, CUDA_R_16BF, m, b, CUDA_R_16BF, m, &beta, c,
                     CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
};

struct Common {
  Gemm gemm;
  double alone_ms = 0;
  int n = 0;
  int conns = 8;
  std::string setting;
  int prio_least = 0, prio_greatest = 0;
  void* copy_src = nullptr;
  void* copy_dst = nullptr;
  size_t copy_bytes = 64 << 10;
  int next_word = kFirstRepWord;
  Options opt;
};

struct RepResult {
  int before = 0;             // GEMMs done before the flag write (of N)
  int after_wait_n = 0;       // GEMMs enqueued after the wait
  int after_wait_before = 0;  // ... of which done before the flag write
  double tput = NAN;          // rate of the GEMMs done before the flag, relative to alone
  double first_ms = 0;        // first after-wait GEMM done, relative to the flag write (GEMM 0 for order b)
  double last_ms = 0;         // last GEMM done, relative to the flag write
  double gather_ms = 0;       // gather stream(s) drained, relative to the flag write
  double enq_ms = 0;          // host time to enqueue everything
  double flag_late_ms = 0;    // flag written this late vs target
};

void EnqueueWait(const Arm& arm, cudaStream_t g, CUdeviceptr word, uint32_t value) {
  switch (arm.kind) {
    case WaitKind::kNone:
      break;
    case WaitKind::kW32:
      CKD(cuStreamWaitValue32(reinterpret_cast<CUstream>(g), word, value, CU_STREAM_WAIT_VALUE_GEQ));
      break;
    case WaitKind::kW64:
      CKD(cuStreamWaitValue64(reinterpret_cast<CUstream>(g), word, value, CU_STREAM_WAIT_VALUE_GEQ));
      break;
    case WaitKind::kBatch: {
      CUstreamBatchMemOpParams p;
      std::memset(&p, 0, sizeof(p));
      p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
      p.waitValue.address = word;
      p.waitValue.value = value;
      p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
      CKD(cuStreamBatchMemOp(reinterpret_cast<CUstream>(g), 1, &p, 0));
      break;
    }
    case WaitKind::kSpin: {
      const auto* f = reinterpret_cast<const volatile uint32_t*>(word);
      auto* to = reinterpret_cast<volatile uint32_t*>(g_flags_dev + sizeof(uint32_t) * kWordSpinTimeout);
      SpinWait<<<1, 32, 0, g>>>(f, value, 5000000000ull, to);
      CK(cudaGetLastError());
      break;
    }
  }
}

void EnqueueGatherBody(Common& c, const Arm& arm, cudaStream_t g, CUdeviceptr word, uint32_t value,
                       cudaEvent_t tail_ev) {
  if (arm.ready_write)
    CKD(cuStreamWriteValue32(reinterpret_cast<CUstream>(g), g_flags_dev + sizeof(uint32_t) * kWordReady, value, 0));
  EnqueueWait(arm, g, word, value);
  if (arm.tail >= 2) CK(cudaMemcpyAsync(c.copy_dst, c.copy_src, c.copy_bytes, cudaMemcpyDeviceToDevice, g));
  if (arm.tail >= 1) CK(cudaEventRecord(tail_ev, g));
}

double Median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

RepResult RunRep(Common& c, const Arm& arm, int rep, cudaStream_t s, const std::vector<cudaStream_t>& gs,
                 cudaEvent_t ev_start, const std::vector<cudaEvent_t>& ev, const std::vector<cudaEvent_t>& tail_ev) {
  const int n = c.n;
  if (c.next_word + 4 > kFlagWords) Die("out of flag words (too many reps)");
  const int word_idx = c.next_word;  // gather stream k waits on word word_idx + 2k (8-byte aligned)
  c.next_word += 4;
  for (int k = 0; k < 4; ++k) __atomic_store_n(&g_flags[word_idx + k], 0u, __ATOMIC_SEQ_CST);

  RepResult r;
  const int n_before = arm.order == Order::kBefore ? n : arm.order == Order::kSplit ? n / 2 : 0;
  r.after_wait_n = n - n_before;

  std::atomic<double> t_flag{-1.0};
  const double t0 = NowMs();
  const auto target = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(c.opt.t_ms * 1000.0));
  std::thread writer([&] {
    std::this_thread::sleep_until(target);
    // 64-bit store of 1 per gather word: the low word reads 1 for 32-bit waits.
    for (int k = 0; k < 2; ++k)
      __atomic_store_n(reinterpret_cast<uint64_t*>(&g_flags[word_idx + 2 * k]), uint64_t{1}, __ATOMIC_SEQ_CST);
    t_flag.store(NowMs());
  });

  CK(cudaEventRecord(ev_start, s));
  int i = 0;
  for (; i < n_before; ++i) {
    c.gemm.Run(s);
    CK(cudaEventRecord(ev[i], s));
  }
  for (size_t k = 0; k < gs.size(); ++k)
    EnqueueGatherBody(c, arm, gs[k], g_flags_dev + sizeof(uint32_t) * (word_idx + 2 * k), 1, tail_ev[k]);
  for (; i < n; ++i) {
    c.gemm.Run(s);
    CK(cudaEventRecord(ev[i], s));
  }
  if (!arm.tail)
    for (size_t k = 0; k < gs.size(); ++k) CK(cudaEventRecord(tail_ev[k], gs[k]));
  const double t_enq_end = NowMs();

  const double deadline = t0 + c.opt.t_ms + 3000.0 + 4.0 * n * c.alone_ms;
  std::vector<double> done(n);
  for (int j = 0; j < n; ++j) done[j] = PollEvent(ev[j], deadline, "a GEMM event");
  double gdone = 0;
  for (size_t k = 0; k < gs.size(); ++k) gdone = std::max(gdone, PollEvent(tail_ev[k], deadline, "the gather stream"));
  writer.join();  // it finished at T (the polls above can end earlier only if nothing waited)
  const double tf = t_flag.load();
  if (tf < 0) Die("flag writer did not run");
  if (gs.empty()) gdone = tf;
  if (arm.kind == WaitKind::kSpin && __atomic_load_n(&g_flags[kWordSpinTimeout], __ATOMIC_SEQ_CST) != 0)
    Die("the spin kernel timed out: it never saw the host's flag write");

  for (int j = 0; j < n; ++j) {
    if (done[j] < tf) {
      ++r.before;
      if (j >= n_before) ++r.after_wait_before;
    }
  }
  if (r.before > 0) {
    float span = 0;
    CK(cudaEventElapsedTime(&span, ev_start, ev[r.before - 1]));
    r.tput = span > 0 ? c.alone_ms * r.before / span : NAN;
  }
  const int first = n_before < n ? n_before : 0;
  r.first_ms = done[first] - tf;
  r.last_ms = done[n - 1] - tf;
  r.gather_ms = gdone - tf;
  r.enq_ms = t_enq_end - t0;
  r.flag_late_ms = tf - (t0 + c.opt.t_ms);
  std::printf(
      "rep setting=%s arm=%s rep=%d before=%d/%d after_wait_before=%d/%d tput=%.3f first_ms=%+.2f "
      "last_ms=%+.2f gather_ms=%+.2f enq_ms=%.2f flag_late_ms=%.2f\n",
      c.setting.c_str(), arm.name, rep, r.before, n, r.after_wait_before, r.after_wait_n, r.tput, r.first_ms, r.last_ms,
      r.gather_ms, r.enq_ms, r.flag_late_ms);
  std::fflush(stdout);
  return r;
}

void PrintHeader() {
  std::printf("TABLEH %-9s %-11s %8s %7s %6s %9s %9s %9s %7s  %s\n", "setting", "arm", "alone_ms", "before", "tput",
              "first_ms", "last_ms", "gather_ms", "enq_ms", "verdict");
}

void RunArm(Common& c, const Arm& arm) {
  g_where.store(arm.name);
  std::printf("arm %s: %s\n", arm.name, arm.what);

  // Streams: gather stream(s) first, then fillers (wrap arm), then the GEMM stream.
  int g_prio = 0, s_prio = 0;
  if (arm.prio == Prio::kGatherLow) {
    g_prio = c.prio_least;
    s_prio = c.prio_greatest;
  } else if (arm.prio == Prio::kGatherHigh) {
    g_prio = c.prio_greatest;
    s_prio = c.prio_least;
  }
  std::vector<cudaStream_t> gs(arm.gathers), fillers;
  for (auto& g : gs) CK(cudaStreamCreateWithPriority(&g, cudaStreamNonBlocking, g_prio));
  if (arm.wrap) {
    fillers.resize(std::max(0, c.conns - 1));
    for (auto& f : fillers) CK(cudaStreamCreateWithPriority(&f, cudaStreamNonBlocking, g_prio));
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, s_prio));

  cudaEvent_t ev_start;
  CK(cudaEventCreate(&ev_start));
  std::vector<cudaEvent_t> ev(c.n), tail_ev(std::max(1, arm.gathers));
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (auto& e : tail_ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

  // Warm-up with nothing parked: every op of the arm once, the wait on a word
  // that is already 1.  Loads lazily-loaded modules before any wait is parked.
  {
    for (size_t k = 0; k < gs.size(); ++k)
      EnqueueGatherBody(c, arm, gs[k], g_flags_dev + sizeof(uint32_t) * kWordOne, 1, tail_ev[k]);
    if (!arm.tail)
      for (size_t k = 0; k < gs.size(); ++k) CK(cudaEventRecord(tail_ev[k], gs[k]));
    c.gemm.Run(s);
    CK(cudaEventRecord(ev[0], s));
    const double deadline = NowMs() + 5000.0;
    PollEvent(ev[0], deadline, "warm-up GEMM");
    for (size_t k = 0; k < gs.size(); ++k) PollEvent(tail_ev[k], deadline, "warm-up gather");
  }

  std::vector<double> before, awb, tput, first, last, gather, enq;
  int after_wait_n = 0;
  for (int rep = 0; rep < c.opt.reps; ++rep) {
    RepResult r = RunRep(c, arm, rep, s, gs, ev_start, ev, tail_ev);
    before.push_back(r.before);
    awb.push_back(r.after_wait_before);
    tput.push_back(r.tput);
    first.push_back(r.first_ms);
    last.push_back(r.last_ms);
    gather.push_back(r.gather_ms);
    enq.push_back(r.enq_ms);
    after_wait_n = r.after_wait_n;
  }

  const double mb = Median(before), ma = Median(awb), mt = Median(tput);
  const char* verdict;
  if (after_wait_n == 0) {
    verdict = mb >= c.n ? "RUNS" : "STALLED";
  } else if (ma >= after_wait_n) {
    verdict = (!std::isnan(mt) && mt < 0.8) ? "RUNS_SLOW" : "RUNS";
  } else if (ma <= 0) {
    verdict = "BLOCKED";
  } else {
    verdict = "PARTIAL";
  }
  char before_s[32], tput_s[32];
  std::snprintf(before_s, sizeof(before_s), "%g/%d", mb, c.n);
  if (std::isnan(mt))
    std::snprintf(tput_s, sizeof(tput_s), "-");
  else
    std::snprintf(tput_s, sizeof(tput_s), "%.2f", mt);
  std::printf("TABLE  %-9s %-11s %8.3f %7s %6s %+9.2f %+9.2f %+9.2f %7.2f  %s\n", c.setting.c_str(), arm.name,
              c.alone_ms, before_s, tput_s, Median(first), Median(last), Median(gather), Median(enq), verdict);
  std::fflush(stdout);

  for (auto& e : ev) CK(cudaEventDestroy(e));
  for (auto& e : tail_ev) CK(cudaEventDestroy(e));
  CK(cudaEventDestroy(ev_start));
  CK(cudaStreamDestroy(s));
  for (auto& g : gs) CK(cudaStreamDestroy(g));
  for (auto& f : fillers) CK(cudaStreamDestroy(f));
}

void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--m=8192] [--t_ms=50] [--n=0 (auto)] [--reps=3] [--watchdog_s=20] [--only=a,b,...]\n"
               "Run once per CUDA_DEVICE_MAX_CONNECTIONS setting (see run.sh).\n",
               argv0);
  std::exit(64);
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    auto val = [&](const char* key) -> const char* {
      const size_t k = std::strlen(key);
      return std::strncmp(a, key, k) == 0 && a[k] == '=' ? a + k + 1 : nullptr;
    };
    if (const char* v = val("--m"))
      o.m = std::atoi(v);
    else if (const char* v = val("--t_ms"))
      o.t_ms = std::atof(v);
    else if (const char* v = val("--n"))
      o.n = std::atoi(v);
    else if (const char* v = val("--reps"))
      o.reps = std::atoi(v);
    else if (const char* v = val("--watchdog_s"))
      o.watchdog_s = std::atof(v);
    else if (const char* v = val("--only"))
      o.only = v;
    else
      Usage(argv[0]);
  }
  if (o.m < 256 || o.m > 16384 || o.t_ms < 5 || o.t_ms > 2000 || o.n < 0 || o.n > 256 || o.reps < 1 || o.reps > 20 ||
      o.watchdog_s < 1)
    Usage(argv[0]);
  return o;
}

bool Selected(const std::string& only, const char* name) {
  if (only.empty()) return true;
  const std::string key = "," + only + ",";
  return key.find("," + std::string(name) + ",") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  Common c;
  c.opt = ParseArgs(argc, argv);
  std::thread(Watchdog, c.opt.watchdog_s).detach();

  const char* env = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  c.setting = env ? env : "unset(8)";
  c.conns = env ? std::max(1, std::atoi(env)) : 8;

  // ---- context, device facts ----
  g_where.store("context");
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CUcontext ctx = nullptr;
  CKD(cuCtxGetCurrent(&ctx));
  if (ctx == nullptr) Die("no current driver context after cudaFree(0)");
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int drv = 0, rt = 0;
  CK(cudaDriverGetVersion(&drv));
  CK(cudaRuntimeGetVersion(&rt));
  CUdevice dev;
  CKD(cuCtxGetDevice(&dev));
  int nor = 0, hostptr = 0;
  CKD(cuDeviceGetAttribute(&nor, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, dev));
  CKD(cuDeviceGetAttribute(&hostptr, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, dev));
  CK(cudaDeviceGetStreamPriorityRange(&c.prio_least, &c.prio_greatest));
  std::printf(
      "probe: device=\"%s\" sm_%d%d SMs=%d driver=%d runtime=%d CUDA_DEVICE_MAX_CONNECTIONS=%s "
      "stream_priorities=[least %d, greatest %d] wait_value_nor=%d host_ptr_registered=%d\n",
      prop.name, prop.major, prop.minor, prop.multiProcessorCount, drv, rt, c.setting.c_str(), c.prio_least,
      c.prio_greatest, nor, hostptr);

  // ---- flag page (host memory, registered and mapped like the client's) ----
  g_where.store("flag page");
  void* page = nullptr;
  if (posix_memalign(&page, 4096, 4096) != 0) Die("posix_memalign failed");
  std::memset(page, 0, 4096);
  CK(cudaHostRegister(page, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
  void* page_dev = nullptr;
  CK(cudaHostGetDevicePointer(&page_dev, page, 0));
  g_flags = static_cast<uint32_t*>(page);
  g_flags_dev = reinterpret_cast<CUdeviceptr>(page_dev);
  __atomic_store_n(&g_flags[kWordOne], 1u, __ATOMIC_SEQ_CST);

  // ---- GEMM ----
  g_where.store("gemm setup");
  const int m = c.opt.m;
  c.gemm.m = m;
  const size_t elems = static_cast<size_t>(m) * m;
  CK(cudaMalloc(&c.gemm.a, elems * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&c.gemm.b, elems * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&c.gemm.c, elems * sizeof(__nv_bfloat16)));
  const size_t ws_bytes = 64ull << 20;
  CK(cudaMalloc(&c.gemm.workspace, ws_bytes));
  CK(cudaMalloc(&c.copy_src, c.copy_bytes));
  CK(cudaMalloc(&c.copy_dst, c.copy_bytes));
  CK(cudaMemset(c.copy_src, 1, c.copy_bytes));
  FillBf16<<<1024, 256>>>(c.gemm.a, elems, 1u);
  CK(cudaGetLastError());
  FillBf16<<<1024, 256>>>(c.gemm.b, elems, 2u);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());  // nothing is parked yet
  CKB(cublasCreate(&c.gemm.h));
  CKB(cublasSetWorkspace(c.gemm.h, c.gemm.workspace, ws_bytes));

  // ---- GEMM alone ----
  g_where.store("gemm alone");
  {
    cudaStream_t s0;
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    const int warm = 5, k = 21;
    std::vector<cudaEvent_t> e(k + 1);
    for (auto& x : e) CK(cudaEventCreate(&x));
    for (int i = 0; i < warm; ++i) c.gemm.Run(s0);
    CK(cudaEventRecord(e[0], s0));
    for (int i = 1; i <= k; ++i) {
      c.gemm.Run(s0);
      CK(cudaEventRecord(e[i], s0));
    }
    PollEvent(e[k], NowMs() + 8000.0, "GEMM-alone runs");
    std::vector<double> per;
    for (int i = 1; i <= k; ++i) {
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e[i - 1], e[i]));
      per.push_back(ms);
    }
    c.alone_ms = Median(per);
    for (auto& x : e) CK(cudaEventDestroy(x));
    CK(cudaStreamDestroy(s0));
  }
  if (!(c.alone_ms > 0.01)) Die("implausible GEMM time %.4f ms", c.alone_ms);
  c.n = c.opt.n > 0 ? c.opt.n : std::max(4, std::min(64, static_cast<int>(0.5 * c.opt.t_ms / c.alone_ms)));
  std::printf(
      "probe: GEMM bf16 %dx%dx%d alone %.3f ms median (%.0f TFLOP/s); N=%d GEMMs per rep, flag written at "
      "T=%.0f ms, %d reps per arm; a GEMM is 'before' if the host saw its event complete before the flag "
      "write\n",
      m, m, m, c.alone_ms, 2.0 * m * m * static_cast<double>(m) / (c.alone_ms * 1e9), c.n, c.opt.t_ms, c.opt.reps);
  if (c.n * c.alone_ms > 0.9 * c.opt.t_ms)
    std::printf("probe: WARNING N GEMMs alone take %.1f ms, close to T: 'before' undercounts; raise --t_ms\n",
                c.n * c.alone_ms);

  // name, what, order, wait kind, gather streams, tail (0 none, 1 event, 2 copy + event), ready write, priority, wrap
  const Arm arms[] = {
      {"ctl", "control: no wait parked; N GEMMs", Order::kAfter, WaitKind::kNone, 0, 0, false, Prio::kSame, false},
      {"a", "cuStreamWaitValue32 parked on the gather stream, then N GEMMs on the GEMM stream", Order::kAfter,
       WaitKind::kW32, 1, 0, false, Prio::kSame, false},
      {"b", "N GEMMs enqueued first, then the wait parked", Order::kBefore, WaitKind::kW32, 1, 0, false, Prio::kSame,
       false},
      {"ab", "N/2 GEMMs, then the wait, then N/2 GEMMs", Order::kSplit, WaitKind::kW32, 1, 0, false, Prio::kSame,
       false},
      {"c", "wait + 64 KiB copy + event on the gather stream (a gather's shape), then GEMMs", Order::kAfter,
       WaitKind::kW32, 1, 2, false, Prio::kSame, false},
      {"cw", "as c with cuStreamWriteValue32(ready) before the wait (the client's sequence)", Order::kAfter,
       WaitKind::kW32, 1, 2, true, Prio::kSame, false},
      {"d", "two gather streams, each with a parked wait, then GEMMs", Order::kAfter, WaitKind::kW32, 2, 0, false,
       Prio::kSame, false},
      {"batch", "as a with cuStreamBatchMemOp(WAIT_VALUE_32)", Order::kAfter, WaitKind::kBatch, 1, 0, false,
       Prio::kSame, false},
      {"w64", "as a with cuStreamWaitValue64", Order::kAfter, WaitKind::kW64, 1, 0, false, Prio::kSame, false},
      {"a_prio", "as a; gather stream lowest priority, GEMM stream highest", Order::kAfter, WaitKind::kW32, 1, 0, false,
       Prio::kGatherLow, false},
      {"c_prio", "as c; gather stream lowest priority, GEMM stream highest", Order::kAfter, WaitKind::kW32, 1, 2, false,
       Prio::kGatherLow, false},
      {"a_prioinv", "as a; gather stream highest priority, GEMM stream lowest", Order::kAfter, WaitKind::kW32, 1, 0,
       false, Prio::kGatherHigh, false},
      {"a_wrap", "as a; (connections - 1) streams created between the gather and the GEMM stream", Order::kAfter,
       WaitKind::kW32, 1, 0, false, Prio::kSame, true},
      {"spin", "a 1-warp kernel polling the flag on the gather stream instead of a stream wait", Order::kAfter,
       WaitKind::kSpin, 1, 0, false, Prio::kSame, false},
      {"spin_e", "spin kernel + event on the gather stream (NCCL's shape: a kernel, then an event), then GEMMs",
       Order::kAfter, WaitKind::kSpin, 1, 1, false, Prio::kSame, false},
      {"spin_c", "spin kernel + 64 KiB copy + event on the gather stream, then GEMMs", Order::kAfter, WaitKind::kSpin,
       1, 2, false, Prio::kSame, false},
  };

  PrintHeader();
  for (const Arm& arm : arms)
    if (Selected(c.opt.only, arm.name)) RunArm(c, arm);

  // ---- teardown (everything has drained: every event above was seen complete) ----
  g_where.store("teardown");
  CKB(cublasDestroy(c.gemm.h));
  CK(cudaFree(c.gemm.a));
  CK(cudaFree(c.gemm.b));
  CK(cudaFree(c.gemm.c));
  CK(cudaFree(c.gemm.workspace));
  CK(cudaFree(c.copy_src));
  CK(cudaFree(c.copy_dst));
  CK(cudaHostUnregister(page));
  g_flags = nullptr;
  std::free(page);
  g_finished.store(true);
  std::printf("probe: done in %.1f s\n", NowMs() / 1000.0);
  return 0;
}
