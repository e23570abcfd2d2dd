// Trains new experts from a problem's joined log (the paper's batched algorithm:
// importance-weighted XGBoost classifiers on bootstrap resamples) on its own thread, so that
// training never blocks Choose, Reward or the maintenance work, and registers each through
// Problem::RegisterExpert, the same path as the RegisterExpert RPC. (The maintenance bounds
// the number of active experts of auto-training problems once they finish backfilling.)
//
// Thread safety: every method may be called from any thread. Jobs run one at a time
// (run_mu_), whether on the trainer's thread or in callers of RunPending.
#ifndef DECISION_SERVER_TRAINER_H_
#define DECISION_SERVER_TRAINER_H_

#include <cstdint>
#include <deque>
#include <random>
#include <set>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/problem.h"

namespace decision::server {

class Trainer {
 public:
  // With `background` false no thread is started and jobs run in RunPending (tests, and the
  // deterministic inline-maintenance mode).
  Trainer(bool background, int threads_per_job, uint64_t seed);
  ~Trainer();

  // Queues a job for `problem` (which must outlive the trainer). A problem with a job
  // already queued is not queued again. Returns the number of queued jobs.
  int Enqueue(Problem* problem, int tree_experts, int linear_experts);
  // Runs the queued jobs in the caller's thread. Returns the first error.
  absl::Status RunPending();
  // Stops the thread after the job in progress; queued jobs are dropped.
  void Stop();

 private:
  struct Job {
    Problem* problem;
    int trees;
    int linear;
  };
  absl::Status Run(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // Runs one job under run_mu_.
  absl::Status RunOne(const Job& job) ABSL_LOCKS_EXCLUDED(run_mu_, mu_);
  void Loop();

  const int threads_per_job_;
  absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  std::set<Problem*> queued_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Taken before mu_ when both are held.
  absl::Mutex run_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::mt19937_64 gen_ ABSL_GUARDED_BY(run_mu_);
  std::thread thread_;
};

}  // namespace decision::server

#endif  // DECISION_SERVER_TRAINER_H_
