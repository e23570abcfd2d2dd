#include "server/trainer.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/xgboost_trainer.h"
#include "server/executor.h"
#include "server/scoring_cost.h"

namespace decision::server {

using storage::v1::TrainingJobRecord;

Trainer::Trainer(bool background, int threads_per_job, uint64_t seed, TrainingJobBook* book,
                 const TrainerHooks* hooks, ThreadPriority priority, std::vector<int> cpus)
    : threads_per_job_(threads_per_job), book_(book), hooks_(hooks), gen_(seed) {
  if (background) {
    thread_ = std::thread([this, priority, cpus = std::move(cpus)] {
      PinCurrentThread(cpus);
      SetCurrentThreadPriority(priority);
      Loop();
    });
    pthread_setname_np(thread_.native_handle(), "trainer");  // for profiles
  }
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

bool Trainer::Stopping() {
  absl::MutexLock lock(&mu_);
  return stop_;
}

absl::StatusOr<Trainer::Enqueued> Trainer::Enqueue(Problem* problem, uint32_t index,
                                                   int tree_experts, int linear_experts,
                                                   storage::v1::TrainingJobOrigin origin,
                                                   int64_t samples) {
  absl::MutexLock enqueue(&enqueue_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError("the trainer is stopping");
    if (auto it = queued_.find(problem); samples == 0 && it != queued_.end()) {
      return Enqueued{it->second, /*joined=*/true, static_cast<int>(queue_.size())};
    }
  }
  // The record is durable before the job is queued (and before TrainExperts answers).
  DECISION_ASSIGN_OR_RETURN(
      const TrainingJobRecord record,
      book_->Create(index, problem->id(), tree_experts, linear_experts, origin, samples));
  absl::MutexLock lock(&mu_);
  // Stopped meanwhile: the record stays QUEUED and the next start resumes it.
  if (!stop_) {
    queue_.push_back({problem, index, record.job_id()});
    if (samples == 0) queued_[problem] = record.job_id();
  }
  return Enqueued{record.job_id(), /*joined=*/false, static_cast<int>(queue_.size())};
}

void Trainer::Requeue(Problem* problem, uint32_t index, int64_t job_id, int64_t samples) {
  absl::MutexLock lock(&mu_);
  if (stop_) return;
  queue_.push_back({problem, index, job_id});
  // As Enqueue: only a TrainExperts job (on the whole log) is one a later request joins.
  if (samples == 0) queued_[problem] = job_id;
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
      if (auto it = queued_.find(job.problem); it != queued_.end() && it->second == job.job_id) {
        queued_.erase(it);
      }
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
      if (auto it = queued_.find(job.problem); it != queued_.end() && it->second == job.job_id) {
        queued_.erase(it);
      }
    }
    absl::Status s = RunOne(job);
    if (!s.ok()) {
      std::fprintf(stderr, "decisiond: training job %lld of problem %s: %s\n",
                   static_cast<long long>(job.job_id), job.problem->id().c_str(),
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
  DECISION_ASSIGN_OR_RETURN(TrainingJobRecord r, book_->Get(job.index, job.job_id));
  if (!Unfinished(r)) return absl::OkStatus();  // queued twice; already ended
  // A record that cannot be written leaves the job going: memory has the change, and a
  // restart recounts the job's experts by name (training_jobs.h).
  auto update = [&] {
    if (absl::Status s = book_->Update(job.index, r); !s.ok()) {
      std::fprintf(stderr, "decisiond: training job %lld of problem %s: record not written: %s\n",
                   static_cast<long long>(r.job_id()), p.id().c_str(), s.ToString().c_str());
    }
  };
  auto fail = [&](absl::string_view why) {
    r.set_state(storage::v1::TRAINING_JOB_STATE_FAILED);
    r.set_error(std::string(why));
    update();
    std::fprintf(stderr, "decisiond: training job %lld of problem %s FAILED: %s\n",
                 static_cast<long long>(r.job_id()), p.id().c_str(), r.error().c_str());
    return absl::OkStatus();  // the failure is the job's, recorded
  };
  r.set_state(storage::v1::TRAINING_JOB_STATE_RUNNING);
  if (r.first_expert_id() == 0) r.set_first_expert_id(p.Summary().experts());
  update();
  absl::StatusOr<TrainingSet> set = p.TrainingSetFromLog(r.samples());
  if (!set.ok()) return fail(absl::StrCat("no training set: ", set.status().message()));
  if (hooks_ != nullptr && hooks_->on_training_set) {
    hooks_->on_training_set(r.job_id(), set->size());
  }
  const int num_arms = p.record().num_arms();
  const int total = r.tree_experts() + r.linear_experts();
  auto skip = [&](int i, absl::string_view why) {
    r.set_skipped_experts(r.skipped_experts() + 1);
    r.add_skip_reasons(absl::StrCat("expert ", i + 1, " of ", total, ": ", why));
    update();
  };
  // Problems that train automatically also retire automatically (RetireDominated): a
  // model over the scoring budget may retire their least useful experts to fit.
  Problem::RegisterOptions register_options;
  register_options.retire_to_fit = p.record().auto_train();
  const TrainingObjective objective = TrainingObjectiveOf(p.record());
  // The experts train on up to threads_per_job_ threads at once, one XGBoost thread each,
  // and register in their order. Every recipe is drawn from gen_ in the experts' order
  // before any starts, so the models depend neither on the thread count nor on the order
  // in which they start. With one thread, each trains after the previous one registered,
  // in this thread. With more, a free thread starts the costliest expert not started yet
  // (the longest first, so that no long expert starts last and ends the job alone), while
  // the experts before it may still be training: a trained model waits in memory for its
  // turn to register.
  struct Training {
    XgboostTrainOptions options;  // options.linear: the gblinear expert
    uint64_t bootstrap_seed = 0;
    bool started = false;  // guarded by `mu` below, as is done
    absl::StatusOr<std::string> model;
    std::thread thread;
    bool done = false;
  };
  std::vector<Training> training(static_cast<size_t>(total));
  absl::Mutex mu;
  int running = 0;  // guarded by mu: experts started and not done
  const bool whole_log = p.record().train_on_whole_log();  // read here, not in the threads
  // From the first expert not yet trained: a resumed job continues where it stopped.
  const int first = r.expert_ids_size() + r.skipped_experts();
  int unstarted = total - first;  // guarded by mu
  std::vector<double> cost(static_cast<size_t>(total));  // RelativeTrainingCost
  for (int i = first; i < total; ++i) {
    Training& t = training[static_cast<size_t>(i)];
    t.options = SampleExpertOptions(/*linear=*/i >= r.tree_experts(), /*threads=*/1, gen_);
    // Bounded memory (many features: fewer bins, less depth), and nothing that
    // registration would refuse (many arms: fewer rounds).
    FitTreeRecipeToMemory(p.record().num_features(), kMaxTrainingHistogramBytes, &t.options);
    FitRoundsToModelLimits(num_arms, XgboostModelLimits(), &t.options);
    t.options.objective = objective;
    t.bootstrap_seed = whole_log ? 0 : gen_();
    cost[static_cast<size_t>(i)] = RelativeTrainingCost(t.options);
  }
  // Training takes a copy of the training set per expert in training (XGBoost's matrix and
  // buffers): memory grows with threads_per_job_.
  auto train = [&](int i) {
    Training& t = training[static_cast<size_t>(i)];
    absl::StatusOr<std::string> model;
    if (whole_log) {
      model = TrainXgboostModel(*set, num_arms, t.options);
    } else {
      std::mt19937_64 resample(t.bootstrap_seed);
      model = TrainXgboostModel(Bootstrap(*set, objective, resample), num_arms, t.options);
    }
    if (hooks_ != nullptr && hooks_->after_training) hooks_->after_training(r.job_id(), i);
    absl::MutexLock lock(&mu);
    t.model = std::move(model);
    t.done = true;
    --running;
  };
  // Waits for the experts in training; what they trained is dropped (a resumed job trains
  // them again).
  auto join_all = [&] {
    for (Training& t : training) {
      if (t.thread.joinable()) t.thread.join();
    }
  };
  const int parallel = std::max(1, threads_per_job_);
  // The expert a free thread starts: with one thread expert `i`, the first not trained;
  // with more, the costliest not started (the first of equals).
  auto next_to_start = [&](int i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (parallel == 1) return i;
    int best = -1;
    for (int j = first; j < total; ++j) {
      const size_t c = static_cast<size_t>(j);
      if (!training[c].started && (best < 0 || cost[c] > cost[static_cast<size_t>(best)])) {
        best = j;
      }
    }
    return best;
  };
  for (int i = first; i < total; ++i) {
    // Start experts while a thread is free, until expert i is trained.
    for (;;) {
      int start;
      {
        absl::MutexLock lock(&mu);
        const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
          return training[static_cast<size_t>(i)].done || (unstarted > 0 && running < parallel);
        };
        mu.Await(absl::Condition(&ready));
        if (training[static_cast<size_t>(i)].done) break;
        start = next_to_start(i);
        training[static_cast<size_t>(start)].started = true;
        --unstarted;
        ++running;
      }
      // Stopping: the record stays RUNNING, and the next start resumes the job.
      if (Stopping() || (hooks_ != nullptr && hooks_->before_expert &&
                         !hooks_->before_expert(r.job_id(), start).ok())) {
        join_all();
        return absl::OkStatus();
      }
      if (hooks_ != nullptr && hooks_->on_start) {
        hooks_->on_start(r.job_id(), start, training[static_cast<size_t>(start)].options);
      }
      if (parallel == 1) {
        train(start);
      } else {
        training[static_cast<size_t>(start)].thread = std::thread(train, start);
      }
    }
    Training& t = training[static_cast<size_t>(i)];
    if (t.thread.joinable()) t.thread.join();
    if (absl::IsFailedPrecondition(t.model.status())) {  // diverged: skip this one
      skip(i, "training diverged");
      continue;
    }
    if (!t.model.ok()) {
      join_all();
      return fail(absl::StrCat("training expert ", i + 1, " of ", total, ": ",
                               t.model.status().message()));
    }
    storage::v1::ExpertModelRecord record;
    record.set_xgboost(*std::move(t.model));
    t.model = absl::CancelledError("registered");  // its bytes are in the record now
    const int64_t at = r.samples() > 0 ? r.samples() : p.Summary().samples();
    const std::string name = TrainedExpertName(r.job_id(), t.options.linear, at);
    absl::StatusOr<v1::Expert> e =
        p.RegisterExpert(name, std::move(record), p.record().smoothing(), register_options);
    if (IsOverScoringBudget(e.status())) {  // the budget cannot hold it: skip this one
      skip(i, e.status().message());
      continue;
    }
    if (!e.ok()) {
      join_all();
      return fail(absl::StrCat("registering expert ", i + 1, " of ", total, " (",
                               r.expert_ids_size(), " registered): ", e.status().message()));
    }
    r.add_expert_ids(e->expert_id());
    update();
  }
  r.set_state(storage::v1::TRAINING_JOB_STATE_SUCCEEDED);
  update();
  return absl::OkStatus();
}

}  // namespace decision::server
