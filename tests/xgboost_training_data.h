// Test support: the synthetic training set the XGBoost tests train their models on
// (xgboost_expert_test, xgboost_model_check_test). 300 rows of 4 features in [0, 1), drawn
// with a fixed seed; the label of a row is the index of its largest feature among the first
// 3 (3 classes). Features are float (what XGBoost trains on) and exactly representable as
// double, so an expert sees the same values the booster was trained on.
#ifndef DECISION_TESTS_XGBOOST_TRAINING_DATA_H_
#define DECISION_TESTS_XGBOOST_TRAINING_DATA_H_

#include <random>
#include <vector>

namespace decision::xgb_test {

inline constexpr int kXgbRows = 300;
inline constexpr int kXgbFeatures = 4;
inline constexpr int kXgbClasses = 3;

struct XgbTrainingData {
  std::vector<float> features;  // kXgbRows x kXgbFeatures, row-major
  std::vector<float> labels;    // class in {0, 1, 2}

  std::vector<double> Row(int i) const {
    return std::vector<double>(features.begin() + i * kXgbFeatures,
                               features.begin() + (i + 1) * kXgbFeatures);
  }
};

inline const XgbTrainingData& XgbData() {
  static const XgbTrainingData* const data = [] {
    auto* d = new XgbTrainingData;
    std::mt19937 gen(1);  // fixed seed; the conversion below is exact and portable
    d->features.resize(kXgbRows * kXgbFeatures);
    d->labels.resize(kXgbRows);
    for (int i = 0; i < kXgbRows; ++i) {
      for (int f = 0; f < kXgbFeatures; ++f) {
        d->features[i * kXgbFeatures + f] = static_cast<float>(gen() >> 8) / 16777216.0f;
      }
      int best = 0;
      for (int f = 1; f < kXgbClasses; ++f) {
        if (d->features[i * kXgbFeatures + f] > d->features[i * kXgbFeatures + best]) best = f;
      }
      d->labels[i] = static_cast<float>(best);
    }
    return d;
  }();
  return *data;
}

}  // namespace decision::xgb_test

#endif  // DECISION_TESTS_XGBOOST_TRAINING_DATA_H_
