#include "server/executor.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace decision::server {

void SetCurrentThreadPriority(ThreadPriority priority) {
  int failed = 0;
  if (priority == ThreadPriority::kLow) {
    // PRIO_PROCESS with a thread id sets that thread's nice value alone (setpriority(2),
    // NOTES: a Linux thread is a process for this call).
    failed = setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);
  } else if (priority == ThreadPriority::kIdle) {
    const sched_param param{};  // sched_priority 0, as SCHED_IDLE requires
    failed = sched_setscheduler(0, SCHED_IDLE, &param);  // 0: the calling thread
  }
  if (failed != 0) {
    std::fprintf(stderr, "decisiond: cannot lower a background thread's priority: %s\n",
                 std::strerror(errno));
  }
}

Executor::Executor(int threads, std::string name, ThreadPriority priority)
    : name_(std::move(name)), priority_(priority) {
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] { Loop(); });
    // Shown by top -H, perf and gdb; Linux allows 15 characters.
    pthread_setname_np(threads_.back().native_handle(), name_.substr(0, 15).c_str());
  }
}

Executor::~Executor() { Stop(); }

void Executor::Schedule(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) {
      tasks_.push_back(std::move(task));
      return;
    }
  }
  task();  // stopped: run in the caller
}

bool Executor::TrySchedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return false;
  tasks_.push_back(std::move(task));
  return true;
}

void Executor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  // Tasks scheduled by the last tasks, after the threads saw an empty queue.
  while (!tasks_.empty()) {
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    mu_.Unlock();
    task();
    mu_.Lock();
  }
}

void Executor::Loop() {
  SetCurrentThreadPriority(priority_);
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Executor* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
            return e->stopping_ || !e->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stopping, and nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace decision::server
