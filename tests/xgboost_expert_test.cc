// Tests of core/xgboost_expert.h. The models are trained here, through libxgboost's C API,
// on a small synthetic problem with fixed seeds: 300 contexts of 4 features uniform in
// [0, 1), and the label (arm) is the index of the largest of features 0..2 (feature 3 is
// noise). Training takes a few milliseconds; each model is trained once per process.
#include "tests/xgboost_training_data.h"
#include "core/xgboost_expert.h"

#include <xgboost/c_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/expert.h"
#include "core/xgboost_model_check.h"
#include "tests/read_syscalls.h"

namespace decision {
namespace {

using ::testing::HasSubstr;

constexpr int kRows = xgb_test::kXgbRows;
constexpr int kFeatures = xgb_test::kXgbFeatures;
constexpr int kClasses = xgb_test::kXgbClasses;
using TrainingData = xgb_test::XgbTrainingData;
const TrainingData& Data() { return xgb_test::XgbData(); }


using Params = std::vector<std::pair<std::string, std::string>>;

// Trains a booster on Data() (labels mapped through `binary_labels` if set) and returns its
// model bytes in `format` ("json", "ubj" or "deprecated"). Returns "" and records a test
// failure if any libxgboost call fails.
std::string TrainModel(const Params& params, const std::string& format, int rounds = 10,
                       bool binary_labels = false) {
  const TrainingData& data = Data();
  std::vector<float> labels = data.labels;
  if (binary_labels) {
    for (float& y : labels) y = (y == 0.0f) ? 1.0f : 0.0f;
  }
  DMatrixHandle dtrain = nullptr;
  BoosterHandle booster = nullptr;
  std::string bytes;
  auto ok = [](int rc, const char* what) {
    if (rc != 0) ADD_FAILURE() << what << " failed: " << XGBGetLastError();
    return rc == 0;
  };
  if (ok(XGDMatrixCreateFromMat(data.features.data(), kRows, kFeatures,
                                std::numeric_limits<float>::quiet_NaN(), &dtrain),
         "XGDMatrixCreateFromMat") &&
      ok(XGDMatrixSetFloatInfo(dtrain, "label", labels.data(), kRows),
         "XGDMatrixSetFloatInfo") &&
      ok(XGBoosterCreate(&dtrain, 1, &booster), "XGBoosterCreate")) {
    bool params_ok = true;
    for (const auto& [name, value] : params) {
      params_ok = params_ok && ok(XGBoosterSetParam(booster, name.c_str(), value.c_str()),
                                  name.c_str());
    }
    bool trained = params_ok;
    for (int iter = 0; trained && iter < rounds; ++iter) {
      trained = ok(XGBoosterUpdateOneIter(booster, iter, dtrain), "XGBoosterUpdateOneIter");
    }
    const std::string config = "{\"format\": \"" + format + "\"}";
    bst_ulong len = 0;
    const char* buffer = nullptr;
    if (trained && ok(XGBoosterSaveModelToBuffer(booster, config.c_str(), &len, &buffer),
                      "XGBoosterSaveModelToBuffer")) {
      bytes.assign(buffer, len);  // the buffer belongs to the booster: copy before freeing
    }
  }
  if (booster != nullptr) XGBoosterFree(booster);
  if (dtrain != nullptr) XGDMatrixFree(dtrain);
  return bytes;
}

// The bytes converted to UBJSON (trusted here: this process trained them), or "" after
// recording a failure.
std::string MustConvert(const std::string& bytes) {
  absl::StatusOr<std::string> converted = ConvertXgboostModelToUbjson(bytes);
  if (!converted.ok()) {
    ADD_FAILURE() << converted.status();
    return "";
  }
  return *std::move(converted);
}

Params SoftprobTreeParams() {
  return {{"booster", "gbtree"}, {"objective", "multi:softprob"}, {"num_class", "3"},
          {"max_depth", "3"},    {"eta", "0.3"},                  {"nthread", "1"},
          {"seed", "1"},         {"verbosity", "0"}};
}

// Every model the tests use, trained once per process.
struct Models {
  std::string tree_json;
  std::string tree_ubj;
  std::string tree_legacy;  // XGBoost's deprecated binary format
  std::string tree_legacy_with_metric;  // the same, trained with eval_metric set
  // The legacy models as the sandbox hands them over: through ConvertXgboostModelToUbjson.
  std::string tree_legacy_converted;
  std::string tree_legacy_with_metric_converted;
  std::string linear_json;
  std::string binary_logistic_json;
  std::string softmax_json;
};

const Models& GetModels() {
  static const Models* const models = [] {
    auto* m = new Models;
    m->tree_json = TrainModel(SoftprobTreeParams(), "json");
    m->tree_ubj = TrainModel(SoftprobTreeParams(), "ubj");
    m->tree_legacy = TrainModel(SoftprobTreeParams(), "deprecated");
    Params with_metric = SoftprobTreeParams();
    with_metric.emplace_back("eval_metric", "mlogloss");
    m->tree_legacy_with_metric = TrainModel(with_metric, "deprecated");
    m->tree_legacy_converted = MustConvert(m->tree_legacy);
    m->tree_legacy_with_metric_converted = MustConvert(m->tree_legacy_with_metric);
    m->linear_json = TrainModel({{"booster", "gblinear"},
                                 {"objective", "multi:softprob"},
                                 {"num_class", "3"},
                                 {"eta", "0.5"},
                                 {"nthread", "1"},
                                 {"seed", "1"},
                                 {"verbosity", "0"}},
                                "json");
    m->binary_logistic_json = TrainModel({{"objective", "binary:logistic"},
                                          {"max_depth", "3"},
                                          {"nthread", "1"},
                                          {"seed", "1"},
                                          {"verbosity", "0"}},
                                         "json", 5, /*binary_labels=*/true);
    Params softmax = SoftprobTreeParams();
    softmax[1].second = "multi:softmax";
    m->softmax_json = TrainModel(softmax, "json", 5);
    return m;
  }();
  return *models;
}

void ExpectInvalid(const absl::Status& status, const std::string& word) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(word)) << status;
}

void ExpectInvalidModel(int num_arms, int num_features, const std::string& bytes,
                        const std::string& word, double smoothing = kDefaultSmoothing) {
  absl::StatusOr<std::unique_ptr<Expert>> made =
      MakeXgboostExpert(num_arms, num_features, bytes, smoothing);
  EXPECT_FALSE(made.ok()) << "a model of " << bytes.size() << " bytes was accepted";
  ExpectInvalid(made.status(), word);
}

std::unique_ptr<Expert> MustLoad(const std::string& bytes, double smoothing = kDefaultSmoothing,
                                 int num_arms = kClasses, int num_features = kFeatures) {
  EXPECT_FALSE(bytes.empty()) << "training failed";
  absl::StatusOr<std::unique_ptr<Expert>> made =
      MakeXgboostExpert(num_arms, num_features, bytes, smoothing);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return nullptr;
  return std::move(made).value();
}

std::vector<double> MustPredict(const Expert& expert, const std::vector<double>& x) {
  std::vector<double> probs(expert.num_arms(), -1.0);
  const absl::Status status = expert.Predict(x, absl::MakeSpan(probs));
  EXPECT_TRUE(status.ok()) << status;
  return probs;
}

// Sums to 1 within 1e-9 (the booster computes in float; the expert renormalises in double)
// and every arm is at least the smoothing floor eta / K.
void ExpectSmoothedDistribution(const std::vector<double>& probs, double eta) {
  double total = 0.0;
  for (size_t v = 0; v < probs.size(); ++v) {
    EXPECT_TRUE(std::isfinite(probs[v])) << "arm " << v;
    EXPECT_GE(probs[v], eta / probs.size() - 1e-15) << "arm " << v;
    EXPECT_LE(probs[v], 1.0) << "arm " << v;
    total += probs[v];
  }
  EXPECT_NEAR(total, 1.0, 1e-9);
}

int ArgMax(const std::vector<double>& probs) {
  return static_cast<int>(std::max_element(probs.begin(), probs.end()) - probs.begin());
}

// ---------------------------------------------------------------------------------------
// Loading and predicting.

class TreeModelTest : public testing::TestWithParam<std::string> {
 protected:
  const std::string& Bytes() const {
    const Models& m = GetModels();
    if (GetParam() == "json") return m.tree_json;
    if (GetParam() == "ubj") return m.tree_ubj;
    return m.tree_legacy_converted;  // "deprecated": loaded after conversion
  }
};

INSTANTIATE_TEST_SUITE_P(Formats, TreeModelTest, testing::Values("json", "ubj", "deprecated"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST_P(TreeModelTest, LoadsAndPredictsSmoothedDistributions) {
  std::unique_ptr<Expert> expert = MustLoad(Bytes());
  ASSERT_NE(expert, nullptr);
  EXPECT_STREQ(expert->kind(), "xgboost");
  EXPECT_EQ(expert->num_arms(), kClasses);
  EXPECT_EQ(expert->num_features(), kFeatures);
  EXPECT_EQ(expert->smoothing(), kDefaultSmoothing);
  for (int i = 0; i < kRows; i += 7) {
    ExpectSmoothedDistribution(MustPredict(*expert, Data().Row(i)), kDefaultSmoothing);
  }
}

TEST_P(TreeModelTest, SmoothingMixesWithUniform) {
  std::unique_ptr<Expert> raw = MustLoad(Bytes(), 0.0);
  ASSERT_NE(raw, nullptr);
  for (double eta : {0.05, 0.3, 1.0}) {
    std::unique_ptr<Expert> smoothed = MustLoad(Bytes(), eta);
    ASSERT_NE(smoothed, nullptr);
    for (int i = 0; i < kRows; i += 11) {
      const std::vector<double> p0 = MustPredict(*raw, Data().Row(i));
      const std::vector<double> p_eta = MustPredict(*smoothed, Data().Row(i));
      ExpectSmoothedDistribution(p0, 0.0);
      ExpectSmoothedDistribution(p_eta, eta);
      for (int v = 0; v < kClasses; ++v) {
        EXPECT_NEAR(p_eta[v], (1 - eta) * p0[v] + eta / kClasses, 1e-9)
            << "eta=" << eta << " row " << i << " arm " << v;
      }
    }
  }
}

TEST_P(TreeModelTest, ArgmaxAgreesWithTheLabelOnTrainingData) {
  std::unique_ptr<Expert> expert = MustLoad(Bytes());
  ASSERT_NE(expert, nullptr);
  int correct = 0;
  for (int i = 0; i < kRows; ++i) {
    if (ArgMax(MustPredict(*expert, Data().Row(i))) == static_cast<int>(Data().labels[i])) {
      ++correct;
    }
  }
  // 10 rounds of depth-3 trees on a noiseless 3-class problem fit the training set well;
  // 0.8 leaves a wide margin.
  EXPECT_GT(static_cast<double>(correct) / kRows, 0.8) << correct << " / " << kRows;
}

TEST_P(TreeModelTest, BatchEqualsSinglePredictions) {
  std::unique_ptr<Expert> expert = MustLoad(Bytes());
  ASSERT_NE(expert, nullptr);
  constexpr int kBatch = 25;
  std::vector<double> rows(Data().features.begin(),
                           Data().features.begin() + kBatch * kFeatures);
  std::vector<double> batch(kBatch * kClasses, -1.0);
  ASSERT_TRUE(expert->PredictBatch(rows, kBatch, absl::MakeSpan(batch)).ok());
  for (int i = 0; i < kBatch; ++i) {
    const std::vector<double> single = MustPredict(*expert, Data().Row(i));
    for (int v = 0; v < kClasses; ++v) {
      EXPECT_EQ(batch[i * kClasses + v], single[v]) << "row " << i << " arm " << v;
    }
  }
}

// The compiled forest (core/xgboost_forest.h) gives the same floats as libxgboost's
// predictor: bit for bit, on deep and shallow models, in both formats, on training rows,
// random rows, rows on the split conditions themselves and rows far outside the data.
// Rows to compare predictors on: the training rows, random ones around them, rows mixing
// the training data's values, and extremes (margins that overflow float included).
std::vector<double> ComparisonRows() {
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<double> u(-0.5, 1.5);
  std::vector<double> rows;
  for (int i = 0; i < kRows; ++i) {
    const std::vector<double> x = Data().Row(i);
    rows.insert(rows.end(), x.begin(), x.end());
  }
  for (int i = 0; i < 500; ++i) {
    for (int f = 0; f < kFeatures; ++f) rows.push_back(u(gen));
  }
  for (int i = 0; i < 50; ++i) {  // every feature at a value the training data has
    for (int f = 0; f < kFeatures; ++f) {
      rows.push_back(static_cast<double>(Data().features[(i * 7 % kRows) * kFeatures + f]));
    }
  }
  for (double far : {-1e30, 1e30, 0.0, -0.0, 1e6, -3.5e4}) {
    for (int f = 0; f < kFeatures; ++f) rows.push_back(far);
  }
  return rows;
}

// The compiled and libxgboost's predictions of `bytes` on `rows`, as a batch and one row
// at a time, are the same doubles.
void ExpectCompiledPredictsAsLibxgboost(const std::string& bytes, const std::vector<double>& rows,
                                        const std::string& what) {
  const size_t n = rows.size() / kFeatures;
  auto compiled = MakeXgboostExpert(kClasses, kFeatures, bytes, 0.0);
  auto reference =
      MakeXgboostExpert(kClasses, kFeatures, bytes, 0.0, XgboostPredictor::kLibxgboost);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::vector<double> got(n * kClasses), want(n * kClasses);
  ASSERT_TRUE((*compiled)->PredictBatch(rows, n, absl::MakeSpan(got)).ok());
  ASSERT_TRUE((*reference)->PredictBatch(rows, n, absl::MakeSpan(want)).ok());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << what << ", row " << i / kClasses << " class " << i % kClasses;
  }
  // One row at a time too (the forest's blocks of rows change nothing).
  for (size_t r = 0; r < n; r += 37) {
    const std::vector<double> x(rows.begin() + r * kFeatures, rows.begin() + (r + 1) * kFeatures);
    const std::vector<double> one = MustPredict(**compiled, x);
    for (int v = 0; v < kClasses; ++v) ASSERT_EQ(one[v], want[r * kClasses + v]) << what;
  }
}

TEST(XgboostExpert, CompiledForestPredictsExactlyWhatLibxgboostPredicts) {
  const std::vector<double> rows = ComparisonRows();
  for (const auto& [depth, rounds, extra] :
       {std::tuple<const char*, int, const char*>{"3", 10, "1"}, {"6", 20, "0.8"},
        {"10", 40, "0.6"}}) {
    Params params = SoftprobTreeParams();
    params.push_back({"max_depth", depth});
    params.push_back({"colsample_bytree", extra});
    params.push_back({"base_score", "0.3"});
    for (const std::string format : {"json", "ubj"}) {
      const std::string bytes = TrainModel(params, format, rounds);
      ASSERT_FALSE(bytes.empty());
      // Rows whose features sit exactly on this model's split conditions.
      XgboostForest forest;
      ASSERT_TRUE(CheckXgboostModel(bytes, kClasses, kFeatures, {}, &forest).ok());
      ASSERT_GT(forest.roots.size(), 0u);
      std::vector<double> model_rows = rows;
      for (size_t i = 0; i < forest.nodes.size(); i += 3) {
        if (std::isinf(forest.nodes[i].condition)) continue;  // a leaf
        for (int f = 0; f < kFeatures; ++f) model_rows.push_back(forest.nodes[i].condition);
      }
      ExpectCompiledPredictsAsLibxgboost(bytes, model_rows,
                                         absl::StrCat("depth ", depth, " ", format));
    }
  }
}

// gblinear: libxgboost predicts it through a DMatrix per call; the compiled weights give
// the same floats. Penalties and rates that make large and small weights, a base_score
// other than 0.5, both formats.
TEST(XgboostExpert, CompiledGblinearPredictsExactlyWhatLibxgboostPredicts) {
  const std::vector<double> rows = ComparisonRows();
  for (const auto& [eta, lambda, rounds] :
       {std::tuple<const char*, const char*, int>{"0.5", "0", 10}, {"0.1", "1", 30},
        {"1", "0.01", 40}}) {
    const Params params = {{"booster", "gblinear"}, {"objective", "multi:softprob"},
                           {"num_class", "3"},      {"eta", eta},
                           {"lambda", lambda},      {"base_score", "0.3"},
                           {"nthread", "1"},        {"verbosity", "0"}};
    for (const std::string format : {"json", "ubj"}) {
      const std::string bytes = TrainModel(params, format, rounds);
      ASSERT_FALSE(bytes.empty());
      XgboostForest compiled;
      ASSERT_TRUE(CheckXgboostModel(bytes, kClasses, kFeatures, {}, &compiled).ok());
      ASSERT_EQ(compiled.linear_weights.size(), static_cast<size_t>((kFeatures + 1) * kClasses));
      EXPECT_TRUE(compiled.roots.empty());
      ExpectCompiledPredictsAsLibxgboost(bytes, rows,
                                         absl::StrCat("eta ", eta, " lambda ", lambda, " ", format));
    }
  }
}

TEST(XgboostExpert, AllFormatsPredictTheSame) {
  std::unique_ptr<Expert> json = MustLoad(GetModels().tree_json);
  std::unique_ptr<Expert> ubj = MustLoad(GetModels().tree_ubj);
  ASSERT_NE(json, nullptr);
  ASSERT_NE(ubj, nullptr);
  for (int i = 0; i < kRows; i += 13) {
    const std::vector<double> a = MustPredict(*json, Data().Row(i));
    const std::vector<double> b = MustPredict(*ubj, Data().Row(i));
    for (int v = 0; v < kClasses; ++v) EXPECT_NEAR(a[v], b[v], 1e-7) << i;
  }
}

// BUG (core/xgboost_expert.cc, MakeXgboostExpert): the objective is read as the first
// "name" after the first "objective": key of the saved config. The first such key is
// learner_train_param's string "objective":"multi:softprob"; the legacy binary format keeps
// the evaluation metrics, so "metrics":[{"name":"mlogloss"}] comes next and a valid
// multi:softprob model is rejected as "the model's objective is 'mlogloss'". Enable once
// fixed.
TEST(XgboostExpert, LegacyModelTrainedWithEvalMetricLoads) {
  std::unique_ptr<Expert> expert = MustLoad(GetModels().tree_legacy_with_metric_converted);
  ASSERT_NE(expert, nullptr);
  ExpectSmoothedDistribution(MustPredict(*expert, Data().Row(0)), kDefaultSmoothing);
}

// libxgboost's legacy binary reader is not checked: the serving process refuses the
// format, and the sandbox converts it (ConvertXgboostModelToUbjson) into bytes that are.
TEST(XgboostExpert, LegacyModelsLoadOnlyAfterConversion) {
  ExpectInvalidModel(3, 4, GetModels().tree_legacy, "legacy binary");
  ExpectInvalidModel(3, 4, GetModels().tree_legacy_with_metric, "ConvertXgboostModelToUbjson");
  std::unique_ptr<Expert> converted = MustLoad(GetModels().tree_legacy_converted);
  std::unique_ptr<Expert> json = MustLoad(GetModels().tree_json);
  ASSERT_NE(converted, nullptr);
  ASSERT_NE(json, nullptr);
  for (int i = 0; i < kRows; i += 13) {
    EXPECT_EQ(MustPredict(*converted, Data().Row(i)), MustPredict(*json, Data().Row(i))) << i;
  }
}

TEST(XgboostExpert, GblinearModelLoadsAndPredictsADistribution) {
  std::unique_ptr<Expert> expert = MustLoad(GetModels().linear_json, 0.1);
  ASSERT_NE(expert, nullptr);
  for (int i = 0; i < kRows; i += 17) {
    ExpectSmoothedDistribution(MustPredict(*expert, Data().Row(i)), 0.1);
  }
}

// BUG (core/xgboost_expert.cc, XgboostExpert::PredictRaw): for n = 0 libxgboost 1.7 reports
// the output shape as [0, 0], the shape check wants [0, K], and an empty batch (which the
// other experts accept) comes back INTERNAL "unexpected shape". Enable once fixed.
TEST(XgboostExpert, EmptyBatchIsOk) {
  std::unique_ptr<Expert> expert = MustLoad(GetModels().tree_json);
  ASSERT_NE(expert, nullptr);
  const absl::Status status = expert->PredictBatch({}, 0, {});
  EXPECT_TRUE(status.ok()) << status;
}

// 1e300 is a finite double (ValidateContext accepts it, so a Choose may carry it) but
// overflows the float the booster reads; libxgboost refuses an infinite feature, and the
// expert used to answer INTERNAL (found by tests/fuzz/xgboost_model_fuzz). Beyond float's
// range a feature saturates to +-FLT_MAX (XgboostFeature), for trees and gblinear alike.
TEST(XgboostExpert, FeaturesBeyondFloatRangePredictAsTheLargestFloats) {
  constexpr double kMax = std::numeric_limits<float>::max();
  for (const std::string* model : {&GetModels().tree_json, &GetModels().linear_json}) {
    std::unique_ptr<Expert> expert = MustLoad(*model);
    ASSERT_NE(expert, nullptr);
    for (const auto& [x, saturated] :
         {std::pair<std::vector<double>, std::vector<double>>{{1e300, 0.5, 0.5, 0.5},
                                                              {kMax, 0.5, 0.5, 0.5}},
          {{-1e300, 1e300, 0, 0}, {-kMax, kMax, 0, 0}},
          {{1e-320, 0.5, -3.5e38, 0.5}, {0, 0.5, -kMax, 0.5}}}) {
      std::vector<double> probs(kClasses);
      const absl::Status status = expert->Predict(x, absl::MakeSpan(probs));
      ASSERT_TRUE(status.ok()) << status;
      ExpectSmoothedDistribution(probs, kDefaultSmoothing);
      EXPECT_EQ(probs, MustPredict(*expert, saturated));
    }
  }
  EXPECT_EQ(XgboostFeature(1e300), std::numeric_limits<float>::max());
  EXPECT_EQ(XgboostFeature(-1e300), -std::numeric_limits<float>::max());
  EXPECT_EQ(XgboostFeature(0.25), 0.25f);
}

// ---------------------------------------------------------------------------------------
// Bad model bytes: INVALID_ARGUMENT with a message, never a crash. CheckXgboostModel
// refuses them before libxgboost sees them, so the messages start "xgboost model: "
// (tests/xgboost_model_check_test.cc checks each defect).

TEST(XgboostExpert, RejectsEmptyBytes) { ExpectInvalidModel(3, 4, "", "empty"); }

TEST(XgboostExpert, RejectsGarbageBytes) {
  std::mt19937 gen(7);
  for (size_t size : {1, 3, 16, 100, 1000, 5000}) {
    std::string bytes(size, '\0');
    for (char& c : bytes) c = static_cast<char>(gen() & 0xff);
    ExpectInvalidModel(3, 4, bytes, "xgboost model");
    // The same garbage behind '{', which sends libxgboost to its JSON / UBJSON readers.
    bytes[0] = '{';
    ExpectInvalidModel(3, 4, bytes, "xgboost model");
  }
  ExpectInvalidModel(3, 4, "not a model at all", "xgboost model");
}

TEST(XgboostExpert, RejectsTruncatedModels) {
  const Models& m = GetModels();
  for (const std::string* bytes : {&m.tree_json, &m.tree_ubj, &m.tree_legacy, &m.linear_json}) {
    ASSERT_FALSE(bytes->empty());
    ExpectInvalidModel(3, 4, bytes->substr(0, bytes->size() / 2), "xgboost model");
    ExpectInvalidModel(3, 4, bytes->substr(0, bytes->size() - 1), "xgboost model");
  }
}

TEST(XgboostExpert, RejectsJsonThatIsNotAModel) {
  for (const char* text : {"{}", "{\"foo\":1}", "[]", "null", "{\"learner\": {}}",
                           "{\"learner\": 1, \"version\": [1, 7, 4]}"}) {
    ExpectInvalidModel(3, 4, text, "xgboost model");
  }
}

TEST(XgboostExpert, RejectsWrongNumberOfArms) {
  ExpectInvalidModel(4, 4, GetModels().tree_json, "classes");
  ExpectInvalidModel(2, 4, GetModels().tree_ubj, "classes");
  ExpectInvalidModel(0, 4, GetModels().tree_json, "arms");
  ExpectInvalidModel(-1, 4, GetModels().tree_json, "arms");
}

TEST(XgboostExpert, RejectsWrongNumberOfFeatures) {
  ExpectInvalidModel(3, 5, GetModels().tree_json, "features");
  ExpectInvalidModel(3, 3, GetModels().tree_ubj, "features");
  ExpectInvalidModel(3, 5, GetModels().linear_json, "features");
  ExpectInvalidModel(3, -1, GetModels().tree_json, "features");
}

TEST(XgboostExpert, RejectsBadSmoothing) {
  ExpectInvalidModel(3, 4, GetModels().tree_json, "smoothing", -0.1);
  ExpectInvalidModel(3, 4, GetModels().tree_json, "smoothing", 1.5);
  ExpectInvalidModel(3, 4, GetModels().tree_json, "smoothing",
                     std::numeric_limits<double>::quiet_NaN());
}

TEST(XgboostExpert, RejectsBinaryLogistic) {
  ASSERT_FALSE(GetModels().binary_logistic_json.empty());
  ExpectInvalidModel(3, 4, GetModels().binary_logistic_json, "multi:softprob");
  ExpectInvalidModel(1, 4, GetModels().binary_logistic_json, "multi:softprob");
  ExpectInvalidModel(2, 4, GetModels().binary_logistic_json, "multi:softprob");
}

TEST(XgboostExpert, RejectsMultiSoftmax) {
  ASSERT_FALSE(GetModels().softmax_json.empty());
  ExpectInvalidModel(3, 4, GetModels().softmax_json, "multi:softprob");
}

// ---------------------------------------------------------------------------------------
// Bad contexts.

TEST(XgboostExpert, PredictRejectsWrongFeatureCount) {
  std::unique_ptr<Expert> expert = MustLoad(GetModels().tree_json);
  ASSERT_NE(expert, nullptr);
  std::vector<double> probs(kClasses);
  ExpectInvalid(expert->Predict({0.1, 0.2, 0.3}, absl::MakeSpan(probs)), "features");
  ExpectInvalid(expert->Predict({0.1, 0.2, 0.3, 0.4, 0.5}, absl::MakeSpan(probs)), "features");
  std::vector<double> wrong_output(kClasses + 1);
  ExpectInvalid(expert->Predict({0.1, 0.2, 0.3, 0.4}, absl::MakeSpan(wrong_output)), "output");
}

TEST(XgboostExpert, PredictRejectsNonFiniteFeatures) {
  std::unique_ptr<Expert> expert = MustLoad(GetModels().tree_json);
  ASSERT_NE(expert, nullptr);
  std::vector<double> probs(kClasses);
  ExpectInvalid(expert->Predict({0.1, 0.2, std::numeric_limits<double>::quiet_NaN(), 0.4},
                                absl::MakeSpan(probs)),
                "feature[2]");
  ExpectInvalid(expert->Predict({std::numeric_limits<double>::infinity(), 0.2, 0.3, 0.4},
                                absl::MakeSpan(probs)),
                "feature[0]");
}

// ---------------------------------------------------------------------------------------
// Concurrency.

// Tree boosters predict in place; gblinear goes through a DMatrix: both paths are shared.
class ConcurrencyTest : public testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Boosters, ConcurrencyTest, testing::Values("gbtree", "gblinear"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST_P(ConcurrencyTest, ConcurrentPredictionsMatchSingleThreaded) {
  std::unique_ptr<Expert> expert =
      MustLoad(GetParam() == "gbtree" ? GetModels().tree_json : GetModels().linear_json);
  ASSERT_NE(expert, nullptr);
  constexpr int kThreads = 4;
  constexpr int kCalls = 200;
  constexpr int kContexts = 50;
  std::vector<std::vector<double>> expected(kContexts);
  for (int i = 0; i < kContexts; ++i) expected[i] = MustPredict(*expert, Data().Row(i));

  std::vector<int> mismatches(kThreads, 0);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<double> probs(kClasses);
      for (int call = 0; call < kCalls; ++call) {
        const int i = (call * 7 + t * 13) % kContexts;  // threads interleave contexts
        if (!expert->Predict(Data().Row(i), absl::MakeSpan(probs)).ok()) {
          ++failures[t];
        } else if (probs != expected[i]) {
          ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
    EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  }
}

// Threads mixing batch sizes: each call in flight has its own scratch (the float rows and
// the proxy DMatrix), reused by later calls of other sizes on other threads.
TEST_P(ConcurrencyTest, ConcurrentBatchesOfMixedSizesMatchSingleThreaded) {
  std::unique_ptr<Expert> expert =
      MustLoad(GetParam() == "gbtree" ? GetModels().tree_json : GetModels().linear_json);
  ASSERT_NE(expert, nullptr);
  constexpr int kThreads = 4;
  constexpr int kCalls = 100;
  constexpr size_t kSizes[] = {1, 5, 50};
  const std::vector<double> rows(Data().features.begin(), Data().features.end());
  auto slice = [&](int call, int t, size_t* n) {
    *n = kSizes[(call + t) % 3];
    return static_cast<size_t>((call * 11 + t * 29) % (kRows - 50));
  };
  // Single-threaded: every row once.
  std::vector<double> expected(kRows * kClasses);
  ASSERT_TRUE(expert->PredictBatch(rows, kRows, absl::MakeSpan(expected)).ok());

  std::vector<int> mismatches(kThreads, 0);
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<double> probs(50 * kClasses);
      for (int call = 0; call < kCalls; ++call) {
        size_t n = 0;
        const size_t first = slice(call, t, &n);
        const absl::Status s = expert->PredictBatch(
            absl::MakeConstSpan(rows).subspan(first * kFeatures, n * kFeatures), n,
            absl::MakeSpan(probs).subspan(0, n * kClasses));
        if (!s.ok()) {
          ++failures[t];
          continue;
        }
        mismatches[t] += !std::equal(probs.begin(), probs.begin() + n * kClasses,
                                     expected.begin() + first * kClasses);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
    EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  }
}

// ---------------------------------------------------------------------------------------
// No file read on the prediction path.

using ::decision::testutil::ReadSyscalls;

// libxgboost 1.7.4 reads two cgroup files (common::GetCfsCPUCount) whenever it constructs
// a DMatrix: per call for XGBoosterPredictFromDense given no DMatrix, and for gblinear,
// which it predicts only from a DMatrix. Experts predict with their compiled model
// (core/xgboost_forest.h), trees and gblinear alike, so once loaded they read nothing. syscr counts read(2) calls: where the cgroup v1 files exist
// (the CI host) the regression is 2 reads per call, 800 here; under cgroup v2 they do not
// exist, the failed openat reads nothing and this test cannot see it.
TEST(XgboostExpert, PredictionsReadNoFiles) {
  for (const std::string* bytes : {&GetModels().tree_ubj, &GetModels().linear_json}) {
    std::unique_ptr<Expert> expert = MustLoad(*bytes);
    ASSERT_NE(expert, nullptr);
    const std::vector<double> rows(Data().features.begin(),
                                   Data().features.begin() + 25 * kFeatures);
    std::vector<double> batch(25 * kClasses);
    const int64_t before = ReadSyscalls();
    if (before < 0) GTEST_SKIP() << "/proc/self/io is not readable here";
    for (int i = 0; i < 200; ++i) {
      MustPredict(*expert, Data().Row(i));
      ASSERT_TRUE(expert->PredictBatch(rows, 25, absl::MakeSpan(batch)).ok());
    }
    const int64_t after = ReadSyscalls();
    // ReadSyscalls itself reads /proc/self/io (a few calls); 400 predictions reading the
    // cgroup files would add 800.
    EXPECT_LT(after - before, 20) << (bytes == &GetModels().tree_ubj ? "trees" : "gblinear");
  }
}

}  // namespace
}  // namespace decision
