// Trains new experts from a problem's joined log (the paper's batched algorithm:
// importance-weighted XGBoost classifiers on bootstrap resamples) on its own thread, so that
// training never blocks Choose, Reward or the maintenance work, and registers each through
// Problem::RegisterExpert, the same path as the RegisterExpert RPC. (The maintenance bounds
// the number of active experts of auto-training problems once they finish backfilling.)
//
// Every job has a durable record in the TrainingJobBook (training_jobs.h): written QUEUED
// by Enqueue before it returns, RUNNING when the job starts, after each expert it registers
// (named TrainedExpertName(job, ...)), and SUCCEEDED or FAILED (with the reason) when it
// ends. An expert whose training diverges, or that the problem's scoring budget cannot hold
// (scoring_cost.h), is skipped and counted (skipped_experts, and why in skip_reasons); for a
// problem with auto-training, a model over the budget first retires the lowest-UCB experts
// to make room when that can (Problem::RegisterOptions). A problem that is full
// (--max_experts_per_problem, retired experts included) or a training error fails the job. A job interrupted by Stop or a crash stays QUEUED or RUNNING on disk, and the next start queues
// it again for the experts it has not trained yet (DecisionService::ResumeTrainingJobs).
//
// A job trains up to `threads_per_job` of its experts at once, each on a thread of its own
// with one XGBoost thread, and registers them in order; a thread that finishes one starts
// the costliest one not started yet (RelativeTrainingCost: the longest first, so that the
// job's last expert to finish is a short one), while a trained model waits for its turn to
// register. Every expert's recipe (SampleExpertOptions, and the seed of its bootstrap
// resample) is drawn from the trainer's generator in the experts' order when the job
// starts, so the models are the same at any thread count and in any start order
// (XGBoost's own threads would change them: gblinear's updates race, and histogram sums
// are added in another order).
//
// Thread safety: every method may be called from any thread. Jobs run one at a time
// (run_mu_), whether on the trainer's thread or in callers of RunPending.
#ifndef DECISION_SERVER_TRAINER_H_
#define DECISION_SERVER_TRAINER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/xgboost_trainer.h"
#include "server/problem.h"
#include "server/executor.h"
#include "server/training_jobs.h"

namespace decision::server {

// Testing seam (as ProblemHooks): called, when set, by the job's thread with run_mu_ held
// and no other lock. Null in production.
struct TrainerHooks {
  // Before the training of expert `expert` (0-based) of job `job_id` starts (with one
  // training thread, after the previous expert is registered). A non-OK status abandons the
  // job there with its record as it stands, as a crash would: experts trained but not yet
  // registered are dropped.
  std::function<absl::Status(int64_t job_id, int expert)> before_expert;
  // On expert `expert`'s training thread once its model is trained, before the job sees
  // it (with one training thread, in the job's thread).
  std::function<void(int64_t job_id, int expert)> after_training;
  // When expert `expert` of job `job_id` starts training (after before_expert), with the
  // recipe it trains with.
  std::function<void(int64_t job_id, int expert, const XgboostTrainOptions& recipe)> on_start;
  // Once job `job_id` has read its training set from the log, with its number of samples.
  std::function<void(int64_t job_id, size_t samples)> on_training_set;
};

class Trainer {
 public:
  // With `background` false no thread is started and jobs run in RunPending (tests, and the
  // deterministic inline-maintenance mode). `book` and `hooks` (may be null) must outlive
  // the trainer.
  // The background thread runs at `priority` (executor.h) on `cpus` (all if empty), and so
  // do the training threads and XGBoost's, which it creates.
  Trainer(bool background, int threads_per_job, uint64_t seed, TrainingJobBook* book,
          const TrainerHooks* hooks = nullptr,
          ThreadPriority priority = ThreadPriority::kNormal, std::vector<int> cpus = {});
  ~Trainer();

  struct Enqueued {
    int64_t job_id = 0;
    // A job of the problem was already queued (not started): the request joined it, and
    // that job's counts stand. Nothing was written.
    bool joined = false;
    int queued_jobs = 0;  // jobs waiting, including this one
  };
  // Queues a job for `problem` (which must outlive the trainer; `index` is its index in the
  // store), its record written QUEUED first. `samples` > 0: an auto-training job of the
  // batch boundary at that many samples, trained on them alone; every boundary gets its
  // own job, so that none is skipped however far training lags (they queue and catch up).
  // A TrainExperts job (samples 0) joins the problem's TrainExperts job already waiting, if
  // any. INTERNAL if the record cannot be written (nothing is queued); UNAVAILABLE once
  // stopped.
  absl::StatusOr<Enqueued> Enqueue(Problem* problem, uint32_t index, int tree_experts,
                                   int linear_experts, storage::v1::TrainingJobOrigin origin,
                                   int64_t samples = 0);
  // Queues a job the book already holds (a restart resuming it); `samples` is its record's
  // (0: a TrainExperts job, which a later TrainExperts joins while it is queued).
  void Requeue(Problem* problem, uint32_t index, int64_t job_id, int64_t samples);
  // Runs the queued jobs in the caller's thread. A job's failure is in its record, not
  // here: returns an error only if a queued job is not in the book (a bug).
  absl::Status RunPending();
  // Stops the thread after the experts in training; queued jobs are dropped from memory and
  // stay QUEUED (or RUNNING) on disk, to be resumed at the next start.
  void Stop();

 private:
  struct Job {
    Problem* problem = nullptr;
    uint32_t index = 0;
    int64_t job_id = 0;
  };
  absl::Status Run(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // Runs one job under run_mu_.
  absl::Status RunOne(const Job& job) ABSL_LOCKS_EXCLUDED(run_mu_, mu_);
  bool Stopping() ABSL_LOCKS_EXCLUDED(mu_);
  void Loop();

  const int threads_per_job_;
  TrainingJobBook* const book_;
  const TrainerHooks* const hooks_;
  // One Enqueue at a time: the check for a queued job and the new job's record and push
  // are one step for other Enqueue calls. Taken before mu_.
  absl::Mutex enqueue_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  // The newest queued TrainExperts job (samples 0) of each problem with one queued.
  std::map<Problem*, int64_t> queued_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Taken before mu_ when both are held.
  absl::Mutex run_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::mt19937_64 gen_ ABSL_GUARDED_BY(run_mu_);
  std::thread thread_;
};

}  // namespace decision::server

#endif  // DECISION_SERVER_TRAINER_H_
