// CpuRelax: the spin-wait hint for polling loops, portable. x86: `pause`;
// aarch64: `yield`; elsewhere a compiler barrier only (the loop still
// re-reads memory, it just does not tell the core it is spinning).
#pragma once

namespace dmagather::common {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield" ::: "memory");
#else
  asm volatile("" ::: "memory");
#endif
}

}  // namespace dmagather::common
