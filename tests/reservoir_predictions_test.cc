// ReservoirPredictions (server/reservoir_predictions.h): a refresh predicts only the rows of
// the reservoir that changed since the last one, and gets exactly what predicting every row
// would give.
#include "server/reservoir_predictions.h"

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "absl/random/random.h"
#include "core/divergence.h"
#include "core/xgboost_expert.h"
#include "core/xgboost_trainer.h"

namespace decision::server {
namespace {

constexpr int kArms = 5;
constexpr int kFeatures = 3;

// A tree booster trained on random contexts labelled by their largest feature.
std::shared_ptr<const Expert> TreeExpert() {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  TrainingSet set;
  set.num_features = kFeatures;
  for (int i = 0; i < 400; ++i) {
    std::vector<double> x = {u(gen), u(gen), u(gen)};
    const int arm = static_cast<int>(x[0] * 2 + x[1] * 2 + x[2]) % kArms;
    set.Add(x, arm, 1.0, 0.5);
  }
  XgboostTrainOptions o;
  o.rounds = 8;
  o.max_depth = 4;
  std::string model = TrainXgboostModel(set, kArms, o).value();
  return MakeXgboostExpert(kArms, kFeatures, model).value();
}

void Offer(ContextReservoir* r, int n, std::mt19937_64& gen) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < n; ++i) r->Offer(std::vector<double>{u(gen), u(gen), u(gen)}, gen);
}

std::vector<double> AllRows(const Expert& e, const ContextReservoir& r) {
  std::vector<double> out(r.size() * kArms);
  EXPECT_TRUE(e.PredictBatch(r.contexts(), r.size(), absl::MakeSpan(out)).ok());
  return out;
}

TEST(ContextReservoirTest, AStampChangesExactlyWhenItsRowIsRewritten) {
  std::mt19937_64 gen(1);
  ContextReservoir r(kFeatures, 64);
  Offer(&r, 64, gen);
  ASSERT_EQ(r.stamps().size(), 64u);
  const std::vector<uint64_t> stamps(r.stamps().begin(), r.stamps().end());
  const std::vector<double> rows(r.contexts().begin(), r.contexts().end());
  Offer(&r, 40, gen);
  int changed = 0;
  for (int i = 0; i < 64; ++i) {
    const bool same_row = std::equal(rows.begin() + i * kFeatures, rows.begin() + (i + 1) * kFeatures,
                                     r.contexts().begin() + i * kFeatures);
    const bool same_stamp = stamps[i] == r.stamps()[i];
    EXPECT_EQ(same_stamp, same_row) << "row " << i;
    changed += !same_stamp;
  }
  EXPECT_GT(changed, 0);
  EXPECT_LT(changed, 40);
  // A restored reservoir gets stamps it never gave before.
  const std::vector<uint64_t> before(r.stamps().begin(), r.stamps().end());
  r.Reset(std::vector<double>(r.contexts().begin(), r.contexts().end()), r.seen());
  for (int i = 0; i < 64; ++i) {
    for (uint64_t old : before) EXPECT_NE(r.stamps()[i], old);
  }
}

// Predict, with the result copied to *out.
absl::Status PredictInto(ReservoirPredictions& cache, int expert,
                         const std::shared_ptr<const Expert>& model, const ContextReservoir& r,
                         std::vector<double>* out) {
  absl::StatusOr<ReservoirPredictions::Shared> p =
      cache.Predict(expert, model, r.contexts(), r.stamps());
  if (!p.ok()) return p.status();
  *out = **p;
  return absl::OkStatus();
}

TEST(ReservoirPredictionsTest, OnlyChangedRowsArePredictedAndTheResultIsExact) {
  const std::shared_ptr<const Expert> tree = TreeExpert();
  std::mt19937_64 gen(2);
  ContextReservoir r(kFeatures, 256);
  ReservoirPredictions cache(int64_t{1} << 20);
  std::vector<double> out;
  Offer(&r, 100, gen);  // not yet full
  ASSERT_TRUE(PredictInto(cache, 0, tree, r, &out).ok());
  EXPECT_EQ(out, AllRows(*tree, r));
  EXPECT_EQ(cache.rows_predicted(), 100);
  EXPECT_GT(cache.bytes(), 0);
  int64_t predicted = cache.rows_predicted();
  for (int step = 0; step < 6; ++step) {
    Offer(&r, 50 + 40 * step, gen);
    ASSERT_TRUE(PredictInto(cache, 0, tree, r, &out).ok());
    // Bit for bit what predicting all rows gives.
    EXPECT_EQ(out, AllRows(*tree, r)) << "step " << step;
    const int64_t changed = cache.rows_predicted() - predicted;
    predicted = cache.rows_predicted();
    EXPECT_LT(changed, static_cast<int64_t>(r.size())) << "step " << step;
    EXPECT_GT(changed, 0) << "step " << step;
  }
  EXPECT_GT(cache.rows_reused(), 0);
  // Nothing changed: nothing predicted.
  ASSERT_TRUE(PredictInto(cache, 0, tree, r, &out).ok());
  EXPECT_EQ(cache.rows_predicted(), predicted);
}

// A result is shared with the cache, and a later call that changes rows does not change
// a result still held.
TEST(ReservoirPredictionsTest, AHeldResultIsNeverWritten) {
  const std::shared_ptr<const Expert> tree = TreeExpert();
  std::mt19937_64 gen(5);
  ContextReservoir r(kFeatures, 64);
  Offer(&r, 64, gen);
  ReservoirPredictions cache(int64_t{1} << 20);
  absl::StatusOr<ReservoirPredictions::Shared> first =
      cache.Predict(0, tree, r.contexts(), r.stamps());
  ASSERT_TRUE(first.ok());
  const std::vector<double> expected = AllRows(*tree, r);
  absl::StatusOr<ReservoirPredictions::Shared> same =
      cache.Predict(0, tree, r.contexts(), r.stamps());
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->get(), first->get());  // nothing changed: the same vector, no copy
  Offer(&r, 30, gen);
  absl::StatusOr<ReservoirPredictions::Shared> later =
      cache.Predict(0, tree, r.contexts(), r.stamps());
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(**first, expected);
  EXPECT_EQ(**later, AllRows(*tree, r));
  EXPECT_NE(**later, expected);
}

TEST(ReservoirPredictionsTest, AnotherModelForTheSameExpertIsPredictedInFull) {
  const std::shared_ptr<const Expert> tree = TreeExpert();
  const std::shared_ptr<const Expert> uniform = MakeUniformExpert(kArms, kFeatures).value();
  std::mt19937_64 gen(3);
  ContextReservoir r(kFeatures, 64);
  Offer(&r, 64, gen);
  ReservoirPredictions cache(int64_t{1} << 20);
  std::vector<double> out;
  ASSERT_TRUE(PredictInto(cache, 4, tree, r, &out).ok());
  ASSERT_TRUE(PredictInto(cache, 4, uniform, r, &out).ok());
  EXPECT_EQ(out, AllRows(*uniform, r));
  EXPECT_EQ(cache.rows_predicted(), 128);
  // Experts are kept apart.
  ASSERT_TRUE(PredictInto(cache, 5, tree, r, &out).ok());
  EXPECT_EQ(out, AllRows(*tree, r));
}

TEST(ReservoirPredictionsTest, PastTheBudgetNothingIsKeptAndResultsStayExact) {
  const std::shared_ptr<const Expert> tree = TreeExpert();
  std::mt19937_64 gen(4);
  ContextReservoir r(kFeatures, 64);
  Offer(&r, 64, gen);
  ReservoirPredictions cache(0);
  std::vector<double> out;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(PredictInto(cache, 0, tree, r, &out).ok());
    EXPECT_EQ(out, AllRows(*tree, r));
    Offer(&r, 10, gen);
  }
  EXPECT_EQ(cache.bytes(), 0);
  EXPECT_EQ(cache.rows_predicted(), 3 * 64);
  EXPECT_EQ(cache.rows_reused(), 0);
}

TEST(ReservoirPredictionsTest, MismatchedSizesAreRefused) {
  const std::shared_ptr<const Expert> tree = TreeExpert();
  ReservoirPredictions cache(int64_t{1} << 20);
  std::vector<double> out;
  const std::vector<double> contexts(10);  // not a multiple of 3 features
  const std::vector<uint64_t> stamps = {1, 2, 3};
  EXPECT_EQ(cache.Predict(0, tree, contexts, stamps).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace decision::server
