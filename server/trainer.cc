#include "server/trainer.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/xgboost_trainer.h"

namespace decision::server {

Trainer::Trainer(bool background, int threads_per_job, uint64_t seed)
    : threads_per_job_(threads_per_job), gen_(seed) {
  if (background) thread_ = std::thread([this] { Loop(); });
}

Trainer::~Trainer() { Stop(); }

void Trainer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    queue_.clear();
    queued_.clear();
  }
  if (thread_.joinable()) thread_.join();
}

int Trainer::Enqueue(Problem* problem, int tree_experts, int linear_experts) {
  absl::MutexLock lock(&mu_);
  if (!stop_ && queued_.insert(problem).second) {
    queue_.push_back({problem, tree_experts, linear_experts});
  }
  return static_cast<int>(queue_.size());
}

absl::Status Trainer::RunPending() {
  absl::Status first = absl::OkStatus();
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) break;
      job = queue_.front();
      queue_.pop_front();
      queued_.erase(job.problem);
    }
    absl::Status s = RunOne(job);
    if (first.ok()) first = s;
  }
  return first;
}

void Trainer::Loop() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Trainer* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) {
            return t->stop_ || !t->queue_.empty();
          },
          this));
      if (stop_) return;
      job = queue_.front();
      queue_.pop_front();
      queued_.erase(job.problem);
    }
    absl::Status s = RunOne(job);
    if (!s.ok()) {
      std::fprintf(stderr, "decisiond: training for problem %s: %s\n", job.problem->id().c_str(),
                   s.ToString().c_str());
    }
  }
}

absl::Status Trainer::RunOne(const Job& job) {
  absl::MutexLock lock(&run_mu_);
  return Run(job);
}

absl::Status Trainer::Run(const Job& job) {
  Problem& p = *job.problem;
  DECISION_ASSIGN_OR_RETURN(TrainingSet set, p.TrainingSetFromLog());
  const int num_arms = p.record().num_arms();
  for (int i = 0; i < job.trees + job.linear; ++i) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return absl::OkStatus();
    }
    const bool linear = i >= job.trees;
    const XgboostTrainOptions options = SampleExpertOptions(linear, threads_per_job_, gen_);
    absl::StatusOr<std::string> model = TrainXgboostModel(Bootstrap(set, gen_), num_arms, options);
    if (absl::IsFailedPrecondition(model.status())) continue;  // diverged: skip this one
    if (!model.ok()) return model.status();
    storage::v1::ExpertModelRecord record;
    record.set_xgboost(*std::move(model));
    const std::string name =
        absl::StrCat("trained-", linear ? "linear" : "trees", "-t", p.Summary().samples());
    absl::StatusOr<v1::Expert> e = p.RegisterExpert(name, std::move(record), p.record().smoothing());
    if (absl::IsResourceExhausted(e.status())) break;  // the problem is full
    if (!e.ok()) return e.status();
  }
  return absl::OkStatus();
}

}  // namespace decision::server
