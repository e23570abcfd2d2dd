// Per-request eligibility in the engine: experts' distributions restricted to the eligible
// arms, the divergences over restricted contexts, and D-UCB's estimates over samples
// decided under random eligibility, each checked against the definitions written out
// literally here (docs/ENGINE.md, "Eligibility").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/random/random.h"
#include "core/divergence.h"
#include "core/expert.h"
#include "core/policy.h"
#include "tests/reference_estimators.h"

namespace decision {
namespace {

using ::testing::HasSubstr;

// The restricted distribution, literally: (1 - eta) pi(v) / sum_E pi + eta / |E| on E.
std::vector<double> Restricted(const std::vector<double>& raw, const std::vector<int32_t>& e,
                               double eta) {
  std::vector<double> out(raw.size(), 0.0);
  if (e.empty()) {
    for (size_t v = 0; v < raw.size(); ++v) out[v] = (1 - eta) * raw[v] + eta / raw.size();
    return out;
  }
  double mass = 0.0;
  for (int32_t a : e) mass += raw[a];
  if (e.size() == 1) {
    out[e[0]] = 1.0;
    return out;
  }
  for (int32_t a : e) {
    out[a] = mass > 0 ? std::min(1.0, (1 - eta) * raw[a] / mass + eta / e.size())
                      : 1.0 / e.size();
  }
  return out;
}

// A random non-empty subset of [0, k), ascending; every arm (empty) one time in four.
std::vector<int32_t> RandomEligible(int k, std::mt19937_64& gen) {
  std::vector<int32_t> e;
  if (absl::Uniform<int>(gen, 0, 4) == 0) return e;
  for (int a = 0; a < k; ++a) {
    if (absl::Bernoulli(gen, 0.5)) e.push_back(a);
  }
  if (e.empty()) e.push_back(absl::Uniform<int>(gen, 0, k));
  return e;
}

TEST(RestrictToEligible, RenormalisesOverTheEligibleArmsThenSmoothsOverThem) {
  const std::vector<double> raw = {0.5, 0.2, 0.2, 0.1};
  std::vector<double> p = raw;
  RestrictToEligible({1, 3}, 0.1, absl::MakeSpan(p));
  // pi on {1, 3}: 0.2 / 0.3 and 0.1 / 0.3, then 0.9 of that plus 0.1 / 2.
  EXPECT_DOUBLE_EQ(p[0], 0.0);
  EXPECT_DOUBLE_EQ(p[1], 0.9 * 2.0 / 3.0 + 0.05);
  EXPECT_DOUBLE_EQ(p[2], 0.0);
  EXPECT_DOUBLE_EQ(p[3], 0.9 * 1.0 / 3.0 + 0.05);
  // No mass on the eligible arms: uniform over them.
  std::vector<double> q = {1.0, 0.0, 0.0};
  RestrictToEligible({1, 2}, 0.0, absl::MakeSpan(q));
  EXPECT_THAT(q, ::testing::ElementsAre(0.0, 0.5, 0.5));
  // A single eligible arm gets everything.
  std::vector<double> one = raw;
  RestrictToEligible({2}, 0.05, absl::MakeSpan(one));
  EXPECT_THAT(one, ::testing::ElementsAre(0.0, 0.0, 1.0, 0.0));  // exactly 1, never above
}

TEST(RestrictToEligible, EveryArmIsThePlainSmoothingBitForBit) {
  auto expert = MakeLinearSoftmaxExpert(5, 2, {0.3, -1.2, 0.7, 0.1, 2.0, -0.4, 0.9, 0.0,
                                               -0.6, 1.1},
                                        {0.1, 0.2, -0.3, 0.0, 0.5});
  ASSERT_TRUE(expert.ok());
  const std::vector<double> x = {0.8, -1.7};
  std::vector<double> plain(5), all(5), listed(5);
  ASSERT_TRUE((*expert)->Predict(x, absl::MakeSpan(plain)).ok());
  ASSERT_TRUE((*expert)->PredictEligible(x, {}, absl::MakeSpan(all)).ok());
  ASSERT_TRUE((*expert)->PredictEligible(x, {0, 1, 2, 3, 4}, absl::MakeSpan(listed)).ok());
  EXPECT_EQ(all, plain);
  EXPECT_EQ(listed, plain);
}

TEST(PredictBatchEligible, EachRowUnderItsOwnArmsMatchesTheDefinition) {
  std::mt19937_64 gen(7);
  const int k = 7;
  std::vector<std::vector<double>> table(3, std::vector<double>(k));
  for (auto& row : table) {
    double total = 0;
    for (double& p : row) total += (p = absl::Uniform<double>(gen, 0.0, 1.0));
    for (double& p : row) p /= total;
  }
  auto expert = MakeTableExpert(k, 1, table, 0, 0.1);
  ASSERT_TRUE(expert.ok());
  const int n = 50;
  std::vector<double> rows(n);
  std::vector<std::vector<int32_t>> eligible(n);
  for (int r = 0; r < n; ++r) {
    rows[r] = absl::Uniform<int>(gen, 0, 3);
    eligible[r] = RandomEligible(k, gen);
  }
  const std::vector<absl::Span<const int32_t>> spans(eligible.begin(), eligible.end());
  std::vector<double> probs(n * k);
  ASSERT_TRUE((*expert)->PredictBatchEligible(rows, n, spans, absl::MakeSpan(probs)).ok());
  for (int r = 0; r < n; ++r) {
    const std::vector<double> want =
        Restricted(table[static_cast<int>(rows[r])], eligible[r], 0.1);
    for (int v = 0; v < k; ++v) {
      EXPECT_NEAR(probs[r * k + v], want[v], 1e-15) << "row " << r << " arm " << v;
    }
  }
}

TEST(PredictBatchEligible, RefusesBadSetsWithTheirReason) {
  auto expert = MakeUniformExpert(4, 1);
  ASSERT_TRUE(expert.ok());
  std::vector<double> probs(4);
  const std::vector<double> x = {0.0};
  absl::Status s = (*expert)->PredictEligible(x, {0, 4}, absl::MakeSpan(probs));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("eligible arm 4 (entry 1) is not an arm in [0, 4)"));
  s = (*expert)->PredictEligible(x, {2, -1}, absl::MakeSpan(probs));
  EXPECT_THAT(s.message(), HasSubstr("eligible arm -1 (entry 1) is not an arm in [0, 4)"));
  s = (*expert)->PredictEligible(x, {1, 3, 3}, absl::MakeSpan(probs));
  EXPECT_THAT(s.message(), HasSubstr("eligible arms are not ascending at entry 2 (3 after 3)"));
  s = (*expert)->PredictEligible(x, {3, 1}, absl::MakeSpan(probs));
  EXPECT_THAT(s.message(), HasSubstr("eligible arms are not ascending at entry 1 (1 after 3)"));
  // A request's set in any order is validated (and then sorted) by the server.
  EXPECT_THAT(ValidateEligibleArms({1, 3, 1}, 4).message(),
              HasSubstr("eligible arm 1 is listed twice (entry 2)"));
  EXPECT_TRUE(ValidateEligibleArms({3, 1}, 4).ok());
  const std::vector<int32_t> one = {1};
  const std::vector<absl::Span<const int32_t>> two_sets = {one, one};
  s = (*expert)->PredictBatchEligible(x, 1, two_sets, absl::MakeSpan(probs));
  EXPECT_THAT(s.message(), HasSubstr("2 eligible-arm sets for 1 rows"));
}

// The divergences over contexts with eligible arms, from their definition: sums over each
// context's eligible arms of the restricted distributions, averaged over the contexts (one
// median-of-means group).
TEST(DivergencesWithEligibility, SumOverEachContextsEligibleArms) {
  std::mt19937_64 gen(11);
  const int k = 6, n = 3, contexts = 40;
  std::vector<std::unique_ptr<Expert>> experts;
  std::vector<std::vector<std::vector<double>>> tables(n);
  for (int e = 0; e < n; ++e) {
    tables[e].assign(4, std::vector<double>(k));
    for (auto& row : tables[e]) {
      double total = 0;
      for (double& p : row) total += (p = absl::Uniform<double>(gen, 0.0, 1.0) + 0.01);
      for (double& p : row) p /= total;
    }
    auto made = MakeTableExpert(k, 1, tables[e], 0, 0.05);
    ASSERT_TRUE(made.ok());
    experts.push_back(*std::move(made));
  }
  ContextReservoir reservoir(1, contexts);
  for (int c = 0; c < contexts; ++c) {
    const std::vector<double> x = {static_cast<double>(absl::Uniform<int>(gen, 0, 4))};
    reservoir.Offer(x, RandomEligible(k, gen), gen);
  }
  ASSERT_TRUE(reservoir.any_eligible());
  std::vector<const Expert*> pointers;
  for (const auto& e : experts) pointers.push_back(e.get());
  DivergenceMatrix d;
  ASSERT_TRUE(EstimateDivergences(pointers, reservoir, /*num_groups=*/1, &d).ok());
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      double f1 = 0, f2 = 0;
      for (int c = 0; c < contexts; ++c) {
        const int key = static_cast<int>(reservoir.contexts()[c]);
        const std::vector<int32_t>& e = reservoir.eligible()[c];
        const std::vector<double> pi = Restricted(tables[i][key], e, 0.05);
        const std::vector<double> pj = Restricted(tables[j][key], e, 0.05);
        for (int v = 0; v < k; ++v) {
          if (pi[v] == 0) continue;  // not eligible for this context
          f1 += pi[v] * std::exp(pi[v] / pj[v] - 1);
          f2 += pi[v] * pi[v] / pj[v];
        }
      }
      EXPECT_NEAR(d.M(i, j), 1 + std::max(0.0, std::log(f1 / contexts)), 1e-12)
          << i << "," << j;
      EXPECT_NEAR(d.Sigma(i, j), std::sqrt(std::max(1.0, f2 / contexts)), 1e-12)
          << i << "," << j;
    }
  }
  // A zero where another expert is positive is not a restriction: refused.
  std::vector<std::vector<double>> bad = {{0.5, 0.5, 0.0}, {0.4, 0.3, 0.3}};
  DivergenceMatrix out;
  const absl::Status s = ComputeDivergences(bad, 3, 1, nullptr, 0, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("expert 1 gives probability 0.3 to arm 2 of context 0"));
}

// D-UCB over a stream decided under random eligibility: the incremental estimators equal
// the literal reference over the same log, whose propensities are the restricted
// distributions written out above; the divergences come from a reservoir of restricted
// contexts.
TEST(DUcbWithEligibility, EstimatesEqualTheLiteralReferenceUnderRandomMasks) {
  for (const EstimatorKind kind : {EstimatorKind::kMedianOfMeans, EstimatorKind::kClipped}) {
    std::mt19937_64 gen(kind == EstimatorKind::kClipped ? 5 : 6);
    const int k = 5, n = 4, keys = 6;
    std::vector<std::unique_ptr<Expert>> experts;
    std::vector<std::vector<std::vector<double>>> tables(n);
    for (int e = 0; e < n; ++e) {
      tables[e].assign(keys, std::vector<double>(k));
      for (auto& row : tables[e]) {
        double total = 0;
        for (double& p : row) total += (p = std::pow(absl::Uniform<double>(gen, 0, 1), 3));
        for (double& p : row) p /= total;
      }
      auto made = MakeTableExpert(k, 1, tables[e], 0, 0.1);
      ASSERT_TRUE(made.ok());
      experts.push_back(*std::move(made));
    }
    // Arm a pays with probability (a + 1) / (k + 1), whatever the context.
    EstimatorOptions options;
    options.kind = kind;
    if (kind == EstimatorKind::kMedianOfMeans) {
      options.grouping = MedianOfMeansGrouping::kRoundRobin;
    }
    absl::StatusOr<DUcb> made = DUcb::Create(options, n);
    ASSERT_TRUE(made.ok()) << made.status();
    DUcb& ducb = *made;
    ContextReservoir reservoir(1, 256);
    std::vector<const Expert*> pointers;
    for (const auto& e : experts) pointers.push_back(e.get());
    DivergenceMatrix d = DivergenceMatrix::Identity(n);
    std::vector<double> probs(k), propensities(n);
    for (int t = 1; t <= 1200; ++t) {
      const std::vector<double> x = {static_cast<double>(absl::Uniform<int>(gen, 0, keys))};
      const std::vector<int32_t> eligible = RandomEligible(k, gen);
      reservoir.Offer(x, eligible, gen);
      const int chooser = ducb.SelectExpert(gen);
      ASSERT_TRUE(experts[chooser]->PredictEligible(x, eligible, absl::MakeSpan(probs)).ok());
      const int arm = SampleArm(probs, absl::Uniform<double>(gen, 0, 1));
      ASSERT_TRUE(eligible.empty() || std::count(eligible.begin(), eligible.end(), arm) == 1)
          << "arm " << arm << " was not eligible";
      for (int e = 0; e < n; ++e) {
        const std::vector<double> want =
            Restricted(tables[e][static_cast<int>(x[0])], eligible, 0.1);
        ASSERT_TRUE(experts[e]->PredictEligible(x, eligible, absl::MakeSpan(probs)).ok());
        ASSERT_NEAR(probs[arm], want[arm], 1e-15);
        propensities[e] = want[arm];  // the literal value is what the reference reads
      }
      const double reward = absl::Bernoulli(gen, (arm + 1.0) / (k + 1.0)) ? 1.0 : 0.0;
      ASSERT_TRUE(ducb.Learn(chooser, reward, propensities).ok());
      if (t % 300 == 0) {
        ASSERT_TRUE(EstimateDivergences(pointers, reservoir, 8, &d).ok());
        ASSERT_TRUE(ducb.SetDivergences(d).ok());
      }
      if (t % 100 == 0) {
        for (int e = 0; e < n; ++e) {
          const ExpertEstimate inc = ducb.Estimate(e);
          const ExpertEstimate ref = reference::Estimate(ducb.log(), t, d, options, e);
          EXPECT_NEAR(inc.mean, ref.mean, 1e-9 * std::max(1.0, std::abs(ref.mean)))
              << "t=" << t << " expert " << e;
          EXPECT_NEAR(inc.width, ref.width, 1e-9 * std::max(1.0, std::abs(ref.width)))
              << "t=" << t << " expert " << e;
        }
      }
      if (HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace decision
