#include "server/validation.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/estimator.h"
#include "core/expert.h"
#include "core/status_macros.h"
#include "server/conversions.h"

namespace decision::server {
namespace {

constexpr int64_t kDefaultWaitMs = 60'000;
constexpr int64_t kMaxWaitMs = 30LL * 24 * 3600 * 1000;
constexpr int kDefaultReservoir = 2048;
constexpr int kMinReservoir = 16;
constexpr int kMaxReservoir = 65536;
constexpr int kDefaultGroups = 16;
constexpr size_t kMaxProblemIdBytes = 64;


absl::Status CheckUnitInterval(double v, const char* field, bool allow_zero) {
  if (!(std::isfinite(v) && v <= 1.0 && (allow_zero ? v >= 0.0 : v > 0.0))) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is ", v, "; it must be in ",
                                                   allow_zero ? "[0, 1]" : "(0, 1]"));
  }
  return absl::OkStatus();
}

// Smoothing eta in [kMinSmoothing, 1]. Below that, eta / K can underflow to 0 (5e-324 is a
// valid double): the played arm's probability could be 0 and no sample could be learned.
absl::Status CheckSmoothing(double v, const char* field) {
  if (!(std::isfinite(v) && v >= kMinSmoothing && v <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", v, "; it must be in [", kMinSmoothing, ", 1]"));
  }
  return absl::OkStatus();
}

// Two expert counts, each >= 0, at most `max_total` in all. The sum is formed in 64 bits:
// two int32 counts from the wire can overflow an int.
absl::Status CheckExpertCounts(int32_t trees, int32_t linear, int max_total,
                               const char* prefix) {
  if (trees < 0 || linear < 0 || int64_t{trees} + int64_t{linear} > max_total) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "tree_experts (", trees,
                                                   ") and linear_experts (", linear,
                                                   ") must be >= 0, at most ", max_total,
                                                   " in all"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSizes(const v1::ProblemConfig& c, int reservoir) {
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
  if (reservoir < kMinReservoir || reservoir > kMaxReservoir) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.divergence_reservoir is ", c.divergence_reservoir(), "; it must be in [",
        kMinReservoir, ", ", kMaxReservoir, "] (0 for ", kDefaultReservoir, ")"));
  }
  // Sizes that multiply into one allocation are bounded together.
  const int64_t contexts = int64_t{reservoir} * c.num_features();
  const int64_t predictions = int64_t{reservoir} * c.num_arms();
  if (contexts > kMaxConfigDoubles || predictions > kMaxConfigDoubles) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: divergence_reservoir (", reservoir, ") x num_features (", c.num_features(),
        ") = ", contexts, " and divergence_reservoir x num_arms (", c.num_arms(), ") = ",
        predictions, " must each be at most ", kMaxConfigDoubles,
        "; lower divergence_reservoir"));
  }
  return absl::OkStatus();
}

absl::Status ValidateEstimatorEnums(const v1::EstimatorConfig& e) {
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
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateReplicaId(const std::string& id, const char* field) {
  if (id.empty() || id.size() > kMaxProblemIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must have 1 to ", kMaxProblemIdBytes,
                                                   " characters, got ", id.size()));
  }
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " '", id, "' has a character outside [A-Za-z0-9_.-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateProblemId(const std::string& id) {
  if (id.empty() || id.size() > kMaxProblemIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("problem_id must have 1 to ",
                                                   kMaxProblemIdBytes, " characters, got ",
                                                   id.size()));
  }
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "problem_id '", id, "' has a character outside [A-Za-z0-9_.-]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<storage::v1::ProblemRecord> ProblemRecordFromConfig(const std::string& problem_id,
                                                                   const v1::ProblemConfig& c) {
  DECISION_RETURN_IF_ERROR(ValidateProblemId(problem_id));
  const int reservoir =
      c.divergence_reservoir() == 0 ? kDefaultReservoir : c.divergence_reservoir();
  DECISION_RETURN_IF_ERROR(ValidateSizes(c, reservoir));
  if (c.reward_wait_ms() < 0 || c.reward_wait_ms() > kMaxWaitMs) {
    return absl::InvalidArgumentError(absl::StrCat("config.reward_wait_ms is ",
                                                   c.reward_wait_ms(), "; it must be in [1, ",
                                                   kMaxWaitMs, "] (0 for the default)"));
  }
  DECISION_RETURN_IF_ERROR(CheckUnitInterval(c.default_reward(), "config.default_reward", true));
  if (c.has_smoothing()) DECISION_RETURN_IF_ERROR(CheckSmoothing(c.smoothing(), "config.smoothing"));
  if (c.has_batch_multiplier() &&
      !(std::isfinite(c.batch_multiplier()) && c.batch_multiplier() > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("config.batch_multiplier is ",
                                                   c.batch_multiplier(),
                                                   "; it must be finite and > 0"));
  }
  const int groups = c.divergence_groups() == 0 ? kDefaultGroups : c.divergence_groups();
  if (groups < 1 || groups > reservoir) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.divergence_groups is ", c.divergence_groups(),
                     "; it must be in [1, divergence_reservoir] (0 for ", kDefaultGroups, ")"));
  }
  DECISION_RETURN_IF_ERROR(ValidateEstimatorEnums(c.estimator()));
  const EstimatorOptions o = EstimatorOptionsFromWire(c.estimator());
  if (absl::Status s = ValidateEstimatorOptions(o); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.estimator: ", s.message()));
  }
  if (o.kind == EstimatorKind::kMedianOfMeans &&
      o.grouping == MedianOfMeansGrouping::kContiguous) {
    return absl::InvalidArgumentError(
        "config.estimator.grouping is MEDIAN_OF_MEANS_GROUPING_CONTIGUOUS, which the service "
        "does not run: it regroups every sample whenever l(t) changes, so it needs the whole "
        "log in memory; use ROUND_ROBIN (the default; bench/regret runs both)");
  }
  const v1::AutoTrainConfig& at = c.auto_train();
  DECISION_RETURN_IF_ERROR(CheckExpertCounts(at.tree_experts(), at.linear_experts(),
                                             kMaxExpertsPerTrainingJob, "config.auto_train: "));
  if (at.max_active_experts() < 0 || at.max_active_experts() > kMaxExpertsPerProblem) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.auto_train.max_active_experts is ", at.max_active_experts(),
        "; it must be in [0, ", kMaxExpertsPerProblem, "] (0 for 32)"));
  }
  if (!(std::isfinite(c.scoring_budget_us()) && c.scoring_budget_us() >= 0.0 &&
        c.scoring_budget_us() <= kMaxScoringBudgetUs)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.scoring_budget_us is ", c.scoring_budget_us(), "; it must be in [0, ",
        kMaxScoringBudgetUs, "] microseconds per decision (0 for no budget)"));
  }
  if (c.has_divergence_refresh_turnover() &&
      !(c.divergence_refresh_turnover() >= 0.0 && c.divergence_refresh_turnover() <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("config.divergence_refresh_turnover is ",
                                                   c.divergence_refresh_turnover(),
                                                   "; it must be in [0, 1] (unset for 0.5)"));
  }
  DECISION_RETURN_IF_ERROR(
      ValidateRetention(c.retention(), o.kind, "config.retention"));
  if (!v1::SlateLearning_IsValid(c.slate_learning())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.slate_learning is ", c.slate_learning(),
        "; it must be SLATE_LEARNING_EVERY_SLOT (1) or SLATE_LEARNING_FIRST_SLOT (2), or "
        "unset (every slot)"));
  }
  if (!v1::TrainingSample_IsValid(at.training_sample())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.auto_train.training_sample is ", at.training_sample(),
        "; it must be TRAINING_SAMPLE_WHOLE_LOG (1) or TRAINING_SAMPLE_BOOTSTRAP (2), or "
        "unset (the whole log)"));
  }
  if (!v1::TrainingObjective_IsValid(at.training_objective())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.auto_train.training_objective is ", at.training_objective(),
        "; it must be TRAINING_OBJECTIVE_LIKELIHOOD (1) or "
        "TRAINING_OBJECTIVE_IMPORTANCE_WEIGHTED (2), or unset (the likelihood)"));
  }
  storage::v1::ProblemRecord r;
  r.set_problem_id(problem_id);
  r.set_retention_max_samples(c.retention().max_samples());
  r.set_retention_max_age_ms(c.retention().max_age_ms());
  r.set_auto_train(at.enabled());
  const bool default_counts = at.tree_experts() == 0 && at.linear_experts() == 0;
  r.set_auto_train_trees(default_counts ? 3 : at.tree_experts());
  r.set_auto_train_linear(default_counts ? 1 : at.linear_experts());
  r.set_max_active_experts(at.max_active_experts() == 0 ? 32 : at.max_active_experts());
  r.set_train_on_whole_log(at.training_sample() != v1::TRAINING_SAMPLE_BOOTSTRAP);
  r.set_train_by_likelihood(at.training_objective() !=
                            v1::TRAINING_OBJECTIVE_IMPORTANCE_WEIGHTED);
  r.set_num_arms(c.num_arms());
  r.set_num_features(c.num_features());
  *r.mutable_estimator() = EstimatorRecordOf(o);
  r.set_reward_wait_ms(c.reward_wait_ms() == 0 ? kDefaultWaitMs : c.reward_wait_ms());
  r.set_default_reward(c.default_reward());
  r.set_drop_unrewarded(c.drop_unrewarded());
  r.set_smoothing(c.has_smoothing() ? c.smoothing() : kDefaultSmoothing);
  r.set_batch_multiplier(c.has_batch_multiplier() ? c.batch_multiplier() : 7.0);
  r.set_divergence_reservoir(reservoir);
  r.set_divergence_groups(groups);
  r.set_scoring_budget_us(c.scoring_budget_us());
  r.set_divergence_refresh_turnover(
      c.has_divergence_refresh_turnover() ? c.divergence_refresh_turnover() : 0.5);
  r.set_auto_promote(c.auto_promote());
  r.set_learn_first_slot_only(c.slate_learning() == v1::SLATE_LEARNING_FIRST_SLOT);
  return r;
}

absl::Status CheckStoredProblem(const storage::v1::ProblemRecord& record) {
  const absl::StatusOr<storage::v1::ProblemRecord> valid =
      ProblemRecordFromConfig(record.problem_id(), ConfigFromRecord(record));
  if (valid.ok()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("stored problem '", record.problem_id(),
                                          "': ", valid.status().message()));
}

absl::Status ValidateChooseRequest(const v1::ChooseRequest& request, int num_features,
                                   int num_arms) {
  if (request.features_size() != num_features) {
    return absl::InvalidArgumentError(absl::StrCat("features: problem ", request.problem_id(),
                                                   " expects ", num_features,
                                                   " features, got ", request.features_size()));
  }
  for (int f = 0; f < num_features; ++f) {
    if (!std::isfinite(request.features(f))) {
      return absl::InvalidArgumentError(
          absl::StrCat("features[", f, "] is ", request.features(f), "; features must be finite"));
    }
  }
  if (request.event_id().size() > kMaxEventIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("event_id has ", request.event_id().size(),
                                                   " bytes; at most ", kMaxEventIdBytes));
  }
  if (request.has_eligible()) {
    const auto& arms = request.eligible().arms();
    if (arms.empty()) {
      return absl::InvalidArgumentError(
          "eligible.arms is empty: at least one arm must be eligible (leave eligible unset "
          "for every arm)");
    }
    if (absl::Status s = ValidateEligibleArms(absl::MakeConstSpan(arms.data(), arms.size()),
                                              num_arms);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("eligible.arms: ", s.message(), " (problem ", request.problem_id(),
                       " has ", num_arms, " arms)"));
    }
  }
  return absl::OkStatus();
}

bool StoredEligibleArmsValid(absl::Span<const int32_t> eligible, int arm, int num_arms) {
  if (eligible.empty()) return true;
  bool played = false;
  for (size_t i = 0; i < eligible.size(); ++i) {
    if (eligible[i] < 0 || eligible[i] >= num_arms) return false;
    if (i > 0 && eligible[i] <= eligible[i - 1]) return false;
    played = played || eligible[i] == arm;
  }
  return played;
}

std::vector<int32_t> EligibleArmsOf(const v1::ChooseRequest& request, int num_arms) {
  const auto& arms = request.eligible().arms();
  if (arms.size() >= num_arms) return {};  // every arm (they are distinct)
  std::vector<int32_t> out(arms.begin(), arms.end());
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
// Reward, Activate and Explain name a decided event: 1 to kMaxEventIdBytes bytes.
absl::Status ValidateEventId(const std::string& event_id) {
  if (event_id.empty() || event_id.size() > kMaxEventIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("event_id has ", event_id.size(), " bytes; 1 to ", kMaxEventIdBytes));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status ValidateRewardRequest(const v1::RewardRequest& request) {
  const double value = request.value();
  if (!(value >= 0.0 && value <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("value is ", value, "; a reward must be in [0, 1]"));
  }
  return ValidateEventId(request.event_id());
}

absl::StatusOr<double> ValidateRegisterExpertRequest(const v1::RegisterExpertRequest& request,
                                                     double default_smoothing) {
  if (request.name().size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("name has ", request.name().size(),
                                                   " bytes; at most ", kMaxNameBytes));
  }
  if (!request.model().has_smoothing()) return default_smoothing;
  DECISION_RETURN_IF_ERROR(CheckSmoothing(request.model().smoothing(), "model.smoothing"));
  return request.model().smoothing();
}

absl::Status ValidateRetention(const v1::RetentionConfig& retention, EstimatorKind estimator,
                               absl::string_view field) {
  const int64_t n = retention.max_samples(), age = retention.max_age_ms();
  if (n != 0 && (n < kMinRetentionSamples || n > kMaxRetentionSamples)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".max_samples is ", n, "; it must be 0 (keep all) or in [",
        kMinRetentionSamples, ", 2^53]"));
  }
  if (age != 0 && (age < kMinRetentionAgeMs || age > kMaxRetentionAgeMs)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".max_age_ms is ", age, "; it must be 0 (no limit) or in [",
        kMinRetentionAgeMs, ", ", kMaxRetentionAgeMs, "] (100 years)"));
  }
  if ((n != 0 || age != 0) && estimator == EstimatorKind::kClipped) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is set, but the problem's estimator is ESTIMATOR_KIND_CLIPPED, which cannot "
        "estimate an expert over the samples retention keeps (docs/ENGINE.md, \"Windows\"); "
        "use the median-of-means estimator (the default)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateDeleteEventsRequest(const v1::DeleteEventsRequest& request) {
  if (request.event_ids_size() == 0 || request.event_ids_size() > kMaxDeleteEvents) {
    return absl::InvalidArgumentError(absl::StrCat(
        "event_ids has ", request.event_ids_size(), " ids; it must have 1 to ",
        kMaxDeleteEvents));
  }
  for (int i = 0; i < request.event_ids_size(); ++i) {
    const size_t n = request.event_ids(i).size();
    if (n == 0 || n > kMaxEventIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat("event_ids[", i, "] has ", n,
                                                     " bytes; it must have 1 to ",
                                                     kMaxEventIdBytes));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRetireExpertRequest(const v1::RetireExpertRequest&) {
  // Every int32 is a well-formed expert id: one the problem does not have (negative ones
  // included) is NOT_FOUND, as for every other id.
  return absl::OkStatus();
}

absl::Status ValidateTrainExpertsRequest(const v1::TrainExpertsRequest& request) {
  return CheckExpertCounts(request.tree_experts(), request.linear_experts(),
                           kMaxExpertsPerTrainingJob, "");
}

absl::Status ValidateExplainRequest(const v1::ExplainRequest& request) {
  return ValidateEventId(request.event_id());
}

absl::Status ValidateActivateRequest(const v1::ActivateRequest& request) {
  return ValidateEventId(request.event_id());
}

absl::Status ValidateExportLogRequest(const v1::ExportLogRequest& request) {
  if (request.start() < 0 || request.limit() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("start (", request.start(), ") and limit (",
                                                   request.limit(), ") must be >= 0"));
  }
  if (!v1::ExportFormat_IsValid(request.format())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format ", request.format(), " is not an export format (0: samples, 1: DSJSON)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateListAuditLogRequest(const v1::ListAuditLogRequest& request) {
  if (request.start() < 0 || request.limit() < 0 || request.limit() > kMaxAuditPage) {
    return absl::InvalidArgumentError(absl::StrCat("start (", request.start(),
                                                   ") must be >= 0 and limit (", request.limit(),
                                                   ") in [0, ", kMaxAuditPage, "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateGetTrainingJobRequest(const v1::GetTrainingJobRequest& request) {
  if (request.job_id() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id is ", request.job_id(), "; job ids start at 1"));
  }
  return absl::OkStatus();
}

}  // namespace decision::server
