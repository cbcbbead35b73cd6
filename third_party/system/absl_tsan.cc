// ThreadSanitizer annotations for Debian's Abseil synchronization library
// (--config=tsan only; empty otherwise). libabsl_synchronization.so is not
// built with -fsanitize=thread, so TSan cannot see absl::Mutex, CondVar or
// Notification order memory and reports every access they protect as a
// race. This file interposes the calls our code makes: each forwards to the
// real function (dlsym(RTLD_NEXT)) and tells TSan about the happens-before
// edge (release before unlocking, acquire after locking). Limit: an
// absl::Condition evaluated inside Await/LockWhen by the waiting thread
// reads before the acquire and may still be reported. Also here: the
// reference count of absl::Status (below), and the suppression of Abseil's
// own deadlock-graph accesses (at the end).
#if defined(__SANITIZE_THREAD__)

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {

#define DMAG_ABSL_STR2(x) #x
#define DMAG_ABSL_STR(x) DMAG_ABSL_STR2(x)

// The real function of the Itanium-mangled member `tail` of absl's inline
// namespace: "5Mutex4LockEv" -> _ZN4absl<len><ns>5Mutex4LockEv.
void* Real(const char* tail, bool is_const = false) {
  const char* ns = DMAG_ABSL_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  std::string name = std::string(is_const ? "_ZNK4absl" : "_ZN4absl") + std::to_string(std::strlen(ns)) + ns + tail;
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "absl_tsan: %s not found in the Abseil libraries\n", name.c_str());
    std::abort();
  }
  return f;
}

template <typename Fn>
Fn Resolve(const char* tail, bool is_const = false) {
  return reinterpret_cast<Fn>(Real(tail, is_const));
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Resolve<void (*)(Mutex*)>("5Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::Unlock() {
  static auto real = Resolve<void (*)(Mutex*)>("5Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

bool Mutex::TryLock() {
  static auto real = Resolve<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  const bool ok = real(this);
  if (ok) __tsan_acquire(this);
  return ok;
}

void Mutex::ReaderLock() {
  static auto real = Resolve<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderUnlock() {
  static auto real = Resolve<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

bool Mutex::ReaderTryLock() {
  static auto real = Resolve<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  const bool ok = real(this);
  if (ok) __tsan_acquire(this);
  return ok;
}

void Mutex::LockWhen(const Condition& cond) {
  static auto real = Resolve<void (*)(Mutex*, const Condition&)>("5Mutex8LockWhenERKNS0_9ConditionE");
  real(this, cond);
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Resolve<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const bool r = real(this, cond, timeout);
  __tsan_acquire(this);  // Held either way.
  return r;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Resolve<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool r = real(this, cond, deadline);
  __tsan_acquire(this);
  return r;
}

void Mutex::Await(const Condition& cond) {
  static auto real = Resolve<void (*)(Mutex*, const Condition&)>("5Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  real(this, cond);
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Resolve<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  const bool r = real(this, cond, timeout);
  __tsan_acquire(this);
  return r;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Resolve<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  const bool r = real(this, cond, deadline);
  __tsan_acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Resolve<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto real = Resolve<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool r = real(this, mu, timeout);
  __tsan_acquire(mu);
  return r;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static auto real = Resolve<bool (*)(CondVar*, Mutex*, Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool r = real(this, mu, deadline);
  __tsan_acquire(mu);
  return r;
}

void Notification::Notify() {
  static auto real = Resolve<void (*)(Notification*)>("12Notification6NotifyEv");
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real = Resolve<void (*)(const Notification*)>("12Notification19WaitForNotificationEv", true);
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static auto real = Resolve<bool (*)(const Notification*, Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  const bool r = real(this, timeout);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static auto real = Resolve<bool (*)(const Notification*, Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  const bool r = real(this, deadline);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

// A non-OK Status shares one heap rep between its copies: Ref is an inline
// (instrumented) relaxed increment, but the decrement and the delete are in
// libabsl_status (not instrumented), so a copy made on one thread and the
// last copy dropped on another look unordered (seen: an engine op's status,
// copied by the test's thread, freed by the issue thread). Each drop
// releases what its holder did and acquires the others' before the real
// decrement, as the acq_rel decrement in the library does.
void Status::UnrefNonInlined(uintptr_t rep) {
  static auto real = Resolve<void (*)(uintptr_t)>("6Status15UnrefNonInlinedEm");
  void* shared = reinterpret_cast<void*>(rep - 1);
  __tsan_release(shared);
  __tsan_acquire(shared);
  real(rep);
}

ABSL_NAMESPACE_END
}  // namespace absl

// Abseil's deadlock detector (on in Debian's build: it keeps a graph of the
// order Mutexes are taken in) guards its graph with a SpinLock inside the
// uninstrumented libabsl_synchronization, so TSan sees the graph's memmoves
// from two threads with no order between them and reports a race that is
// not there (seen with nested locks of 8 devices, gpu_deadlock_test). The
// library's own calls are ignored; nothing of this project is.
extern "C" const char* __tsan_default_suppressions() { return "called_from_lib:libabsl_graphcycles_internal.so\n"; }

#endif  // __SANITIZE_THREAD__
