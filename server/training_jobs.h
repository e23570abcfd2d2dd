// The book of training jobs: every TrainExperts call and every auto-training batch is a
// job with a durable record (storage::v1::TrainingJobRecord), so that a crash never loses
// one silently. The book keeps every job's latest record in memory (a few hundred bytes
// each) for GetTrainingJob, and writes each change through the store. Job ids are dense per
// problem, from 1.
//
// Who writes what: DecisionService creates a job (QUEUED) before TrainExperts answers;
// the Trainer (trainer.h) marks it RUNNING, adds each expert it registers and ends it
// (SUCCEEDED or FAILED); at start, DecisionService::ResumeTrainingJobs queues the jobs a
// crash or a shutdown left QUEUED or RUNNING again, or fails them with the reason.
//
// A record change is applied in memory even when its write fails (the failure is
// returned): memory shows what happened, and the store catches up at the job's next write.
// A restart that finds an older record recounts the job's experts by their names, so a lost
// progress write never makes a job look shorter than it is.
//
// Thread safety: every method may be called concurrently. Writes of one job come from one
// thread at a time (its creator, then the trainer); the book does not order them.
#ifndef DECISION_SERVER_TRAINING_JOBS_H_
#define DECISION_SERVER_TRAINING_JOBS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "decision/v1/decision.pb.h"
#include "server/clock.h"
#include "storage/records.pb.h"
#include "storage/store.h"

namespace decision::server {

// A job is unfinished while QUEUED or RUNNING.
bool Unfinished(const storage::v1::TrainingJobRecord& record);

// The name of the expert a job registers: "job<id>-trees-t<samples>" or
// "job<id>-linear-t<samples>". ExpertNameIsOfJob is its inverse test.
std::string TrainedExpertName(int64_t job_id, bool linear, int64_t samples);
bool ExpertNameIsOfJob(absl::string_view name, int64_t job_id);
// Whether `name` has the form of a trained expert's name, of any job: a restart counts an
// expert so named as its job's, so RegisterExpert refuses such names from clients.
bool IsTrainedExpertName(absl::string_view name);

// A job found RUNNING by this many starts is FAILED instead of resumed (a job that crashes
// the server must not crash every restart).
inline constexpr int kMaxTrainingJobInterruptions = 3;

// What a start does with a job it found unfinished (pure: the caller writes the result).
// `experts`: the problem's experts, or null if the problem was not loaded. First the job's
// experts that its record missed (registered after its last write: id >= first_expert_id,
// named TrainedExpertName of this job) join expert_ids. Then the state: SUCCEEDED if no
// expert is left to train; FAILED with the reason if the record is inconsistent, the
// problem is gone, it has no positive reward to train on, or the job was interrupted
// kMaxTrainingJobInterruptions times; else QUEUED (a RUNNING one counts an interruption).
// Returns true if the job is to be queued again.
bool PrepareResume(const std::vector<v1::Expert>* experts, bool has_positive_reward,
                   storage::v1::TrainingJobRecord* record);

class TrainingJobBook {
 public:
  // `store` and `clock` must outlive the book.
  TrainingJobBook(storage::Store* store, const Clock* clock) : store_(store), clock_(clock) {}

  // Reads every stored job (once, at start, before any other call). Returns the unfinished
  // ones in (problem, job id) order, for DecisionService::ResumeTrainingJobs. DATA_LOSS if a
  // record does not parse.
  absl::StatusOr<std::vector<std::pair<uint32_t, storage::v1::TrainingJobRecord>>> Load()
      ABSL_LOCKS_EXCLUDED(mu_);

  // A new job of `problem` (its index in the store), written QUEUED. INTERNAL (nothing
  // kept) if the write fails.
  absl::StatusOr<storage::v1::TrainingJobRecord> Create(uint32_t problem,
                                                        const std::string& problem_id,
                                                        int tree_experts, int linear_experts,
                                                        storage::v1::TrainingJobOrigin origin,
                                                        int64_t samples = 0)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sets updated_at_ms, writes `record` and then keeps it as the job's latest state (also
  // when the write failed). Returns the write's status (see the header comment).
  // REQUIRES: the job was created or loaded.
  absl::Status Update(uint32_t problem, storage::v1::TrainingJobRecord record)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The batch boundary (TrainingJobRecord::samples) of the problem's oldest unfinished
  // auto-training job; 0 if none.
  int64_t OldestUnfinishedBoundary(uint32_t problem) const ABSL_LOCKS_EXCLUDED(mu_);

  // The latest record of a job; NOT_FOUND if the problem has no such job.
  absl::StatusOr<storage::v1::TrainingJobRecord> Get(uint32_t problem, int64_t job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  storage::Store* const store_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  // problem index -> job id -> latest record.
  absl::flat_hash_map<uint32_t, std::map<int64_t, storage::v1::TrainingJobRecord>> jobs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace decision::server

#endif  // DECISION_SERVER_TRAINING_JOBS_H_
