#include "server/decision_service.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/conversions.h"
#include "server/validation.h"

namespace decision::server {

namespace {
constexpr int kBlockingThreads = 2;
// How many of a problem's recent contexts a new model is probed on, besides the synthetic
// rows of ProbeRows.
constexpr int kProbeRealContexts = 64;
constexpr int kDefaultAuditPage = 100;
}  // namespace

DecisionService::DecisionService(const ServiceOptions& options, const Clock* clock,
                                 Metrics* metrics)
    : options_(options), clock_(clock), metrics_(metrics), sandbox_(options.model_sandbox) {}

Problem::Env DecisionService::ProblemEnv() const {
  Problem::Env env{store_.get(), clock_, metrics_, writer_.get(), blocking_.get(), seed_};
  env.defer_decisions = !options_.durable_choose;
  env.decision_flush_ms = options_.maintenance_interval_ms;
  env.hooks = options_.problem_hooks;
  env.learner = learner_.get();
  env.scorers = scorers_.get();
  env.reservoir_predictions_bytes = options_.reservoir_predictions_mb << 20;
  env.max_pending_decisions = options_.max_pending_decisions;
  env.max_pending_decision_bytes = options_.max_pending_decisions_mb << 20;
  env.metrics_pair_experts = options_.metrics_pair_experts;
  env.max_experts = options_.max_experts_per_problem;
  env.max_memory_bytes = options_.max_problem_memory_mb << 20;
  env.max_divergence_terms = options_.max_divergence_terms;
  return env;
}

absl::StatusOr<std::unique_ptr<DecisionService>> DecisionService::Open(
    const ServiceOptions& options, const Clock* clock, Metrics* metrics) {
  std::unique_ptr<DecisionService> service(new DecisionService(options, clock, metrics));
  storage::StoreOptions store_options;  // Store::Open creates the directory if missing
  store_options.sync = options.sync_writes;
  store_options.fault_injection = options.store_fault_injection;
  store_options.env = options.store_env;
  store_options.low_priority_compactions =
      options.background_priority == ThreadPriority::kIdle;
  store_options.now_ms = [clock] { return clock->NowMs(); };
  {
    // RocksDB starts its flush and compaction threads here, with this thread's CPUs.
    const std::vector<int> caller_cpus = CurrentThreadCpus();
    PinCurrentThread(options.background_cpus);
    absl::StatusOr<std::unique_ptr<storage::Store>> store =
        storage::Store::Open(options.data_dir, store_options);
    if (!options.background_cpus.empty()) PinCurrentThread(caller_cpus);
    if (!store.ok()) return store.status();
    service->store_ = *std::move(store);
  }
  service->seed_ = options.seed != 0 ? options.seed : std::random_device{}();
  service->writer_ = std::make_unique<Executor>(1, "writer");
  service->learner_ = std::make_unique<Executor>(1, "learner", options.background_priority,
                                                 options.background_cpus);
  // Reads a file: once.
  const int cpus = options.background_cpus.empty()
                       ? CpusAvailable()
                       : CpuQuotaBound(static_cast<int>(options.background_cpus.size()));
  const int scoring_threads = options.scoring_threads > 0
                                  ? options.scoring_threads
                                  : std::min(cpus, kMaxDefaultScoringThreads);
  if (scoring_threads > 1) {
    service->scorers_ = std::make_unique<Executor>(scoring_threads - 1, "scorer",
                                                   options.background_priority,
                                                   options.background_cpus);
  }
  service->blocking_ = std::make_unique<Executor>(kBlockingThreads, "blocking");
  service->training_jobs_ =
      std::make_unique<TrainingJobBook>(service->store_.get(), service->clock_);
  service->trainer_ = std::make_unique<Trainer>(
      /*background=*/!options.inline_maintenance,
      options.training_threads > 0 ? options.training_threads : cpus,
      service->seed_, service->training_jobs_.get(), options.trainer_hooks,
      options.background_priority, options.background_cpus);
  const Problem::Env env = service->ProblemEnv();
  {
    absl::MutexLock lock(&service->mu_);
    // One problem that cannot be loaded fails alone: the others serve.
    auto fail = [&](const std::string& name, const absl::Status& why) {
      std::fprintf(stderr, "decisiond: problem %s FAILED to load and serves no call: %s\n",
                   name.c_str(), why.ToString().c_str());
      service->failed_problems_[name] = why;
      metrics->ProblemFailed(name).Set(1.0);
      return absl::OkStatus();
    };
    DECISION_RETURN_IF_ERROR(service->store_->ForEachProblem(
        [&](uint32_t index, const storage::v1::ProblemRecord& record) -> absl::Status {
          service->next_index_ = std::max(service->next_index_, index + 1);
          if (record.importing()) {
            // An import that did not commit (the target crashed or restarted meanwhile):
            // nothing serves it, and the mover starts it again.
            std::fprintf(stderr, "decisiond: deleting the unfinished import of problem %s\n",
                         record.problem_id().c_str());
            return service->store_->DeleteProblem(index);
          }
          if (!record.moved_to().empty()) {
            service->moved_away_[record.problem_id()] = {record.moved_to(), index};
            return absl::OkStatus();
          }
          absl::StatusOr<std::unique_ptr<Problem>> p = Problem::Load(index, record, env);
          if (!p.ok()) return fail(record.problem_id(), p.status());
          service->problems_[record.problem_id()] = *std::move(p);
          return absl::OkStatus();
        },
        [&](uint32_t index, const absl::Status& damage) -> absl::Status {
          // Its id is in the record that does not parse: it is listed as "#INDEX", which no
          // problem id can be ([A-Za-z0-9_.-] only).
          service->next_index_ = std::max(service->next_index_, index + 1);
          return fail(absl::StrCat("#", index), damage);
        }));
  }
  DECISION_RETURN_IF_ERROR(service->ResumeTrainingJobs());
  if (options.start_maintenance_thread) {
    service->maintenance_ = std::thread([s = service.get()] { s->MaintenanceLoop(); });
    service->expert_pool_ = std::thread([s = service.get()] { s->ExpertPoolLoop(); });
    // Named for profiles and per-thread CPU (/proc/PID/task/*/comm).
    pthread_setname_np(service->maintenance_.native_handle(), "maintenance");
    pthread_setname_np(service->expert_pool_.native_handle(), "expert-pool");
  }
  return service;
}

DecisionService::~DecisionService() { Shutdown().IgnoreError(); }

absl::Status DecisionService::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::OkStatus();
    shut_down_ = true;
  }
  // Open may have failed at any step: stop only what it started.
  if (blocking_ != nullptr) blocking_->Stop();  // the RPC work in flight finishes
  stop_.Notify();
  if (maintenance_.joinable()) maintenance_.join();
  if (expert_pool_.joinable()) expert_pool_.join();
  if (trainer_ != nullptr) trainer_->Stop();
  if (store_ == nullptr) return absl::OkStatus();  // Open failed before the store opened
  if (!store_->Health().writable) {
    // One last attempt (the disk may have space again since the last round): else the
    // writes below fail, and what was answered but not written is lost.
    if (absl::Status s = store_->Recover(); !s.ok()) {
      std::fprintf(stderr, "decisiond: shutdown: %s\n", s.ToString().c_str());
    }
  }
  std::vector<Problem*> problems;
  {
    absl::MutexLock lock(&mu_);  // no problem is added once shut_down_ is set
    for (auto& [id, problem] : problems_) problems.push_back(problem.get());
  }
  absl::Status status = absl::OkStatus();
  for (Problem* problem : problems) {
    // Twice: a flush queued before this one that failed put its decisions back after this
    // one took the rest. No decision is answered any more, so the second leaves none.
    absl::Status s = problem->FlushDecisions();
    if (s.ok()) s = problem->FlushDecisions();
    if (s.ok()) s = problem->WaitLearned();  // the checkpoint then covers every sample
    if (s.ok()) s = problem->WriteLogChunks();
    if (s.ok()) s = problem->Checkpoint();
    if (!s.ok()) {
      std::fprintf(stderr, "decisiond: shutdown: problem %s: %s\n", problem->id().c_str(),
                   s.ToString().c_str());
      if (status.ok()) status = s;
    }
  }
  if (writer_ != nullptr) writer_->Stop();
  if (learner_ != nullptr) learner_->Stop();  // after the writer, which schedules it
  if (scorers_ != nullptr) scorers_->Stop();  // after the learner, which uses them
  absl::Status closed = store_->Close();
  return status.ok() ? closed : status;
}

absl::Status DecisionService::FailedLoadError(const std::string& problem_id,
                                              const absl::Status& why) {
  return absl::FailedPreconditionError(absl::StrCat(
      "problem '", problem_id, "' failed to load at start-up and serves no call until its "
      "store records are repaired and decisiond restarts: ", why.ToString()));
}

absl::Status DecisionService::ProblemLoadStatus(const std::string& problem_id) {
  absl::MutexLock lock(&mu_);
  if (auto failed = failed_problems_.find(problem_id); failed != failed_problems_.end()) {
    return failed->second;
  }
  if (problems_.contains(problem_id)) return absl::OkStatus();
  return UnknownProblem(problem_id);
}

absl::Status DecisionService::UnknownProblem(const std::string& problem_id) {
  // Not a problem id at all (too long, or characters no id has): said so, without echoing
  // the caller's bytes whole.
  DECISION_RETURN_IF_ERROR(ValidateProblemId(problem_id));
  return absl::NotFoundError(absl::StrCat("problem '", problem_id, "' does not exist"));
}

absl::StatusOr<Problem*> DecisionService::Find(const std::string& problem_id) {
  absl::ReaderMutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("the service is shutting down");
  if (problem_id.empty()) return absl::InvalidArgumentError("problem_id is empty");
  auto it = problems_.find(problem_id);
  if (auto failed = failed_problems_.find(problem_id); failed != failed_problems_.end()) {
    return FailedLoadError(problem_id, failed->second);
  }
  if (it == problems_.end()) {
    if (auto moved = moved_away_.find(problem_id); moved != moved_away_.end()) {
      return MovedError(problem_id, moved->second.to);
    }
    return UnknownProblem(problem_id);
  }
  return it->second.get();
}

absl::Status DecisionService::MovedError(const std::string& problem_id, const std::string& to) {
  return absl::FailedPreconditionError(absl::StrCat(
      "problem '", problem_id, "' moved to replica ", to, ", which serves it now"));
}

absl::StatusOr<EnteredProblem> DecisionService::Enter(const std::string& problem_id) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(problem_id));
  DECISION_RETURN_IF_ERROR(p->EnterCall());
  return EnteredProblem(p);
}

void DecisionService::OffReactor(std::function<absl::Status()> work, Done done) {
  blocking_->Schedule([work = std::move(work), done = std::move(done)] { done(work()); });
}

// ------------------------------------------------------------------------------ Audit

void DecisionService::RecordAudit(storage::v1::AuditRecord record) {
  blocking_->Schedule([this, record = std::move(record)] {
    if (absl::Status s = store_->AppendAudit(record); !s.ok()) {
      metrics_->audit_write_errors().Increment();
      audit_log_.Report(clock_->NowMs(),
                        absl::StrCat("audit record of ", record.method(), " by ",
                                     record.caller(), " not written: ", s.ToString()));
    }
  });
}

absl::Status DecisionService::ListAuditLog(const v1::ListAuditLogRequest& request,
                                           v1::ListAuditLogResponse* response) {
  DECISION_RETURN_IF_ERROR(ValidateListAuditLogRequest(request));
  const int limit = request.limit() == 0 ? kDefaultAuditPage : request.limit();
  response->set_next_start(request.start());
  return store_->ForEachAudit(
      request.start(), limit, [&](int64_t seq, const storage::v1::AuditRecord& r) {
        v1::AuditEntry* e = response->add_entries();
        e->set_sequence(seq);
        e->set_at_ms(r.at_ms());
        e->set_caller(r.caller());
        e->set_method(r.method());
        e->set_problem_id(r.problem_id());
        e->set_detail(r.detail());
        e->set_code(absl::StatusCodeToString(static_cast<absl::StatusCode>(r.code())));
        e->set_message(r.message());
        response->set_next_start(seq + 1);
        return absl::OkStatus();
      });
}

void DecisionService::ListAuditLog(const v1::ListAuditLogRequest& request,
                                   v1::ListAuditLogResponse* response, Done done) {
  OffReactor([this, &request, response] { return ListAuditLog(request, response); },
             std::move(done));
}

// --------------------------------------------------------------------------- Problems

absl::Status DecisionService::CheckStoreWritable(absl::string_view refused) const {
  if (store_->Writable()) return absl::OkStatus();  // the hot path: one atomic load
  const storage::StoreHealth health = store_->Health();
  if (health.writable) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "the store cannot write: ", health.error.message(), " (for ",
      std::max<int64_t>(0, clock_->NowMs() - health.since_ms) / 1000, " s); ", refused,
      " are refused until it recovers"));
}

absl::Status DecisionService::CreateProblemNow(const v1::CreateProblemRequest& request,
                                               v1::Problem* response) {
  DECISION_ASSIGN_OR_RETURN(storage::v1::ProblemRecord record,
                            ProblemRecordFromConfig(request.problem_id(), request.config()));
  // Every job would fail (TrainExperts refuses such a problem). Here, not in the validation
  // stored problems are loaded with: one created before this check still loads.
  if (record.auto_train() && record.num_features() == 0) {
    return absl::InvalidArgumentError(
        "config.auto_train.enabled needs config.num_features >= 1: without features there is "
        "no context to train experts on");
  }
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("new problems"));
  record.set_created_at_ms(clock_->NowMs());
  // One creation at a time: the id is checked, the problem written, then published, without
  // holding mu_ through the write (Find and the other problems' calls go on meanwhile).
  absl::MutexLock create(&create_mu_);
  uint32_t index;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("the service is shutting down");
    if (problems_.contains(request.problem_id()) ||
        failed_problems_.contains(request.problem_id()) ||
        imports_.contains(request.problem_id())) {
      return absl::AlreadyExistsError(
          absl::StrCat("problem '", request.problem_id(), "' already exists"));
    }
    if (auto moved = moved_away_.find(request.problem_id()); moved != moved_away_.end()) {
      return MovedError(request.problem_id(), moved->second.to);
    }
    // Problems that failed to load count: they keep their stored data.
    if (const size_t n = problems_.size() + failed_problems_.size();
        static_cast<int64_t>(n) >= options_.max_problems) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this server has ", n, " problems, the most --max_problems (", options_.max_problems,
          ") allows; create the problem on another replica or raise the cap"));
    }
    index = next_index_;
  }
  DECISION_ASSIGN_OR_RETURN(std::unique_ptr<Problem> p,
                            Problem::Create(index, std::move(record), ProblemEnv()));
  *response = p->Summary();
  absl::MutexLock lock(&mu_);
  next_index_ = index + 1;
  problems_[request.problem_id()] = std::move(p);
  return absl::OkStatus();
}

void DecisionService::CreateProblem(const v1::CreateProblemRequest& request,
                                    v1::Problem* response, Done done) {
  OffReactor([this, &request, response] { return CreateProblemNow(request, response); },
             std::move(done));
}

absl::Status DecisionService::CreateProblem(const v1::CreateProblemRequest& request,
                                            v1::Problem* response) {
  return CreateProblemNow(request, response);
}

void DecisionService::AfterLearning(const std::string& problem_id,
                                    std::function<absl::Status(const Problem&)> read,
                                    Done done) {
  absl::StatusOr<Problem*> p = Find(problem_id);
  if (!p.ok()) return done(p.status());
  (*p)->WhenLearned([p = *p, read = std::move(read), done = std::move(done)](absl::Status s) {
    done(s.ok() ? read(*p) : s);
  });
}

void DecisionService::GetProblem(const v1::GetProblemRequest& request, v1::Problem* response,
                                 Done done) {
  AfterLearning(
      request.problem_id(),
      [response](const Problem& p) {
        *response = p.Summary();
        return absl::OkStatus();
      },
      std::move(done));
}

absl::Status DecisionService::GetProblem(const v1::GetProblemRequest& request,
                                         v1::Problem* response) {
  return AwaitDone([&](Done done) { GetProblem(request, response, std::move(done)); });
}

absl::Status DecisionService::ListProblems(const v1::ListProblemsRequest&,
                                           v1::ListProblemsResponse* response) {
  std::vector<Problem*> serving;
  std::vector<v1::Problem> listed;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("the service is shutting down");
    for (auto& [id, p] : problems_) serving.push_back(p.get());
    for (const auto& [id, why] : failed_problems_) {
      listed.emplace_back();
      listed.back().set_problem_id(id);
      listed.back().set_error(FailedLoadError(id, why).ToString());
    }
  }
  for (Problem* p : serving) {
    listed.emplace_back(p->Summary());
  }
  std::sort(listed.begin(), listed.end(), [](const v1::Problem& a, const v1::Problem& b) {
    return a.problem_id() < b.problem_id();
  });
  for (v1::Problem& p : listed) *response->add_problems() = std::move(p);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------- Experts

absl::Status DecisionService::ProbeInSandbox(Problem& p,
                                             storage::v1::ExpertModelRecord* model) {
  if (!model->has_xgboost() || !sandbox_.enabled()) return absl::OkStatus();
  // A client's model is loaded and scored first in the sandbox; what is stored and loaded
  // here is the probe's canonical form (a legacy binary model becomes UBJSON).
  ModelProbeRequest probe;
  probe.num_arms = p.record().num_arms();
  probe.num_features = p.record().num_features();
  probe.model = model->xgboost();
  probe.rows = ProbeRows(p.RecentContexts(kProbeRealContexts), probe.num_features,
                         kProbeRealContexts);
  DECISION_ASSIGN_OR_RETURN(std::string canonical, sandbox_.Check(probe));
  model->set_xgboost(std::move(canonical));
  return absl::OkStatus();
}

absl::Status DecisionService::RegisterExpert(const v1::RegisterExpertRequest& request,
                                             v1::Expert* response) {
  DECISION_ASSIGN_OR_RETURN(EnteredProblem p, Enter(request.problem_id()));
  DECISION_ASSIGN_OR_RETURN(const double smoothing,
                            ValidateRegisterExpertRequest(request, p->record().smoothing()));
  if (IsTrainedExpertName(request.name())) {
    // A restart would count it as one of that job's experts (PrepareResume).
    return absl::InvalidArgumentError(absl::StrCat(
        "name '", request.name(), "' has the form of a trained expert's name "
        "(job<id>-trees-t<samples>, job<id>-linear-t<samples>), which the training jobs "
        "keep for their own experts; choose another name"));
  }
  DECISION_ASSIGN_OR_RETURN(storage::v1::ExpertModelRecord model,
                            ModelRecordFromWire(request.model()));
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("new experts"));
  DECISION_RETURN_IF_ERROR(ProbeInSandbox(*p, &model));
  // Its backfill covers every reward acknowledged before the registration (backfill_total),
  // whether or not the learner has caught up with them.
  DECISION_RETURN_IF_ERROR(p->WaitLearned());
  Problem::RegisterOptions options;
  options.shadow = request.shadow();
  DECISION_ASSIGN_OR_RETURN(
      *response, p->RegisterExpert(request.name(), std::move(model), smoothing, options));
  return absl::OkStatus();
}

absl::Status DecisionService::EvaluateModel(const v1::EvaluateModelRequest& request,
                                            v1::ModelEvaluation* response) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  v1::RegisterExpertRequest as_registration;
  *as_registration.mutable_model() = request.model();
  DECISION_ASSIGN_OR_RETURN(const double smoothing,
                            ValidateRegisterExpertRequest(as_registration,
                                                          p->record().smoothing()));
  const double clip = request.clip() == 0.0 ? 100.0 : request.clip();
  if (!(clip >= 1.0 && std::isfinite(clip))) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip is ", request.clip(), "; it must be 0 (100) or finite and >= 1"));
  }
  DECISION_ASSIGN_OR_RETURN(storage::v1::ExpertModelRecord model,
                            ModelRecordFromWire(request.model()));
  DECISION_RETURN_IF_ERROR(ProbeInSandbox(*p, &model));  // untrusted like any registered one
  DECISION_ASSIGN_OR_RETURN(
      std::unique_ptr<Expert> built,
      BuildExpert(model, p->record().num_arms(), p->record().num_features(), smoothing));
  DECISION_RETURN_IF_ERROR(p->WaitLearned());
  DECISION_ASSIGN_OR_RETURN(*response, p->EvaluateModel(*built, clip));
  return absl::OkStatus();
}

void DecisionService::EvaluateModel(const v1::EvaluateModelRequest& request,
                                    v1::ModelEvaluation* response, Done done) {
  OffReactor([this, &request, response] { return EvaluateModel(request, response); },
             std::move(done));
}

absl::Status DecisionService::SetShadow(const v1::PromoteRequest& request, bool shadow,
                                        v1::Expert* response) {
  DECISION_ASSIGN_OR_RETURN(EnteredProblem p, Enter(request.problem_id()));
  DECISION_RETURN_IF_ERROR(CheckStoreWritable(shadow ? "demotions" : "promotions"));
  DECISION_ASSIGN_OR_RETURN(*response, p->SetShadow(request.expert_id(), shadow));
  return absl::OkStatus();
}

void DecisionService::Promote(const v1::PromoteRequest& request, v1::Expert* response,
                              Done done) {
  OffReactor([this, &request, response] { return SetShadow(request, false, response); },
             std::move(done));
}

void DecisionService::Demote(const v1::PromoteRequest& request, v1::Expert* response,
                             Done done) {
  OffReactor([this, &request, response] { return SetShadow(request, true, response); },
             std::move(done));
}

void DecisionService::RegisterExpert(const v1::RegisterExpertRequest& request,
                                     v1::Expert* response, Done done) {
  OffReactor([this, &request, response] { return RegisterExpert(request, response); },
             std::move(done));
}

void DecisionService::ListExperts(const v1::ListExpertsRequest& request,
                                  v1::ListExpertsResponse* response, Done done) {
  AfterLearning(
      request.problem_id(),
      [response](const Problem& p) {
        for (v1::Expert& e : p.ListExperts()) *response->add_experts() = std::move(e);
        return absl::OkStatus();
      },
      std::move(done));
}

absl::Status DecisionService::ListExperts(const v1::ListExpertsRequest& request,
                                          v1::ListExpertsResponse* response) {
  return AwaitDone([&](Done done) { ListExperts(request, response, std::move(done)); });
}

absl::Status DecisionService::RetireExpert(const v1::RetireExpertRequest& request,
                                           v1::Expert* response) {
  DECISION_ASSIGN_OR_RETURN(EnteredProblem p, Enter(request.problem_id()));
  DECISION_RETURN_IF_ERROR(ValidateRetireExpertRequest(request));
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("changes to experts"));
  DECISION_ASSIGN_OR_RETURN(*response, p->RetireExpert(request.expert_id()));
  return absl::OkStatus();
}

absl::Status DecisionService::SetRetention(const v1::SetRetentionRequest& request,
                                           v1::Problem* response) {
  DECISION_ASSIGN_OR_RETURN(EnteredProblem p, Enter(request.problem_id()));
  DECISION_RETURN_IF_ERROR(ValidateRetention(
      request.retention(), EstimatorOptionsOf(p->record()).kind, "retention"));
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("changes to problems"));
  DECISION_RETURN_IF_ERROR(p->SetRetention(request.retention()));
  *response = p->Summary();
  return absl::OkStatus();
}

absl::Status DecisionService::DeleteEvents(const v1::DeleteEventsRequest& request,
                                           v1::DeleteEventsResponse* response) {
  DECISION_ASSIGN_OR_RETURN(EnteredProblem p, Enter(request.problem_id()));
  DECISION_RETURN_IF_ERROR(ValidateDeleteEventsRequest(request));
  if (EstimatorOptionsOf(p->record()).kind == EstimatorKind::kClipped) {
    return absl::FailedPreconditionError(absl::StrCat(
        "problem ", request.problem_id(), " uses the clipped estimator, which cannot leave "
        "a deleted sample out of a later expert's estimate; DeleteEvents needs the "
        "median-of-means estimator (the default)"));
  }
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("deletions"));
  return p->DeleteEvents({request.event_ids().begin(), request.event_ids().end()}, response);
}

void DecisionService::DeleteEvents(const v1::DeleteEventsRequest& request,
                                   v1::DeleteEventsResponse* response, Done done) {
  OffReactor([this, &request, response] { return DeleteEvents(request, response); },
             std::move(done));
}

void DecisionService::SetRetention(const v1::SetRetentionRequest& request,
                                   v1::Problem* response, Done done) {
  OffReactor([this, &request, response] { return SetRetention(request, response); },
             std::move(done));
}

void DecisionService::RetireExpert(const v1::RetireExpertRequest& request, v1::Expert* response,
                                   Done done) {
  OffReactor([this, &request, response] { return RetireExpert(request, response); },
             std::move(done));
}

// --------------------------------------------------------------------- Choose, Reward

absl::Status DecisionService::Choose(const v1::ChooseRequest& request,
                                     v1::ChooseResponse* response) {
  DECISION_ASSIGN_OR_RETURN(EnteredProblem p, Enter(request.problem_id()));
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("decisions"));
  return p->Choose(request, response);
}

absl::Status DecisionService::ChooseSlate(const v1::ChooseSlateRequest& request,
                                          v1::ChooseSlateResponse* response) {
  DECISION_ASSIGN_OR_RETURN(EnteredProblem p, Enter(request.problem_id()));
  const int k = p->record().num_arms();
  v1::ChooseRequest slot;
  slot.set_problem_id(request.problem_id());
  *slot.mutable_features() = request.features();
  slot.set_deferred(request.deferred());
  if (request.has_eligible()) *slot.mutable_eligible() = request.eligible();
  DECISION_RETURN_IF_ERROR(ValidateChooseRequest(slot, p->record().num_features(), k));
  std::vector<int32_t> remaining = EligibleArmsOf(slot, k);
  if (remaining.empty()) {
    for (int a = 0; a < k; ++a) remaining.push_back(a);
  }
  const int most = std::min<int>(kMaxSlateSlots, static_cast<int>(remaining.size()));
  if (request.slots() < 1 || request.slots() > most) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots is ", request.slots(), "; it must be in [1, ", most, "] (",
                     remaining.size(), " eligible arms, at most ", kMaxSlateSlots, " slots)"));
  }
  if (request.event_id().size() > kMaxEventIdBytes - 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("event_id has ", request.event_id().size(), " bytes; at most ",
                     kMaxEventIdBytes - 4, " for a slate (its slots add \"/<slot>\")"));
  }
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("decisions"));
  const std::string base = request.event_id().empty() ? RandomEventId() : request.event_id();
  response->set_event_id(base);
  for (int s = 0; s < request.slots(); ++s) {
    slot.set_event_id(absl::StrCat(base, "/", s));
    // The eligible arms no earlier slot took; always set, so that slot s > 0 never sees
    // every arm.
    slot.mutable_eligible()->mutable_arms()->Assign(remaining.begin(), remaining.end());
    v1::ChooseResponse* chosen = response->add_slots();
    if (absl::Status decided = p->ChooseSlot(slot, s, chosen); !decided.ok()) {
      // The caller gets no slate: the slots decided are not delivered (dropped at their
      // expiry, never learned), unless a retry with the same event id gets them.
      for (int before = 0; before < s; ++before) {
        p->Undeliver(response->slots(before).event_id());
      }
      return absl::Status(decided.code(),
                          absl::StrCat("slots[", s, "]: ", decided.message(),
                                       s > 0 ? " (the slots before it were not delivered)" : ""));
    }
    remaining.erase(std::remove(remaining.begin(), remaining.end(), chosen->arm()),
                    remaining.end());
  }
  return absl::OkStatus();
}

void DecisionService::ChooseSlate(const v1::ChooseSlateRequest& request,
                                  v1::ChooseSlateResponse* response, Done done) {
  OffReactor([this, &request, response] { return ChooseSlate(request, response); },
             std::move(done));
}

absl::Status DecisionService::ChooseBatch(const v1::ChooseBatchRequest& request,
                                          v1::ChooseBatchResponse* response) {
  if (request.requests_size() > kMaxChooseBatch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "requests has ", request.requests_size(), " decisions; at most ", kMaxChooseBatch));
  }
  std::vector<EnteredProblem> problems;
  for (int i = 0; i < request.requests_size(); ++i) {
    const v1::ChooseRequest& r = request.requests(i);
    absl::StatusOr<EnteredProblem> p = Enter(r.problem_id());
    absl::Status s = p.status();
    if (p.ok()) {
      s = ValidateChooseRequest(r, (*p)->record().num_features(), (*p)->record().num_arms());
    }
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("requests[", i, "]: ", s.message()));
    problems.push_back(*std::move(p));
  }
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("decisions"));
  for (int i = 0; i < request.requests_size(); ++i) {
    absl::Status s = problems[i]->Choose(request.requests(i), response->add_responses());
    if (!s.ok()) {
      // The caller gets no answer: the decisions made are not delivered (dropped at their
      // expiry, never learned), unless a retry with the same event ids gets them.
      for (int before = 0; before < i; ++before) {
        problems[before]->Undeliver(response->responses(before).event_id());
      }
      return absl::Status(
          s.code(), absl::StrCat("requests[", i, "]: ", s.message(),
                                 i > 0 ? " (the decisions before it were not delivered)" : ""));
    }
  }
  return absl::OkStatus();
}

void DecisionService::ChooseBatch(const v1::ChooseBatchRequest& request,
                                  v1::ChooseBatchResponse* response, Done done) {
  OffReactor([this, &request, response] { return ChooseBatch(request, response); },
             std::move(done));
}

absl::Status DecisionService::Reward(const v1::RewardRequest& request,
                                     v1::RewardResponse* response) {
  if (options_.inline_maintenance) {
    return AwaitDone([&](Done done) { Reward(request, response, std::move(done)); });
  }
  DECISION_ASSIGN_OR_RETURN(EnteredProblem p, Enter(request.problem_id()));
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("rewards"));
  return p->Reward(request, response);
}

void DecisionService::Activate(const v1::ActivateRequest& request,
                               v1::ActivateResponse* response, Done done) {
  absl::StatusOr<EnteredProblem> p = Enter(request.problem_id());
  if (!p.ok()) return done(p.status());
  if (absl::Status s = CheckStoreWritable("activations"); !s.ok()) return done(s);
  Problem* problem = p->get();
  problem->Activate(request, response, std::move(*p).LeaveAfter(std::move(done)));
}

absl::Status DecisionService::Activate(const v1::ActivateRequest& request,
                                       v1::ActivateResponse* response) {
  return AwaitDone([&](Done done) { Activate(request, response, std::move(done)); });
}

void DecisionService::Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response,
                             Done done) {
  absl::StatusOr<EnteredProblem> p = Enter(request.problem_id());
  if (!p.ok()) return done(p.status());
  // Deferred decisions are answered before they are written: one answered now could not
  // be kept.
  if (absl::Status s = CheckStoreWritable("decisions"); !s.ok()) return done(s);
  Problem* problem = p->get();
  problem->Choose(request, response, std::move(*p).LeaveAfter(std::move(done)));
}

void DecisionService::Undeliver(const std::string& problem_id, const std::string& event_id) {
  // Entered (it counts an undelivered answer): a moving problem keeps its counts as they
  // were at the fence.
  if (absl::StatusOr<EnteredProblem> p = Enter(problem_id); p.ok()) (*p)->Undeliver(event_id);
}

void DecisionService::Reward(const v1::RewardRequest& request, v1::RewardResponse* response,
                             Done done) {
  absl::StatusOr<EnteredProblem> p = Enter(request.problem_id());
  if (!p.ok()) return done(p.status());
  if (absl::Status s = CheckStoreWritable("rewards"); !s.ok()) return done(s);
  Problem* problem = p->get();
  done = std::move(*p).LeaveAfter(std::move(done));
  if (!options_.inline_maintenance) return problem->Reward(request, response, std::move(done));
  // The reward completes on the writer; the maintenance blocks, so it runs on the blocking
  // executor, and the reward is answered after it.
  problem->Reward(request, response, [this, problem, done = std::move(done)](absl::Status s) {
    // `done` is shared: if the executor has stopped (shutdown), the writer thread, which
    // runs this, answers without the maintenance (which would wait for the writer itself).
    auto shared_done = std::make_shared<Done>(std::move(done));
    const bool scheduled = blocking_->TrySchedule([this, problem, s, shared_done] {
      if (absl::Status m = MaintainInline(problem); !m.ok()) {
        maintenance_log_.Report(clock_->NowMs(), "maintenance: " + m.ToString());
      }
      (*shared_done)(s);
    });
    if (!scheduled) (*shared_done)(s);
  });
}

absl::Status DecisionService::MaintainInline(Problem* p) {
  // Deterministic: the reward just acknowledged is learned before anything else happens.
  DECISION_RETURN_IF_ERROR(p->WaitLearned());
  absl::MutexLock writes(&maintenance_mu_);
  absl::MutexLock pool(&pool_mu_);
  absl::Status m = MaintainWrites(p);
  absl::Status grown = MaintainPool(p, std::chrono::hours(1), std::chrono::milliseconds(-1));
  absl::Status trained = trainer_->RunPending();
  return !m.ok() ? m : !grown.ok() ? grown : trained;
}

// ---------------------------------------------------------------- Queries and training

void DecisionService::GetEstimates(const v1::GetEstimatesRequest& request,
                                   v1::Estimates* response, Done done) {
  AfterLearning(
      request.problem_id(),
      [response](const Problem& p) {
        *response = p.GetEstimates();
        return absl::OkStatus();
      },
      std::move(done));
}

absl::Status DecisionService::GetEstimates(const v1::GetEstimatesRequest& request,
                                           v1::Estimates* response) {
  return AwaitDone([&](Done done) { GetEstimates(request, response, std::move(done)); });
}

absl::Status DecisionService::ExportLog(
    const v1::ExportLogRequest& request,
    const std::function<absl::Status(const v1::LoggedSample&)>& fn) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  DECISION_RETURN_IF_ERROR(ValidateExportLogRequest(request));
  // Every acknowledged sample then carries its experts' propensities.
  DECISION_RETURN_IF_ERROR(p->WaitLearned());
  return p->ExportLog(request.start(), request.limit(),
                      request.format() == v1::EXPORT_FORMAT_DSJSON, fn);
}

absl::Status DecisionService::Explain(const v1::ExplainRequest& request,
                                      v1::Explanation* response) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  DECISION_RETURN_IF_ERROR(ValidateExplainRequest(request));
  DECISION_ASSIGN_OR_RETURN(*response, p->Explain(request.event_id()));
  return absl::OkStatus();
}

void DecisionService::Explain(const v1::ExplainRequest& request, v1::Explanation* response,
                              Done done) {
  OffReactor([this, &request, response] { return Explain(request, response); },
             std::move(done));
}

void DecisionService::ExportLogPage(const v1::ExportLogRequest& request,
                                    std::vector<v1::LoggedSample>* page, Done done) {
  OffReactor(
      [this, request, page] {
        return ExportLog(request, [page](const v1::LoggedSample& s) {
          page->push_back(s);
          return absl::OkStatus();
        });
      },
      std::move(done));
}

absl::Status DecisionService::TrainExpertsNow(const v1::TrainExpertsRequest& request,
                                              v1::TrainExpertsResponse* response) {
  DECISION_ASSIGN_OR_RETURN(EnteredProblem p, Enter(request.problem_id()));
  DECISION_RETURN_IF_ERROR(ValidateTrainExpertsRequest(request));
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("training jobs"));
  DECISION_RETURN_IF_ERROR(p->WaitLearned());  // the acknowledged rewards count
  int trees = request.tree_experts(), linear = request.linear_experts();
  if (trees == 0 && linear == 0) {
    trees = 3;
    linear = 1;
  }
  if (p->record().num_features() == 0) {
    // Its experts could not depend on a context; the job would only fail in the background.
    return absl::FailedPreconditionError(absl::StrCat(
        "problem ", p->id(), " has no features: there is no context to train experts on"));
  }
  if (p->Summary().samples() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("problem ", p->id(), " has no joined sample to train on"));
  }
  if (!p->HasPositiveReward()) {
    // Training weighs each sample by its reward: with none positive there is nothing to
    // learn, and the job would only fail in the background.
    return absl::FailedPreconditionError(absl::StrCat(
        "problem ", p->id(), " has no sample with a positive reward to train on"));
  }
  if (absl::Status cap = p->ExpertCap(); !cap.ok()) {
    // Its first expert would be refused once trained: refused now, before the CPU is spent.
    return absl::Status(cap.code(),
                        absl::StrCat(cap.message(), ": no trained expert could be registered"));
  }
  DECISION_ASSIGN_OR_RETURN(
      const Trainer::Enqueued queued,
      trainer_->Enqueue(p.get(), p->index(), trees, linear, storage::v1::TRAINING_JOB_ORIGIN_RPC));
  response->set_queued_jobs(queued.queued_jobs);
  response->set_job_id(queued.job_id);
  response->set_joined_queued_job(queued.joined);
  // The job's outcome is in its record (GetTrainingJob), also when it runs here.
  if (options_.inline_maintenance) return trainer_->RunPending();
  return absl::OkStatus();
}

void DecisionService::TrainExperts(const v1::TrainExpertsRequest& request,
                                   v1::TrainExpertsResponse* response, Done done) {
  OffReactor([this, &request, response] { return TrainExpertsNow(request, response); },
             std::move(done));
}

absl::Status DecisionService::TrainExperts(const v1::TrainExpertsRequest& request,
                                           v1::TrainExpertsResponse* response) {
  return TrainExpertsNow(request, response);
}

}  // namespace decision::server
