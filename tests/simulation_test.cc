// The sharing benchmark's guard (bench/sharing_suite.sh, issue 17): with a fixed pool of
// experts and a stronger one added mid-run, D-UCB, which estimates the new expert from the
// whole logged history at once, follows it within a few rounds, while the baselines that
// treat experts as separate arms take long or never do. On digits (s1), a learning bound,
// not a timing: the simulation is deterministic for a seed with one training thread.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "bench/dataset.h"
#include "bench/simulation.h"

namespace decision::bench {
namespace {

// A data set of bench/data, and its fixed row order s.
absl::StatusOr<Dataset> Data(const std::string& name) {
  return LoadCsv(absl::StrCat(DECISION_SOURCE_DIR, "/bench/data/", name, ".csv"));
}
absl::StatusOr<std::vector<int>> Order(const std::string& name, int s, size_t rows) {
  return LoadOrder(
      absl::StrCat(DECISION_SOURCE_DIR, "/bench/data/orders/", name, ".s", s, ".perm.txt"), rows);
}

TEST(SharingTest, DUcbFollowsAStrongExpertAddedMidRunAndBeatsTheBaselines) {
  auto data = Data("digits");
  ASSERT_TRUE(data.ok()) << data.status();
  auto order = Order("digits", 1, data->size());
  ASSERT_TRUE(order.ok()) << order.status();
  std::map<std::string, SimulationResult> results;
  for (const char* policy : {"d-ucb", "ucb1", "epsilon-greedy", "exp4"}) {
    SimulationOptions o;
    o.policy = policy;
    o.train_threads = 1;
    o.pool_experts = 40;
    o.pool_good = 2;
    o.pool_prefix = 500;
    o.late_expert_round = 400;
    auto r = Simulate(*data, *order, o);
    ASSERT_TRUE(r.ok()) << policy << ": " << r.status();
    results[policy] = *std::move(r);
  }
  const SimulationResult& ducb = results["d-ucb"];
  ASSERT_EQ(ducb.progressive_loss.size(), data->size() - 500);
  // The late expert is better than the pool's best (0.84 against 0.71 on these rows).
  ASSERT_GT(ducb.late_expert_true_mean, 0.8);
  // Followed by 90% of a 100-decision window within 200 rounds (100 is the earliest), and
  // little regret against it over the 898 rounds after its arrival (3.6 measured).
  EXPECT_GE(ducb.late_expert_rounds_to_90, 100);
  EXPECT_LE(ducb.late_expert_rounds_to_90, 200);
  EXPECT_LT(ducb.late_expert_regret, 30.0);
  for (const char* baseline : {"ucb1", "epsilon-greedy", "exp4"}) {
    SCOPED_TRACE(baseline);
    const SimulationResult& b = results[baseline];
    EXPECT_GT(b.late_expert_regret, 3 * ducb.late_expert_regret + 30.0);
    EXPECT_LT(ducb.progressive_loss.back() + 0.05, b.progressive_loss.back());
  }
}

// Issue 17: results that do not depend on the number of training threads. A batch's experts
// train side by side, one XGBoost thread each, their recipes drawn in order first: the same
// run at one and at three threads is the same, round by round (with XGBoost's own threads
// it was not: gblinear's updates race). Digits s1, its first 600 rounds (7 batches).
TEST(TrainThreadsTest, ARunIsTheSameAtAnyNumberOfTrainingThreads) {
  auto data = Data("digits");
  ASSERT_TRUE(data.ok()) << data.status();
  auto order = Order("digits", 1, data->size());
  ASSERT_TRUE(order.ok()) << order.status();
  std::vector<double> curves[2];
  for (int run = 0; run < 2; ++run) {
    SimulationOptions o;
    o.train_threads = run == 0 ? 1 : 3;
    o.max_rounds = 600;
    auto r = Simulate(*data, *order, o);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_GT(r->num_experts, 20);  // trained batches, not just the uniform expert
    curves[run] = r->progressive_loss;
  }
  ASSERT_EQ(curves[0].size(), 600u);
  EXPECT_EQ(curves[0], curves[1]);
}

// The default expert recipe's guard (bench/results/short_data, issue 17): experts trained on
// the whole log with c3 = 0.25 learn better where data is short than the paper's recipe (a
// bootstrap per expert, c3 = 2). On vowel over its five orders (seed 1: 0.782 against
// 0.853 measured; over 8 seeds 0.794 against 0.835, the five-order mean moving by about
// 0.013 between seeds): a learning bound, deterministic for a seed with one training thread.
TEST(ShortDataTest, TheDefaultRecipeLearnsVowelBetterThanThePapers) {
  auto data = Data("vowel");
  ASSERT_TRUE(data.ok()) << data.status();
  double defaults = 0.0;
  double paper = 0.0;
  for (int s = 1; s <= 5; ++s) {
    auto order = Order("vowel", s, data->size());
    ASSERT_TRUE(order.ok()) << order.status();
    for (const bool paper_recipe : {false, true}) {
      SimulationOptions o;
      o.train_threads = 1;
      if (paper_recipe) {
        o.bootstrap = true;
        o.objective = TrainingObjective::kImportanceWeighted;
        o.estimator.constants = EstimatorConstants::Practical();
      }
      auto r = Simulate(*data, *order, o);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->progressive_loss.size(), data->size());
      (paper_recipe ? paper : defaults) += r->progressive_loss.back() / 5;
    }
  }
  EXPECT_LT(defaults + 0.03, paper) << "defaults " << defaults << ", paper's recipe " << paper;
  // Both learn: uniform play loses 1 - 1/11 = 0.909.
  EXPECT_LT(paper, 0.89);
}

// The suite's short form (issue 17): letter s1 and digits s1 with the default recipe, one
// training thread, seed 1, against bounds a little above today's (0.347 and 0.317 with
// experts fitted by the likelihood; 0.546 and 0.536 with the paper's importance-weighted
// classifiers). A regression guard on learning, deterministic for the seed; about 75 s.
// Also that D-UCB stays close to the best expert available at each round (0.005 above it
// on letter, 0.016 on digits, measured): what it loses beyond them is its choices' fault.
TEST(RegretShortForm, LetterAndDigitsOrderOneStayBelowTheirBounds) {
  for (const auto& [name, bound] : {std::pair<const char*, double>{"letter", 0.40},
                                    std::pair<const char*, double>{"digits", 0.37}}) {
    SCOPED_TRACE(name);
    auto data = Data(name);
    ASSERT_TRUE(data.ok()) << data.status();
    auto order = Order(name, 1, data->size());
    ASSERT_TRUE(order.ok()) << order.status();
    SimulationOptions o;
    o.train_threads = 1;
    auto r = Simulate(*data, *order, o);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->progressive_loss.size(), data->size());
    EXPECT_LT(r->progressive_loss.back(), bound);
    EXPECT_LT(r->progressive_loss.back(), r->best_available_loss + 0.04);
    // The comparator is attainable: no policy of these experts beats it by much.
    EXPECT_GT(r->progressive_loss.back(), r->best_available_loss - 0.03);
    EXPECT_LT(r->best_available_argmax_loss, r->best_available_loss);
  }
}

}  // namespace
}  // namespace decision::bench
