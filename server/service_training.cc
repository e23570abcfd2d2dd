// DecisionService: training jobs. GetTrainingJob reads the job book (training_jobs.h); at
// start, ResumeTrainingJobs queues again the jobs a crash or a shutdown interrupted, or
// ends them with the reason. (TrainExperts itself is in decision_service.cc.)
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/conversions.h"
#include "server/decision_service.h"
#include "server/validation.h"

namespace decision::server {

absl::Status DecisionService::GetTrainingJob(const v1::GetTrainingJobRequest& request,
                                             v1::TrainingJob* response) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  DECISION_RETURN_IF_ERROR(ValidateGetTrainingJobRequest(request));
  absl::StatusOr<storage::v1::TrainingJobRecord> job =
      training_jobs_->Get(p->index(), request.job_id());
  if (!job.ok()) {
    return absl::NotFoundError(absl::StrCat("problem ", p->id(), " has no training job ",
                                            request.job_id()));
  }
  *response = TrainingJobToWire(*job);
  return absl::OkStatus();
}

absl::Status DecisionService::ResumeTrainingJobs() {
  DECISION_ASSIGN_OR_RETURN(auto unfinished, training_jobs_->Load());
  if (unfinished.empty()) return absl::OkStatus();
  absl::flat_hash_map<uint32_t, Problem*> by_index;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, p] : problems_) by_index[p->index()] = p.get();
  }
  for (auto& [index, record] : unfinished) {
    auto it = by_index.find(index);
    Problem* p = it == by_index.end() ? nullptr : it->second;
    std::vector<v1::Expert> experts;
    if (p != nullptr) experts = p->ListExperts();
    const bool queue =
        PrepareResume(p == nullptr ? nullptr : &experts, p != nullptr && p->HasPositiveReward(),
                      &record);
    std::fprintf(stderr, "decisiond: training job %lld of problem %s was unfinished: %s%s%s\n",
                 static_cast<long long>(record.job_id()), record.problem_id().c_str(),
                 queue ? "resumed"
                 : record.state() == storage::v1::TRAINING_JOB_STATE_SUCCEEDED ? "SUCCEEDED"
                                                                               : "FAILED",
                 record.error().empty() ? "" : ": ", record.error().c_str());
    // Not written: memory has the decision, the job runs, and its next write (or the next
    // start, which decides again) brings the store up to date.
    if (absl::Status s = training_jobs_->Update(index, record); !s.ok()) {
      std::fprintf(stderr, "decisiond: training job %lld of problem %s: record not written: %s\n",
                   static_cast<long long>(record.job_id()), record.problem_id().c_str(),
                   s.ToString().c_str());
    }
    if (queue) trainer_->Requeue(p, index, record.job_id(), record.samples());
  }
  return absl::OkStatus();
}

}  // namespace decision::server
