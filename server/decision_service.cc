#include "server/decision_service.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/estimator.h"
#include "core/status_macros.h"
#include "server/trainer.h"

namespace decision::server {
namespace {

using storage::v1::ExpertModelRecord;
using storage::v1::ProblemRecord;

constexpr int kMinArms = 2;
constexpr int kMaxArmsPerProblem = 4096;
constexpr int kMaxFeaturesPerProblem = 65536;
constexpr int64_t kDefaultWaitMs = 60'000;
constexpr int64_t kMaxWaitMs = 30LL * 24 * 3600 * 1000;
constexpr int kDefaultReservoir = 2048;
constexpr int kDefaultGroups = 16;
constexpr size_t kMaxNameBytes = 128;

absl::Status ValidateProblemId(const std::string& id) {
  if (id.empty() || id.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("problem_id must have 1 to 64 characters, got ", id.size()));
  }
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "problem_id '", id, "' has a character outside [A-Za-z0-9_.-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckUnitInterval(double v, const char* field, bool allow_zero) {
  if (!(std::isfinite(v) && v <= 1.0 && (allow_zero ? v >= 0.0 : v > 0.0))) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", v, "; it must be in ",
                                                   allow_zero ? "[0, 1]" : "(0, 1]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExpertModelRecord> ModelRecordFromWire(const v1::ExpertModel& model) {
  ExpertModelRecord r;
  switch (model.kind_case()) {
    case v1::ExpertModel::kUniform:
      r.set_uniform(true);
      break;
    case v1::ExpertModel::kTable:
      for (const auto& row : model.table().rows()) {
        *r.mutable_table()->add_rows()->mutable_probabilities() = row.probabilities();
      }
      r.mutable_table()->set_key_feature(model.table().key_feature());
      break;
    case v1::ExpertModel::kLinearSoftmax: {
      auto* l = r.mutable_linear_softmax();
      *l->mutable_weights() = model.linear_softmax().weights();
      *l->mutable_bias() = model.linear_softmax().bias();
      l->set_temperature(model.linear_softmax().temperature());
      break;
    }
    case v1::ExpertModel::kXgboost:
      r.set_xgboost(model.xgboost().model());
      break;
    case v1::ExpertModel::KIND_NOT_SET:
      return absl::InvalidArgumentError(
          "model: no model kind is set (uniform, table, linear_softmax or xgboost)");
  }
  return r;
}

}  // namespace

absl::Status ValidateExportLogRequest(const v1::ExportLogRequest& request) {
  if (request.start() < 0 || request.limit() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("start (", request.start(), ") and limit (",
                                                   request.limit(), ") must be >= 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProblemRecord> ProblemRecordFromConfig(const std::string& problem_id,
                                                      const v1::ProblemConfig& c) {
  DECISION_RETURN_IF_ERROR(ValidateProblemId(problem_id));
  if (c.num_arms() < kMinArms || c.num_arms() > kMaxArmsPerProblem) {
    return absl::InvalidArgumentError(absl::StrCat("config.num_arms is ", c.num_arms(),
                                                   "; it must be in [", kMinArms, ", ",
                                                   kMaxArmsPerProblem, "]"));
  }
  if (c.num_features() < 0 || c.num_features() > kMaxFeaturesPerProblem) {
    return absl::InvalidArgumentError(absl::StrCat("config.num_features is ", c.num_features(),
                                                   "; it must be in [0, ",
                                                   kMaxFeaturesPerProblem, "]"));
  }
  if (c.reward_wait_ms() < 0 || c.reward_wait_ms() > kMaxWaitMs) {
    return absl::InvalidArgumentError(absl::StrCat("config.reward_wait_ms is ",
                                                   c.reward_wait_ms(), "; it must be in [1, ",
                                                   kMaxWaitMs, "] (0 for the default)"));
  }
  DECISION_RETURN_IF_ERROR(CheckUnitInterval(c.default_reward(), "config.default_reward", true));
  if (c.has_smoothing()) {
    DECISION_RETURN_IF_ERROR(CheckUnitInterval(c.smoothing(), "config.smoothing", false));
  }
  if (c.has_batch_multiplier() &&
      !(std::isfinite(c.batch_multiplier()) && c.batch_multiplier() > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("config.batch_multiplier is ",
                                                   c.batch_multiplier(),
                                                   "; it must be finite and > 0"));
  }
  const int reservoir = c.divergence_reservoir() == 0 ? kDefaultReservoir : c.divergence_reservoir();
  if (reservoir < 16 || reservoir > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("config.divergence_reservoir is ",
                                                   c.divergence_reservoir(),
                                                   "; it must be in [16, 65536] (0 for 2048)"));
  }
  const int groups = c.divergence_groups() == 0 ? kDefaultGroups : c.divergence_groups();
  if (groups < 1 || groups > reservoir) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.divergence_groups is ", c.divergence_groups(),
                     "; it must be in [1, divergence_reservoir] (0 for 16)"));
  }
  const v1::EstimatorConfig& e = c.estimator();
  for (const auto& [field, value, valid] :
       {std::tuple<const char*, int, bool>{"kind", e.kind(), v1::EstimatorKind_IsValid(e.kind())},
        {"epsilon_rule", e.epsilon_rule(), v1::EpsilonRule_IsValid(e.epsilon_rule())},
        {"width_rule", e.width_rule(), v1::WidthRule_IsValid(e.width_rule())},
        {"clip_test", e.clip_test(), v1::ClipTest_IsValid(e.clip_test())},
        {"grouping", e.grouping(), v1::MedianOfMeansGrouping_IsValid(e.grouping())}}) {
    if (!valid) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.estimator.", field, " is ", value, ", not a known value"));
    }
  }
  EstimatorOptions o;
  o.kind = e.kind() == v1::ESTIMATOR_KIND_CLIPPED ? EstimatorKind::kClipped
                                                  : EstimatorKind::kMedianOfMeans;
  if (e.has_big_c()) o.constants.C = e.big_c();
  if (e.has_c1()) o.constants.c1 = e.c1();
  if (e.has_c2()) o.constants.c2 = e.c2();
  if (e.has_c3()) o.constants.c3 = e.c3();
  o.epsilon_rule = e.epsilon_rule() == v1::EPSILON_RULE_TWO_OVER_T ? EpsilonRule::kTwoOverT
                                                                   : EpsilonRule::kPaper;
  o.width_rule = e.width_rule() == v1::WIDTH_RULE_AUTHORS_CODE ? WidthRule::kAuthorsCode
                                                               : WidthRule::kPaper;
  o.clip_test = e.clip_test() == v1::CLIP_TEST_REWARD_TIMES_RATIO ? ClipTest::kRewardTimesRatio
                                                                  : ClipTest::kRatio;
  o.grouping = e.grouping() == v1::MEDIAN_OF_MEANS_GROUPING_CONTIGUOUS
                   ? MedianOfMeansGrouping::kContiguous
                   : MedianOfMeansGrouping::kRoundRobin;
  if (absl::Status s = ValidateEstimatorOptions(o); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.estimator: ", s.message()));
  }
  const v1::AutoTrainConfig& at = c.auto_train();
  if (at.tree_experts() < 0 || at.linear_experts() < 0 ||
      at.tree_experts() + at.linear_experts() > 16 || at.max_active_experts() < 0 ||
      at.max_active_experts() > kMaxExpertsPerProblem) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.auto_train: tree_experts (", at.tree_experts(), ") and linear_experts (",
        at.linear_experts(), ") must be >= 0 with at most 16 in all, max_active_experts (",
        at.max_active_experts(), ") in [0, ", kMaxExpertsPerProblem, "]"));
  }
  ProblemRecord r;
  r.set_problem_id(problem_id);
  r.set_auto_train(at.enabled());
  const bool default_counts = at.tree_experts() == 0 && at.linear_experts() == 0;
  r.set_auto_train_trees(default_counts ? 3 : at.tree_experts());
  r.set_auto_train_linear(default_counts ? 1 : at.linear_experts());
  r.set_max_active_experts(at.max_active_experts() == 0 ? 32 : at.max_active_experts());
  r.set_num_arms(c.num_arms());
  r.set_num_features(c.num_features());
  auto* er = r.mutable_estimator();
  er->set_kind(static_cast<int>(o.kind));
  er->set_big_c(o.constants.C);
  er->set_c1(o.constants.c1);
  er->set_c2(o.constants.c2);
  er->set_c3(o.constants.c3);
  er->set_epsilon_rule(static_cast<int>(o.epsilon_rule));
  er->set_width_rule(static_cast<int>(o.width_rule));
  er->set_clip_test(static_cast<int>(o.clip_test));
  er->set_grouping(static_cast<int>(o.grouping));
  r.set_reward_wait_ms(c.reward_wait_ms() == 0 ? kDefaultWaitMs : c.reward_wait_ms());
  r.set_default_reward(c.default_reward());
  r.set_drop_unrewarded(c.drop_unrewarded());
  r.set_smoothing(c.has_smoothing() ? c.smoothing() : kDefaultSmoothing);
  r.set_batch_multiplier(c.has_batch_multiplier() ? c.batch_multiplier() : 7.0);
  r.set_divergence_reservoir(reservoir);
  r.set_divergence_groups(groups);
  return r;
}

v1::ProblemConfig ConfigFromRecord(const ProblemRecord& r) {
  v1::ProblemConfig c;
  c.set_num_arms(r.num_arms());
  c.set_num_features(r.num_features());
  auto* e = c.mutable_estimator();
  const auto& er = r.estimator();
  e->set_kind(er.kind() == static_cast<int>(EstimatorKind::kClipped)
                  ? v1::ESTIMATOR_KIND_CLIPPED
                  : v1::ESTIMATOR_KIND_MEDIAN_OF_MEANS);
  e->set_big_c(er.big_c());
  e->set_c1(er.c1());
  e->set_c2(er.c2());
  e->set_c3(er.c3());
  e->set_epsilon_rule(er.epsilon_rule() == static_cast<int>(EpsilonRule::kTwoOverT)
                          ? v1::EPSILON_RULE_TWO_OVER_T
                          : v1::EPSILON_RULE_PAPER);
  e->set_width_rule(er.width_rule() == static_cast<int>(WidthRule::kAuthorsCode)
                        ? v1::WIDTH_RULE_AUTHORS_CODE
                        : v1::WIDTH_RULE_PAPER);
  e->set_clip_test(er.clip_test() == static_cast<int>(ClipTest::kRewardTimesRatio)
                       ? v1::CLIP_TEST_REWARD_TIMES_RATIO
                       : v1::CLIP_TEST_RATIO);
  e->set_grouping(er.grouping() == static_cast<int>(MedianOfMeansGrouping::kRoundRobin)
                      ? v1::MEDIAN_OF_MEANS_GROUPING_ROUND_ROBIN
                      : v1::MEDIAN_OF_MEANS_GROUPING_CONTIGUOUS);
  c.set_reward_wait_ms(r.reward_wait_ms());
  c.set_default_reward(r.default_reward());
  c.set_drop_unrewarded(r.drop_unrewarded());
  c.set_smoothing(r.smoothing());
  c.set_batch_multiplier(r.batch_multiplier());
  c.set_divergence_reservoir(r.divergence_reservoir());
  c.set_divergence_groups(r.divergence_groups());
  c.mutable_auto_train()->set_enabled(r.auto_train());
  c.mutable_auto_train()->set_tree_experts(r.auto_train_trees());
  c.mutable_auto_train()->set_linear_experts(r.auto_train_linear());
  c.mutable_auto_train()->set_max_active_experts(r.max_active_experts());
  return c;
}

absl::StatusOr<std::unique_ptr<DecisionService>> DecisionService::Open(
    const ServiceOptions& options, const Clock* clock, Metrics* metrics) {
  std::unique_ptr<DecisionService> service(new DecisionService(options, clock, metrics));
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create data directory ", options.data_dir, ": ", ec.message()));
  }
  storage::StoreOptions store_options;
  store_options.sync = options.sync_writes;
  DECISION_ASSIGN_OR_RETURN(service->store_,
                            storage::Store::Open(options.data_dir, store_options));
  const uint64_t seed = options.seed != 0 ? options.seed : std::random_device{}();
  service->trainer_ = std::make_unique<Trainer>(
      /*background=*/!options.inline_maintenance, std::max(1, options.training_threads), seed);
  Problem::Env env{service->store_.get(), clock, metrics, seed, !options.durable_choose,
                   options.maintenance_interval_ms};
  {
    absl::MutexLock lock(&service->mu_);
    DECISION_RETURN_IF_ERROR(service->store_->ForEachProblem(
        [&](uint32_t index, const ProblemRecord& record) -> absl::Status {
          DECISION_ASSIGN_OR_RETURN(std::unique_ptr<Problem> p,
                                    Problem::Load(index, record, env));
          service->next_index_ = std::max(service->next_index_, index + 1);
          service->problems_[record.problem_id()] = std::move(p);
          return absl::OkStatus();
        }));
  }
  if (options.start_maintenance_thread) {
    service->maintenance_ = std::thread([s = service.get()] { s->MaintenanceLoop(); });
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
  stop_.Notify();
  if (maintenance_.joinable()) maintenance_.join();
  trainer_->Stop();
  absl::Status status = absl::OkStatus();
  absl::MutexLock lock(&mu_);
  for (auto& [id, problem] : problems_) {
    problem->FlushDecisions(/*wait=*/true);
    absl::Status s = problem->WriteLogChunks();
    if (s.ok()) s = problem->Checkpoint();
    if (status.ok()) status = s;
  }
  absl::Status closed = store_->Close();
  return status.ok() ? closed : status;
}

absl::StatusOr<Problem*> DecisionService::Find(const std::string& problem_id) {
  absl::ReaderMutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("the service is shutting down");
  if (problem_id.empty()) return absl::InvalidArgumentError("problem_id is empty");
  auto it = problems_.find(problem_id);
  if (it == problems_.end()) {
    return absl::NotFoundError(absl::StrCat("problem '", problem_id, "' does not exist"));
  }
  return it->second.get();
}

absl::Status DecisionService::CreateProblem(const v1::CreateProblemRequest& request,
                                            v1::Problem* response) {
  DECISION_ASSIGN_OR_RETURN(ProblemRecord record,
                            ProblemRecordFromConfig(request.problem_id(), request.config()));
  record.set_created_at_ms(clock_->NowMs());
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("the service is shutting down");
  if (problems_.contains(request.problem_id())) {
    return absl::AlreadyExistsError(
        absl::StrCat("problem '", request.problem_id(), "' already exists"));
  }
  Problem::Env env{store_.get(), clock_, metrics_,
                   options_.seed != 0 ? options_.seed : std::random_device{}(),
                   !options_.durable_choose, options_.maintenance_interval_ms};
  DECISION_ASSIGN_OR_RETURN(std::unique_ptr<Problem> p,
                            Problem::Create(next_index_, std::move(record), env));
  ++next_index_;
  *response = p->Summary();
  *response->mutable_config() = ConfigFromRecord(p->record());
  problems_[request.problem_id()] = std::move(p);
  return absl::OkStatus();
}

absl::Status DecisionService::GetProblem(const v1::GetProblemRequest& request,
                                         v1::Problem* response) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  *response = p->Summary();
  *response->mutable_config() = ConfigFromRecord(p->record());
  return absl::OkStatus();
}

absl::Status DecisionService::ListProblems(const v1::ListProblemsRequest&,
                                           v1::ListProblemsResponse* response) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("the service is shutting down");
  std::vector<Problem*> sorted;
  for (auto& [id, p] : problems_) sorted.push_back(p.get());
  std::sort(sorted.begin(), sorted.end(),
            [](const Problem* a, const Problem* b) { return a->id() < b->id(); });
  for (Problem* p : sorted) {
    v1::Problem* out = response->add_problems();
    *out = p->Summary();
    *out->mutable_config() = ConfigFromRecord(p->record());
  }
  return absl::OkStatus();
}

absl::Status DecisionService::RegisterExpert(const v1::RegisterExpertRequest& request,
                                             v1::Expert* response) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  if (request.name().size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("name has ", request.name().size(),
                                                   " bytes; at most ", kMaxNameBytes));
  }
  double smoothing = p->record().smoothing();
  if (request.model().has_smoothing()) {
    DECISION_RETURN_IF_ERROR(
        CheckUnitInterval(request.model().smoothing(), "model.smoothing", false));
    smoothing = request.model().smoothing();
  }
  DECISION_ASSIGN_OR_RETURN(ExpertModelRecord model, ModelRecordFromWire(request.model()));
  absl::StatusOr<v1::Expert> expert = p->RegisterExpert(request.name(), std::move(model), smoothing);
  if (!expert.ok()) return expert.status();
  *response = *std::move(expert);
  return absl::OkStatus();
}

absl::Status DecisionService::ListExperts(const v1::ListExpertsRequest& request,
                                          v1::ListExpertsResponse* response) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  for (v1::Expert& e : p->ListExperts()) *response->add_experts() = std::move(e);
  return absl::OkStatus();
}

absl::Status DecisionService::RetireExpert(const v1::RetireExpertRequest& request,
                                           v1::Expert* response) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  if (request.expert_id() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert_id is ", request.expert_id(), "; expert ids start at 0"));
  }
  DECISION_ASSIGN_OR_RETURN(*response, p->RetireExpert(request.expert_id()));
  return absl::OkStatus();
}

absl::Status DecisionService::Choose(const v1::ChooseRequest& request,
                                     v1::ChooseResponse* response) {
  return AwaitDone([&](Done done) { Choose(request, response, std::move(done)); });
}

absl::Status DecisionService::Reward(const v1::RewardRequest& request,
                                     v1::RewardResponse* response) {
  return AwaitDone([&](Done done) { Reward(request, response, std::move(done)); });
}

void DecisionService::Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response,
                             Done done) {
  absl::StatusOr<Problem*> p = Find(request.problem_id());
  if (!p.ok()) return done(p.status());
  (*p)->Choose(request, response, std::move(done));
}

void DecisionService::Reward(const v1::RewardRequest& request, v1::RewardResponse* response,
                             Done done) {
  absl::StatusOr<Problem*> p = Find(request.problem_id());
  if (!p.ok()) return done(p.status());
  if (!options_.inline_maintenance) return (*p)->Reward(request, response, std::move(done));
  absl::Status s = (*p)->Reward(request, response);
  {
    absl::MutexLock round(&maintenance_mu_);
    absl::Status m = MaintainProblem(*p, std::chrono::hours(1));
    if (m.ok()) m = trainer_->RunPending();
    if (!m.ok()) std::fprintf(stderr, "decisiond: maintenance: %s\n", m.ToString().c_str());
  }
  done(s);
}

absl::Status DecisionService::TrainExperts(const v1::TrainExpertsRequest& request,
                                           v1::TrainExpertsResponse* response) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  int trees = request.tree_experts(), linear = request.linear_experts();
  if (trees < 0 || linear < 0 || trees + linear > 16) {
    return absl::InvalidArgumentError(absl::StrCat("tree_experts (", trees, ") and linear_experts (",
                                                   linear, ") must be >= 0, at most 16 in all"));
  }
  if (trees == 0 && linear == 0) {
    trees = 3;
    linear = 1;
  }
  if (p->Summary().samples() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("problem ", p->id(), " has no joined sample to train on"));
  }
  response->set_queued_jobs(trainer_->Enqueue(p, trees, linear));
  if (options_.inline_maintenance) return trainer_->RunPending();
  return absl::OkStatus();
}

absl::Status DecisionService::GetEstimates(const v1::GetEstimatesRequest& request,
                                           v1::Estimates* response) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  *response = p->GetEstimates();
  return absl::OkStatus();
}

absl::Status DecisionService::ExportLog(
    const v1::ExportLogRequest& request,
    const std::function<absl::Status(const v1::LoggedSample&)>& fn) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  DECISION_RETURN_IF_ERROR(ValidateExportLogRequest(request));
  return p->ExportLog(request.start(), request.limit(), fn);
}

absl::Status DecisionService::RunMaintenance() {
  absl::MutexLock round(&maintenance_mu_);
  std::vector<Problem*> problems;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, p] : problems_) problems.push_back(p.get());
  }
  absl::Status status = absl::OkStatus();
  auto keep = [&](absl::Status s) {
    if (!s.ok() && status.ok()) status = s;
  };
  const auto now = std::chrono::steady_clock::now();
  const bool export_metrics = now - last_metrics_export_ >= std::chrono::milliseconds(500);
  backfill_behind_ = false;
  for (Problem* p : problems) {
    keep(MaintainProblem(p, std::chrono::milliseconds(100)));
    if (export_metrics) p->ExportMetrics();
  }
  if (export_metrics) {
    last_metrics_export_ = now;
    metrics_->storage_size().Set(static_cast<double>(store_->ApproximateSizeBytes()));
  }
  return status;
}

absl::Status DecisionService::MaintainProblem(Problem* p,
                                              std::chrono::milliseconds backfill_budget) {
  p->FlushDecisions(/*wait=*/false);
  DECISION_RETURN_IF_ERROR(p->WriteLogChunks());
  DECISION_RETURN_IF_ERROR(p->ExpireDue());
  // Backfill one chunk at a time, within the budget.
  const auto start = std::chrono::steady_clock::now();
  bool worked = true;
  while (worked && std::chrono::steady_clock::now() - start < backfill_budget) {
    DECISION_RETURN_IF_ERROR(p->StepBackfill(&worked));
  }
  if (worked) backfill_behind_ = true;
  const ProblemRecord& r = p->record();
  if (r.auto_train()) DECISION_RETURN_IF_ERROR(p->RetireDominated(r.max_active_experts()));
  bool batch_boundary = false;
  DECISION_RETURN_IF_ERROR(p->MaybeRefreshDivergences(
      &batch_boundary, options_.inline_maintenance ? 0 : options_.min_refresh_interval_ms));
  if (batch_boundary && r.auto_train()) {
    trainer_->Enqueue(p, r.auto_train_trees(), r.auto_train_linear());
  }
  return absl::OkStatus();
}

void DecisionService::MaintenanceLoop() {
  bool behind = false;
  while (!stop_.WaitForNotificationWithTimeout(
      behind ? absl::ZeroDuration() : absl::Milliseconds(options_.maintenance_interval_ms))) {
    absl::Status s = RunMaintenance();
    if (!s.ok()) std::fprintf(stderr, "decisiond: maintenance: %s\n", s.ToString().c_str());
    absl::MutexLock lock(&maintenance_mu_);
    behind = s.ok() && backfill_behind_;
  }
}

}  // namespace decision::server
