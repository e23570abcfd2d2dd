#include "core/xgboost_trainer.h"

#include <xgboost/c_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/xgboost_expert.h"
#include "core/xgboost_forest.h"

namespace decision {
namespace {

// Owns the C handles for one training run.
struct Handles {
  DMatrixHandle matrix = nullptr;
  BoosterHandle booster = nullptr;
  ~Handles() {
    if (booster != nullptr) XGBoosterFree(booster);
    if (matrix != nullptr) XGDMatrixFree(matrix);
  }
};

absl::Status XgbError(const char* what) {
  return absl::InternalError(absl::StrCat("xgboost ", what, " failed: ", XGBGetLastError()));
}

// The likelihood's gradient pairs of every sample of `set` (n x k, row-major) under the
// probabilities p: a sample with c copies adds c times its gradient and curvature
// (XGBoost's trees and gblinear sum them over rows; the curvature's floor applies to each
// copy).
void LikelihoodGradients(const TrainingSet& set, const float* p, size_t k, float* grad,
                         float* hess) {
  for (size_t i = 0; i < set.size(); ++i) {
    LikelihoodGradient(absl::MakeConstSpan(p + i * k, k), static_cast<int>(set.labels[i]),
                       set.rewards[i], 1.0f / set.propensities[i],
                       absl::MakeSpan(grad + i * k, k), absl::MakeSpan(hess + i * k, k));
    if (const float c = set.copies_of(i); c != 1.0f) {
      for (size_t j = i * k; j < (i + 1) * k; ++j) {
        grad[j] *= c;
        hess[j] *= c;
      }
    }
  }
}

// Gradient boosting on the likelihood loss (xgboost_trainer.h), with the model's own
// softmax: each round predicts p(. | x) on the training rows (XGBoost keeps these
// predictions cached for its training matrix) and boosts one tree per arm on
// LikelihoodGradient.
absl::Status BoostByLikelihood(BoosterHandle booster, DMatrixHandle matrix,
                               const TrainingSet& set, int num_arms, int rounds) {
  static constexpr char kProbabilities[] =
      "{\"type\": 0, \"training\": true, \"iteration_begin\": 0, \"iteration_end\": 0, "
      "\"strict_shape\": false}";
  const size_t n = set.size();
  const size_t k = static_cast<size_t>(num_arms);
  std::vector<float> grad(n * k);
  std::vector<float> hess(n * k);
  for (int round = 0; round < rounds; ++round) {
    const bst_ulong* shape = nullptr;
    bst_ulong dims = 0;
    const float* p = nullptr;
    if (XGBoosterPredictFromDMatrix(booster, matrix, kProbabilities, &shape, &dims, &p) != 0) {
      return XgbError("predicting the training rows");
    }
    bst_ulong values = 1;
    for (bst_ulong d = 0; d < dims; ++d) values *= shape[d];
    if (values != n * k) {
      return absl::InternalError(absl::StrCat("xgboost predicted ", values,
                                              " values for the training rows, not ", n * k));
    }
    LikelihoodGradients(set, p, k, grad.data(), hess.data());
    if (XGBoosterBoostOneIter(booster, matrix, grad.data(), hess.data(), n * k) != 0) {
      return XgbError("training");
    }
  }
  return absl::OkStatus();
}

// The float libxgboost parses from the decimal text of `v` (its parameters are strings).
float ParamFloat(double v) { return std::strtof(absl::StrCat(v).c_str(), nullptr); }

// The gblinear trainer's classes in groups of kLanes, side by side: each class's sums over
// the rows are one chain of double additions, in row order as libxgboost's, and the
// classes of a group make independent chains that the compiler keeps in vector registers.
constexpr size_t kLanes = 8;

// For each lane j of the group's pairs (g, h: n rows of kLanes), the sums over the rows
// of g x and of h x x (x: the feature's column; null for the bias, x = 1), each product
// a float as libxgboost's, added in double.
void SumPairs(const float* g, const float* h, const float* x, size_t n,
              double (&sum_grad)[kLanes], double (&sum_hess)[kLanes]) {
  double sg[kLanes] = {}, sh[kLanes] = {};
  if (x == nullptr) {
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < kLanes; ++j) {
        sg[j] += g[i * kLanes + j];
        sh[j] += h[i * kLanes + j];
      }
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float xi = x[i];
      for (size_t j = 0; j < kLanes; ++j) {
        const float gx = g[i * kLanes + j] * xi;
        const float hxx = h[i * kLanes + j] * xi * xi;
        sg[j] += gx;
        sh[j] += hxx;
      }
    }
  }
  for (size_t j = 0; j < kLanes; ++j) {
    sum_grad[j] = sg[j];
    sum_hess[j] = sh[j];
  }
}

// The residual update of one coordinate step per lane: g += h x step (x: null for the
// bias), a float product then a sum as libxgboost's. A class whose step is 0 is left as it
// is, as libxgboost skips it (not even a zero is added: that could flip a zero's sign);
// the lanes past the group's `lanes` classes are not read again and take any value.
void StepPairs(const float* h, const float* x, const float (&step)[kLanes], size_t lanes,
               size_t n, float* g) {
  size_t zero = 0;
  for (size_t j = 0; j < lanes; ++j) zero += step[j] == 0.0f;
  if (zero == lanes) return;
  if (zero == 0 && x == nullptr) {  // every class steps: loops the compiler vectorises
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < kLanes; ++j) g[i * kLanes + j] += h[i * kLanes + j] * step[j];
    }
    return;
  }
  if (zero == 0) {
    for (size_t i = 0; i < n; ++i) {
      const float xi = x[i];
      for (size_t j = 0; j < kLanes; ++j) {
        g[i * kLanes + j] += h[i * kLanes + j] * xi * step[j];
      }
    }
    return;
  }
  for (size_t j = 0; j < lanes; ++j) {
    if (step[j] == 0.0f) continue;
    for (size_t i = 0; i < n; ++i) {
      const float hx = x == nullptr ? h[i * kLanes + j] : h[i * kLanes + j] * x[i];
      g[i * kLanes + j] += hx * step[j];
    }
  }
}

// gblinear on the likelihood, trained as libxgboost 1.7.4 trains it with one thread, from
// the v1.7.4 sources: src/gbm/gblinear.cc (DoBoost, LazySumWeights, Pred),
// src/linear/updater_shotgun.cc (Update) and src/linear/coordinate_common.h
// (CoordinateDelta, CoordinateDeltaBias, the gradient sums and residual updates). Each
// round predicts p(. | x) on the training rows with the model so far (PredictForest: the
// same floats as libxgboost's gblinear prediction and softmax), takes LikelihoodGradient,
// then updates, for each class, its bias and then every feature's weight in order, each
// by one step of coordinate descent on the gradient pairs, which it updates as it goes.
// The classes do not interact within a round, so the classes of a group of kLanes take
// their steps side by side here, over the group's pairs alone (libxgboost keeps all of
// them as rows x classes, and its passes over one class stride across all 26 of letter's;
// and one class at a time, each sum is a chain of dependent additions). The same
// arithmetic in the same order for each class: float pairs and products, sums in double.
absl::StatusOr<std::string> TrainGblinearByLikelihood(const TrainingSet& set, int num_arms,
                                                      const XgboostTrainOptions& o) {
  const size_t n = set.size();
  const size_t k = static_cast<size_t>(num_arms);
  const size_t d = static_cast<size_t>(set.num_features);
  const float eta = ParamFloat(o.learning_rate);
  // LazySumWeights: the rows' weights (the copies), summed in double.
  double sum_instance_weight = 0.0;
  for (size_t i = 0; i < n; ++i) sum_instance_weight += set.copies_of(i);
  // LinearTrainParam::DenormalizePenalties keeps them as floats.
  const float lambda = static_cast<float>(ParamFloat(o.l2) * sum_instance_weight);
  const float alpha = static_cast<float>(ParamFloat(o.l1) * sum_instance_weight);
  XgboostForest model;
  model.num_class = num_arms;
  model.num_features = set.num_features;
  model.base_score = 0.5f;
  model.linear_weights.assign((d + 1) * k, 0.0f);  // w[f][class] at f * k + class; biases
  float* w = model.linear_weights.data();
  float* bias = w + d * k;
  std::vector<float> columns(d * n);  // feature-major
  for (size_t i = 0; i < n; ++i) {
    for (size_t f = 0; f < d; ++f) columns[f * n + i] = set.rows[i * d + f];
  }
  std::vector<float> p(n * k), grad(n * k), hess(n * k);
  // One group of kLanes classes' gradient pairs, row by row: g[i * kLanes + j] is row i's
  // for class first + j. Lanes past the last class hold g = 0, h = 1 and never step.
  std::vector<float> g(n * kLanes), h(n * kLanes);
  for (int round = 0; round < o.rounds; ++round) {
    PredictForest(model, set.rows.data(), n, p.data());
    LikelihoodGradients(set, p.data(), k, grad.data(), hess.data());
    for (size_t first = 0; first < k; first += kLanes) {
      const size_t lanes = std::min(kLanes, k - first);
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < kLanes; ++j) {
          g[i * kLanes + j] = j < lanes ? grad[i * k + first + j] : 0.0f;
          h[i * kLanes + j] = j < lanes ? hess[i * k + first + j] : 1.0f;
        }
      }
      // The bias (GetBiasGradientParallel, UpdateBiasResidualParallel). The curvature is
      // at least 1e-6 (LikelihoodGradient), so no pair is skipped as libxgboost skips
      // negative ones.
      double sum_grad[kLanes] = {}, sum_hess[kLanes] = {};
      SumPairs(g.data(), h.data(), nullptr, n, sum_grad, sum_hess);
      float step[kLanes] = {};
      for (size_t j = 0; j < lanes; ++j) {
        step[j] = static_cast<float>(eta * (-sum_grad[j] / sum_hess[j]));
        bias[first + j] += step[j];
      }
      StepPairs(h.data(), nullptr, step, lanes, n, g.data());
      // Each feature in turn (the cyclic feature selector).
      for (size_t f = 0; f < d; ++f) {
        const float* x = &columns[f * n];
        SumPairs(g.data(), h.data(), x, n, sum_grad, sum_hess);
        for (size_t j = 0; j < kLanes; ++j) {
          step[j] = 0.0f;
          if (j >= lanes) continue;
          float& weight = w[f * k + first + j];
          // CoordinateDelta, in double.
          double delta = 0.0;
          if (!(sum_hess[j] < 1e-5f)) {
            const double grad_l2 = sum_grad[j] + static_cast<double>(lambda) * weight;
            const double hess_l2 = sum_hess[j] + static_cast<double>(lambda);
            if (weight - grad_l2 / hess_l2 >= 0) {
              delta = std::max(-(grad_l2 + alpha) / hess_l2, -static_cast<double>(weight));
            } else {
              delta = std::min(-(grad_l2 - alpha) / hess_l2, -static_cast<double>(weight));
            }
          }
          step[j] = static_cast<float>(eta * delta);
          if (step[j] != 0.0f) weight += step[j];
        }
        StepPairs(h.data(), x, step, lanes, n, g.data());
      }
    }
  }
  PredictForest(model, set.rows.data(), n, p.data());
  for (float v : p) {
    if (!std::isfinite(v)) {
      return absl::FailedPreconditionError(
          "training diverged: the model gives non-finite probabilities on its training rows");
    }
  }
  // The model as libxgboost 1.7.4 saves a gblinear model in JSON, then loaded by libxgboost
  // (which trusts it: this function wrote it) and saved as UBJSON, as the trees are.
  std::string json = absl::StrCat(
      "{\"learner\":{\"attributes\":{},\"feature_names\":[],\"feature_types\":[],"
      "\"gradient_booster\":{\"model\":{\"boosted_rounds\":",
      o.rounds, ",\"weights\":[");
  char number[32];
  for (size_t i = 0; i < model.linear_weights.size(); ++i) {
    // Nine significant digits (the float itself when read back), always with an exponent:
    // libxgboost's reader takes "0" for an integer, which a weight may not be.
    std::snprintf(number, sizeof(number), "%s%.8E", i == 0 ? "" : ",",
                  static_cast<double>(model.linear_weights[i]));
    json += number;
  }
  absl::StrAppend(&json,
                  "]},\"name\":\"gblinear\"},\"learner_model_param\":{\"base_score\":\"5E-1\","
                  "\"boost_from_average\":\"1\",\"num_class\":\"",
                  num_arms, "\",\"num_feature\":\"", d,
                  "\",\"num_target\":\"1\"},\"objective\":{\"name\":\"multi:softprob\","
                  "\"softmax_multiclass_param\":{\"num_class\":\"",
                  num_arms, "\"}}},\"version\":[1,7,4]}");
  Handles handles;
  if (XGBoosterCreate(nullptr, 0, &handles.booster) != 0) return XgbError("booster creation");
  if (XGBoosterLoadModelFromBuffer(handles.booster, json.data(), json.size()) != 0) {
    return XgbError("loading the trained gblinear model");
  }
  bst_ulong len = 0;
  const char* bytes = nullptr;
  if (XGBoosterSaveModelToBuffer(handles.booster, "{\"format\": \"ubj\"}", &len, &bytes) != 0) {
    return XgbError("saving the model");
  }
  return std::string(bytes, len);
}

}  // namespace

void TrainingSet::Add(absl::Span<const double> x, int arm, double reward, double propensity) {
  for (double v : x) rows.push_back(XgboostFeature(v));
  labels.push_back(static_cast<float>(arm));
  rewards.push_back(static_cast<float>(reward));
  propensities.push_back(static_cast<float>(propensity));
  if (!copies.empty()) copies.push_back(1.0f);
}

void TrainingSet::AddFrom(const TrainingSet& from, size_t i) {
  if (copies.empty() && !from.copies.empty()) copies.assign(size(), 1.0f);
  const auto row = from.rows.begin() + static_cast<std::ptrdiff_t>(i * from.num_features);
  rows.insert(rows.end(), row, row + from.num_features);
  labels.push_back(from.labels[i]);
  rewards.push_back(from.rewards[i]);
  propensities.push_back(from.propensities[i]);
  if (!copies.empty()) copies.push_back(from.copies_of(i));
}

void TrainingSet::DropOldest(size_t n) {
  n = std::min(n, size());
  const auto drop = static_cast<std::ptrdiff_t>(n);
  rows.erase(rows.begin(), rows.begin() + drop * num_features);
  labels.erase(labels.begin(), labels.begin() + drop);
  rewards.erase(rewards.begin(), rewards.begin() + drop);
  propensities.erase(propensities.begin(), propensities.begin() + drop);
  if (!copies.empty()) copies.erase(copies.begin(), copies.begin() + drop);
}

size_t TrainingSet::TrainedOn(TrainingObjective objective) const {
  if (objective == TrainingObjective::kLikelihood) return size();
  return static_cast<size_t>(
      std::count_if(rewards.begin(), rewards.end(), [](float r) { return r > 0; }));
}

void LikelihoodGradient(absl::Span<const float> p, int arm, float reward, float weight,
                        absl::Span<float> grad, absl::Span<float> hess) {
  static constexpr float kMinHessian = 1e-6f;
  const size_t a = static_cast<size_t>(arm);
  const float r = reward;
  const float pa = p[a];
  const float odds = pa / std::max(1.0f - pa, kMinHessian);  // p_a / (1 - p_a)
  for (size_t c = 0; c < p.size(); ++c) {
    const float curvature = 2.0f * p[c] * (1.0f - p[c]);
    float g, h;
    if (c == a) {
      g = r * (pa - 1.0f) + (1.0f - r) * pa;
      h = curvature;
    } else {
      g = r * p[c] - (1.0f - r) * p[c] * odds;
      h = r * curvature + (1.0f - r) * curvature * odds;
    }
    grad[c] = weight * g;
    hess[c] = std::max(weight * h, kMinHessian);
  }
}

TrainingSet Bootstrap(const TrainingSet& set, TrainingObjective objective,
                      absl::BitGenRef gen) {
  std::vector<size_t> pool;
  pool.reserve(set.size());
  for (size_t i = 0; i < set.size(); ++i) {
    if (objective == TrainingObjective::kLikelihood || set.rewards[i] > 0) pool.push_back(i);
  }
  // The draws of before (one Uniform per draw), counted instead of copied.
  std::vector<float> draws(pool.size(), 0.0f);
  for (size_t i = 0; i < pool.size(); ++i) {
    draws[absl::Uniform<size_t>(gen, 0, pool.size())] += 1.0f;
  }
  TrainingSet out;
  out.num_features = set.num_features;
  out.copies.reserve(pool.size());
  for (size_t j = 0; j < pool.size(); ++j) {
    if (draws[j] == 0) continue;
    out.AddFrom(set, pool[j]);
    if (out.copies.empty()) out.copies.assign(out.size(), 1.0f);
    out.copies.back() *= draws[j];
  }
  return out;
}

double RelativeTrainingCost(const XgboostTrainOptions& options) {
  if (options.linear) return 3.0 * options.rounds;
  return static_cast<double>(options.rounds) * (options.max_depth + 4);
}

bool FitRoundsToModelLimits(int num_arms, const XgboostModelLimits& limits,
                            XgboostTrainOptions* options) {
  if (options->linear || num_arms < 1 || options->rounds < 1) return false;
  const int64_t arms = num_arms;
  const int64_t nodes_per_tree = (int64_t{2} << std::clamp(options->max_depth, 0, 40)) - 1;
  const int64_t fit = std::max<int64_t>(
      1, std::min(limits.max_trees / arms, limits.max_total_nodes / (arms * nodes_per_tree)));
  if (options->rounds <= fit) return false;
  options->rounds = static_cast<int>(fit);
  return true;
}

bool FitTreeRecipeToMemory(int num_features, int64_t budget_bytes,
                           XgboostTrainOptions* options) {
  if (options->linear || num_features < 1) return false;
  // The largest histogram, per bin, of a tree of depth `depth`: every node's, every feature
  // (in double: no overflow at any depth).
  const auto per_bin = [&](int depth) {
    return (std::ldexp(2.0, std::clamp(depth, 0, 1000)) - 1) * num_features * 16;
  };
  const double budget = static_cast<double>(budget_bytes);
  const int depth = options->max_depth, bins = options->max_bin;
  if (per_bin(depth) * bins <= budget) return false;
  while (options->max_depth > 1 && per_bin(options->max_depth) * kMinTrainingBins > budget) {
    --options->max_depth;
  }
  const double most = std::min(bins, 256), least = std::min<double>(kMinTrainingBins, most);
  options->max_bin = static_cast<int>(
      std::clamp(std::floor(budget / per_bin(options->max_depth)), least, most));
  return options->max_depth != depth || options->max_bin != bins;
}

XgboostTrainOptions SampleExpertOptions(bool linear, int threads, absl::BitGenRef gen) {
  XgboostTrainOptions train;
  train.linear = linear;
  train.threads = threads;
  train.seed = absl::Uniform<uint32_t>(gen);
  if (linear) {
    static constexpr double kL2[] = {0.01, 0.1, 1.0, 10.0};
    train.l2 = kL2[absl::Uniform<int>(gen, 0, 4)];
    train.rounds = 30;
    // gblinear's coordinate descent on unscaled features diverged at 0.5 (shuttle).
    train.learning_rate = 0.1;
  } else {
    static constexpr int kDepth[] = {3, 6, 10};
    static constexpr int kRounds[] = {10, 20, 40};
    train.max_depth = kDepth[absl::Uniform<int>(gen, 0, 3)];
    train.rounds = kRounds[absl::Uniform<int>(gen, 0, 3)];
    train.learning_rate = 0.3;
    train.colsample_bytree = absl::Bernoulli(gen, 0.5) ? 0.6 : 0.8;
  }
  return train;
}

absl::StatusOr<std::string> TrainXgboostModel(const TrainingSet& set, int num_arms,
                                              const XgboostTrainOptions& o) {
  if (num_arms < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("training needs at least 2 arms, got ", num_arms));
  }
  if (set.num_features < 1) {
    // A problem without features: a model could not depend on the context.
    return absl::InvalidArgumentError("training needs at least one feature, the set has none");
  }
  if (set.rows.size() != set.size() * set.num_features ||
      set.rewards.size() != set.size() || set.propensities.size() != set.size() ||
      (!set.copies.empty() && set.copies.size() != set.size())) {
    return absl::InvalidArgumentError(
        "training set rows, labels, rewards, propensities and copies disagree in size");
  }
  for (size_t i = 0; i < set.size(); ++i) {
    if (!(set.labels[i] >= 0 && set.labels[i] < num_arms)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "training label ", set.labels[i], " is not an arm in [0, ", num_arms, ")"));
    }
    if (!(set.rewards[i] >= 0 && set.rewards[i] <= 1) ||
        !(set.propensities[i] > 0 && set.propensities[i] <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "training sample ", i, " has reward ", set.rewards[i], " and propensity ",
          set.propensities[i], "; they must be in [0, 1] and (0, 1]"));
    }
    if (!(set.copies_of(i) >= 1 && std::isfinite(set.copies_of(i)))) {
      return absl::InvalidArgumentError(absl::StrCat("training sample ", i, " has ",
                                                     set.copies_of(i), " copies, not >= 1"));
    }
  }
  if (o.rounds < 1 || o.max_depth < 1 || o.max_bin < 2 || !(o.learning_rate > 0) ||
      o.threads < 1 ||
      !(o.colsample_bytree > 0 && o.colsample_bytree <= 1) ||
      !(o.subsample > 0 && o.subsample <= 1) || !(o.l1 >= 0) || !(o.l2 >= 0)) {
    return absl::InvalidArgumentError("invalid xgboost training options");
  }
  const bool likelihood = o.objective == TrainingObjective::kLikelihood;
  // The matrix's rows: every sample for the likelihood; the rewarded ones, weighted
  // r / p, for the importance-weighted classifier. A set of rewarded samples only (what
  // the server reads for that objective, and its bootstraps) is used as it is.
  TrainingSet rewarded;
  const bool copy = !likelihood && set.TrainedOn(o.objective) < set.size();
  if (copy) {
    rewarded.num_features = set.num_features;
    for (size_t i = 0; i < set.size(); ++i) {
      if (set.rewards[i] > 0) rewarded.AddFrom(set, i);
    }
  }
  const TrainingSet& train = copy ? rewarded : set;
  if (o.linear && likelihood && o.threads == 1 && !o.libxgboost_linear && train.size() > 0) {
    return TrainGblinearByLikelihood(train, num_arms, o);
  }
  // XGBoost's row weights. The importance-weighted classifier's objective multiplies each
  // row's gradient by its weight, r / p per copy. The likelihood's gradients carry their
  // own weights (BoostByLikelihood), and XGBoost uses these only to weigh the rows in its
  // quantile sketch (the histogram's bins), as the copies would.
  std::vector<float> weights;
  if (!likelihood || !train.copies.empty()) {
    weights.reserve(train.size());
    for (size_t i = 0; i < train.size(); ++i) {
      weights.push_back(likelihood ? train.copies_of(i)
                                   : train.copies_of(i) * train.rewards[i] / train.propensities[i]);
    }
  }
  if (train.size() == 0) {
    return absl::InvalidArgumentError(likelihood ? "training set is empty"
                                                 : "training set has no sample with reward > 0");
  }
  Handles h;
  if (XGDMatrixCreateFromMat(train.rows.data(), train.size(), train.num_features, NAN,
                             &h.matrix) != 0) {
    return XgbError("DMatrix creation");
  }
  if (XGDMatrixSetFloatInfo(h.matrix, "label", train.labels.data(), train.size()) != 0 ||
      (!weights.empty() &&
       XGDMatrixSetFloatInfo(h.matrix, "weight", weights.data(), train.size()) != 0)) {
    return XgbError("setting labels and weights");
  }
  if (XGBoosterCreate(&h.matrix, 1, &h.booster) != 0) return XgbError("booster creation");
  const std::pair<std::string, std::string> params[] = {
      {"objective", "multi:softprob"},
      {"num_class", std::to_string(num_arms)},
      {"booster", o.linear ? "gblinear" : "gbtree"},
      {"max_depth", std::to_string(o.max_depth)},
      {"eta", absl::StrCat(o.learning_rate)},
      {"colsample_bytree", absl::StrCat(o.colsample_bytree)},
      {"subsample", absl::StrCat(o.subsample)},
      {"lambda", absl::StrCat(o.l2)},
      {"alpha", absl::StrCat(o.l1)},
      {"nthread", std::to_string(o.threads)},
      {"seed", std::to_string(o.seed % 2147483647)},
      {"verbosity", "0"},
      {"tree_method", "hist"},
      {"max_bin", std::to_string(o.max_bin)},
  };
  for (const auto& [name, value] : params) {
    if (o.linear && (name == "max_depth" || name == "colsample_bytree" || name == "subsample" ||
                     name == "tree_method" || name == "max_bin")) {
      continue;
    }
    if (XGBoosterSetParam(h.booster, name.c_str(), value.c_str()) != 0) {
      return XgbError("setting a parameter");
    }
  }
  if (likelihood) {
    DECISION_RETURN_IF_ERROR(BoostByLikelihood(h.booster, h.matrix, train, num_arms, o.rounds));
  } else {
    for (int i = 0; i < o.rounds; ++i) {
      if (XGBoosterUpdateOneIter(h.booster, i, h.matrix) != 0) return XgbError("training");
    }
  }
  // A booster can diverge (gblinear on large unscaled features): refuse a model that does
  // not give finite probabilities on its own training rows.
  {
    static constexpr char kPredict[] =
        "{\"type\": 0, \"training\": false, \"iteration_begin\": 0, \"iteration_end\": 0, "
        "\"strict_shape\": false}";
    const bst_ulong* shape = nullptr;
    bst_ulong dims = 0;
    const float* out = nullptr;
    if (XGBoosterPredictFromDMatrix(h.booster, h.matrix, kPredict, &shape, &dims, &out) != 0) {
      return XgbError("checking the trained model");
    }
    const size_t values = train.size() * static_cast<size_t>(num_arms);
    for (size_t i = 0; i < values; ++i) {
      if (!std::isfinite(out[i])) {
        return absl::FailedPreconditionError(
            "training diverged: the model gives non-finite probabilities on its training rows");
      }
    }
  }
  bst_ulong len = 0;
  const char* bytes = nullptr;
  if (XGBoosterSaveModelToBuffer(h.booster, "{\"format\": \"ubj\"}", &len, &bytes) != 0) {
    return XgbError("saving the model");
  }
  return std::string(bytes, len);
}

}  // namespace decision
