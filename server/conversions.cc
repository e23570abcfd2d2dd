#include "server/conversions.h"

#include "core/xgboost_expert.h"

namespace decision::server {
namespace {

namespace rec = storage::v1;

// One enum in its three forms. The first row of each table is the default: what an
// UNSPECIFIED wire value, or an unknown stored value, means.
template <typename Wire, typename Record, typename Core>
struct Row {
  Wire wire;
  Record record;
  Core core;
};

constexpr Row<v1::EstimatorKind, rec::EstimatorKindRecord, EstimatorKind> kEstimatorKinds[] = {
    {v1::ESTIMATOR_KIND_MEDIAN_OF_MEANS, rec::ESTIMATOR_KIND_RECORD_MEDIAN_OF_MEANS,
     EstimatorKind::kMedianOfMeans},
    {v1::ESTIMATOR_KIND_CLIPPED, rec::ESTIMATOR_KIND_RECORD_CLIPPED, EstimatorKind::kClipped},
};
constexpr Row<v1::EpsilonRule, rec::EpsilonRuleRecord, EpsilonRule> kEpsilonRules[] = {
    {v1::EPSILON_RULE_PAPER, rec::EPSILON_RULE_RECORD_PAPER, EpsilonRule::kPaper},
    {v1::EPSILON_RULE_TWO_OVER_T, rec::EPSILON_RULE_RECORD_TWO_OVER_T, EpsilonRule::kTwoOverT},
};
constexpr Row<v1::WidthRule, rec::WidthRuleRecord, WidthRule> kWidthRules[] = {
    {v1::WIDTH_RULE_PAPER, rec::WIDTH_RULE_RECORD_PAPER, WidthRule::kPaper},
    {v1::WIDTH_RULE_AUTHORS_CODE, rec::WIDTH_RULE_RECORD_AUTHORS_CODE, WidthRule::kAuthorsCode},
};
constexpr Row<v1::ClipTest, rec::ClipTestRecord, ClipTest> kClipTests[] = {
    {v1::CLIP_TEST_RATIO, rec::CLIP_TEST_RECORD_RATIO, ClipTest::kRatio},
    {v1::CLIP_TEST_REWARD_TIMES_RATIO, rec::CLIP_TEST_RECORD_REWARD_TIMES_RATIO,
     ClipTest::kRewardTimesRatio},
};
constexpr Row<v1::MedianOfMeansGrouping, rec::GroupingRecord, MedianOfMeansGrouping>
    kGroupings[] = {
        {v1::MEDIAN_OF_MEANS_GROUPING_ROUND_ROBIN, rec::GROUPING_RECORD_ROUND_ROBIN,
         MedianOfMeansGrouping::kRoundRobin},
        {v1::MEDIAN_OF_MEANS_GROUPING_CONTIGUOUS, rec::GROUPING_RECORD_CONTIGUOUS,
         MedianOfMeansGrouping::kContiguous},
};
// Expert states have no core form: core only knows selectable or not.
struct ExpertStateRow {
  v1::ExpertStatus wire;
  rec::ExpertState record;
};
constexpr ExpertStateRow kExpertStates[] = {
    {v1::EXPERT_STATUS_UNSPECIFIED, rec::EXPERT_STATE_UNSPECIFIED},
    {v1::EXPERT_STATUS_BACKFILLING, rec::EXPERT_STATE_BACKFILLING},
    {v1::EXPERT_STATUS_ACTIVE, rec::EXPERT_STATE_ACTIVE},
    {v1::EXPERT_STATUS_RETIRED, rec::EXPERT_STATE_RETIRED},
};

template <typename Table, typename Record>
const auto& RowOfRecord(const Table& table, Record record) {
  for (const auto& row : table) {
    if (row.record == record) return row;
  }
  return table[0];
}
template <typename Table, typename Wire>
const auto& RowOfWire(const Table& table, Wire wire) {
  for (const auto& row : table) {
    if (row.wire == wire) return row;
  }
  return table[0];
}
template <typename Table, typename Core>
const auto& RowOfCore(const Table& table, Core core) {
  for (const auto& row : table) {
    if (row.core == core) return row;
  }
  return table[0];
}

}  // namespace

v1::ExpertStatus ExpertStatusToWire(rec::ExpertState state) {
  return RowOfRecord(kExpertStates, state).wire;
}

EstimatorOptions EstimatorOptionsOf(const rec::ProblemRecord& record) {
  const rec::EstimatorRecord& e = record.estimator();
  EstimatorOptions o;
  o.kind = RowOfRecord(kEstimatorKinds, e.kind()).core;
  o.constants = {e.big_c(), e.c1(), e.c2(), e.c3()};
  o.epsilon_rule = RowOfRecord(kEpsilonRules, e.epsilon_rule()).core;
  o.width_rule = RowOfRecord(kWidthRules, e.width_rule()).core;
  o.clip_test = RowOfRecord(kClipTests, e.clip_test()).core;
  o.grouping = RowOfRecord(kGroupings, e.grouping()).core;
  return o;
}

rec::EstimatorRecord EstimatorRecordOf(const EstimatorOptions& o) {
  rec::EstimatorRecord e;
  e.set_kind(RowOfCore(kEstimatorKinds, o.kind).record);
  e.set_big_c(o.constants.C);
  e.set_c1(o.constants.c1);
  e.set_c2(o.constants.c2);
  e.set_c3(o.constants.c3);
  e.set_epsilon_rule(RowOfCore(kEpsilonRules, o.epsilon_rule).record);
  e.set_width_rule(RowOfCore(kWidthRules, o.width_rule).record);
  e.set_clip_test(RowOfCore(kClipTests, o.clip_test).record);
  e.set_grouping(RowOfCore(kGroupings, o.grouping).record);
  return e;
}

EstimatorOptions EstimatorOptionsFromWire(const v1::EstimatorConfig& e) {
  EstimatorOptions o;
  o.kind = RowOfWire(kEstimatorKinds, e.kind()).core;
  if (e.has_big_c()) o.constants.C = e.big_c();
  if (e.has_c1()) o.constants.c1 = e.c1();
  if (e.has_c2()) o.constants.c2 = e.c2();
  if (e.has_c3()) o.constants.c3 = e.c3();
  o.epsilon_rule = RowOfWire(kEpsilonRules, e.epsilon_rule()).core;
  o.width_rule = RowOfWire(kWidthRules, e.width_rule()).core;
  o.clip_test = RowOfWire(kClipTests, e.clip_test()).core;
  o.grouping = RowOfWire(kGroupings, e.grouping()).core;
  return o;
}

v1::EstimatorConfig EstimatorConfigToWire(const rec::EstimatorRecord& er) {
  v1::EstimatorConfig e;
  e.set_kind(RowOfRecord(kEstimatorKinds, er.kind()).wire);
  e.set_big_c(er.big_c());
  e.set_c1(er.c1());
  e.set_c2(er.c2());
  e.set_c3(er.c3());
  e.set_epsilon_rule(RowOfRecord(kEpsilonRules, er.epsilon_rule()).wire);
  e.set_width_rule(RowOfRecord(kWidthRules, er.width_rule()).wire);
  e.set_clip_test(RowOfRecord(kClipTests, er.clip_test()).wire);
  e.set_grouping(RowOfRecord(kGroupings, er.grouping()).wire);
  return e;
}

v1::ProblemConfig ConfigFromRecord(const rec::ProblemRecord& r) {
  v1::ProblemConfig c;
  c.set_num_arms(r.num_arms());
  c.set_num_features(r.num_features());
  *c.mutable_estimator() = EstimatorConfigToWire(r.estimator());
  c.set_reward_wait_ms(r.reward_wait_ms());
  c.set_default_reward(r.default_reward());
  c.set_drop_unrewarded(r.drop_unrewarded());
  c.set_smoothing(r.smoothing());
  c.set_batch_multiplier(r.batch_multiplier());
  c.set_divergence_reservoir(r.divergence_reservoir());
  c.set_divergence_groups(r.divergence_groups());
  v1::AutoTrainConfig* at = c.mutable_auto_train();
  at->set_enabled(r.auto_train());
  at->set_tree_experts(r.auto_train_trees());
  at->set_linear_experts(r.auto_train_linear());
  at->set_training_sample(r.train_on_whole_log() ? v1::TRAINING_SAMPLE_WHOLE_LOG
                                                 : v1::TRAINING_SAMPLE_BOOTSTRAP);
  at->set_training_objective(r.train_by_likelihood()
                                 ? v1::TRAINING_OBJECTIVE_LIKELIHOOD
                                 : v1::TRAINING_OBJECTIVE_IMPORTANCE_WEIGHTED);
  at->set_max_active_experts(r.max_active_experts());
  c.set_scoring_budget_us(r.scoring_budget_us());
  c.set_auto_promote(r.auto_promote());
  c.set_slate_learning(r.learn_first_slot_only() ? v1::SLATE_LEARNING_FIRST_SLOT
                                                 : v1::SLATE_LEARNING_EVERY_SLOT);
  c.set_divergence_refresh_turnover(r.divergence_refresh_turnover());
  c.mutable_retention()->set_max_samples(r.retention_max_samples());
  c.mutable_retention()->set_max_age_ms(r.retention_max_age_ms());
  return c;
}

absl::StatusOr<rec::ExpertModelRecord> ModelRecordFromWire(const v1::ExpertModel& model) {
  rec::ExpertModelRecord r;
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

absl::StatusOr<std::unique_ptr<Expert>> BuildExpert(const rec::ExpertModelRecord& model,
                                                    int num_arms, int num_features,
                                                    double smoothing) {
  switch (model.kind_case()) {
    case rec::ExpertModelRecord::kUniform:
      return MakeUniformExpert(num_arms, num_features);
    case rec::ExpertModelRecord::kTable: {
      std::vector<std::vector<double>> rows;
      for (const auto& row : model.table().rows()) {
        rows.emplace_back(row.probabilities().begin(), row.probabilities().end());
      }
      return MakeTableExpert(num_arms, num_features, std::move(rows),
                             model.table().key_feature(), smoothing);
    }
    case rec::ExpertModelRecord::kLinearSoftmax: {
      const auto& l = model.linear_softmax();
      return MakeLinearSoftmaxExpert(
          num_arms, num_features, std::vector<double>(l.weights().begin(), l.weights().end()),
          std::vector<double>(l.bias().begin(), l.bias().end()),
          l.temperature() == 0.0 ? 1.0 : l.temperature(), smoothing);
    }
    case rec::ExpertModelRecord::kXgboost:
      return MakeXgboostExpert(num_arms, num_features, model.xgboost(), smoothing);
    case rec::ExpertModelRecord::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("model: no model kind is set");
}

namespace {
// Training job states and origins have no core form.
struct TrainingJobStateRow {
  v1::TrainingJobState wire;
  rec::TrainingJobState record;
};
constexpr TrainingJobStateRow kTrainingJobStates[] = {
    {v1::TRAINING_JOB_STATE_UNSPECIFIED, rec::TRAINING_JOB_STATE_UNSPECIFIED},
    {v1::TRAINING_JOB_STATE_QUEUED, rec::TRAINING_JOB_STATE_QUEUED},
    {v1::TRAINING_JOB_STATE_RUNNING, rec::TRAINING_JOB_STATE_RUNNING},
    {v1::TRAINING_JOB_STATE_SUCCEEDED, rec::TRAINING_JOB_STATE_SUCCEEDED},
    {v1::TRAINING_JOB_STATE_FAILED, rec::TRAINING_JOB_STATE_FAILED},
};
struct TrainingJobOriginRow {
  v1::TrainingJobOrigin wire;
  rec::TrainingJobOrigin record;
};
constexpr TrainingJobOriginRow kTrainingJobOrigins[] = {
    {v1::TRAINING_JOB_ORIGIN_UNSPECIFIED, rec::TRAINING_JOB_ORIGIN_UNSPECIFIED},
    {v1::TRAINING_JOB_ORIGIN_TRAIN_EXPERTS, rec::TRAINING_JOB_ORIGIN_RPC},
    {v1::TRAINING_JOB_ORIGIN_AUTO_TRAIN, rec::TRAINING_JOB_ORIGIN_AUTO},
};
}  // namespace

v1::TrainingJob TrainingJobToWire(const rec::TrainingJobRecord& record) {
  v1::TrainingJob job;
  job.set_problem_id(record.problem_id());
  job.set_job_id(record.job_id());
  job.set_state(RowOfRecord(kTrainingJobStates, record.state()).wire);
  job.set_origin(RowOfRecord(kTrainingJobOrigins, record.origin()).wire);
  job.set_tree_experts(record.tree_experts());
  job.set_linear_experts(record.linear_experts());
  job.mutable_expert_ids()->CopyFrom(record.expert_ids());
  job.set_skipped_experts(record.skipped_experts());
  *job.mutable_skip_reasons() = record.skip_reasons();
  job.set_error(record.error());
  job.set_created_at_ms(record.created_at_ms());
  job.set_updated_at_ms(record.updated_at_ms());
  job.set_interruptions(record.interruptions());
  job.set_samples(record.samples());
  return job;
}

v1::ModelEvaluation OffPolicyToWire(const OffPolicyEstimate& e) {
  v1::ModelEvaluation out;
  out.set_samples(e.samples);
  if (e.samples == 0) return out;
  out.set_ips(e.ips);
  out.set_ips_lower(e.ips_lower);
  out.set_ips_upper(e.ips_upper);
  out.set_snips(e.snips);
  out.set_clipped_ips(e.clipped_ips);
  out.set_effective_sample_size(e.effective_sample_size);
  out.set_mean_weight(e.mean_weight);
  out.set_max_weight(e.max_weight);
  return out;
}

}  // namespace decision::server
