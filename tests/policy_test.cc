#include "core/policy.h"

#include <cmath>
#include <map>
#include <vector>

#include <gmock/gmock.h>
#include <random>
#include <gtest/gtest.h>

#include "absl/random/random.h"
#include "core/expert.h"

namespace decision {
namespace {

using ::testing::HasSubstr;

TEST(DUcb, FirstDecisionIsUniformOverSelectableExperts) {
  auto ducb = DUcb::Create(EstimatorOptions(), 4);
  ASSERT_TRUE(ducb.ok());
  ducb->SetSelectable(2, false);
  std::mt19937_64 gen(1);
  std::map<int, int> counts;
  for (int i = 0; i < 3000; ++i) ++counts[ducb->SelectExpert(gen)];
  EXPECT_EQ(counts.count(2), 0u);
  // Each of the 3 selectable experts: 1000 expected, sd ~26; 150 is ~6 sd.
  for (int k : {0, 1, 3}) EXPECT_NEAR(counts[k], 1000, 150) << k;
}

TEST(DUcb, SelectsTheHighestUpperConfidenceBound) {
  auto ducb = DUcb::Create(EstimatorOptions(), 2);
  ASSERT_TRUE(ducb.ok());
  // Expert 1 puts all its mass where the rewards are: every sample favours it.
  for (int s = 0; s < 200; ++s) {
    const bool good_arm = s % 2 == 0;
    const std::vector<double> p = good_arm ? std::vector<double>{0.5, 0.9}
                                           : std::vector<double>{0.5, 0.1};
    ASSERT_TRUE(ducb->Learn(0, good_arm ? 1.0 : 0.0, p).ok());
  }
  EXPECT_GT(ducb->Estimate(1).mean, ducb->Estimate(0).mean);
  std::mt19937_64 gen(2);
  EXPECT_EQ(ducb->SelectExpert(gen), 1);
  ducb->SetSelectable(1, false);
  EXPECT_EQ(ducb->SelectExpert(gen), 0);
  ducb->SetSelectable(0, false);
  EXPECT_EQ(ducb->SelectExpert(gen), -1);
}

TEST(DUcb, BadInputChangesNothing) {
  auto ducb = DUcb::Create(EstimatorOptions(), 2);
  ASSERT_TRUE(ducb.ok());
  ASSERT_TRUE(ducb->Learn(0, 1.0, std::vector<double>{0.5, 0.25}).ok());
  const ExpertEstimate before = ducb->Estimate(1);
  EXPECT_EQ(ducb->Learn(5, 1.0, std::vector<double>{0.5, 0.25}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ducb->Learn(0, 2.0, std::vector<double>{0.5, 0.25}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ducb->Learn(0, 1.0, std::vector<double>{0.5}).code(),
            absl::StatusCode::kInvalidArgument);
  // Backfill of the wrong length, invalid propensity, or divergences of the wrong size.
  const std::vector<std::vector<double>> short_backfill = {{}};
  absl::Status s = ducb->AddExperts(short_backfill, DivergenceMatrix::Identity(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("backfilled"));
  const std::vector<std::vector<double>> zero = {{0.0}};
  EXPECT_EQ(ducb->AddExperts(zero, DivergenceMatrix::Identity(3)).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<std::vector<double>> good = {{0.5}};
  EXPECT_EQ(ducb->AddExperts(good, DivergenceMatrix::Identity(2)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ducb->num_experts(), 2);
  EXPECT_EQ(ducb->log().size(), 1);
  EXPECT_EQ(ducb->Estimate(1).mean, before.mean);
  EXPECT_EQ(DUcb::Create(EstimatorOptions(), -3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DUcb, NewExpertIsEstimatedFromTheWholeHistoryAtOnce) {
  auto ducb = DUcb::Create(EstimatorOptions(), 1);
  ASSERT_TRUE(ducb.ok());
  std::vector<double> backfill;
  for (int s = 0; s < 500; ++s) {
    const bool good = s % 2 == 0;
    ASSERT_TRUE(ducb->Learn(0, good ? 1.0 : 0.0, std::vector<double>{0.5}).ok());
    backfill.push_back(good ? 0.9 : 0.1);
  }
  const std::vector<std::vector<double>> columns = {backfill};
  ASSERT_TRUE(ducb->AddExperts(columns, DivergenceMatrix::Identity(2)).ok());
  // The new expert plays the rewarded arm 90% of the time: its mean is ~0.9 at once.
  EXPECT_NEAR(ducb->Estimate(1).mean, 0.9, 0.05);
  EXPECT_NEAR(ducb->Estimate(0).mean, 0.5, 0.05);
  std::mt19937_64 gen(3);
  EXPECT_EQ(ducb->SelectExpert(gen), 1);
}

// The off-policy estimates of a policy, literally: q[s] its propensity of sample s's arm,
// p[s] the logged one, y[s] the reward.
OffPolicyEstimate LiteralOffPolicy(const std::vector<double>& q, const std::vector<double>& p,
                                   const std::vector<double>& y, double clip) {
  OffPolicyEstimate e;
  const double n = static_cast<double>(q.size());
  e.samples = static_cast<int64_t>(q.size());
  if (q.empty()) return e;
  std::vector<double> w(q.size());
  double sum_w = 0, sum_w2 = 0, sum_wy = 0, sum_clipped = 0, bound = 0;
  for (size_t s = 0; s < q.size(); ++s) {
    w[s] = q[s] / p[s];
    sum_w += w[s];
    sum_w2 += w[s] * w[s];
    sum_wy += w[s] * y[s];
    sum_clipped += std::min(w[s], clip) * y[s];
    bound = std::max(bound, 1 / p[s]);
    e.max_weight = std::max(e.max_weight, w[s]);
  }
  e.ips = sum_wy / n;
  e.snips = sum_wy / sum_w;
  e.clipped_ips = sum_clipped / n;
  e.effective_sample_size = sum_w * sum_w / sum_w2;
  e.mean_weight = sum_w / n;
  // Maurer and Pontil's sample variance (n - 1 in the denominator) and theorem 4 at 2.5%.
  double variance = 0;
  for (size_t s = 0; s < q.size(); ++s) variance += std::pow(w[s] * y[s] - e.ips, 2);
  variance /= n - 1;
  const double half = std::sqrt(2 * variance * std::log(2 / 0.025) / n) +
                      7 * bound * std::log(2 / 0.025) / (3 * (n - 1));
  e.ips_lower = std::max(0.0, e.ips - half);
  e.ips_upper = std::min(1.0, e.ips + half);
  return e;
}

void ExpectOffPolicyNear(const OffPolicyEstimate& a, const OffPolicyEstimate& b) {
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_NEAR(a.ips, b.ips, 1e-9);
  EXPECT_NEAR(a.ips_lower, b.ips_lower, 1e-9);
  EXPECT_NEAR(a.ips_upper, b.ips_upper, 1e-9);
  EXPECT_NEAR(a.snips, b.snips, 1e-9);
  EXPECT_NEAR(a.clipped_ips, b.clipped_ips, 1e-9);
  EXPECT_NEAR(a.effective_sample_size, b.effective_sample_size, 1e-6);
  EXPECT_NEAR(a.mean_weight, b.mean_weight, 1e-9);
  EXPECT_DOUBLE_EQ(a.max_weight, b.max_weight);
}

// Without a log, D-UCB sums every expert's off-policy estimates as samples are learnt, an
// expert added later over the samples its rows were fed (a window), and keeps them through
// Snapshot and Restore; a retired expert's stop at its retirement.
TEST(DUcb, OffPolicySumsMatchTheLiteralEstimatesThroughAddRestoreAndRetire) {
  auto ducb = DUcb::Create(EstimatorOptions(), 2, DUcb::LogMode::kNone);
  ASSERT_TRUE(ducb.ok());
  std::mt19937_64 gen(5);
  std::uniform_real_distribution<double> unit(0.02, 1.0);
  // Expert k's propensities (q), the logged ones (p) and the rewards, per sample counted.
  std::vector<std::vector<double>> q(3), p(3), y(3);
  DUcb* also = nullptr;  // a second D-UCB fed the same samples
  const auto learn = [&](int experts, bool count_first) {
    std::vector<double> props(experts);
    for (double& v : props) v = unit(gen);
    const int chooser = std::uniform_int_distribution<int>(1, experts - 1)(gen);
    const double reward = std::bernoulli_distribution(0.3)(gen) ? 1.0 : 0.0;
    ASSERT_TRUE(ducb->Learn(chooser, reward, props).ok());
    if (also != nullptr) {
      ASSERT_TRUE(also->Learn(chooser, reward, props).ok());
    }
    for (int k = 0; k < experts; ++k) {
      if (k == 0 && !count_first) continue;
      q[k].push_back(props[k]);
      p[k].push_back(props[chooser]);
      y[k].push_back(reward);
    }
  };
  for (int s = 0; s < 400; ++s) learn(2, true);
  // Expert 2 over a window of the last 200 samples: its rows are fed those.
  auto rows = ducb->NewExpertRows(1, 200);
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (int s = 200; s < 400; ++s) {
    const double v = unit(gen);
    const int chooser = 1;
    const double logged = p[1][s];
    ASSERT_TRUE((*rows)->Add(chooser, y[1][s], logged, {v}).ok());
    q[2].push_back(v);
    p[2].push_back(logged);
    y[2].push_back(y[1][s]);
  }
  // (Rows of the estimator itself, not this D-UCB's, are refused.)
  auto foreign = ducb->estimator().NewExpertRows(1);
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ(ducb->AddExperts(*std::move(foreign), DivergenceMatrix::Identity(3)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ducb->AddExperts(*std::move(rows), DivergenceMatrix::Identity(3)).ok());
  for (int s = 0; s < 300; ++s) learn(3, true);
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(k);
    ExpectOffPolicyNear(ducb->OffPolicy(k).Estimate(),
                        LiteralOffPolicy(q[k], p[k], y[k], kDefaultOffPolicyClip));
  }
  // Retired: expert 0's sums stop there.
  ASSERT_TRUE(ducb->Retire(0).ok());
  for (int s = 0; s < 50; ++s) learn(3, false);
  // Restored from its state: the same sums, and it goes on the same.
  auto state = ducb->Snapshot();
  ASSERT_TRUE(state.ok());
  auto restored = DUcb::Restore(EstimatorOptions(), *state, ducb->counts(),
                                ducb->off_policy_sums());
  ASSERT_TRUE(restored.ok()) << restored.status();
  also = &*restored;
  for (int s = 0; s < 50; ++s) learn(3, false);
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(k);
    ExpectOffPolicyNear(ducb->OffPolicy(k).Estimate(),
                        LiteralOffPolicy(q[k], p[k], y[k], kDefaultOffPolicyClip));
    EXPECT_TRUE(restored->OffPolicy(k) == ducb->OffPolicy(k));
  }
  EXPECT_EQ(ducb->OffPolicy(0).samples(), 700);
  EXPECT_EQ(restored->OffPolicy(2).samples(), 200 + 300 + 100);
  // Sums of the wrong number of experts are refused.
  EXPECT_EQ(DUcb::Restore(EstimatorOptions(), *state, ducb->counts(),
                          std::vector<OffPolicySums>(2))
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

TEST(OffPolicySums, StateRoundTripsAndDamageIsRefused) {
  OffPolicySums sums(7.0);
  sums.Add(0.5, 0.25, 1.0);
  sums.Add(0.1, 0.5, 0.0);
  const auto values = sums.ToArray();
  auto back = OffPolicySums::FromArray(values);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == sums);
  EXPECT_EQ(back->clip(), 7.0);
  auto bad = values;
  bad[1] = 1.5;  // a fractional sample count
  EXPECT_EQ(OffPolicySums::FromArray(bad).status().code(), absl::StatusCode::kDataLoss);
  bad = values;
  bad[2] = std::nan("");
  EXPECT_EQ(OffPolicySums::FromArray(bad).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(OffPolicySums::FromArray(absl::MakeConstSpan(values.data(), 3)).status().code(),
            absl::StatusCode::kDataLoss);
  // No samples: nothing estimated, the widest interval.
  const OffPolicyEstimate none = OffPolicySums().Estimate();
  EXPECT_EQ(none.samples, 0);
  EXPECT_EQ(none.ips_upper, 1.0);
}

// Divergences among three experts, asymmetric, for the FromLog comparisons.
DivergenceMatrix ThreeExpertDivergences() {
  DivergenceMatrix d = DivergenceMatrix::Identity(3);
  d.m = {1, 1.5, 2, 1.2, 1, 1.1, 3, 1.4, 1};
  d.sigma = {1, 2, 1.5, 1.3, 1, 2.5, 1.1, 1.7, 1};
  return d;
}

TEST(DUcb, FromLogEqualsLearningOneByOne) {
  for (auto kind : {EstimatorKind::kClipped, EstimatorKind::kMedianOfMeans}) {
    EstimatorOptions o;
    o.kind = kind;
    const DivergenceMatrix d = ThreeExpertDivergences();
    auto one_by_one = DUcb::Create(o, 3);
    ASSERT_TRUE(one_by_one.ok());
    ASSERT_TRUE(one_by_one->SetDivergences(d).ok());
    SampleLog log(3);
    std::mt19937_64 gen(9);
    std::uniform_real_distribution<double> p(0.05, 1.0);
    for (int s = 0; s < 3000; ++s) {
      const std::vector<double> props = {p(gen), p(gen), p(gen)};
      const int chooser = s % 3;
      const double reward = std::bernoulli_distribution(0.4)(gen) ? 1.0 : 0.0;
      ASSERT_TRUE(one_by_one->Learn(chooser, reward, props).ok());
      ASSERT_TRUE(log.Append(chooser, reward, props).ok());
    }
    auto built = DUcb::FromLog(o, std::move(log), d);
    ASSERT_TRUE(built.ok()) << built.status();
    for (int k = 0; k < 3; ++k) {
      EXPECT_NEAR(built->Estimate(k).mean, one_by_one->Estimate(k).mean, 1e-12);
      EXPECT_NEAR(built->Estimate(k).width, one_by_one->Estimate(k).width, 1e-12);
    }
    EXPECT_EQ(DUcb::FromLog(o, SampleLog(2), d).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Round-robin median of means regroups fine-group sums when l(t) steps: the estimates must
// equal, bit for bit, those of an estimator built from the whole log at once (what a
// restart computes), around every step of l beyond t = 500 (48 -> 60 and 60 -> 80: l(t) is
// the paper's floor(8 log t) rounded to a divisor of 240).
TEST(DUcb, RoundRobinGroupsEqualARebuildBitForBit) {
  EstimatorOptions o;
  o.kind = EstimatorKind::kMedianOfMeans;
  o.grouping = MedianOfMeansGrouping::kRoundRobin;
  const DivergenceMatrix d = ThreeExpertDivergences();
  auto one_by_one = DUcb::Create(o, 3);
  ASSERT_TRUE(one_by_one.ok());
  ASSERT_TRUE(one_by_one->SetDivergences(d).ok());
  std::vector<int> choosers;
  std::vector<double> rewards;
  std::vector<std::vector<double>> props;
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<double> p(0.05, 1.0);
  std::vector<int64_t> checks;
  for (int64_t t = 500; t < 10000; ++t) {
    if (MedianOfMeansGroups(o, t + 1) != MedianOfMeansGroups(o, t)) {
      checks.insert(checks.end(), {t, t + 1, t + 2});
    }
  }
  ASSERT_EQ(checks.size(), 6u);
  checks.push_back(10000);
  size_t next_check = 0;
  for (int64_t s = 0; s < checks.back(); ++s) {
    props.push_back({p(gen), p(gen), p(gen)});
    choosers.push_back(static_cast<int>(s % 3));
    rewards.push_back(std::bernoulli_distribution(0.4)(gen) ? 1.0 : 0.0);
    ASSERT_TRUE(one_by_one->Learn(choosers.back(), rewards.back(), props.back()).ok());
    if (s + 1 != checks[next_check]) continue;
    ++next_check;
    SampleLog log(3);
    for (size_t i = 0; i < choosers.size(); ++i) {
      ASSERT_TRUE(log.Append(choosers[i], rewards[i], props[i]).ok());
    }
    auto built = DUcb::FromLog(o, std::move(log), d);
    ASSERT_TRUE(built.ok()) << built.status();
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(built->Estimate(k).mean, one_by_one->Estimate(k).mean) << "t=" << s + 1;
      EXPECT_EQ(built->Estimate(k).width, one_by_one->Estimate(k).width) << "t=" << s + 1;
    }
  }
}

TEST(SampleLog, SharedPrefixIsReadOnlyAndDoesNotChangeWithTheLog) {
  SampleLog log(2);
  std::mt19937_64 gen(5);
  std::uniform_real_distribution<double> p(0.05, 1.0);
  // 5000 samples: the prefix ends inside the log's second chunk, which the log keeps
  // appending to.
  for (int s = 0; s < 5000; ++s) ASSERT_TRUE(log.Append(s % 2, 0.5, {p(gen), p(gen)}).ok());
  const SampleLog prefix = log.SharedPrefix();
  std::vector<double> before;
  for (int64_t s = 0; s < prefix.size(); ++s) before.push_back(prefix.propensity(1, s));
  for (int s = 0; s < 3000; ++s) ASSERT_TRUE(log.Append(s % 2, 1.0, {p(gen), p(gen)}).ok());
  ASSERT_TRUE(log.AddExpert(std::vector<double>(log.size(), 0.5)).ok());  // new storage
  ASSERT_EQ(prefix.size(), 5000);
  EXPECT_EQ(prefix.num_experts(), 2);
  EXPECT_EQ(prefix.count(0), 2500);
  for (int64_t s = 0; s < prefix.size(); ++s) {
    ASSERT_EQ(prefix.propensity(1, s), before[s]) << s;
    ASSERT_EQ(prefix.reward(s), 0.5) << s;
  }
  SampleLog writable = log.SharedPrefix();
  EXPECT_EQ(writable.Append(0, 1.0, {0.5, 0.5, 0.5}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(writable.AddExpert(std::vector<double>(writable.size(), 0.5)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(writable.size(), 8000);
}

// The server's divergence refresh: rebuild from a prefix while samples keep coming, then
// catch up and swap. Must equal a restart's FromLog bit for bit.
TEST(DUcb, EstimatorRebuiltAsideAndSwappedInEqualsFromLogBitForBit) {
  for (EstimatorKind kind : {EstimatorKind::kMedianOfMeans, EstimatorKind::kClipped}) {
    EstimatorOptions o;
    o.kind = kind;
    const DivergenceMatrix d = ThreeExpertDivergences();
    auto live = DUcb::Create(o, 3);
    auto in_lock = DUcb::Create(o, 3);  // SetDivergences at the prefix, under "the lock"
    ASSERT_TRUE(live.ok() && in_lock.ok());
    SampleLog all(3);
    std::mt19937_64 gen(12);
    std::uniform_real_distribution<double> p(0.05, 1.0);
    auto learn = [&](int64_t n) {
      for (int64_t s = 0; s < n; ++s) {
        const std::vector<double> props = {p(gen), p(gen), p(gen)};
        const int chooser = static_cast<int>(gen() % 3);
        const double reward = std::bernoulli_distribution(0.4)(gen) ? 1.0 : 0.0;
        ASSERT_TRUE(live->Learn(chooser, reward, props).ok());
        ASSERT_TRUE(in_lock->Learn(chooser, reward, props).ok());
        ASSERT_TRUE(all.Append(chooser, reward, props).ok());
      }
    };
    learn(21000);
    const SampleLog prefix = live->log().SharedPrefix();
    ASSERT_TRUE(in_lock->SetDivergences(d).ok());
    learn(7000);  // learnt while the rebuild runs
    auto rebuilt = DUcb::RebuildEstimator(o, prefix, d);
    ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
    ASSERT_TRUE(live->SwapInEstimator(*std::move(rebuilt)).ok());
    for (int round = 0; round < 2; ++round) {
      auto restarted = DUcb::FromLog(o, all.SharedPrefix(), d);
      ASSERT_TRUE(restarted.ok()) << restarted.status();
      for (int k = 0; k < 3; ++k) {
        const ExpertEstimate e = live->Estimate(k);
        EXPECT_EQ(e.mean, restarted->Estimate(k).mean) << static_cast<int>(kind) << " " << k;
        EXPECT_EQ(e.width, restarted->Estimate(k).width) << static_cast<int>(kind) << " " << k;
        // SetDivergences at t > 0 recomputes the weighted sums from the divergence-free
        // ones, in a different order: it agrees to rounding only (that path is not what a
        // restart computes).
        EXPECT_NEAR(e.mean, in_lock->Estimate(k).mean, 1e-12);
        EXPECT_NEAR(e.width, in_lock->Estimate(k).width, 1e-12 * e.width);
        const double ess = live->estimator().EffectiveSampleSize(k);
        EXPECT_NEAR(ess, in_lock->estimator().EffectiveSampleSize(k), 1e-12 * ess);
      }
      learn(5000);  // and it keeps learning like the other two
    }
  }
}

TEST(DUcb, SwapInRefusesAnEstimatorForFewerExperts) {
  EstimatorOptions o;
  auto live = DUcb::Create(o, 3);
  ASSERT_TRUE(live.ok());
  for (int s = 0; s < 100; ++s) ASSERT_TRUE(live->Learn(s % 3, 1.0, {0.5, 0.25, 0.4}).ok());
  const SampleLog prefix = live->log().SharedPrefix();
  auto rebuilt = DUcb::RebuildEstimator(o, prefix, ThreeExpertDivergences());
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  ASSERT_TRUE(live->AddExperts({std::vector<double>(100, 0.5)}, DivergenceMatrix::Identity(4)).ok());
  const ExpertEstimate before = live->Estimate(0);
  EXPECT_EQ(live->SwapInEstimator(*std::move(rebuilt)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(live->Estimate(0).mean, before.mean);
  EXPECT_EQ(live->estimator().num_experts(), 4);
}

// The server's backfill completion: the log widened by the new expert's column from a
// prefix while samples keep coming (their new-expert values in a tail), then swapped in.
// Must equal a restart's FromLog over the wider log, bit for bit, and keep learning alike.
TEST(DUcb, ExtensionPreparedAsideAndSwappedInEqualsFromLogBitForBit) {
  for (EstimatorKind kind : {EstimatorKind::kMedianOfMeans, EstimatorKind::kClipped}) {
    EstimatorOptions o;
    o.kind = kind;
    const DivergenceMatrix d = ThreeExpertDivergences();
    auto live = DUcb::Create(o, 2);
    ASSERT_TRUE(live.ok());
    SampleLog all(3);  // what a restart reads: every sample with all three propensities
    std::mt19937_64 gen(13);
    std::uniform_real_distribution<double> p(0.05, 1.0);
    std::vector<double> column, tail;
    auto learn = [&](int64_t n, std::vector<double>* third) {
      for (int64_t s = 0; s < n; ++s) {
        const std::vector<double> props = {p(gen), p(gen), p(gen)};
        const int chooser = static_cast<int>(gen() % 2);
        const double reward = std::bernoulli_distribution(0.4)(gen) ? 1.0 : 0.0;
        ASSERT_TRUE(live->Learn(chooser, reward, {props[0], props[1]}).ok());
        ASSERT_TRUE(all.Append(chooser, reward, props).ok());
        third->push_back(props[2]);
      }
    };
    learn(9000, &column);
    const SampleLog prefix = live->log().SharedPrefix();
    auto extension = DUcb::PrepareExtension(o, prefix, {column}, d);
    ASSERT_TRUE(extension.ok()) << extension.status();
    learn(3000, &tail);  // learnt while the extension is prepared
    ASSERT_TRUE(live->SwapInExtension(*std::move(extension), {tail}).ok());
    ASSERT_EQ(live->num_experts(), 3);
    EXPECT_TRUE(live->selectable(2));
    auto restarted = DUcb::FromLog(o, all.SharedPrefix(), d);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(live->Estimate(k).mean, restarted->Estimate(k).mean) << k;
      EXPECT_EQ(live->Estimate(k).width, restarted->Estimate(k).width) << k;
    }
    // A tail of the wrong size, or an extension for fewer experts, changes nothing.
    auto stale = DUcb::PrepareExtension(o, prefix, {column}, d);
    ASSERT_TRUE(stale.ok());
    EXPECT_EQ(live->SwapInExtension(*std::move(stale), {tail}).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(live->Estimate(2).mean, restarted->Estimate(2).mean);
  }
}

TEST(DUcb, ExtensionRefusesColumnsOfTheWrongSizeOrRange) {
  EstimatorOptions o;
  auto live = DUcb::Create(o, 2);
  ASSERT_TRUE(live.ok());
  for (int s = 0; s < 50; ++s) ASSERT_TRUE(live->Learn(s % 2, 1.0, {0.5, 0.25}).ok());
  const SampleLog prefix = live->log().SharedPrefix();
  const DivergenceMatrix d = ThreeExpertDivergences();
  EXPECT_EQ(DUcb::PrepareExtension(o, prefix, {std::vector<double>(49, 0.5)}, d).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<double> bad(50, 0.5);
  bad[7] = 0.0;
  EXPECT_EQ(DUcb::PrepareExtension(o, prefix, {bad}, d).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto ok = DUcb::PrepareExtension(o, prefix, {std::vector<double>(50, 0.5)}, d);
  ASSERT_TRUE(ok.ok());
  ASSERT_TRUE(live->Learn(0, 1.0, {0.5, 0.25}).ok());
  EXPECT_EQ(live->SwapInExtension(*std::move(ok), {std::vector<double>()}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(live->num_experts(), 2);
}

TEST(BatchSchedule, WarmupThenBatchesOfSqrtT) {
  BatchSchedule schedule(4, BatchOptions{3, 2.0});
  for (int t = 1; t <= 12; ++t) EXPECT_EQ(schedule.Next(), BatchSchedule::Round::kWarmup);
  // Round 13 starts a batch of floor(2 sqrt(13)) = 7 rounds.
  EXPECT_EQ(schedule.Next(), BatchSchedule::Round::kBatchStart);
  for (int t = 14; t <= 19; ++t) EXPECT_EQ(schedule.Next(), BatchSchedule::Round::kInBatch);
  EXPECT_EQ(schedule.Next(), BatchSchedule::Round::kBatchStart);  // round 20
  EXPECT_EQ(schedule.round(), 20);
  EXPECT_EQ(schedule.next_batch_start(), 20 + static_cast<int64_t>(std::floor(2.0 * std::sqrt(20.0))));
  EXPECT_EQ(ValidateBatchOptions({-1, 7.0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateBatchOptions({3, 0.0}).code(), absl::StatusCode::kInvalidArgument);
}

// Two fixed experts over 3 arms for the baseline tests.
struct TwoExperts {
  std::vector<std::vector<double>> dist = {{0.7, 0.2, 0.1}, {0.1, 0.1, 0.8}};
  absl::Status operator()(int k, absl::Span<double> out) const {
    std::copy(dist[k].begin(), dist[k].end(), out.begin());
    return absl::OkStatus();
  }
};

TEST(Baselines, Ucb1TriesEveryExpertThenExploits) {
  auto policy = MakeUcb1Policy(2);
  TwoExperts experts;
  std::mt19937_64 gen(4);
  std::map<int, int> first;
  for (int t = 0; t < 2; ++t) {
    auto d = policy->Decide(2, 3, experts, gen);
    ASSERT_TRUE(d.ok());
    ++first[d->expert];
    EXPECT_DOUBLE_EQ(d->propensity, experts.dist[d->expert][d->arm]);
    ASSERT_TRUE(policy->Learn(*d, d->expert == 1 ? 1.0 : 0.0, {}).ok());
  }
  EXPECT_EQ(first.size(), 2u);
  int ones = 0;
  for (int t = 0; t < 200; ++t) {
    auto d = policy->Decide(2, 3, experts, gen);
    ASSERT_TRUE(d.ok());
    ones += d->expert == 1;
    ASSERT_TRUE(policy->Learn(*d, d->expert == 1 ? 1.0 : 0.0, {}).ok());
  }
  EXPECT_GT(ones, 150);
  Decision bogus;
  bogus.expert = 7;
  EXPECT_EQ(policy->Learn(bogus, 1.0, {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Baselines, Exp4PlaysTheMixtureAndShiftsWeight) {
  auto policy = MakeExp4Policy(2, Exp4Options{0.1, 0.5, 1000});
  ASSERT_TRUE(policy.ok());
  TwoExperts experts;
  std::mt19937_64 gen(5);
  auto d = (*policy)->Decide(2, 3, experts, gen);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->expert, -1);
  // Equal weights: p(a) = 0.9 * (pi_0 + pi_1) / 2 + 0.1 / 3.
  EXPECT_NEAR(d->propensity,
              0.9 * 0.5 * (experts.dist[0][d->arm] + experts.dist[1][d->arm]) + 0.1 / 3, 1e-12);
  // Rewarding arm 2 only (expert 1's favourite) moves the mixture towards expert 1.
  for (int t = 0; t < 300; ++t) {
    auto dt = (*policy)->Decide(2, 3, experts, gen);
    ASSERT_TRUE(dt.ok());
    const std::vector<double> p = {experts.dist[0][dt->arm], experts.dist[1][dt->arm]};
    ASSERT_TRUE((*policy)->Learn(*dt, dt->arm == 2 ? 1.0 : 0.0, p).ok());
  }
  int arm2 = 0;
  for (int t = 0; t < 1000; ++t) arm2 += (*policy)->Decide(2, 3, experts, gen)->arm == 2;
  EXPECT_GT(arm2, 650);  // expert 1 alone plays arm 2 with 0.8*0.9+0.033 = 0.75
  EXPECT_EQ(MakeExp4Policy(2, Exp4Options{0.0, 0.1, 10}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Baselines, EpsilonGreedyAndUniform) {
  EXPECT_EQ(MakeEpsilonGreedyPolicy(2, 1.5).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto greedy = MakeEpsilonGreedyPolicy(2, 0.1);
  ASSERT_TRUE(greedy.ok());
  TwoExperts experts;
  std::mt19937_64 gen(6);
  int ones = 0;
  for (int t = 0; t < 500; ++t) {
    auto d = (*greedy)->Decide(2, 3, experts, gen);
    ASSERT_TRUE(d.ok());
    ones += d->expert == 1;
    ASSERT_TRUE((*greedy)->Learn(*d, d->expert == 1 ? 1.0 : 0.0, {}).ok());
  }
  EXPECT_GT(ones, 400);
  auto uniform = MakeUniformPolicy();
  auto d = uniform->Decide(2, 4, experts, gen);
  ASSERT_TRUE(d.ok());
  EXPECT_DOUBLE_EQ(d->propensity, 0.25);
}

TEST(Policies, ReproducibleFromASeed) {
  auto run = [](uint64_t seed) {
    auto ducb = DUcb::Create(EstimatorOptions(), 2);
    DUcbPolicy policy(*std::move(ducb));
    TwoExperts experts;
    std::mt19937_64 gen(seed);
    std::vector<int> arms;
    for (int t = 0; t < 300; ++t) {
      auto d = policy.Decide(2, 3, experts, gen);
      arms.push_back(d->arm * 10 + d->expert);
      const std::vector<double> p = {experts.dist[0][d->arm], experts.dist[1][d->arm]};
      EXPECT_TRUE(policy.Learn(*d, d->arm == 0 ? 1.0 : 0.0, p).ok());
    }
    return arms;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

}  // namespace
}  // namespace decision
