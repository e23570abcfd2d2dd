// The sharing benchmark's guard (bench/sharing_suite.sh, issue 17): with a fixed pool of
// experts and a stronger one added mid-run, D-UCB, which estimates the new expert from the
// whole logged history at once, follows it within a few rounds, while the baselines that
// treat experts as separate arms take long or never do. On digits (s1), a learning bound,
// not a timing: the simulation is deterministic for a seed with one training thread.
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "bench/dataset.h"
#include "bench/simulation.h"

namespace decision::bench {
namespace {

TEST(SharingTest, DUcbFollowsAStrongExpertAddedMidRunAndBeatsTheBaselines) {
  const std::string root = DECISION_SOURCE_DIR;
  auto data = LoadCsv(root + "/bench/data/digits.csv");
  ASSERT_TRUE(data.ok()) << data.status();
  auto order = LoadOrder(root + "/bench/data/orders/digits.s1.perm.txt", data->size());
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

}  // namespace
}  // namespace decision::bench
