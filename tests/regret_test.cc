// A seeded synthetic problem with known expert means (N = 50 experts that share
// information, K = 10 arms): D-UCB's pseudo-regret against UCB1 over the same experts.
//
// Contexts are 20 discrete types drawn uniformly; arm a in context x pays 1 with
// probability mu(x, a). Expert k plays softmax(beta_k * mu(x, .) + noise_k(x, .)), smoothed;
// so every expert puts mass on every arm (information leaks between them) and their means
// differ. The mean of expert k is known exactly: (1/20) sum_x sum_a pi_k(a|x) mu(x, a), and
// the pseudo-regret after T rounds is sum_t (mu* - mu_{k(t)}).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <random>
#include <gtest/gtest.h>

#include "absl/random/random.h"
#include "core/divergence.h"
#include "core/expert.h"
#include "core/policy.h"

namespace decision {
namespace {

constexpr int kExperts = 50;
constexpr int kArms = 10;
constexpr int kContexts = 20;

struct Problem {
  std::vector<std::vector<double>> mu;  // [context][arm]
  std::vector<std::unique_ptr<Expert>> experts;
  std::vector<double> expert_mean;
  double best_mean = 0.0;
};

Problem MakeProblem(uint64_t seed) {
  std::mt19937_64 gen(seed);
  Problem p;
  p.mu.assign(kContexts, std::vector<double>(kArms));
  for (auto& row : p.mu) {
    for (double& m : row) m = absl::Uniform<double>(gen, 0.0, 0.6);
    row[absl::Uniform<int>(gen, 0, kArms)] = absl::Uniform<double>(gen, 0.7, 0.95);
  }
  for (int k = 0; k < kExperts; ++k) {
    const double beta = absl::Uniform<double>(gen, 0.0, 8.0);
    std::vector<std::vector<double>> table(kContexts, std::vector<double>(kArms));
    for (int x = 0; x < kContexts; ++x) {
      double total = 0.0;
      for (int a = 0; a < kArms; ++a) {
        table[x][a] = std::exp(beta * p.mu[x][a] + absl::Gaussian<double>(gen, 0.0, 0.5));
        total += table[x][a];
      }
      for (double& v : table[x]) v /= total;
    }
    auto expert = MakeTableExpert(kArms, 1, table, 0);
    EXPECT_TRUE(expert.ok());
    p.experts.push_back(*std::move(expert));
  }
  std::vector<double> probs(kArms);
  for (const auto& e : p.experts) {
    double mean = 0.0;
    for (int x = 0; x < kContexts; ++x) {
      EXPECT_TRUE(e->Predict(std::vector<double>{double(x)}, absl::MakeSpan(probs)).ok());
      for (int a = 0; a < kArms; ++a) mean += probs[a] * p.mu[x][a] / kContexts;
    }
    p.expert_mean.push_back(mean);
  }
  p.best_mean = *std::max_element(p.expert_mean.begin(), p.expert_mean.end());
  return p;
}

// Runs `policy` for `rounds` rounds; returns the pseudo-regret after each round.
// D-UCB's divergences are re-estimated from a reservoir of the contexts seen whenever the
// round count doubles from 64 on (a batch-boundary refresh in miniature).
std::vector<double> Simulate(const Problem& p, Policy& policy, DUcbPolicy* ducb, int rounds,
                        uint64_t seed) {
  std::mt19937_64 gen(seed);
  ContextReservoir reservoir(1, 512);
  std::vector<const Expert*> experts;
  for (const auto& e : p.experts) experts.push_back(e.get());
  std::vector<double> regret;
  regret.reserve(rounds);
  double total = 0.0;
  std::vector<double> propensities(kExperts), probs(kArms);
  int64_t next_refresh = 64;
  for (int t = 1; t <= rounds; ++t) {
    const std::vector<double> x = {double(absl::Uniform<int>(gen, 0, kContexts))};
    reservoir.Offer(x, gen);
    auto distribution = [&](int k, absl::Span<double> out) {
      return p.experts[k]->Predict(x, out);
    };
    absl::StatusOr<Decision> d = policy.Decide(kExperts, kArms, distribution, gen);
    EXPECT_TRUE(d.ok()) << d.status();
    const double y = absl::Bernoulli(gen, p.mu[static_cast<int>(x[0])][d->arm]) ? 1.0 : 0.0;
    for (int k = 0; k < kExperts; ++k) {
      EXPECT_TRUE(p.experts[k]->Predict(x, absl::MakeSpan(probs)).ok());
      propensities[k] = probs[d->arm];
    }
    EXPECT_TRUE(policy.Learn(*d, y, propensities).ok());
    total += p.best_mean - p.expert_mean[d->expert];
    regret.push_back(total);
    if (ducb != nullptr && t == next_refresh) {
      DivergenceMatrix divergences;
      EXPECT_TRUE(EstimateDivergences(experts, reservoir, 16, &divergences).ok());
      EXPECT_TRUE(ducb->SetDivergences(divergences).ok());
      next_refresh *= 2;
    }
  }
  return regret;
}

TEST(Regret, DUcbBeatsUcb1OverExpertsAndGrowsSublinearly) {
  constexpr int kT = 20000;
  double ducb_sum = 0.0, ucb1_sum = 0.0, ducb_t = 0.0, ducb_2t = 0.0;
  for (uint64_t seed : {11u, 12u, 13u}) {
    const Problem p = MakeProblem(seed);
    auto ducb = DUcb::Create(EstimatorOptions(), kExperts);
    ASSERT_TRUE(ducb.ok());
    DUcbPolicy ducb_policy(*std::move(ducb));
    const std::vector<double> r_ducb = Simulate(p, ducb_policy, &ducb_policy, 2 * kT, seed + 100);
    std::unique_ptr<Policy> ucb1 = MakeUcb1Policy(kExperts);
    const std::vector<double> r_ucb1 = Simulate(p, *ucb1, nullptr, kT, seed + 100);
    ducb_sum += r_ducb[kT - 1];
    ucb1_sum += r_ucb1[kT - 1];
    ducb_t += r_ducb[kT - 1];
    ducb_2t += r_ducb[2 * kT - 1];
  }
  const double ratio = ducb_sum / ucb1_sum;
  RecordProperty("ducb_regret_at_T", std::to_string(ducb_sum / 3));
  RecordProperty("ucb1_regret_at_T", std::to_string(ucb1_sum / 3));
  RecordProperty("growth_2T_over_T", std::to_string(ducb_2t / ducb_t));
  std::printf("mean pseudo-regret at T=%d: D-UCB %.1f, UCB1 %.1f, ratio %.3f; "
              "D-UCB regret(2T)/regret(T) = %.3f\n",
              kT, ducb_sum / 3, ucb1_sum / 3, ratio, ducb_2t / ducb_t);
  // Measured with these seeds (printed above), default estimator (median of means,
  // round-robin fine groups): regret 76.1 vs 1651, ratio 0.046, growth 1.016. Before the
  // fine groups (l not rounded, commit 230d7cc): 50.6, ratio 0.031, growth 1.021. Over six
  // seed triples (11-13 ... 61-63) the mean D-UCB regret was 61.6 with fine groups and
  // 64.9 before (growth 1.083 and 1.137), so this triple's rise is the seed's. With
  // contiguous groups: 34.5, ratio 0.021, growth 1.010.
  EXPECT_LT(ratio, 0.25);  // measured 0.046
  EXPECT_LT(ducb_2t / ducb_t, 1.5);  // measured 1.016 (linear growth would be 2)
}

}  // namespace
}  // namespace decision
