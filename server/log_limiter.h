// A report that can repeat at the rate of requests or maintenance rounds (a store that
// cannot write fails every write, 50 rounds a second) printed at most once per interval,
// with the count of the reports held back since the last one printed:
//   decisiond: maintenance: ... (2491 more since the last report)
// The first report is printed at once. Time is passed in (Clock::NowMs), so tests decide
// what is printed.
//
// Thread safety: all methods may be called concurrently.
#ifndef DECISION_SERVER_LOG_LIMITER_H_
#define DECISION_SERVER_LOG_LIMITER_H_

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace decision::server {

class LogLimiter {
 public:
  // REQUIRES: interval_ms >= 0 (0: every report is printed).
  explicit LogLimiter(int64_t interval_ms) : interval_ms_(interval_ms) {}

  // Whether a report made at now_ms is printed; if so, *held_back is the number of reports
  // not printed since the last printed one (and the count restarts).
  bool ShouldPrint(int64_t now_ms, int64_t* held_back) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (last_printed_ms_ != kNever && now_ms - last_printed_ms_ < interval_ms_) {
      ++held_back_;
      return false;
    }
    last_printed_ms_ = now_ms;
    *held_back = held_back_;
    held_back_ = 0;
    return true;
  }

  // Prints "decisiond: <message>" to stderr if ShouldPrint, with the count held back.
  // Returns whether it printed.
  bool Report(int64_t now_ms, const std::string& message) {
    int64_t held_back = 0;
    if (!ShouldPrint(now_ms, &held_back)) return false;
    if (held_back > 0) {
      std::fprintf(stderr, "decisiond: %s (%lld more since the last report)\n", message.c_str(),
                   static_cast<long long>(held_back));
    } else {
      std::fprintf(stderr, "decisiond: %s\n", message.c_str());
    }
    return true;
  }

  // Forgets the last report: the next one is printed at once (when the condition that
  // repeated has ended, so that its return is reported).
  void Reset() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    last_printed_ms_ = kNever;
    held_back_ = 0;
  }

 private:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::min();
  const int64_t interval_ms_;
  absl::Mutex mu_;
  int64_t last_printed_ms_ ABSL_GUARDED_BY(mu_) = kNever;
  int64_t held_back_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace decision::server

#endif  // DECISION_SERVER_LOG_LIMITER_H_
