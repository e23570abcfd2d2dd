// The expert trainer on a small real data set (UCI optical digits, bench/data): trained
// under full information and from bandit feedback (importance weights), its accuracy on
// held-out rows clearly beats the uniform expert's 1/K.
#include "core/xgboost_trainer.h"

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/xgboost_expert.h"

namespace decision {
namespace {

struct Data {
  int num_features = 0;
  std::vector<std::vector<double>> x;
  std::vector<int> y;
};

Data LoadDigits() {
  Data d;
  std::ifstream in(DECISION_SOURCE_DIR "/bench/data/digits.csv");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string cell;
    std::vector<double> row;
    while (std::getline(ss, cell, ',')) row.push_back(std::stod(cell));
    d.y.push_back(static_cast<int>(row.back()));
    row.pop_back();
    d.x.push_back(std::move(row));
  }
  d.num_features = d.x.empty() ? 0 : static_cast<int>(d.x[0].size());
  return d;
}

double HeldOutAccuracy(const std::string& model, const Data& d, size_t from) {
  auto expert = MakeXgboostExpert(10, d.num_features, model, 0.0);
  EXPECT_TRUE(expert.ok()) << expert.status();
  std::vector<double> probs(10);
  int correct = 0;
  for (size_t i = from; i < d.x.size(); ++i) {
    EXPECT_TRUE((*expert)->Predict(d.x[i], absl::MakeSpan(probs)).ok());
    correct += std::max_element(probs.begin(), probs.end()) - probs.begin() == d.y[i];
  }
  return static_cast<double>(correct) / (d.x.size() - from);
}

constexpr size_t kTrainRows = 1200;  // of 1797; the rest is held out

TEST(XgboostTrainer, FullInformationExpertBeatsUniform) {
  const Data d = LoadDigits();
  ASSERT_EQ(d.x.size(), 1797u);
  TrainingSet set;
  set.num_features = d.num_features;
  for (size_t i = 0; i < kTrainRows; ++i) set.Add(d.x[i], d.y[i], 1.0, 1.0);
  std::mt19937_64 gen(1);
  for (bool linear : {false, true}) {
    const XgboostTrainOptions o = SampleExpertOptions(linear, 1, gen);
    auto model = TrainXgboostModel(Bootstrap(set, gen), 10, o);
    ASSERT_TRUE(model.ok()) << model.status();
    // Uniform gets 0.1; a one-pass linear learner gets ~0.9 on this data (VW --oaa: 0.894).
    // Measured: trees 0.87, linear 0.91; 0.7 leaves room for the sampled hyper-parameters.
    const double accuracy = HeldOutAccuracy(*model, d, kTrainRows);
    std::printf("full information, %s expert: held-out accuracy %.3f\n",
                linear ? "linear" : "trees", accuracy);
    EXPECT_GT(accuracy, 0.7) << (linear ? "linear" : "trees");
  }
}

TEST(XgboostTrainer, BanditFeedbackExpertBeatsUniform) {
  // Uniform logging: a random arm per row, reward 1 if it is the label, weight 1/p = K.
  // Only ~1/10 of the rows carry a positive reward.
  const Data d = LoadDigits();
  TrainingSet set;
  set.num_features = d.num_features;
  std::mt19937_64 gen(2);
  for (size_t i = 0; i < kTrainRows; ++i) {
    const int arm = std::uniform_int_distribution<int>(0, 9)(gen);
    set.Add(d.x[i], arm, arm == d.y[i] ? 1.0 : 0.0, 0.1);
  }
  ASSERT_GT(set.size(), 80u);
  ASSERT_LT(set.size(), 170u);
  auto model = TrainXgboostModel(set, 10, SampleExpertOptions(false, 1, gen));
  ASSERT_TRUE(model.ok()) << model.status();
  // ~130 positive examples over 10 classes (measured: 0.78 held-out accuracy, against 0.87
  // under full information and uniform's 0.1).
  const double accuracy = HeldOutAccuracy(*model, d, kTrainRows);
  std::printf("bandit feedback (%zu positive samples): held-out accuracy %.3f\n", set.size(),
              accuracy);
  EXPECT_GT(accuracy, 0.4);
}

TEST(XgboostTrainer, RejectsBadTrainingSets) {
  TrainingSet empty;
  empty.num_features = 2;
  EXPECT_EQ(TrainXgboostModel(empty, 3, {}).status().code(), absl::StatusCode::kInvalidArgument);
  TrainingSet bad_label;
  bad_label.num_features = 1;
  bad_label.Add(std::vector<double>{1.0}, 5, 1.0, 1.0);
  EXPECT_EQ(TrainXgboostModel(bad_label, 3, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  TrainingSet ok = bad_label;
  ok.labels[0] = 1;
  XgboostTrainOptions o;
  o.rounds = 0;
  EXPECT_EQ(TrainXgboostModel(ok, 3, o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainXgboostModel(ok, 1, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // A zero reward adds nothing.
  TrainingSet zero;
  zero.num_features = 1;
  zero.Add(std::vector<double>{1.0}, 0, 0.0, 0.5);
  EXPECT_EQ(zero.size(), 0u);
}

}  // namespace
}  // namespace decision
