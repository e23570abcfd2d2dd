// The incremental estimators against the literal reference (tests/reference_estimators.h)
// on randomized streams: several experts, rewards anywhere in [0, 1] (and many zeros),
// experts added mid-stream with backfilled propensities, and divergence refreshes.
// Every variant of both estimators must agree to a relative difference of 1e-9.
#include "core/estimator.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <random>
#include <gtest/gtest.h>

#include "absl/random/random.h"
#include "core/sample_log.h"
#include "tests/reference_estimators.h"

namespace decision {
namespace {

using ::testing::HasSubstr;

constexpr double kRelTol = 1e-9;

void ExpectClose(double incremental, double reference, const std::string& what) {
  if (std::isinf(reference)) {
    EXPECT_EQ(incremental, reference) << what;
    return;
  }
  const double scale = std::max({std::abs(incremental), std::abs(reference), 1e-12});
  EXPECT_LE(std::abs(incremental - reference), kRelTol * scale)
      << what << ": incremental " << incremental << " reference " << reference;
}

// A stream of samples from N synthetic experts over K arms: each sample has a random
// context-specific distribution per expert (a shared base plus per-expert noise, smoothed),
// the chooser's arm is drawn from its distribution, and the reward is 0 half the time and
// uniform in [0, 1] otherwise (so both the Y = 0 shortcut and fractional rewards are hit).
class Stream {
 public:
  Stream(int num_arms, uint64_t seed) : num_arms_(num_arms), gen_(seed) {}

  // Fills one sample's propensities for `num_experts` experts; returns chooser and reward.
  void Next(int num_experts, int chooser, std::vector<double>* propensities, double* reward,
            std::vector<std::vector<double>>* distributions) {
    distributions->assign(num_experts, std::vector<double>(num_arms_));
    std::vector<double> base(num_arms_);
    for (double& b : base) b = absl::Exponential<double>(gen_);
    for (int k = 0; k < num_experts; ++k) {
      double total = 0.0;
      auto& p = (*distributions)[k];
      for (int v = 0; v < num_arms_; ++v) {
        // Experts differ a lot (so ratios exceed clip thresholds) but share the base.
        p[v] = base[v] * std::exp(3.0 * absl::Gaussian<double>(gen_));
        total += p[v];
      }
      for (double& x : p) x = 0.95 * x / total + 0.05 / num_arms_;
    }
    const auto& pj = (*distributions)[chooser];
    double u = absl::Uniform<double>(gen_, 0.0, 1.0), c = 0.0;
    int arm = num_arms_ - 1;
    for (int v = 0; v < num_arms_; ++v) {
      c += pj[v];
      if (u < c) {
        arm = v;
        break;
      }
    }
    propensities->resize(num_experts);
    for (int k = 0; k < num_experts; ++k) (*propensities)[k] = (*distributions)[k][arm];
    *reward = absl::Bernoulli(gen_, 0.5) ? 0.0 : absl::Uniform<double>(gen_, 0.0, 1.0);
    if (absl::Bernoulli(gen_, 0.1)) *reward = 1.0;
  }
  std::mt19937_64& gen() { return gen_; }

 private:
  int num_arms_;
  std::mt19937_64 gen_;
};

DivergenceMatrix RandomDivergences(int n, std::mt19937_64& gen) {
  DivergenceMatrix d = DivergenceMatrix::Identity(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      d.m[i * n + j] = 1.0 + absl::Uniform<double>(gen, 0.0, 2.0);
      d.sigma[i * n + j] = 1.0 + absl::Uniform<double>(gen, 0.0, 3.0);
    }
  }
  return d;
}

DivergenceMatrix Extend(const DivergenceMatrix& old_d, int n, std::mt19937_64& gen) {
  DivergenceMatrix d = RandomDivergences(n, gen);
  for (int i = 0; i < old_d.num_experts; ++i) {
    for (int j = 0; j < old_d.num_experts; ++j) {
      d.m[i * n + j] = old_d.M(i, j);
      d.sigma[i * n + j] = old_d.Sigma(i, j);
    }
  }
  return d;
}

// An estimator of n experts fed `samples` samples of a Stream over 4 arms (seed `seed`),
// chosen in turn.
absl::StatusOr<std::unique_ptr<Estimator>> Fed(const EstimatorOptions& o, int n, uint64_t seed,
                                               int samples) {
  absl::StatusOr<std::unique_ptr<Estimator>> e = MakeEstimator(o, n);
  if (!e.ok()) return e;
  Stream stream(4, seed);
  std::vector<double> p;
  std::vector<std::vector<double>> dists;
  double y;
  for (int t = 0; t < samples; ++t) {
    stream.Next(n, t % n, &p, &y, &dists);
    if (absl::Status s = (*e)->Add(t % n, y, p); !s.ok()) return s;
  }
  return e;
}

// The estimator its snapshot (*state) restores to, which must save as the same bytes.
std::unique_ptr<Estimator> RestoredCopy(const Estimator& e, const EstimatorOptions& o,
                                        std::string* state) {
  absl::StatusOr<std::string> saved = e.Snapshot();
  EXPECT_TRUE(saved.ok()) << saved.status();
  if (!saved.ok()) return nullptr;
  *state = *saved;
  absl::StatusOr<std::unique_ptr<Estimator>> back = RestoreEstimator(o, *state);
  EXPECT_TRUE(back.ok()) << back.status();
  if (!back.ok()) return nullptr;
  absl::StatusOr<std::string> again = (*back)->Snapshot();
  EXPECT_TRUE(again.ok() && *again == *state) << "a restored state saves as other bytes";
  return *std::move(back);
}

struct Variant {
  std::string name;
  EstimatorOptions options;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

std::vector<Variant> AllVariants() {
  std::vector<Variant> v;
  for (auto eps : {EpsilonRule::kPaper, EpsilonRule::kTwoOverT}) {
    for (auto width : {WidthRule::kPaper, WidthRule::kAuthorsCode}) {
      for (auto test : {ClipTest::kRatio, ClipTest::kRewardTimesRatio}) {
        EstimatorOptions o;
        o.kind = EstimatorKind::kClipped;
        o.epsilon_rule = eps;
        o.width_rule = width;
        o.clip_test = test;
        v.push_back({std::string("clipped_") + (eps == EpsilonRule::kPaper ? "epsPaper" : "eps2overT") +
                         (width == WidthRule::kPaper ? "_widthPaper" : "_widthAuthors") +
                         (test == ClipTest::kRatio ? "_testR" : "_testYR"),
                     o});
      }
    }
  }
  EstimatorOptions analysis_clipped;
  analysis_clipped.kind = EstimatorKind::kClipped;
  analysis_clipped.constants = EstimatorConstants::Analysis(2.0, 0.1, 2.0);
  v.push_back({"clipped_analysisConstants", analysis_clipped});
  EstimatorOptions small_c_clipped = analysis_clipped;
  small_c_clipped.constants.C = 0.05;  // eps well below 2: clipping is active but partial
  v.push_back({"clipped_smallC", small_c_clipped});
  EstimatorOptions mom;
  mom.kind = EstimatorKind::kMedianOfMeans;
  v.push_back({"mom_practical", mom});
  EstimatorOptions mom_analysis = mom;
  mom_analysis.constants = EstimatorConstants::Analysis(2.0, 0.1, 2.0);
  v.push_back({"mom_analysisConstants", mom_analysis});
  EstimatorOptions mom_rr = mom;
  mom_rr.grouping = MedianOfMeansGrouping::kRoundRobin;
  v.push_back({"mom_roundRobin", mom_rr});
  EstimatorOptions mom_rr_few = mom_rr;
  mom_rr_few.constants.c2 = 0.5;
  v.push_back({"mom_roundRobinFewGroups", mom_rr_few});
  EstimatorOptions mom_c2 = mom;
  mom_c2.constants.c2 = 0.5;  // few groups: even and odd group counts both occur
  v.push_back({"mom_fewGroups", mom_c2});
  return v;
}

class EstimatorEquivalence : public ::testing::TestWithParam<Variant> {};

void CompareAll(const Estimator& e, const SampleLog& log, const DivergenceMatrix& d,
                const EstimatorOptions& o, const std::string& where) {
  ASSERT_EQ(e.num_samples(), log.size());
  double best_ucb = -1.0;
  std::vector<double> ucb;
  for (int k = 0; k < log.num_experts(); ++k) {
    const ExpertEstimate inc = e.Estimate(k);
    const ExpertEstimate ref = reference::Estimate(log, log.size(), d, o, k);
    ExpectClose(inc.mean, ref.mean, where + " mean of expert " + std::to_string(k));
    ExpectClose(inc.width, ref.width, where + " width of expert " + std::to_string(k));
    ucb.push_back(ref.mean + ref.width);
    best_ucb = std::max(best_ucb, ucb.back());
  }
  // The serving argmax (which may prune with bounds) picks an expert with the largest UCB,
  // also when some experts are not selectable.
  std::mt19937_64 gen(e.num_samples());
  std::vector<bool> selectable(log.num_experts(), true);
  const int chosen = e.ArgmaxUcb(selectable, gen);
  ASSERT_GE(chosen, 0);
  ExpectClose(ucb[chosen], best_ucb, where + " argmax");
  selectable[chosen] = false;
  double second = -1.0;
  for (int k = 0; k < log.num_experts(); ++k) if (selectable[k]) second = std::max(second, ucb[k]);
  const int next = e.ArgmaxUcb(selectable, gen);
  ASSERT_NE(next, chosen);
  ExpectClose(ucb[next], second, where + " argmax without the best");
}

TEST_P(EstimatorEquivalence, IncrementalEqualsLiteralReference) {
  const EstimatorOptions& o = GetParam().options;
  const int num_arms = 6;
  for (uint64_t seed : {1u, 2u, 3u}) {
    Stream stream(num_arms, seed);
    int n = 4;
    SampleLog log(n);
    auto made = MakeEstimator(o, n);
    ASSERT_TRUE(made.ok()) << made.status();
    Estimator& e = **made;
    DivergenceMatrix d = RandomDivergences(n, stream.gen());
    ASSERT_TRUE(e.SetDivergences(log, d).ok());
    std::vector<double> propensities;
    std::vector<std::vector<double>> dists;
    std::vector<std::vector<std::vector<double>>> history;  // per sample, per expert dist
    std::vector<int> arms;
    double reward;
    const int total = 700;
    for (int t = 1; t <= total; ++t) {
      const int chooser = absl::Uniform<int>(stream.gen(), 0, n);
      stream.Next(n, chooser, &propensities, &reward, &dists);
      ASSERT_TRUE(log.Append(chooser, reward, propensities).ok());
      // Updates arrive one at a time, and sometimes in bursts of several samples.
      if (t % 5 != 0 || t < 20) {
        ASSERT_TRUE(e.Update(log).ok());
      }
      if (t == 250 || t == 480) {
        // A new expert mid-stream, with the old divergence block kept: the estimator
        // computes only the new row. Its propensities are backfilled from a fresh random
        // distribution per sample (any values in (0, 1] are a valid backfill).
        ASSERT_TRUE(e.Update(log).ok());
        std::vector<double> backfill(log.size());
        for (double& p : backfill) p = absl::Uniform<double>(stream.gen(), 0.01, 1.0);
        ASSERT_TRUE(log.AddExpert(backfill).ok());
        ++n;
        d = Extend(d, n, stream.gen());
        ASSERT_TRUE(e.SetDivergences(log, d).ok());
        CompareAll(e, log, d, o, "after adding expert at t=" + std::to_string(t));
      }
      if (t == 400) {
        // A divergence refresh: every entry changes, the state is rebuilt from the log.
        ASSERT_TRUE(e.Update(log).ok());
        d = RandomDivergences(n, stream.gen());
        ASSERT_TRUE(e.SetDivergences(log, d).ok());
        CompareAll(e, log, d, o, "after refresh");
      }
      if (t % 5 != 0 && (t < 60 || t % 23 == 0 || t == total - 1)) {
        CompareAll(e, log, d, o, GetParam().name + " t=" + std::to_string(t));
      }
      if (HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, EstimatorEquivalence, ::testing::ValuesIn(AllVariants()),
                         [](const auto& info) { return info.param.name; });

// Longer streams than the parameterised test: round-robin regroups many times (l(t) steps
// 40 -> 48 -> 60 -> 80 while t passes L = 240 many times), and the clipped estimator folds
// entries once L(t) passes them, then must reclassify what it kept when M changes.
TEST(Estimator, LongStreamsMatchTheReferenceAcrossRegroupingsAndRefreshes) {
  EstimatorOptions mom;
  EstimatorOptions clipped;
  clipped.kind = EstimatorKind::kClipped;
  EstimatorOptions clipped_small_c = clipped;
  clipped_small_c.constants = EstimatorConstants::Analysis(2.0, 0.1, 2.0);
  clipped_small_c.constants.C = 0.05;
  for (const EstimatorOptions& o : {mom, clipped, clipped_small_c}) {
    Stream stream(6, 21);
    int n = 3;
    SampleLog log(n);
    auto made = MakeEstimator(o, n);
    ASSERT_TRUE(made.ok());
    Estimator& e = **made;
    DivergenceMatrix d = RandomDivergences(n, stream.gen());
    ASSERT_TRUE(e.SetDivergences(log, d).ok());
    std::vector<double> p;
    std::vector<std::vector<double>> dists;
    double y;
    for (int t = 1; t <= 6000; ++t) {
      const int chooser = absl::Uniform<int>(stream.gen(), 0, n);
      stream.Next(n, chooser, &p, &y, &dists);
      ASSERT_TRUE(log.Append(chooser, y, p).ok());
      if (t % 7 != 0) {
        ASSERT_TRUE(e.Update(log).ok());  // sometimes two at once
      }
      if (t == 2500) {
        std::vector<double> backfill(log.size());
        for (double& x : backfill) x = absl::Uniform<double>(stream.gen(), 0.01, 1.0);
        ASSERT_TRUE(log.AddExpert(backfill).ok());
        ++n;
        d = Extend(d, n, stream.gen());
        ASSERT_TRUE(e.SetDivergences(log, d).ok());
      }
      if (t == 4000) {
        d = RandomDivergences(n, stream.gen());
        ASSERT_TRUE(e.SetDivergences(log, d).ok());
      }
      if (t == 1000 || t == 2500 || t == 3333 || t == 4000 || t == 5998) {
        CompareAll(e, log, d, o, DescribeEstimatorOptions(o) + " t=" + std::to_string(t));
      }
      if (HasFailure()) return;
    }
  }
}

// The estimators' own state is bounded: round-robin's does not change size with t; the
// clipped estimator's grows only by the entries it keeps, up to max_kept_clipped.
TEST(Estimator, StateDoesNotGrowWithTheLog) {
  for (EstimatorKind kind : {EstimatorKind::kMedianOfMeans, EstimatorKind::kClipped}) {
    EstimatorOptions o;
    o.kind = kind;
    o.max_kept_clipped = 4096;
    Stream stream(6, 5);
    SampleLog log(4);
    auto made = MakeEstimator(o, 4);
    ASSERT_TRUE(made.ok());
    ASSERT_TRUE((*made)->SetDivergences(log, RandomDivergences(4, stream.gen())).ok());
    std::vector<double> p;
    std::vector<std::vector<double>> dists;
    double y;
    EstimatorStats at_20k;
    for (int t = 1; t <= 200'000; ++t) {
      const int chooser = t % 4;
      stream.Next(4, chooser, &p, &y, &dists);
      ASSERT_TRUE(log.Append(chooser, y, p).ok());
      ASSERT_TRUE((*made)->Update(log).ok());
      if (t == 20'000) at_20k = (*made)->Stats();
    }
    const EstimatorStats at_200k = (*made)->Stats();
    if (kind == EstimatorKind::kMedianOfMeans) {
      // 240 fine groups x 4 experts x (4 + 4) doubles, a tail of < 240 samples, scratch.
      EXPECT_LE(at_200k.state_bytes, 88'000);
      EXPECT_LE(at_200k.state_bytes, at_20k.state_bytes + 240 * 6 * 8);
    } else {
      // The stream's experts differ a lot (ratios in the 100s, far above L(t) ~ 10), so
      // entries wait for good and their number grows with t until the cap drops some.
      EXPECT_LE(at_200k.clipped_kept, 4096);
      EXPECT_GT(at_200k.clipped_dropped, 0);
      EXPECT_LE(at_200k.state_bytes, 32 * 2 * 4096 + 2'000);
    }
  }
}

// Beyond max_kept_clipped the waiting entries that would be released last are dropped:
// the kept entries stay within the cap, the estimate can only be lower than without the
// cap, and the stats say how many were given up.
TEST(Estimator, ClippedCapKeepsEntriesBoundedAndCountsWhatItDrops) {
  EstimatorOptions uncapped;
  uncapped.kind = EstimatorKind::kClipped;
  uncapped.max_kept_clipped = 0;
  EstimatorOptions capped = uncapped;
  capped.max_kept_clipped = 64;
  auto a = MakeEstimator(uncapped, 4);
  auto b = MakeEstimator(capped, 4);
  ASSERT_TRUE(a.ok() && b.ok());
  Stream stream(6, 8);
  SampleLog log(4);
  std::vector<double> p;
  std::vector<std::vector<double>> dists;
  double y;
  int64_t max_kept = 0;
  for (int t = 1; t <= 5000; ++t) {
    stream.Next(4, t % 4, &p, &y, &dists);
    ASSERT_TRUE(log.Append(t % 4, y, p).ok());
    ASSERT_TRUE((*a)->Update(log).ok());
    ASSERT_TRUE((*b)->Update(log).ok());
    max_kept = std::max(max_kept, (*b)->Stats().clipped_kept);
  }
  EXPECT_LE(max_kept, 64);
  EXPECT_GT((*a)->Stats().clipped_kept, 64);
  EXPECT_GT((*b)->Stats().clipped_dropped, 0);
  for (int k = 0; k < 4; ++k) {
    ExpectClose((*a)->Estimate(k).mean,
                reference::Clipped(log, log.size(), DivergenceMatrix::Identity(4), uncapped, k).mean,
                "uncapped");
    EXPECT_LE((*b)->Estimate(k).mean, (*a)->Estimate(k).mean + 1e-12) << k;
    EXPECT_EQ((*b)->Estimate(k).width, (*a)->Estimate(k).width) << k;
  }
}

// Add() is the log-free entry point: sample by sample it computes exactly what Update()
// computes from a log, refreshes need no log, and bad samples change nothing.
TEST(Estimator, AddLearnsWithoutALogExactlyAsUpdate) {
  for (EstimatorKind kind : {EstimatorKind::kMedianOfMeans, EstimatorKind::kClipped}) {
    EstimatorOptions o;
    o.kind = kind;
    auto from_log = MakeEstimator(o, 3);
    auto added = MakeEstimator(o, 3);
    ASSERT_TRUE(from_log.ok() && added.ok());
    Stream stream(5, 17);
    SampleLog log(3);
    const SampleLog no_log(3);
    std::vector<double> p;
    std::vector<std::vector<double>> dists;
    double y;
    for (int t = 1; t <= 3000; ++t) {
      stream.Next(3, t % 3, &p, &y, &dists);
      ASSERT_TRUE(log.Append(t % 3, y, p).ok());
      ASSERT_TRUE((*added)->Add(t % 3, y, p).ok());
      if (t == 1500) {
        const DivergenceMatrix d = RandomDivergences(3, stream.gen());
        ASSERT_TRUE((*from_log)->Update(log).ok());
        ASSERT_TRUE((*from_log)->SetDivergences(log, d).ok());
        ASSERT_TRUE((*added)->SetDivergences(no_log, d).ok());
      }
    }
    ASSERT_TRUE((*from_log)->Update(log).ok());
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ((*added)->Estimate(k).mean, (*from_log)->Estimate(k).mean) << k;
      EXPECT_EQ((*added)->Estimate(k).width, (*from_log)->Estimate(k).width) << k;
    }
    const ExpertEstimate before = (*added)->Estimate(1);
    EXPECT_EQ((*added)->Add(3, 1.0, {0.5, 0.5, 0.5}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*added)->Add(0, 1.5, {0.5, 0.5, 0.5}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*added)->Add(0, 1.0, {0.5, 0.5}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*added)->Add(0, 1.0, {0.5, 0.0, 0.5}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*added)->Add(0, std::nan(""), {0.5, 0.5, 0.5}).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*added)->num_samples(), 3000);
    EXPECT_EQ((*added)->Estimate(1).mean, before.mean);
    // New experts need their backfill: a log without the samples is refused.
    EXPECT_EQ((*added)->SetDivergences(SampleLog(4), DivergenceMatrix::Identity(4)).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*added)->num_experts(), 3);
  }
  EstimatorOptions contiguous;
  contiguous.grouping = MedianOfMeansGrouping::kContiguous;
  auto c = MakeEstimator(contiguous, 2);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->Add(0, 1.0, {0.5, 0.5}).code(), absl::StatusCode::kUnimplemented);
}

// Without a log (what the service does): samples through Add, new experts through
// NewExpertRows fed the past samples as storage would give them (chooser, reward, the
// chooser's propensity, the new expert's) while the estimator keeps learning, divergence
// refreshes in place, and the state saved and restored mid-stream. Every variant that
// keeps no log must agree with the literal reference, and a restored estimator must go on
// bit for bit as the original.
TEST_P(EstimatorEquivalence, WithoutALogNewRowsAndSnapshotsMatchTheReference) {
  const EstimatorOptions& o = GetParam().options;
  if (o.kind == EstimatorKind::kMedianOfMeans &&
      o.grouping == MedianOfMeansGrouping::kContiguous) {
    GTEST_SKIP() << "contiguous median of means reads the log (covered by the log tests)";
  }
  const int num_arms = 6;
  for (uint64_t seed : {1u, 2u}) {
    Stream stream(num_arms, seed);
    int n = 4;
    SampleLog log(n);  // the reference's, never given to the estimator
    auto made = MakeEstimator(o, n);
    ASSERT_TRUE(made.ok()) << made.status();
    std::unique_ptr<Estimator> e = *std::move(made);
    DivergenceMatrix d = RandomDivergences(n, stream.gen());
    ASSERT_TRUE(e->SetDivergences(SampleLog(n), d).ok());
    // The same samples through the log: round-robin's state must then be the same bytes
    // (the new rows' sums are added in the same order), which a median may not show.
    auto with_log_made = MakeEstimator(o, n);
    ASSERT_TRUE(with_log_made.ok());
    std::unique_ptr<Estimator> with_log = *std::move(with_log_made);
    ASSERT_TRUE(with_log->SetDivergences(log, d).ok());
    const bool same_bytes = o.kind == EstimatorKind::kMedianOfMeans;
    const auto expect_same_state = [&](const std::string& where) {
      if (!same_bytes) return;
      ASSERT_TRUE(with_log->Update(log).ok());
      auto a = e->Snapshot();
      auto b = with_log->Snapshot();
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_TRUE(*a == *b) << where << ": the state without a log differs from the log's";
    };
    std::unique_ptr<Estimator> restored;  // from a snapshot, fed the same samples since
    std::vector<double> p;
    std::vector<std::vector<double>> dists;
    double reward;
    // An expert registered at `started` (its rows begin), added at `started + lag`.
    std::unique_ptr<ExpertRows> rows;
    int adding = 0;
    std::vector<std::vector<double>> columns;  // the new experts' propensities so far
    const auto feed = [&](int64_t from, int64_t to) {
      for (int64_t s = from; s < to; ++s) {
        std::vector<double> q;
        for (const auto& c : columns) q.push_back(c[s]);
        const int j = log.chooser(s);
        ASSERT_TRUE(rows->Add(j, log.reward(s), log.propensity(j, s), q).ok());
      }
    };
    int64_t fed = 0;
    for (int t = 1; t <= 1300; ++t) {
      const int chooser = absl::Uniform<int>(stream.gen(), 0, n);
      stream.Next(n, chooser, &p, &reward, &dists);
      ASSERT_TRUE(log.Append(chooser, reward, p).ok());
      ASSERT_TRUE(e->Add(chooser, reward, p).ok());
      if (restored != nullptr) {
        ASSERT_TRUE(restored->Add(chooser, reward, p).ok());
      }
      for (auto& c : columns) c.push_back(absl::Uniform<double>(stream.gen(), 0.01, 1.0));
      if (t == 250 || t == 700) {
        // One new expert at 250, two at 700; their rows start now and are fed the past
        // while samples keep coming.
        adding = t == 250 ? 1 : 2;
        auto started = e->NewExpertRows(adding);
        ASSERT_TRUE(started.ok()) << started.status();
        rows = *std::move(started);
        columns.assign(adding, {});
        for (auto& c : columns) {
          for (int64_t s = 0; s < log.size(); ++s) {
            c.push_back(absl::Uniform<double>(stream.gen(), 0.01, 1.0));
          }
        }
        feed(0, log.size() - 37);
        fed = log.size() - 37;
      }
      if (rows != nullptr && (t == 290 || t == 761)) {
        feed(fed, log.size());
        // Rows that miss a sample are refused, and nothing changes.
        const DivergenceMatrix wider = Extend(d, n + adding, stream.gen());
        auto early = e->NewExpertRows(adding);
        ASSERT_TRUE(early.ok());
        EXPECT_EQ(e->AddExperts(*std::move(early), wider).code(),
                  absl::StatusCode::kFailedPrecondition);
        EXPECT_EQ(e->AddExperts(std::move(rows), DivergenceMatrix::Identity(n)).code(),
                  absl::StatusCode::kInvalidArgument);
        ASSERT_EQ(e->num_experts(), n);
        auto again = e->NewExpertRows(adding);
        ASSERT_TRUE(again.ok());
        rows = *std::move(again);
        feed(0, log.size());
        ASSERT_TRUE(e->AddExperts(std::move(rows), wider).ok());
        ASSERT_TRUE(with_log->Update(log).ok());
        for (const auto& c : columns) ASSERT_TRUE(log.AddExpert(c).ok());
        ASSERT_TRUE(with_log->SetDivergences(log, wider).ok());
        n += adding;
        d = wider;
        expect_same_state("after adding experts at t=" + std::to_string(t));
        columns.clear();
        restored = nullptr;  // it has fewer experts now
        CompareAll(*e, log, d, o, "after adding experts at t=" + std::to_string(t));
      }
      if (t == 400 || t == 1000) {
        d = RandomDivergences(n, stream.gen());
        ASSERT_TRUE(e->SetDivergences(SampleLog(n), d).ok());
        if (restored != nullptr) {
          ASSERT_TRUE(restored->SetDivergences(SampleLog(n), d).ok());
        }
        ASSERT_TRUE(with_log->Update(log).ok());
        ASSERT_TRUE(with_log->SetDivergences(log, d).ok());
        expect_same_state("after a refresh at t=" + std::to_string(t));
        CompareAll(*e, log, d, o, "after refresh in place");
      }
      if (t == 333 || t == 800 || t == 1111) {
        std::string state;
        restored = RestoredCopy(*e, o, &state);
        ASSERT_NE(restored, nullptr);
      }
      if (restored != nullptr) {
        ASSERT_EQ(restored->num_samples(), e->num_samples());
        for (int k = 0; k < n; ++k) {
          ASSERT_EQ(restored->Estimate(k).mean, e->Estimate(k).mean) << "t=" << t << " k=" << k;
          ASSERT_EQ(restored->Estimate(k).width, e->Estimate(k).width) << "t=" << t;
          ASSERT_EQ(restored->EffectiveSampleSize(k), e->EffectiveSampleSize(k));
        }
      }
      if (t % 41 == 0 || t == 1299) {
        CompareAll(*e, log, d, o, GetParam().name + " t=" + std::to_string(t));
        expect_same_state("t=" + std::to_string(t));
      }
      if (HasFailure()) return;
    }
  }
}

// The top-left n x n block of d.
DivergenceMatrix Block(const DivergenceMatrix& d, int n) {
  DivergenceMatrix b = DivergenceMatrix::Identity(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      b.m[i * n + j] = d.M(i, j);
      b.sigma[i * n + j] = d.Sigma(i, j);
    }
  }
  return b;
}

// `trials` copies of `state`, each with one bit flipped at or after byte `from`: each is
// refused with DATA_LOSS, or restores to an estimator that can choose (a damaged value that
// passes the checks gives wrong estimates, never an invalid computation).
void FlipBitsOf(const std::string& state, const EstimatorOptions& o, size_t from, int trials,
                uint64_t seed) {
  std::mt19937_64 gen(seed);
  for (int trial = 0; trial < trials; ++trial) {
    std::string damaged = state;
    damaged[absl::Uniform<size_t>(gen, from, damaged.size())] ^=
        static_cast<char>(1 << absl::Uniform<int>(gen, 0, 8));
    auto bad = RestoreEstimator(o, damaged);
    if (!bad.ok()) {
      ASSERT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
      continue;
    }
    (*bad)->ArgmaxUcb(std::vector<bool>((*bad)->num_experts(), true), gen);
  }
}

// The next sample of `stream`, chosen by `chooser`: into `log` with every expert's column,
// and learnt by `e` (its n experts) and by `restored`, if any, which must go on bit for bit.
void LearnNext(Stream& stream, int chooser, int n, SampleLog* log, Estimator* e,
               Estimator* restored) {
  std::vector<double> p;
  std::vector<std::vector<double>> dists;
  double reward;
  stream.Next(log->num_experts(), chooser, &p, &reward, &dists);
  ASSERT_TRUE(log->Append(chooser, reward, p).ok());
  const std::vector<double> seen(p.begin(), p.begin() + n);
  ASSERT_TRUE(e->Add(chooser, reward, seen).ok());
  if (restored == nullptr) return;
  ASSERT_TRUE(restored->Add(chooser, reward, seen).ok());
  for (int k = 0; k < n; ++k) {
    ASSERT_EQ(restored->Estimate(k).mean, e->Estimate(k).mean);
    ASSERT_EQ(restored->Estimate(k).width, e->Estimate(k).width);
  }
}

// Experts added with a window (rows from a first sample on, as a store that keeps only
// the recent log feeds them, with samples skipped, as deleted contexts are) against the
// literal reference of the windowed definition: mid-stream, while samples keep coming,
// with windows that leave groups empty, next to unwindowed experts, across refreshes and
// snapshots.
TEST(Estimator, WindowedExpertsMatchTheReference) {
  EstimatorOptions wide;
  wide.constants.c2 = 8.0;
  for (const EstimatorOptions& o : {EstimatorOptions{}, wide}) {
    constexpr int kMax = 7;
    Stream stream(6, 17);
    SampleLog log(kMax);  // every expert's column from the start: the reference's
    DivergenceMatrix full = RandomDivergences(kMax, stream.gen());
    int n = 2;
    auto made = MakeEstimator(o, n);
    ASSERT_TRUE(made.ok());
    std::unique_ptr<Estimator> e = *std::move(made);
    ASSERT_TRUE(e->SetDivergences(SampleLog(n), Block(full, n)).ok());
    std::vector<int64_t> first(kMax, 0);
    // Samples each window leaves out (ExpertRows::Skip), by expert: one in 23 of those fed,
    // and the next to last, which is still in the tail when the experts are added.
    std::vector<std::vector<int64_t>> excluded(kMax);
    std::unique_ptr<Estimator> restored;
    // Expert 2, the only one of the first window, is retired at t = 1091, when three later
    // windows exist and the newest has a skipped sample in the tail: its window is freed and
    // the others' renumbered under them.
    constexpr int kRetired = 2, kRetiredAt = 1091;
    std::optional<ExpertEstimate> frozen;
    const auto compare = [&](const std::string& where) {
      ASSERT_EQ(e->num_samples(), log.size());
      std::vector<double> ucb;
      for (int k = 0; k < n; ++k) {
        EXPECT_EQ(e->WindowStart(k), first[k]) << where;
        const ExpertEstimate inc = e->Estimate(k);
        if (k == kRetired && frozen.has_value()) {
          EXPECT_EQ(inc.mean, frozen->mean) << where;
          EXPECT_EQ(inc.width, frozen->width) << where;
          ucb.push_back(-1.0);  // never picked
          continue;
        }
        const ExpertEstimate ref =
            reference::MedianOfMeans(log, log.size(), full, o, k, first[k], excluded[k]);
        ExpectClose(inc.mean, ref.mean, where + " mean of expert " + std::to_string(k));
        ExpectClose(inc.width, ref.width, where + " width of expert " + std::to_string(k));
        ucb.push_back(ref.mean + ref.width);
      }
      std::mt19937_64 gen(log.size());
      const int chosen = e->ArgmaxUcb(std::vector<bool>(n, true), gen);
      ASSERT_GE(chosen, 0);
      ExpectClose(ucb[chosen], *std::max_element(ucb.begin(), ucb.end()), where + " argmax");
    };
    // (when started, when added, how many, window start; -1: t - 70, -2: the newest
    // sample in groups)
    struct Plan {
      int start, add, count;
      int64_t first;
    };
    const Plan plans[] = {{300, 340, 1, 180}, {700, 703, 2, -2}, {900, 950, 1, 0},
                          {1000, 1090, 1, -1}};
    std::unique_ptr<ExpertRows> rows;
    int64_t fed = 0, window = 0;
    const Plan* adding = nullptr;
    std::vector<int64_t> skipping;
    const auto feed = [&](int64_t to) {
      for (; fed < to; ++fed) {
        const int j = log.chooser(fed);
        if (fed % 23 == 5 || fed == to - 2) {
          ASSERT_TRUE(rows->Skip(j).ok());
          skipping.push_back(fed);
          continue;
        }
        std::vector<double> q;
        for (int i = 0; i < adding->count; ++i) q.push_back(log.propensity(n + i, fed));
        ASSERT_TRUE(rows->Add(j, log.reward(fed), log.propensity(j, fed), q).ok());
      }
    };
    for (int t = 1; t <= 1500; ++t) {
      const int chooser = absl::Uniform<int>(stream.gen(), 0, n);
      LearnNext(stream, chooser, n, &log, e.get(), restored.get());
      ASSERT_FALSE(HasFailure()) << "t=" << t;
      for (const Plan& plan : plans) {
        if (t == plan.start) {
          // A window may start anywhere up to the samples in groups, not past them.
          EXPECT_EQ(e->NewExpertRows(1, log.size() + 1).status().code(),
                    absl::StatusCode::kInvalidArgument);
          EXPECT_EQ(e->NewExpertRows(1, -1).status().code(),
                    absl::StatusCode::kInvalidArgument);
          window = plan.first >= 0 ? plan.first : plan.first == -1 ? t - 70 : -1;
          if (window < 0) {  // the last sample a window may start at
            window = log.size();
            while (!e->NewExpertRows(1, window).ok()) --window;
          }
          auto started = e->NewExpertRows(plan.count, window);
          ASSERT_TRUE(started.ok()) << started.status();
          rows = *std::move(started);
          adding = &plan;
          fed = window;
          skipping.clear();
          EXPECT_EQ(rows->Skip(n).code(), absl::StatusCode::kInvalidArgument);
          feed(log.size() - 1);  // the newest one later, after more samples came
        }
        if (t == plan.add) {
          feed(log.size());
          ASSERT_TRUE(e->AddExperts(std::move(rows), Block(full, n + plan.count)).ok());
          for (int i = 0; i < plan.count; ++i) {
            first[n + i] = window;
            excluded[n + i] = skipping;
          }
          n += plan.count;
          restored = nullptr;
          compare("after adding experts at t=" + std::to_string(t));
        }
      }
      if (t == kRetiredAt) {
        ASSERT_EQ(n, kMax);
        const int64_t bytes = e->Stats().state_bytes;
        frozen = e->Estimate(kRetired);
        ASSERT_TRUE(e->Retire(kRetired).ok());
        EXPECT_GE(bytes - e->Stats().state_bytes, 8 * MedianOfMeansFineGroups(o) * 2);
        first[kRetired] = 0;
        restored = nullptr;
        compare("after retiring expert 2");
      }
      if (t == 500 || t == 1200) {
        const DivergenceMatrix previous = full;
        full = RandomDivergences(kMax, stream.gen());
        // A retired expert's pairs stay as they were (Estimator::Retire).
        for (int i = 0; i < kMax && frozen.has_value(); ++i) {
          for (int j : {i * kMax + kRetired, kRetired * kMax + i}) {
            full.m[j] = previous.m[j];
            full.sigma[j] = previous.sigma[j];
          }
        }
        ASSERT_TRUE(e->SetDivergences(SampleLog(n), Block(full, n)).ok());
        if (restored != nullptr) {
          ASSERT_TRUE(restored->SetDivergences(SampleLog(n), Block(full, n)).ok());
        }
        compare("after a refresh at t=" + std::to_string(t));
      }
      if (t == 800 || t == 1300) {
        std::string saved;
        restored = RestoredCopy(*e, o, &saved);
        ASSERT_NE(restored, nullptr);
        const std::string* state = &saved;
        for (int k = 0; k < n; ++k) EXPECT_EQ(restored->WindowStart(k), first[k]);
        // The windows are part of what a damaged state is checked for.
        for (size_t len = 0; len < state->size(); len += 1 + len / 8) {
          ASSERT_EQ(RestoreEstimator(o, state->substr(0, len)).status().code(),
                    absl::StatusCode::kDataLoss)
              << len;
        }
        FlipBitsOf(*state, o, state->size() / 2, 500, t);
      }
      if (t % 7 == 0 && (t < 120 || t % 29 == 0 || (t > 700 && t < 760))) {
        compare("t=" + std::to_string(t));
      }
      if (HasFailure()) return;
    }
    ASSERT_EQ(n, kMax);
    compare("at the end");
    // The windows changed what the experts' estimates count: without them they differ.
    bool differs = false;
    for (int k = 0; k < n; ++k) {
      if (first[k] == 0 && excluded[k].empty()) continue;
      differs |= e->Estimate(k).mean !=
                 reference::MedianOfMeans(log, log.size(), full, o, k, 0).mean;
    }
    EXPECT_TRUE(differs);
  }
}

// Retired experts (Estimator::Retire) against the literal reference: their rows are
// freed and their columns folded under divergences fixed at retirement, while samples
// they chose keep coming in (decided before, learnt after), refreshes try to change their
// pairs, experts are added after them (one with a window), and snapshots go on bit for bit.
TEST(Estimator, RetiredExpertsAreFoldedAndMatchTheReference) {
  EstimatorOptions wide;
  wide.constants.c2 = 8.0;
  for (const EstimatorOptions& o : {EstimatorOptions{}, wide}) {
    constexpr int kMax = 7;
    Stream stream(5, 23);
    SampleLog log(kMax);
    DivergenceMatrix full = RandomDivergences(kMax, stream.gen());
    // The divergences the estimates must use: full's, except pairs with an expert retired
    // before the matrix came, which keep the values they had then.
    DivergenceMatrix fixed = full;
    DivergenceMatrix naive = full;  // the last matrix given, pairs with retired ones too
    int n = 4;
    auto made = MakeEstimator(o, n);
    ASSERT_TRUE(made.ok());
    std::unique_ptr<Estimator> e = *std::move(made);
    ASSERT_TRUE(e->SetDivergences(SampleLog(n), Block(full, n)).ok());
    std::vector<bool> retired(kMax, false);
    std::vector<ExpertEstimate> at_retirement(kMax);
    std::vector<int64_t> first(kMax, 0), retired_at(kMax, -1);
    std::vector<std::vector<int64_t>> excluded(kMax);
    // A new matrix for the first `count` experts: fixed takes it but for retired pairs.
    const auto offer = [&](const DivergenceMatrix& next, int count) {
      for (int i = 0; i < count; ++i) {
        for (int j = 0; j < count; ++j) {
          naive.m[i * kMax + j] = next.M(i, j);
          naive.sigma[i * kMax + j] = next.Sigma(i, j);
          if ((retired[i] || retired[j]) && i < n && j < n) continue;
          fixed.m[i * kMax + j] = next.M(i, j);
          fixed.sigma[i * kMax + j] = next.Sigma(i, j);
        }
      }
    };
    std::unique_ptr<Estimator> restored;
    const auto compare = [&](const std::string& where) {
      ASSERT_EQ(e->num_samples(), log.size());
      for (int k = 0; k < n; ++k) {
        const ExpertEstimate inc = e->Estimate(k);
        EXPECT_EQ(e->Retired(k), retired[k]) << where;
        if (retired[k]) {
          EXPECT_EQ(inc.mean, at_retirement[k].mean) << where << " expert " << k;
          EXPECT_EQ(inc.width, at_retirement[k].width) << where << " expert " << k;
          continue;
        }
        const ExpertEstimate ref =
            reference::MedianOfMeans(log, log.size(), fixed, o, k, first[k], excluded[k]);
        ExpectClose(inc.mean, ref.mean, where + " mean of expert " + std::to_string(k));
        ExpectClose(inc.width, ref.width, where + " width of expert " + std::to_string(k));
      }
      const DivergenceMatrix& used = e->divergences();
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          if (retired[i] || retired[j]) {
            EXPECT_EQ(used.Sigma(i, j), fixed.sigma[i * kMax + j]) << where << " " << i << j;
            EXPECT_EQ(used.M(i, j), fixed.m[i * kMax + j]) << where << " " << i << j;
          }
        }
      }
      // Never picked, even when the caller says it may be.
      std::mt19937_64 gen(log.size());
      for (int trial = 0; trial < 20; ++trial) {
        const int chosen = e->ArgmaxUcb(std::vector<bool>(n, true), gen);
        ASSERT_GE(chosen, 0);
        EXPECT_FALSE(retired[chosen]) << where;
      }
    };
    const auto retire = [&](int k, int t) {
      std::vector<ExpertEstimate> others(n);
      for (int i = 0; i < n; ++i) others[i] = e->Estimate(i);
      const int64_t bytes = e->Stats().state_bytes;
      ASSERT_TRUE(e->Retire(k).ok());
      ASSERT_TRUE(e->Retire(k).ok());  // again: nothing more
      retired[k] = true;
      retired_at[k] = t;
      at_retirement[k] = others[k];
      EXPECT_LT(e->Stats().state_bytes, bytes);
      // Retiring changes nobody's estimate.
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(e->Estimate(i).mean, others[i].mean) << "retiring " << k;
        EXPECT_EQ(e->Estimate(i).width, others[i].width) << "retiring " << k;
      }
      restored = nullptr;
      compare("after retiring " + std::to_string(k) + " at t=" + std::to_string(t));
    };
    for (int t = 1; t <= 1600; ++t) {
      // Mostly live choosers; a retired one for 60 samples after its retirement (its
      // decisions still being joined).
      std::vector<int> choosers;
      for (int k = 0; k < n; ++k) {
        if (!retired[k] || t - retired_at[k] < 60) choosers.push_back(k);
      }
      const int chooser = choosers[absl::Uniform<size_t>(stream.gen(), 0, choosers.size())];
      LearnNext(stream, chooser, n, &log, e.get(), restored.get());
      ASSERT_FALSE(HasFailure()) << "t=" << t;
      if (t == 300) retire(1, t);
      if (t == 400 || t == 1000) {
        const DivergenceMatrix next = RandomDivergences(kMax, stream.gen());
        ASSERT_TRUE(e->SetDivergences(SampleLog(n), Block(next, n)).ok());
        if (restored != nullptr) {
          ASSERT_TRUE(restored->SetDivergences(SampleLog(n), Block(next, n)).ok());
        }
        offer(next, n);
        compare("after a refresh at t=" + std::to_string(t));
      }
      if (t == 500 || t == 800) {
        // Experts added after a retirement: every sample (t = 500, two of them) or a
        // window with a skipped sample (t = 800).
        const int count = t == 500 ? 2 : 1;
        const int64_t window = t == 500 ? 0 : t - 150;
        auto rows = e->NewExpertRows(count, window);
        ASSERT_TRUE(rows.ok()) << rows.status();
        std::vector<int64_t> skipped;
        for (int64_t s = window; s < log.size(); ++s) {
          if (t == 800 && s % 31 == 3) {
            ASSERT_TRUE((*rows)->Skip(log.chooser(s)).ok());
            skipped.push_back(s);
            continue;
          }
          std::vector<double> q;
          for (int i = 0; i < count; ++i) q.push_back(log.propensity(n + i, s));
          ASSERT_TRUE(
              (*rows)->Add(log.chooser(s), log.reward(s), log.propensity(log.chooser(s), s), q)
                  .ok());
        }
        const DivergenceMatrix next = RandomDivergences(kMax, stream.gen());
        ASSERT_TRUE(e->AddExperts(*std::move(rows), Block(next, n + count)).ok());
        offer(next, n + count);
        for (int i = 0; i < count; ++i) {
          first[n + i] = window;
          excluded[n + i] = skipped;
        }
        n += count;
        restored = nullptr;
        compare("after adding experts at t=" + std::to_string(t));
      }
      if (t == 650) {
        retire(0, t);
        retire(4, t);  // one added after the first retirement
      }
      if (t == 1200) {
        // The windowed one, the only expert of its window: the window (8 L per expert
        // there when it was added, six of them) is freed with its row.
        const int64_t bytes = e->Stats().state_bytes;
        retire(6, t);
        EXPECT_GE(bytes - e->Stats().state_bytes, 8 * MedianOfMeansFineGroups(o) * 6);
        EXPECT_EQ(e->WindowStart(6), 0);
      }
      if (t == 900 || t == 1300) {
        std::string saved;
        restored = RestoredCopy(*e, o, &saved);
        ASSERT_NE(restored, nullptr);
        for (int k = 0; k < n; ++k) EXPECT_EQ(restored->Retired(k), retired[k]);
        FlipBitsOf(saved, o, 5, 300, t);
      }
      if (t % 11 == 0 && (t < 100 || t % 37 == 0)) compare("t=" + std::to_string(t));
      if (HasFailure()) return;
    }
    ASSERT_EQ(n, kMax);
    compare("at the end");
    EXPECT_EQ(e->Retire(kMax).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(e->Retire(-1).code(), absl::StatusCode::kInvalidArgument);
    // The fixed pairs matter: with the last matrix everywhere the estimates differ.
    bool differs = false;
    for (int k = 0; k < n; ++k) {
      if (retired[k]) continue;
      differs |= e->Estimate(k).mean != reference::MedianOfMeans(log, log.size(), naive, o, k,
                                                                 first[k], excluded[k])
                                            .mean;
    }
    EXPECT_TRUE(differs);
  }
  EstimatorOptions clipped;
  clipped.kind = EstimatorKind::kClipped;
  auto c = MakeEstimator(clipped, 3);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->Retire(1).code(), absl::StatusCode::kUnimplemented);
}

// The state of an estimator with nothing retired as version 2 wrote it: without the
// retired experts' section after the sample counts (four empty arrays) and the retired
// columns' sums after the effective sample sizes.
std::string AsVersion2(const std::string& v3, int n, int64_t fine) {
  const size_t header = 4 + 1 + 8, divergences = 8 + 2 * (8 + 8 * n * n), counts = 16;
  const size_t retired_at = header + divergences + counts;
  std::string out = v3.substr(0, retired_at) + v3.substr(retired_at + 32);
  int64_t tail;
  std::memcpy(&tail, out.data() + retired_at, 8);
  const size_t folded_at = retired_at + (8 + 4 * tail) + (8 + 8 * tail) + (8 + 8 * tail * n) +
                           (8 + 8 * fine * n * n) + 3 * (8 + 8 * fine * n) + (8 + 8 * n);
  out.erase(folded_at, 8 + 8 * fine * n);
  out[3] = '2';
  return out;
}

// States saved before windows (format version 1) or retirement (version 2) still restore.
TEST(Estimator, StatesOfEarlierFormatsRestore) {
  absl::StatusOr<std::unique_ptr<Estimator>> e = Fed(EstimatorOptions{}, 3, 4, 700);
  ASSERT_TRUE(e.ok()) << e.status();
  auto state = (*e)->Snapshot();
  ASSERT_TRUE(state.ok());
  const std::string v2 = AsVersion2(*state, 3, MedianOfMeansFineGroups(EstimatorOptions{}));
  // Version 1: the header's "DES1", and none of the windows' section at the end (their
  // count, the experts' windows, the tail's excluded samples and their windows).
  std::string v1 = v2.substr(0, v2.size() - (8 + 8 + 3 * sizeof(int) + 8 + 8));
  v1[3] = '1';
  for (const std::string& old : {v1, v2}) {
    auto back = RestoreEstimator(EstimatorOptions{}, old);
    ASSERT_TRUE(back.ok()) << back.status();
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ((*back)->Estimate(k).mean, (*e)->Estimate(k).mean);
      EXPECT_EQ((*back)->WindowStart(k), 0);
      EXPECT_FALSE((*back)->Retired(k));
    }
    auto again = (*back)->Snapshot();
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *state);
  }
  // A version 1 state with the window section is damaged (trailing bytes), and so is a
  // version 2 state with the retired section, or a version 4.
  for (char version : {'1', '2', '4'}) {
    std::string wrong = *state;
    wrong[3] = version;
    EXPECT_EQ(RestoreEstimator(EstimatorOptions{}, wrong).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(Estimator, ExpertRowsRefuseBadSamplesAndForeignRows) {
  EstimatorOptions mom, clipped;
  clipped.kind = EstimatorKind::kClipped;
  auto a = MakeEstimator(mom, 3);
  auto b = MakeEstimator(clipped, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Add(0, 1.0, {0.5, 0.5, 0.5}).ok());
  ASSERT_TRUE((*b)->Add(0, 1.0, {0.5, 0.5, 0.5}).ok());
  for (Estimator* e : {a->get(), b->get()}) {
    EXPECT_EQ(e->NewExpertRows(0).status().code(), absl::StatusCode::kInvalidArgument);
    auto rows = e->NewExpertRows(1);
    ASSERT_TRUE(rows.ok());
    EXPECT_EQ((*rows)->Add(3, 1.0, 0.5, {0.5}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*rows)->Add(0, -1.0, 0.5, {0.5}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*rows)->Add(0, 1.0, 0.0, {0.5}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*rows)->Add(0, 1.0, 0.5, {1.5}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*rows)->Add(0, 1.0, 0.5, {0.5, 0.5}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*rows)->num_samples(), 0);
  }
  auto from_b = (*b)->NewExpertRows(1);
  ASSERT_TRUE(from_b.ok());
  ASSERT_TRUE((*from_b)->Add(0, 1.0, 0.5, {0.25}).ok());
  EXPECT_EQ((*a)->AddExperts(*std::move(from_b), DivergenceMatrix::Identity(4)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*a)->num_experts(), 3);
  EstimatorOptions contiguous;
  contiguous.grouping = MedianOfMeansGrouping::kContiguous;
  auto c = MakeEstimator(contiguous, 2);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->NewExpertRows(1).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ((*c)->Snapshot().status().code(), absl::StatusCode::kUnimplemented);
}

// A snapshot is read back from storage: damaged bytes (truncated, flipped) or a snapshot of
// other options must give DATA_LOSS or a valid estimator, never a crash or a huge
// allocation (the sanitizer builds run this).
TEST(Estimator, DamagedSnapshotsAreRefused) {
  EstimatorOptions mom, clipped, mom480;
  clipped.kind = EstimatorKind::kClipped;
  mom480.constants.c2 = 8.0;
  for (const EstimatorOptions& o : {mom, clipped}) {
    absl::StatusOr<std::unique_ptr<Estimator>> e = Fed(o, 3, 5, 500);
    ASSERT_TRUE(e.ok()) << e.status();
    auto state = (*e)->Snapshot();
    ASSERT_TRUE(state.ok());
    if (o.kind == EstimatorKind::kClipped) {
      EXPECT_GT((*e)->Stats().clipped_kept, 0) << "the heaps are part of what is checked";
    }
    for (size_t len = 0; len < state->size(); len += 1 + len / 16) {
      EXPECT_EQ(RestoreEstimator(o, state->substr(0, len)).status().code(),
                absl::StatusCode::kDataLoss)
          << len;
    }
    EXPECT_EQ(RestoreEstimator(o, *state + "x").status().code(), absl::StatusCode::kDataLoss);
    std::mt19937_64 gen(9);
    for (int trial = 0; trial < 3000; ++trial) {
      std::string damaged = *state;
      for (int flips = 0; flips < 3; ++flips) {
        damaged[absl::Uniform<size_t>(gen, 0, damaged.size())] ^=
            static_cast<char>(1 << absl::Uniform<int>(gen, 0, 8));
      }
      auto back = RestoreEstimator(o, damaged);
      if (!back.ok()) {
        EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss) << back.status();
        continue;
      }
      // Whatever it restored is usable.
      std::vector<bool> all((*back)->num_experts(), true);
      if ((*back)->num_samples() > 0 && (*back)->num_experts() > 0) {
        (*back)->ArgmaxUcb(all, gen);
      }
    }
    const EstimatorOptions& other = o.kind == EstimatorKind::kClipped ? mom : clipped;
    EXPECT_EQ(RestoreEstimator(other, *state).status().code(), absl::StatusCode::kDataLoss);
    if (o.kind == EstimatorKind::kMedianOfMeans) {
      auto wrong = RestoreEstimator(mom480, *state);
      EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(wrong.status().message(), HasSubstr("fine groups"));
    }
  }
}

TEST(Estimator, NoSamplesMeansInfiniteWidth) {
  for (auto kind : {EstimatorKind::kClipped, EstimatorKind::kMedianOfMeans}) {
    EstimatorOptions o;
    o.kind = kind;
    auto e = MakeEstimator(o, 3);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ((*e)->Estimate(1).mean, 0.0);
    EXPECT_TRUE(std::isinf((*e)->Estimate(1).width));
  }
}

TEST(Estimator, ClippingIsActiveInTheRandomizedStreams) {
  // Guards the equivalence test against passing vacuously: with the paper's clip level some
  // samples are clipped, so the clipped mean differs from the unclipped weighted mean.
  Stream stream(6, 9);
  SampleLog log(3);
  std::vector<double> p;
  std::vector<std::vector<double>> dists;
  double y;
  for (int t = 0; t < 300; ++t) {
    const int j = t % 3;
    stream.Next(3, j, &p, &y, &dists);
    ASSERT_TRUE(log.Append(j, y, p).ok());
  }
  EstimatorOptions o;
  o.kind = EstimatorKind::kClipped;
  const DivergenceMatrix d = DivergenceMatrix::Identity(3);
  double unclipped = 0.0;
  for (int64_t s = 0; s < log.size(); ++s) {
    unclipped += log.reward(s) * log.propensity(0, s) / log.propensity(log.chooser(s), s);
  }
  unclipped /= log.size();
  const double clipped = reference::Clipped(log, log.size(), d, o, 0).mean;
  EXPECT_LT(clipped, unclipped - 1e-3);
  EXPECT_GT(clipped, 0.0);
}

TEST(Estimator, RejectsBadOptionsAndDivergences) {
  EstimatorOptions o;
  o.constants.c2 = 0.0;
  EXPECT_EQ(MakeEstimator(o, 2).status().code(), absl::StatusCode::kInvalidArgument);
  o.constants.c2 = std::nan("");
  EXPECT_EQ(MakeEstimator(o, 2).status().code(), absl::StatusCode::kInvalidArgument);
  o = EstimatorOptions();
  EXPECT_EQ(MakeEstimator(o, -1).status().code(), absl::StatusCode::kInvalidArgument);

  auto e = MakeEstimator(EstimatorOptions(), 2);
  ASSERT_TRUE(e.ok());
  SampleLog log(2);
  ASSERT_TRUE(log.Append(0, 1.0, std::vector<double>{0.5, 0.25}).ok());
  ASSERT_TRUE((*e)->Update(log).ok());
  const ExpertEstimate before = (*e)->Estimate(1);
  DivergenceMatrix d = DivergenceMatrix::Identity(2);
  d.m[1] = 0.5;  // M < 1 is impossible
  absl::Status s = (*e)->SetDivergences(log, d);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(">= 1"));
  d = DivergenceMatrix::Identity(2);
  d.sigma[2] = std::numeric_limits<double>::infinity();
  EXPECT_EQ((*e)->SetDivergences(log, d).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*e)->SetDivergences(log, DivergenceMatrix::Identity(3)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*e)->Estimate(1).mean, before.mean);  // unchanged

  SampleLog other(3);
  EXPECT_EQ((*e)->Update(other).code(), absl::StatusCode::kFailedPrecondition);
  SampleLog shorter(2);
  EXPECT_EQ((*e)->Update(shorter).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SampleLog, RejectsBadSamplesAndChangesNothing) {
  SampleLog log(2);
  const std::vector<double> good = {0.5, 0.5};
  EXPECT_EQ(log.Append(2, 0.5, good).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.Append(-1, 0.5, good).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.Append(0, 1.5, good).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.Append(0, -0.1, good).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.Append(0, std::nan(""), good).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.Append(0, 0.5, std::vector<double>{0.5}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.Append(0, 0.5, std::vector<double>{0.5, 0.0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.Append(0, 0.5, std::vector<double>{1.5, 0.5}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.Append(0, 0.5, std::vector<double>{std::nan(""), 0.5}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.size(), 0);
  ASSERT_TRUE(log.Append(1, 1.0, good).ok());
  EXPECT_EQ(log.AddExpert(std::vector<double>{}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.AddExpert(std::vector<double>{-0.2}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(log.num_experts(), 2);
  EXPECT_EQ(log.count(1), 1);
}

TEST(EstimatorFunctions, ClipLevelAndGroups) {
  EstimatorOptions o;
  o.epsilon_rule = EpsilonRule::kTwoOverT;
  EXPECT_NEAR(ClipLevel(o, 100), 2.0 * std::log(100.0), 1e-12);
  o.epsilon_rule = EpsilonRule::kPaper;
  EXPECT_TRUE(std::isinf(ClipLevel(o, 1)));  // eps(1) = C w(0) = 0
  EXPECT_GT(ClipLevel(o, 2), ClipLevel(o, 3));  // the paper's level dips once at t = 3
  for (int64_t t = 3; t < 100000; t = t * 3 / 2 + 1) {
    EXPECT_LE(ClipLevel(o, t), ClipLevel(o, t + 1)) << t;
  }
  // Contiguous: the paper's l(t) = floor(c2 * 2 log t), clamped to [1, t].
  o.grouping = MedianOfMeansGrouping::kContiguous;
  EXPECT_EQ(MedianOfMeansGroups(o, 1), 1);
  EXPECT_EQ(MedianOfMeansGroups(o, 2), 2);
  EXPECT_EQ(MedianOfMeansGroups(o, 20000), static_cast<int64_t>(std::floor(8 * std::log(20000.0))));
  // Round-robin: the divisor of L = 240 (c2 = 4) nearest to the paper's l(t) in ratio:
  // within 1.23x of it while that is below 120 and 1.42x up to L, never above t.
  o.grouping = MedianOfMeansGrouping::kRoundRobin;
  ASSERT_EQ(MedianOfMeansFineGroups(o), 240);
  EXPECT_EQ(MedianOfMeansGroups(o, 1), 1);
  EXPECT_EQ(MedianOfMeansGroups(o, 7), 6);  // the paper's 7: 8 would exceed t
  EXPECT_EQ(MedianOfMeansGroups(o, 1000), 60);  // the paper's 55: 60 / 55 < 55 / 48
  EXPECT_EQ(MedianOfMeansGroups(o, 20000), 80);  // the paper's 79
  EXPECT_EQ(MedianOfMeansGroups(o, 100000), 80);  // the paper's 92: 92 / 80 < 120 / 92
  for (int64_t t = 1; t < 100'000'000'000; t = t * 5 / 4 + 1) {
    const int64_t l = MedianOfMeansGroups(o, t);
    o.grouping = MedianOfMeansGrouping::kContiguous;
    const double paper = static_cast<double>(MedianOfMeansGroups(o, t));
    o.grouping = MedianOfMeansGrouping::kRoundRobin;
    EXPECT_EQ(240 % l, 0) << t;
    EXPECT_LE(l, t) << t;
    if (t >= 30 && paper <= 240) {
      EXPECT_LE(std::max(l / paper, paper / l), paper < 120 ? 1.23 : 1.42) << t;
    }
  }
  EXPECT_EQ(MedianOfMeansGroups(o, int64_t{1} << 62), 240);
  o.constants = EstimatorConstants::Analysis(2.0, 0.1, 2.0);  // c2 = 8
  EXPECT_EQ(MedianOfMeansFineGroups(o), 480);
  o.constants.c2 = 16.5;
  EXPECT_EQ(ValidateEstimatorOptions(o).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace decision
