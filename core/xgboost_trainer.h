// Trains stochastic experts from the joined log as importance-weighted multiclass
// classifiers (the paper's Algorithm 2, "cost-sensitive classification experts"):
// example (x, a) with label a = the arm played and weight y / propensity. Samples with
// reward 0 have weight 0 and are left out. The result is XGBoost model bytes (UBJSON) for
// MakeXgboostExpert: a `multi:softprob` tree booster or a `gblinear` booster (the logistic-
// regression expert).
//
// Thread safety: TrainXgboostModel is reentrant; each call owns its booster.
#ifndef DECISION_CORE_XGBOOST_TRAINER_H_
#define DECISION_CORE_XGBOOST_TRAINER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/random/bit_gen_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace decision {

// A weighted multiclass training set, row-major.
struct TrainingSet {
  int num_features = 0;
  std::vector<float> rows;     // size() * num_features
  std::vector<float> labels;   // the arm, 0..K-1
  std::vector<float> weights;  // reward / propensity, > 0
  size_t size() const { return labels.size(); }
  // Adds one logged sample; samples with reward 0 are skipped (weight 0).
  void Add(absl::Span<const double> x, int arm, double reward, double propensity);
};

struct XgboostTrainOptions {
  bool linear = false;  // gblinear (logistic regression) instead of trees
  int rounds = 50;
  int max_depth = 6;
  double learning_rate = 0.3;
  double colsample_bytree = 1.0;
  double subsample = 1.0;
  double l2 = 1.0;  // lambda
  double l1 = 0.0;  // alpha
  int threads = 1;
  uint64_t seed = 0;
};

// Trains on `set`. Returns INVALID_ARGUMENT for an empty set, labels outside [0, K) or bad
// options, FAILED_PRECONDITION if training diverged (non-finite probabilities on the
// training rows), and INTERNAL if libxgboost fails.
absl::StatusOr<std::string> TrainXgboostModel(const TrainingSet& set, int num_arms,
                                              const XgboostTrainOptions& options);

// A bootstrap resample of `set` (size() draws with replacement).
TrainingSet Bootstrap(const TrainingSet& set, absl::BitGenRef gen);

// The varied hyper-parameters of one expert of a batch, after the paper's recipe (trees of
// depth 3, 6 or 10 with 10, 20 or 40 boosting rounds and column sampling 0.6 or 0.8; or a
// gblinear logistic regression with L2 penalty 0.01 .. 10).
XgboostTrainOptions SampleExpertOptions(bool linear, int threads, absl::BitGenRef gen);

}  // namespace decision

#endif  // DECISION_CORE_XGBOOST_TRAINER_H_
