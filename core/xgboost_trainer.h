// Trains stochastic experts from the joined log: multiclass `multi:softprob` tree boosters
// or `gblinear` boosters (the logistic-regression expert), as XGBoost model bytes (UBJSON)
// for MakeXgboostExpert. Two training objectives (TrainingObjective):
//   - kLikelihood (the default): the model's distribution p(. | x) is fitted by maximum
//     likelihood to what the log observed. A sample (x, a, r) says "arm a was right" with
//     probability r, "arm a was wrong" with 1 - r: its loss is
//       -r log p(a | x) - (1 - r) log(1 - p(a | x)),
//     importance-weighted by 1 / propensity. Every sample counts, the unrewarded ones too.
//   - kImportanceWeighted: the paper's Algorithm 2 ("cost-sensitive classification
//     experts"): a multiclass classifier on (x, label a) with weight r / propensity; samples
//     with reward 0 have weight 0 and are left out.
//
// gblinear on the likelihood (one thread) is trained by this file's own coordinate
// descent, which computes what libxgboost 1.7.4's shotgun updater computes, bit for bit,
// on contiguous arrays (about a third of its time on 16000 letter rows); the model is saved
// through libxgboost, as libxgboost would save it.
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
#include "core/xgboost_model_check.h"

namespace decision {

enum class TrainingObjective {
  kLikelihood,          // every sample: the likelihood of its reward (the default)
  kImportanceWeighted,  // the rewarded samples as labels, weight r / p (the paper's)
};

// Logged samples to train on, row-major: the context, the arm played, its reward in
// [0, 1] and the propensity it was played with; and, for a bootstrap resample, how many
// times each sample was drawn. Training on a sample with `copies` c is training on c
// copies of it (its gradients and weight are multiplied by c), at the cost of one row.
struct TrainingSet {
  int num_features = 0;
  std::vector<float> rows;          // size() * num_features
  std::vector<float> labels;        // the arm played, 0..K-1
  std::vector<float> rewards;       // in [0, 1]
  std::vector<float> propensities;  // in (0, 1]
  std::vector<float> copies;        // empty (one copy each), or size() counts >= 1
  size_t size() const { return labels.size(); }
  float copies_of(size_t i) const { return copies.empty() ? 1.0f : copies[i]; }
  void Add(absl::Span<const double> x, int arm, double reward, double propensity);
  // Appends `from`'s sample i, with its copies.
  void AddFrom(const TrainingSet& from, size_t i);
  // Drops the oldest n samples.
  void DropOldest(size_t n);
  // How many samples `objective` trains on: all of them, or the rewarded ones.
  size_t TrainedOn(TrainingObjective objective) const;
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
  int max_bin = 256;  // trees: histogram bins per feature (XGBoost's default)
  int threads = 1;
  uint64_t seed = 0;
  TrainingObjective objective = TrainingObjective::kLikelihood;
  // gblinear on the likelihood with one thread is trained here, as libxgboost's shotgun
  // updater trains it (TrainXgboostModel); true trains it through libxgboost instead (for
  // comparisons: slower, the same model up to the order of sums).
  bool libxgboost_linear = false;
};

// Trains on `set` with options.objective. Returns INVALID_ARGUMENT for a set with nothing
// to train on (no sample; with kImportanceWeighted, no rewarded sample), labels outside
// [0, K), rewards outside [0, 1], propensities outside (0, 1] or bad options,
// FAILED_PRECONDITION if training diverged (non-finite probabilities on the training rows),
// and INTERNAL if libxgboost fails.
absl::StatusOr<std::string> TrainXgboostModel(const TrainingSet& set, int num_arms,
                                              const XgboostTrainOptions& options);

// The likelihood objective's gradient and curvature in the margins f (p = softmax(f)) for
// one sample: arm a, reward r, weight w (1 / propensity), K = p.size() arms. The loss is
// w (-r log p_a - (1 - r) log(1 - p_a)); its gradient:
//   g_a = w (r (p_a - 1) + (1 - r) p_a),   g_c = w (r p_c - (1 - r) p_a p_c / (1 - p_a)).
// The curvature is diagonal: 2 p_c (1 - p_c) for the first term (XGBoost's own
// multi:softprob curvature, whose factor 2 keeps Newton steps short), the same times
// p_a / (1 - p_a) off a for the second (scaled like its gradient); at least 1e-6.
void LikelihoodGradient(absl::Span<const float> p, int arm, float reward, float weight,
                        absl::Span<float> grad, absl::Span<float> hess);

// A bootstrap resample of the samples of `set` that `objective` trains on (all of them;
// with kImportanceWeighted, the rewarded ones), as many draws as there are such samples:
// each sample drawn once or more is kept once, in `set`'s order, with `copies` = its number
// of draws (about 63% of the samples for as many draws; a sample's own copies multiply).
// Trains the model that the drawn rows themselves would train, up to the order of
// floating-point sums.
TrainingSet Bootstrap(const TrainingSet& set, TrainingObjective objective,
                      absl::BitGenRef gen);

// The varied hyper-parameters of one expert of a batch, after the paper's recipe (trees of
// depth 3, 6 or 10 with 10, 20 or 40 boosting rounds and column sampling 0.6 or 0.8; or a
// gblinear logistic regression with L2 penalty 0.01 .. 10).
XgboostTrainOptions SampleExpertOptions(bool linear, int threads, absl::BitGenRef gen);

// Caps the rounds of a tree recipe (not gblinear) so that the model it trains on num_arms
// arms passes `limits` whatever the data: multi:softprob grows num_arms trees a round, each
// of at most 2^(max_depth + 1) - 1 nodes, so rounds <= limits.max_trees / num_arms and
// rounds <= limits.max_total_nodes / (num_arms x that), and at least 1. A model past the
// limits would be refused at registration, after its training's time and memory were
// spent. With CheckXgboostModel's default limits it caps nothing below 205 arms (depth 10,
// 40 rounds: 16.4M nodes at 200 arms); at 2048 arms it leaves depth 10 four rounds and
// depth 3 or 6 32. Returns whether it capped.
bool FitRoundsToModelLimits(int num_arms, const XgboostModelLimits& limits,
                            XgboostTrainOptions* options);

// XGBoost's hist method keeps, for every node it expands, a histogram of 16 bytes (a
// gradient and a curvature sum) per bin of every feature: up to (2^(max_depth + 1) - 1) x
// num_features x max_bin x 16 bytes while a tree trains, whatever the samples (17 GB at
// 2048 features, depth 10 and 256 bins). Fits a tree recipe to `budget_bytes`: fewer bins,
// down to kMinTrainingBins, then less depth, down to 1 (then the bins that fit, at most
// 256). No recipe of the six data sets of bench/data changes at kMaxTrainingHistogramBytes
// (digits, 64 features at depth 10, is the closest). Returns whether it changed anything.
inline constexpr int kMinTrainingBins = 16;
inline constexpr int64_t kMaxTrainingHistogramBytes = int64_t{512} << 20;
bool FitTreeRecipeToMemory(int num_features, int64_t budget_bytes,
                           XgboostTrainOptions* options);

// How long training with `options` takes relative to other options on the same training
// set (for ordering the experts of a job, not a prediction of seconds). Trees: rounds x
// (max_depth + 4); gblinear: rounds x 3. Trees fitted to the per-expert training times of a
// letter replay (bench/README.md, "The paper experiment in about a minute"): a round of
// depth 3 / 6 costs about 0.5 / 0.7 times one of depth 10. gblinear to core_bench's
// BM_TrainBootstrap/copies (trees of depth 6 and 10 at about 300 units a second there):
// the 30-round expert costs 90, between 10 rounds of depth 3 (70) and of depth 6 (100).
double RelativeTrainingCost(const XgboostTrainOptions& options);

}  // namespace decision

#endif  // DECISION_CORE_XGBOOST_TRAINER_H_
