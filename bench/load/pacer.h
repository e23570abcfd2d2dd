// A thread that runs callbacks at given times, in time order: bench/load's paced slots
// (--rate) start their next RPC from it.
//
// Thread safety: At may be called from any thread, a callback included. Callbacks run one at
// a time on the Pacer's thread, without its lock. Destruction drops the callbacks not yet
// due and joins the thread: the owner makes sure none is still wanted.
#ifndef DECISION_BENCH_LOAD_PACER_H_
#define DECISION_BENCH_LOAD_PACER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <queue>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace decision::bench {

class Pacer {
 public:
  Pacer() : thread_([this] { Run(); }) {}
  ~Pacer() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      cv_.Signal();
    }
    thread_.join();
  }

  void At(std::chrono::steady_clock::time_point at, std::function<void()> f) {
    absl::MutexLock lock(&mu_);
    queue_.push(Item{at, seq_++, std::move(f)});
    cv_.Signal();
  }

 private:
  struct Item {
    std::chrono::steady_clock::time_point at;
    int64_t seq;  // first in, first run among equal times
    std::function<void()> f;
    bool operator>(const Item& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  void Run() {
    absl::MutexLock lock(&mu_);
    while (!done_) {
      if (queue_.empty()) {
        cv_.Wait(&mu_);
        continue;
      }
      const auto now = std::chrono::steady_clock::now();
      if (queue_.top().at > now) {
        cv_.WaitWithTimeout(&mu_, absl::FromChrono(queue_.top().at - now));
        continue;
      }
      std::function<void()> f = std::move(const_cast<Item&>(queue_.top()).f);
      queue_.pop();
      mu_.Unlock();
      f();
      mu_.Lock();
    }
  }

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue_;
  int64_t seq_ = 0;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace decision::bench

#endif  // DECISION_BENCH_LOAD_PACER_H_
