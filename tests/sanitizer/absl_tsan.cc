// ThreadSanitizer's view of Debian's prebuilt Abseil synchronization.
//
// Linked into every executable of a DECISION_SANITIZE=thread build (see the top-level
// CMakeLists.txt), and into nothing else.
//
// Why: Debian's libabsl_synchronization.so is not built with -fsanitize=thread. Abseil's
// own TSan annotations (ABSL_TSAN_MUTEX_*, mutex.cc) are compiled in only when the library
// itself is built with TSan, so in Debian's build they are empty, and the lock word is an
// uninstrumented atomic. TSan then sees no happens-before edge through absl::Mutex at all
// and reports every ABSL_GUARDED_BY field touched by two threads as a race: false positives
// that no suppression can remove without also hiding the real races.
//
// How: this file defines the out-of-line absl::Mutex, CondVar, Notification and
// ReleasableMutexLock functions itself. Each one makes the __tsan_mutex_* calls that
// Abseil's own TSan build makes around it (mutex.cc; Conditions aside, see ReleaseWhile)
// and calls the library's function, found with dlsym(RTLD_NEXT). The executable exports these definitions
// (tsan.dynlist), so the dynamic linker binds to them not only our code's calls but
// also gRPC's (grpc_core::Mutex and gpr_mu are absl::Mutex on Debian) and Abseil's own
// internal calls, which Debian's build makes through the PLT. Nothing here changes what the
// functions do; it only tells TSan.
//
// What it does not cover: synchronization inside uninstrumented libraries that is not an
// absl::Mutex (gRPC's lock-free queues: grpc_tsan.cc covers the hand-off our code relies
// on; RocksDB's atomics; XGBoost's OpenMP). deploy/sanitizers/tsan.supp says what that
// leaves.
//
// Thread safety: every function here is as thread-safe as the one it wraps; the lookups of
// the real functions are function-local statics (thread-safe initialization).

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/config.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#if !defined(ABSL_HAVE_THREAD_SANITIZER)
#error "absl_tsan.cc belongs only in a -fsanitize=thread build"
#endif
static_assert(ABSL_OPTION_USE_INLINE_NAMESPACE == 1,
              "the mangled names below assume Abseil's inline namespace (Debian: debian3)");

namespace {

#define DECISION_TSAN_STR2(x) #x
#define DECISION_TSAN_STR(x) DECISION_TSAN_STR2(x)

// The library's definition of `absl::<inline namespace>::<rest>`, e.g. rest =
// "5Mutex4LockEv". `qualifier` is "" or "K" (const member function). Aborts with a message
// if the library does not define it: the build would otherwise silently lose the
// annotations.
void* Real(const char* qualifier, const char* rest) {
  const char* ns = DECISION_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string("_ZN") + qualifier + "4absl" +
                           std::to_string(std::strlen(ns)) + ns + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "absl_tsan: %s not found after the executable: %s\n", name.c_str(),
                 dlerror());
    std::abort();
  }
  return fn;
}

#define DECISION_REAL(type, qualifier, rest) \
  static const auto real = reinterpret_cast<type>(Real(qualifier, rest))

// Abseil's lock word: a writer holds the Mutex (kMuWriter in absl/synchronization/mutex.cc,
// 20220623). Used, as Abseil does, to tell TSan in which mode a waiting thread holds it.
constexpr intptr_t kMuWriter = 0x0008;

unsigned HeldModeFlags(const std::atomic<intptr_t>& mu) {
  return (mu.load(std::memory_order_relaxed) & kMuWriter) != 0 ? 0 : __tsan_mutex_read_lock;
}

// A wait that releases `mu` (held in mode `flags`) and holds it again on return, as
// CondVar::WaitCommon and Mutex::AwaitCommon annotate it. The whole call stays inside the
// unlock annotation, where TSan ignores this thread's accesses: the library evaluates the
// Condition there while it holds the lock, which TSan cannot see (Abseil's own annotated
// build marks those evaluations as locked; from outside the library we can only ignore
// them). The same holds for Conditions other threads evaluate inside Lock/Unlock below.
template <typename Call>
auto ReleaseWhile(void* mu, unsigned flags, Call&& call) {
  __tsan_mutex_pre_unlock(mu, flags);
  auto result = call();
  __tsan_mutex_post_unlock(mu, flags);
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

// The library's *WithTimeout functions are `return *WithDeadline(..., Now() + timeout)`
// calls through the PLT, which would reach the annotated *WithDeadline below and annotate
// twice; ours make the same call directly.
absl::Time DeadlineFromTimeout(absl::Duration timeout) { return absl::Now() + timeout; }

template <typename Call>
auto Locking(void* mu, unsigned flags, Call&& call) {
  __tsan_mutex_pre_lock(mu, flags);
  auto result = call();
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

Mutex::~Mutex() {
  DECISION_REAL(void (*)(Mutex*), "", "5MutexD1Ev");
  __tsan_mutex_destroy(this, __tsan_mutex_not_static);
  real(this);
}

void Mutex::Lock() {
  DECISION_REAL(void (*)(Mutex*), "", "5Mutex4LockEv");
  Locking(this, 0, [&] { return (real(this), 0); });
}

void Mutex::ReaderLock() {
  DECISION_REAL(void (*)(Mutex*), "", "5Mutex10ReaderLockEv");
  Locking(this, __tsan_mutex_read_lock, [&] { return (real(this), 0); });
}

bool Mutex::TryLock() {
  DECISION_REAL(bool (*)(Mutex*), "", "5Mutex7TryLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  __tsan_mutex_post_lock(this, locked ? __tsan_mutex_try_lock : __tsan_mutex_try_lock_failed,
                         0);
  return locked;
}

bool Mutex::ReaderTryLock() {
  DECISION_REAL(bool (*)(Mutex*), "", "5Mutex13ReaderTryLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_read_lock);
  const bool locked = real(this);
  __tsan_mutex_post_lock(
      this, locked ? __tsan_mutex_try_read_lock : __tsan_mutex_try_read_lock_failed, 0);
  return locked;
}

void Mutex::Unlock() {
  DECISION_REAL(void (*)(Mutex*), "", "5Mutex6UnlockEv");
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  DECISION_REAL(void (*)(Mutex*), "", "5Mutex12ReaderUnlockEv");
  __tsan_mutex_pre_unlock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_unlock(this, __tsan_mutex_read_lock);
}

void Mutex::LockWhen(const Condition& cond) {
  DECISION_REAL(void (*)(Mutex*, const Condition&), "", "5Mutex8LockWhenERKNS0_9ConditionE");
  Locking(this, 0, [&] { return (real(this, cond), 0); });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  DECISION_REAL(void (*)(Mutex*, const Condition&), "",
                "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking(this, __tsan_mutex_read_lock, [&] { return (real(this, cond), 0); });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  return LockWhenWithDeadline(cond, DeadlineFromTimeout(timeout));
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  return ReaderLockWhenWithDeadline(cond, DeadlineFromTimeout(timeout));
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  DECISION_REAL(bool (*)(Mutex*, const Condition&, absl::Time), "",
                "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, 0, [&] { return real(this, cond, deadline); });
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  DECISION_REAL(bool (*)(Mutex*, const Condition&, absl::Time), "",
                "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, __tsan_mutex_read_lock, [&] { return real(this, cond, deadline); });
}

void Mutex::Await(const Condition& cond) {
  DECISION_REAL(void (*)(Mutex*, const Condition&), "", "5Mutex5AwaitERKNS0_9ConditionE");
  ReleaseWhile(this, HeldModeFlags(mu_), [&] { return (real(this, cond), 0); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  return AwaitWithDeadline(cond, DeadlineFromTimeout(timeout));
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  DECISION_REAL(bool (*)(Mutex*, const Condition&, absl::Time), "",
                "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return ReleaseWhile(this, HeldModeFlags(mu_), [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  DECISION_REAL(void (*)(CondVar*, Mutex*), "", "7CondVar4WaitEPNS0_5MutexE");
  ReleaseWhile(mu, HeldModeFlags(mu->mu_), [&] { return (real(this, mu), 0); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  return WaitWithDeadline(mu, DeadlineFromTimeout(timeout));
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  DECISION_REAL(bool (*)(CondVar*, Mutex*, absl::Time), "",
                "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return ReleaseWhile(mu, HeldModeFlags(mu->mu_), [&] { return real(this, mu, deadline); });
}

// The library's Release() is `mu_->Unlock(); mu_ = nullptr;`; written here so the unlock
// is the annotated one above whatever the library's build inlined.
void ReleasableMutexLock::Release() {
  if (this->mu_ == nullptr) {
    std::fprintf(stderr, "absl_tsan: ReleasableMutexLock::Release may only be called once\n");
    std::abort();
  }
  this->mu_->Unlock();
  this->mu_ = nullptr;
}

// Notify publishes through notified_yet_; HasBeenNotified() (inline, so instrumented in our
// code) reads it with an acquire load, which TSan pairs with this release.
void Notification::Notify() {
  DECISION_REAL(void (*)(Notification*), "", "12Notification6NotifyEv");
  __tsan_release(&notified_yet_);
  real(this);
}

void Notification::WaitForNotification() const {
  DECISION_REAL(void (*)(const Notification*), "K", "12Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<std::atomic<bool>*>(&notified_yet_));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  return WaitForNotificationWithDeadline(DeadlineFromTimeout(timeout));
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  DECISION_REAL(bool (*)(const Notification*, absl::Time), "K",
                "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<std::atomic<bool>*>(&notified_yet_));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
