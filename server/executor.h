// A fixed pool of threads that runs closures in the order they were scheduled (FIFO across
// the pool). The service keeps two: one thread for the group commits of every problem (the
// join writer), and a small pool for the blocking work of RPCs (store scans and lookups,
// model parsing, waits), so that no gRPC reactor thread blocks (STYLE.md, rule 12).
//
// Thread safety: Schedule may be called from any thread, including a task of the pool.
// Stop runs every task scheduled before it (and those they schedule), then joins the
// threads; tasks scheduled after Stop run in the caller of Schedule, at once.
#ifndef DECISION_SERVER_EXECUTOR_H_
#define DECISION_SERVER_EXECUTOR_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace decision::server {

// CPU priority of a background thread (learning, maintenance, training) against the threads
// that answer requests, so that when the CPU is saturated a Choose does not queue behind
// background work. RocksDB lowers its compaction threads likewise
// (Env::LowerThreadPoolCPUPriority, CpuPriority::kLow and kIdle).
//
// On Linux 6.18 (EEVDF), a request thread woken while a nice-10 background thread runs often
// waits for the next tick (4 ms at HZ=250) rather than preempting it: it must first become
// eligible, and a nice-10 thread's virtual time runs only 9.3 times as fast as its own.
// Nice 19 (68 times) cut Choose p99 at c = 8 with 32 tree experts while training from 3.4 to
// a median of 2.2 ms, but it is as nice to other processes: beside two busy ones, a replay
// test that takes 3.4 s alone took 108 s at nice 19 and 19 s at nice 10 (bench/README.md).
// So kLow stays nice 10; kLowest is for the threads that must never be idle where the
// others are (maintenance, under --background_priority=idle). SCHED_IDLE is preempted at
// once; see the WARNING at ServiceOptions::background_priority.
enum class ThreadPriority {
  kNormal,  // as the request threads
  kLow,     // nice 10: a tenth of a request thread's share when both want the CPU
  kLowest,  // nice 19 (RocksDB's CpuPriority::kLow): 1.5% of it
  kIdle,    // SCHED_IDLE: runs only on CPU time no other thread wants
};
// Sets the calling thread's priority (Linux: a thread's nice value and policy are its own,
// and threads it creates, such as XGBoost's, inherit them). Failures are reported on stderr.
void SetCurrentThreadPriority(ThreadPriority priority);

// The CPUs this process may run on, at least 1: its affinity mask (as taskset and cgroup
// cpusets set it), bounded by its cgroup's CPU quota rounded up (a container's CPU limit).
// The default number of training and scoring threads. Reads a file: call it at start-up.
int CpusAvailable();
// `cpus` bounded by the cgroup's CPU quota as CpusAvailable bounds it, at least 1.
int CpuQuotaBound(int cpus);

// The CPUs of a list such as "2-3" or "0,4-5" (Linux's cpuset list format), each once and in
// order; INVALID_ARGUMENT naming what is wrong otherwise (empty, not numbers, a range
// backwards, a CPU past CPU_SETSIZE).
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list);
// `cpus` (in order) as a list that ParseCpuList reads back: "0-1,3".
std::string FormatCpuList(const std::vector<int>& cpus);
// The CPUs the calling thread may run on (its affinity mask), in order.
std::vector<int> CurrentThreadCpus();
// Restricts the calling thread to `cpus` (nothing if empty); the threads it creates
// afterwards inherit the mask. Failures are reported on stderr.
void PinCurrentThread(const std::vector<int>& cpus);

class Executor {
 public:
  // `name` names the threads (at most 15 characters are kept); they run at `priority`, on
  // `cpus` if not empty (PinCurrentThread).
  Executor(int threads, std::string name, ThreadPriority priority = ThreadPriority::kNormal,
           std::vector<int> cpus = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Schedule(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Like Schedule, but once stopped returns false and does not run the task.
  bool TrySchedule(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string name_;
  const ThreadPriority priority_;
  const std::vector<int> cpus_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Runs fn(0), ..., fn(tasks - 1), each once, on the calling thread and on the threads of
// `pool` (as many as it has), and returns once all have run. Tasks are handed out one at a time in
// order, so a slow one does not hold up the rest. A pool thread that gets to its turn after
// the caller has handed out every task does nothing: the caller waits only for the tasks
// that pool threads already took, never for a pool busy with other work (at worst it runs
// every task itself). With a null pool, all run in the caller, in order.
void ParallelFor(Executor* pool, int tasks, absl::FunctionRef<void(int)> fn);

// WART: the service gives every problem's GroupCommitQueue the same one-thread executor, so
// a slow write of one problem delays the commits of the others. RocksDB appends to one WAL
// for all of them anyway; a second writer thread would only overlap the in-memory apply.
//
// Group commit in the manner of LevelDB's DBImpl::Write, on an executor: callers Submit ops
// and return; one task at a time takes everything queued as one group and hands it to
// `commit`. Ops submitted while a group commits ride in the next group. After each group
// the task reschedules itself if more is queued, so that problems sharing one writer
// thread take turns.
//
// `commit` runs on the executor, except for Submit(op, /*commit_here=*/true) when no group
// is queued or being committed: then the caller commits that one group itself, as the
// front writer of DBImpl::Write does, and hands anything queued meanwhile to the executor.
// That spares a caller that may block (a maintenance thread, a synchronous call) two
// thread hand-offs; a reactor thread never passes true.
template <typename Op>
class GroupCommitQueue {
 public:
  using CommitFn = std::function<void(std::vector<Op>& group)>;
  GroupCommitQueue(Executor* executor, CommitFn commit)
      : executor_(executor), commit_(std::move(commit)) {}

  void Submit(Op op, bool commit_here = false) ABSL_LOCKS_EXCLUDED(mu_) {
    bool idle;
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back(std::move(op));
      idle = !scheduled_;
      scheduled_ = true;
    }
    if (!idle) return;  // the task queued or running takes it
    if (commit_here) return CommitOneGroup();
    executor_->Schedule([this] { CommitOneGroup(); });
  }

 private:
  void CommitOneGroup() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<Op> group;
    {
      absl::MutexLock lock(&mu_);
      group.swap(queue_);
    }
    commit_(group);
    bool more;
    {
      absl::MutexLock lock(&mu_);
      more = !queue_.empty();
      scheduled_ = more;
    }
    if (more) executor_->Schedule([this] { CommitOneGroup(); });
  }

  Executor* const executor_;
  const CommitFn commit_;
  absl::Mutex mu_;
  std::vector<Op> queue_ ABSL_GUARDED_BY(mu_);
  bool scheduled_ ABSL_GUARDED_BY(mu_) = false;  // a CommitOneGroup task is queued or running
};

}  // namespace decision::server

#endif  // DECISION_SERVER_EXECUTOR_H_
