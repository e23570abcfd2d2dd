#include "server/executor.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace decision::server {

void SetCurrentThreadPriority(ThreadPriority priority) {
  int failed = 0;
  if (priority == ThreadPriority::kLow) {
    // PRIO_PROCESS with a thread id sets that thread's nice value alone (setpriority(2),
    // NOTES: a Linux thread is a process for this call).
    failed = setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 10);
  } else if (priority == ThreadPriority::kLowest) {
    failed = setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
  } else if (priority == ThreadPriority::kIdle) {
    const sched_param param{};  // sched_priority 0, as SCHED_IDLE requires
    failed = sched_setscheduler(0, SCHED_IDLE, &param);  // 0: the calling thread
  }
  if (failed != 0) {
    std::fprintf(stderr, "decisiond: cannot lower a background thread's priority: %s\n",
                 std::strerror(errno));
  }
}

int CpusAvailable() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return CpuQuotaBound(sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1);
}

int CpuQuotaBound(int cpus) {
  // A CPU quota (cgroup v2's cpu.max, "QUOTA PERIOD" or "max PERIOD": a container's CPU
  // limit) bounds it too: threads past the quota only take turns in it.
  if (std::FILE* f = std::fopen("/sys/fs/cgroup/cpu.max", "r")) {
    long long quota = 0, period = 0;
    if (std::fscanf(f, "%lld %lld", &quota, &period) == 2 && quota > 0 && period > 0) {
      cpus = std::min<long long>(cpus, (quota + period - 1) / period);
    }
    std::fclose(f);
  }
  return std::max(1, cpus);
}

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list) {
  const auto invalid = [list](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CPU list '", list.substr(0, 64), "' ", why,
        " (a list of CPUs and ranges, such as 2-3 or 0,4-5)"));
  };
  // A CPU number: decimal digits only, below CPU_SETSIZE.
  const auto number = [](absl::string_view digits, int* cpu) {
    if (digits.empty() || digits.size() > 6) return false;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
    }
    return absl::SimpleAtoi(digits, cpu);
  };
  if (list.empty()) return invalid("is empty");
  std::vector<bool> listed(CPU_SETSIZE, false);
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    const size_t dash = part.find('-');
    const absl::string_view low = part.substr(0, dash);
    const absl::string_view high = dash == absl::string_view::npos ? low : part.substr(dash + 1);
    int first = 0, last = 0;
    if (!number(low, &first) || !number(high, &last)) {
      return invalid(absl::StrCat("has '", part.substr(0, 32), "', not a CPU or a range"));
    }
    if (last < first) return invalid(absl::StrCat("has the range '", part, "' backwards"));
    if (last >= CPU_SETSIZE) {
      return invalid(absl::StrCat("names CPU ", last, "; at most ", CPU_SETSIZE - 1));
    }
    for (int c = first; c <= last; ++c) listed[static_cast<size_t>(c)] = true;
  }
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (listed[static_cast<size_t>(c)]) cpus.push_back(c);
  }
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    absl::StrAppend(&out, out.empty() ? "" : ",", cpus[i]);
    if (j > i) absl::StrAppend(&out, "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> CurrentThreadCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

void PinCurrentThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  // 0: the calling thread alone (sched_setaffinity(2): a Linux thread id is a pid here).
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    std::fprintf(stderr, "decisiond: cannot pin a thread to its CPUs: %s\n",
                 std::strerror(errno));
  }
}

Executor::Executor(int threads, std::string name, ThreadPriority priority,
                   std::vector<int> cpus)
    : name_(std::move(name)), priority_(priority), cpus_(std::move(cpus)) {
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
  PinCurrentThread(cpus_);
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

namespace {
// What the caller of ParallelFor and its helpers share. Helpers may start after the call has
// returned (their pool was busy): they hold it by shared_ptr and touch `fn` only while
// `open`, which the caller clears before it waits for the helpers at work.
struct ParallelWork {
  absl::Mutex mu;
  int next ABSL_GUARDED_BY(mu) = 0;
  int working ABSL_GUARDED_BY(mu) = 0;  // helpers inside RunTasks
  bool open ABSL_GUARDED_BY(mu) = true;
  int tasks = 0;
  absl::FunctionRef<void(int)>* fn = nullptr;

  // Runs tasks until none is left. A helper (`helper`) first checks that the call is open.
  void RunTasks(bool helper) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (helper) {
      if (!open) return;
      ++working;
    }
    while (next < tasks) {
      const int task = next++;
      mu.Unlock();
      (*fn)(task);
      mu.Lock();
    }
    if (helper) --working;
  }
};
}  // namespace

void ParallelFor(Executor* pool, int tasks, absl::FunctionRef<void(int)> fn) {
  if (pool == nullptr || pool->threads() < 1 || tasks < 2) {
    for (int i = 0; i < tasks; ++i) fn(i);
    return;
  }
  auto work = std::make_shared<ParallelWork>();
  work->tasks = tasks;
  work->fn = &fn;
  for (int h = 0; h < std::min(pool->threads(), tasks - 1); ++h) {
    pool->Schedule([work] { work->RunTasks(/*helper=*/true); });
  }
  work->RunTasks(/*helper=*/false);
  absl::MutexLock lock(&work->mu);
  work->open = false;
  work->mu.Await(absl::Condition(
      +[](ParallelWork* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu) { return w->working == 0; },
      work.get()));
}

}  // namespace decision::server
