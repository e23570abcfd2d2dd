// Checks the ThreadSanitizer build itself (ctest: TsanCanary.*, DECISION_SANITIZE=thread).
//
// absl_tsan.cc makes TSan see Debian's uninstrumented absl::Mutex, and deploy/test.sh runs
// TSan with ignore_noninstrumented_modules=1. Each could fail silently in the direction
// that matters: reports about data an absl::Mutex does protect (false positives that
// would bury real ones), or no report at all. So:
//   tsan_canary         hands data between threads through absl::Mutex, Mutex::Await
//                       and absl::Notification: must finish with no report (exit 0);
//   tsan_canary --race  also increments a counter from two threads without a lock:
//                       must produce a data race report.

#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

absl::Mutex mu;
int guarded = 0;
int unguarded = 0;

}  // namespace

int main(int argc, char** argv) {
  const bool race = argc > 1 && std::strcmp(argv[1], "--race") == 0;

  // Lock and Unlock (MutexLock).
  std::thread counter([&] {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock lock(&mu);
      ++guarded;
    }
    if (race) ++unguarded;
  });
  for (int i = 0; i < 1000; ++i) {
    absl::MutexLock lock(&mu);
    ++guarded;
  }
  if (race) ++unguarded;
  counter.join();

  // A value published before a flag that Mutex::Await waits for.
  int published = 0;
  bool ready = false;
  std::thread producer([&] {
    published = 42;
    absl::MutexLock lock(&mu);
    ready = true;
  });
  int seen;
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&ready));
    seen = published;
  }
  producer.join();

  // A value published before Notification::Notify.
  absl::Notification notified;
  int payload = 0;
  std::thread notifier([&] {
    payload = 7;
    notified.Notify();
  });
  notified.WaitForNotification();
  const int received = payload;
  notifier.join();

  const bool ok = guarded == 2000 && seen == 42 && received == 7;
  std::printf("tsan_canary: %s\n", ok ? "values as expected" : "WRONG VALUES");
  return ok ? 0 : 1;
}
