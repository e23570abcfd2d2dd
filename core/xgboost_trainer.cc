#include "core/xgboost_trainer.h"

#include <xgboost/c_api.h>

#include <cmath>
#include <string>

#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "core/xgboost_expert.h"

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

}  // namespace

void TrainingSet::Add(absl::Span<const double> x, int arm, double reward, double propensity) {
  if (!(reward > 0.0)) return;
  for (double v : x) rows.push_back(XgboostFeature(v));
  labels.push_back(static_cast<float>(arm));
  weights.push_back(static_cast<float>(reward / propensity));
}

TrainingSet Bootstrap(const TrainingSet& set, absl::BitGenRef gen) {
  TrainingSet out;
  out.num_features = set.num_features;
  const size_t n = set.size();
  out.rows.reserve(set.rows.size());
  out.labels.reserve(n);
  out.weights.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t pick = absl::Uniform<size_t>(gen, 0, n);
    out.rows.insert(out.rows.end(), set.rows.begin() + pick * set.num_features,
                    set.rows.begin() + (pick + 1) * set.num_features);
    out.labels.push_back(set.labels[pick]);
    out.weights.push_back(set.weights[pick]);
  }
  return out;
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
  if (set.size() == 0) {
    return absl::InvalidArgumentError("training set is empty (no sample with reward > 0)");
  }
  if (num_arms < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("training needs at least 2 arms, got ", num_arms));
  }
  if (set.num_features < 1 || set.rows.size() != set.size() * set.num_features ||
      set.weights.size() != set.size()) {
    return absl::InvalidArgumentError("training set rows, labels and weights disagree in size");
  }
  for (float label : set.labels) {
    if (!(label >= 0 && label < num_arms)) {
      return absl::InvalidArgumentError(
          absl::StrCat("training label ", label, " is not an arm in [0, ", num_arms, ")"));
    }
  }
  if (o.rounds < 1 || o.max_depth < 1 || !(o.learning_rate > 0) || o.threads < 1 ||
      !(o.colsample_bytree > 0 && o.colsample_bytree <= 1) ||
      !(o.subsample > 0 && o.subsample <= 1) || !(o.l1 >= 0) || !(o.l2 >= 0)) {
    return absl::InvalidArgumentError("invalid xgboost training options");
  }
  Handles h;
  if (XGDMatrixCreateFromMat(set.rows.data(), set.size(), set.num_features, NAN, &h.matrix) !=
      0) {
    return XgbError("DMatrix creation");
  }
  if (XGDMatrixSetFloatInfo(h.matrix, "label", set.labels.data(), set.size()) != 0 ||
      XGDMatrixSetFloatInfo(h.matrix, "weight", set.weights.data(), set.size()) != 0) {
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
  };
  for (const auto& [name, value] : params) {
    if (o.linear && (name == "max_depth" || name == "colsample_bytree" || name == "subsample" ||
                     name == "tree_method")) {
      continue;
    }
    if (XGBoosterSetParam(h.booster, name.c_str(), value.c_str()) != 0) {
      return XgbError("setting a parameter");
    }
  }
  for (int i = 0; i < o.rounds; ++i) {
    if (XGBoosterUpdateOneIter(h.booster, i, h.matrix) != 0) return XgbError("training");
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
    const size_t values = set.size() * static_cast<size_t>(num_arms);
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
