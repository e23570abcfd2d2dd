#include "core/divergence.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <random>
#include <gtest/gtest.h>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "core/expert.h"

namespace decision {
namespace {

using ::testing::HasSubstr;

// The definitions, term by term in linear space, for one context.
double DF1(const std::vector<double>& pi_i, const std::vector<double>& pi_j) {
  double d = 0.0;
  for (size_t v = 0; v < pi_i.size(); ++v) {
    const double z = pi_i[v] / pi_j[v];
    d += pi_j[v] * (z * std::exp(z - 1.0) - 1.0);
  }
  return d;
}
double DF2(const std::vector<double>& pi_i, const std::vector<double>& pi_j) {
  double d = 0.0;
  for (size_t v = 0; v < pi_i.size(); ++v) {
    const double z = pi_i[v] / pi_j[v];
    d += pi_j[v] * (z * z - 1.0);
  }
  return d;
}

// Two experts over K = 2 arms on three contexts, written out by hand.
const std::vector<std::vector<double>> kExpert0 = {{0.5, 0.5}, {0.3, 0.7}, {0.9, 0.1}};
const std::vector<std::vector<double>> kExpert1 = {{0.8, 0.2}, {0.6, 0.4}, {0.5, 0.5}};

std::vector<std::vector<double>> Flatten() {
  std::vector<std::vector<double>> p(2);
  for (int x = 0; x < 3; ++x) {
    p[0].insert(p[0].end(), kExpert0[x].begin(), kExpert0[x].end());
    p[1].insert(p[1].end(), kExpert1[x].begin(), kExpert1[x].end());
  }
  return p;
}

TEST(Divergence, OneGroupIsThePlainMeanOverContexts) {
  DivergenceMatrix d;
  ASSERT_TRUE(ComputeDivergences(Flatten(), 2, 1, nullptr, 0, &d).ok());
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      const auto& a = i == 0 ? kExpert0 : kExpert1;
      const auto& b = j == 0 ? kExpert0 : kExpert1;
      double f1 = 0.0, f2 = 0.0;
      for (int x = 0; x < 3; ++x) {
        f1 += DF1(a[x], b[x]) / 3.0;
        f2 += DF2(a[x], b[x]) / 3.0;
      }
      EXPECT_NEAR(d.M(i, j), 1.0 + std::log(1.0 + f1), 1e-12) << i << j;
      EXPECT_NEAR(d.Sigma(i, j), std::sqrt(1.0 + f2), 1e-12) << i << j;
    }
  }
  EXPECT_EQ(d.M(0, 0), 1.0);
  EXPECT_EQ(d.Sigma(1, 1), 1.0);
  EXPECT_GT(d.M(0, 1), 1.0);
  EXPECT_NE(d.M(0, 1), d.M(1, 0));  // not symmetric
}

TEST(Divergence, ThreeGroupsTakeTheMedianContext) {
  DivergenceMatrix d;
  ASSERT_TRUE(ComputeDivergences(Flatten(), 2, 3, nullptr, 0, &d).ok());
  std::vector<double> f1, f2;
  for (int x = 0; x < 3; ++x) {
    f1.push_back(DF1(kExpert0[x], kExpert1[x]));
    f2.push_back(DF2(kExpert0[x], kExpert1[x]));
  }
  std::sort(f1.begin(), f1.end());
  std::sort(f2.begin(), f2.end());
  EXPECT_NEAR(d.M(0, 1), 1.0 + std::log(1.0 + f1[1]), 1e-12);
  EXPECT_NEAR(d.Sigma(0, 1), std::sqrt(1.0 + f2[1]), 1e-12);
}

TEST(Divergence, TwoGroupsAverageTheMiddleValues) {
  DivergenceMatrix d;
  auto p = Flatten();
  for (auto& e : p) e.resize(4);  // two contexts
  ASSERT_TRUE(ComputeDivergences(p, 2, 2, nullptr, 0, &d).ok());
  const double f1 = 0.5 * (DF1(kExpert0[0], kExpert1[0]) + DF1(kExpert0[1], kExpert1[1]));
  EXPECT_NEAR(d.M(0, 1), 1.0 + std::log(1.0 + f1), 1e-12);
}

TEST(Divergence, NoOverflowForNearlyDisjointExperts) {
  // One-hot experts with eta = 1e-3 over K = 26 arms: ratios reach ~2.6e4 and
  // exp(ratio - 1) overflows a double. The log-space computation stays finite.
  const int k = 26;
  const double eta = 1e-3;
  std::vector<std::vector<double>> p(2, std::vector<double>(k, eta / k));
  p[0][0] += 1.0 - eta;
  p[1][1] += 1.0 - eta;
  DivergenceMatrix d;
  ASSERT_TRUE(ComputeDivergences(p, k, 1, nullptr, 0, &d).ok());
  const double z = p[0][0] / p[1][0];
  EXPECT_TRUE(std::isfinite(d.M(0, 1)));
  // log sum_v pi_0 e^{z_v - 1} is dominated by arm 0: log(pi_0(0)) + z - 1.
  EXPECT_NEAR(d.M(0, 1), 1.0 + std::log(p[0][0]) + z - 1.0, 1e-6 * z);
  EXPECT_TRUE(std::isfinite(d.Sigma(0, 1)));
  EXPECT_NEAR(d.Sigma(0, 1) * d.Sigma(0, 1), p[0][0] * p[0][0] / p[1][0] + 1.0, 1.0);
}

TEST(Divergence, KeepsTheOldBlockAndComputesNewRows) {
  DivergenceMatrix full, two, extended;
  auto p = Flatten();
  p.push_back(p[0]);  // a third expert identical to expert 0
  ASSERT_TRUE(ComputeDivergences(p, 2, 1, nullptr, 0, &full).ok());
  DivergenceMatrix fake = DivergenceMatrix::Identity(2);
  fake.m[1] = 7.0;  // old block entry that must be copied, not recomputed
  ASSERT_TRUE(ComputeDivergences(p, 2, 1, &fake, 2, &extended).ok());
  EXPECT_EQ(extended.M(0, 1), 7.0);
  EXPECT_EQ(extended.M(2, 1), full.M(2, 1));
  EXPECT_NEAR(extended.M(2, 0), 1.0, 1e-15);  // identical experts
  EXPECT_EQ(extended.M(1, 2), full.M(1, 2));
}

TEST(Divergence, FixedExpertsPairsAreCopiedAndTheRestComputed) {
  DivergenceMatrix full, kept;
  auto p = Flatten();
  p.push_back(p[0]);
  ASSERT_TRUE(ComputeDivergences(p, 2, 1, nullptr, 0, &full).ok());
  DivergenceMatrix previous = DivergenceMatrix::Identity(2);
  previous.m[1] = 7.0;  // (0, 1)
  previous.m[2] = 5.0;  // (1, 0)
  const bool fixed[3] = {true, false, false};  // expert 0's old pairs are kept
  ASSERT_TRUE(ComputeDivergences(p, 2, 1, &previous, 0, &kept, fixed).ok());
  EXPECT_EQ(kept.M(0, 1), 7.0);
  EXPECT_EQ(kept.M(1, 0), 5.0);
  // With a new expert: the new expert's row is computed, the fixed one's is 1 (no
  // estimate reads it).
  EXPECT_EQ(kept.M(2, 0), full.M(2, 0));
  EXPECT_EQ(kept.Sigma(2, 0), full.Sigma(2, 0));
  EXPECT_EQ(kept.M(0, 2), 1.0);
  EXPECT_EQ(kept.Sigma(0, 2), 1.0);
  EXPECT_EQ(kept.M(2, 1), full.M(2, 1));
  const bool none[3] = {false, false, false};
  ASSERT_TRUE(ComputeDivergences(p, 2, 1, &previous, 0, &kept, none).ok());
  EXPECT_EQ(kept.M(1, 0), full.M(1, 0));
  const bool too_few[2] = {true, false};
  EXPECT_EQ(ComputeDivergences(p, 2, 1, &previous, 0, &kept, too_few).code(),
            absl::StatusCode::kInvalidArgument);
}

// An absent expert (its pairs weigh no sample) is not read: its pairs that are not copied
// are 1, copied ones stay, and every other pair is what a computation with it gives.
TEST(Divergence, AbsentExpertsPairsAreOneUnlessCopied) {
  DivergenceMatrix full, got;
  auto p = Flatten();
  p.push_back(p[1]);
  p.push_back(p[0]);
  ASSERT_TRUE(ComputeDivergences(p, 2, 1, nullptr, 0, &full).ok());
  DivergenceMatrix previous = DivergenceMatrix::Identity(3);
  previous.m[1] = 7.0;  // (0, 1)
  previous.m[3] = 5.0;  // (1, 0)
  const bool fixed[4] = {true, false, false, false};
  const bool absent[4] = {true, false, false, false};
  p[0].clear();  // not read
  ASSERT_TRUE(ComputeDivergences(p, 2, 1, &previous, 0, &got, fixed, absent).ok());
  EXPECT_EQ(got.M(0, 1), 7.0);  // copied (fixed, both covered)
  EXPECT_EQ(got.M(1, 0), 5.0);
  for (const auto& [i, j] : {std::pair{0, 3}, std::pair{3, 0}}) {  // with a new expert
    EXPECT_EQ(got.M(i, j), 1.0);
    EXPECT_EQ(got.Sigma(i, j), 1.0);
  }
  for (int i = 1; i < 4; ++i) {
    for (int j = 1; j < 4; ++j) {
      EXPECT_EQ(got.M(i, j), full.M(i, j)) << i << j;
      EXPECT_EQ(got.Sigma(i, j), full.Sigma(i, j)) << i << j;
    }
  }
  // Everyone absent: nothing to compute, nothing read.
  const bool all[4] = {true, true, true, true};
  std::vector<std::vector<double>> none(4);
  ASSERT_TRUE(ComputeDivergences(none, 2, 1, nullptr, 0, &got, {}, all).ok());
  EXPECT_EQ(got.M(1, 2), 1.0);
  const bool too_few[2] = {true, false};
  EXPECT_EQ(ComputeDivergences(p, 2, 1, &previous, 0, &got, fixed, too_few).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Divergence, RejectsBadInput) {
  DivergenceMatrix d;
  auto p = Flatten();
  p[1][3] = 0.0;
  absl::Status s = ComputeDivergences(p, 2, 1, nullptr, 0, &d);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("smooth"));
  p = Flatten();
  p[1].pop_back();
  EXPECT_EQ(ComputeDivergences(p, 2, 1, nullptr, 0, &d).code(),
            absl::StatusCode::kInvalidArgument);
  p = Flatten();
  p[0][0] = std::nan("");
  EXPECT_EQ(ComputeDivergences(p, 2, 1, nullptr, 0, &d).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeDivergences(Flatten(), 2, 0, nullptr, 0, &d).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeDivergences(Flatten(), 2, 1, nullptr, 1, &d).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::vector<double>> empty(2);
  EXPECT_EQ(ComputeDivergences(empty, 2, 1, nullptr, 0, &d).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateDivergenceOptions({0, 4}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateDivergenceOptions({10, 0}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Divergence, EstimateFromExpertsOnReservoir) {
  auto e0 = MakeTableExpert(2, 1, kExpert0, 0, 0.0);
  auto e1 = MakeTableExpert(2, 1, kExpert1, 0, 0.0);
  ASSERT_TRUE(e0.ok() && e1.ok());
  ContextReservoir reservoir(1, 16);
  std::mt19937_64 gen(0);
  for (double x : {0.0, 1.0, 2.0}) reservoir.Offer(std::vector<double>{x}, gen);
  const Expert* experts[] = {e0->get(), e1->get()};
  DivergenceMatrix from_experts, direct;
  ASSERT_TRUE(EstimateDivergences(experts, reservoir, 1, &from_experts).ok());
  ASSERT_TRUE(ComputeDivergences(Flatten(), 2, 1, nullptr, 0, &direct).ok());
  EXPECT_EQ(from_experts.m, direct.m);
  EXPECT_EQ(from_experts.sigma, direct.sigma);
}

// `n` experts' distributions over `k` arms on `rows` shared contexts: softmax of a random
// linear map of three features, smoothed, so that the divergences vary with the context.
std::vector<std::vector<double>> RandomExperts(int n, int k, size_t rows, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  std::vector<double> x(rows * 3);
  for (double& v : x) v = normal(gen);
  std::vector<std::vector<double>> p(n, std::vector<double>(rows * k));
  for (int e = 0; e < n; ++e) {
    std::vector<double> w(static_cast<size_t>(k) * 3);
    for (double& v : w) v = normal(gen);
    for (size_t r = 0; r < rows; ++r) {
      double total = 0.0;
      for (int a = 0; a < k; ++a) {
        double z = 0.0;
        for (int f = 0; f < 3; ++f) z += w[a * 3 + f] * x[r * 3 + f];
        p[e][r * k + a] = std::exp(z);
        total += p[e][r * k + a];
      }
      for (int a = 0; a < k; ++a) {
        p[e][r * k + a] = 0.9 * p[e][r * k + a] / total + 0.1 / k;
      }
    }
  }
  return p;
}

// The callback form over predictions held in memory, recording the rows it was asked for.
struct Reader {
  const std::vector<std::vector<double>>& p;
  size_t k;
  std::vector<std::vector<std::pair<size_t, size_t>>> asked;  // per expert: [begin, end)
  absl::Status Read(int e, size_t begin, size_t end, absl::Span<double> out) {
    asked[e].emplace_back(begin, end);
    EXPECT_EQ(out.size(), (end - begin) * k);
    std::copy(p[e].begin() + begin * k, p[e].begin() + end * k, out.begin());
    return absl::OkStatus();
  }
};

absl::Status ComputeBy(Reader* reader, int groups, const DivergenceLimits& limits,
                       DivergenceMatrix* out, DivergenceWork* work, int keep = 0,
                       const DivergenceMatrix* previous = nullptr,
                       absl::Span<const bool> absent = {}) {
  const int n = static_cast<int>(reader->p.size());
  reader->asked.assign(n, {});
  return ComputeDivergences(
      n, reader->p[0].size() / reader->k,
      [reader](int e, size_t begin, size_t end, absl::Span<double> block) {
        return reader->Read(e, begin, end, block);
      },
      static_cast<int>(reader->k), groups, previous, keep, out, {}, absent, limits, work);
}

// Blocks of contexts smaller than a group give the same divergences (to rounding: the
// log-sum-exp runs over blocks), and a block of a whole group (the default, whenever the
// predictions fit) the same bits as the predictions held in full.
TEST(Divergence, BlocksOfContextsGiveTheSameDivergences) {
  constexpr int kArms = 7, kGroups = 4;
  const auto p = RandomExperts(5, kArms, 96, 11);  // groups of 24 contexts
  DivergenceMatrix whole;
  ASSERT_TRUE(ComputeDivergences(p, kArms, kGroups, nullptr, 0, &whole).ok());
  Reader reader{p, kArms, {}};
  // The predictions and their logarithms of the five experts: 2 x 5 x 7 doubles a row.
  const int64_t row_bytes = 2 * 5 * kArms * sizeof(double);
  for (const size_t block : {size_t{1}, size_t{5}, size_t{24}}) {
    DivergenceLimits limits;
    limits.max_block_bytes = static_cast<int64_t>(block) * row_bytes;
    DivergenceMatrix blocked;
    DivergenceWork work;
    ASSERT_TRUE(ComputeBy(&reader, kGroups, limits, &blocked, &work).ok());
    EXPECT_EQ(work.block_rows, block);
    EXPECT_EQ(work.rows_read, 96u);
    EXPECT_EQ(work.terms, 20 * kArms * 96);
    for (const auto& asked : reader.asked) {
      ASSERT_EQ(asked.size(), (24 + block - 1) / block * kGroups);
      for (const auto& [begin, end] : asked) EXPECT_LE(end - begin, block);
    }
    for (size_t ij = 0; ij < whole.m.size(); ++ij) {
      if (block == 24) {
        EXPECT_EQ(blocked.m[ij], whole.m[ij]);
        EXPECT_EQ(blocked.sigma[ij], whole.sigma[ij]);
      } else {
        EXPECT_NEAR(blocked.m[ij], whole.m[ij], 1e-12 * whole.m[ij]) << block;
        EXPECT_NEAR(blocked.sigma[ij], whole.sigma[ij], 1e-12 * whole.sigma[ij]) << block;
      }
    }
  }
}

// Spread over threads (a runner that starts one thread per task), the results are the
// same bits as in order on one thread, at any split and block size; with several experts
// failing at once, the first one's error is returned.
TEST(Divergence, ThreadsGiveTheSameBits) {
  constexpr int kArms = 7, kGroups = 4;
  const auto p = RandomExperts(6, kArms, 96, 15);
  DivergenceThreads threads;
  threads.run = [](int n, absl::FunctionRef<void(int)> fn) {
    std::vector<std::thread> started;
    for (int t = 0; t < n; ++t) started.emplace_back([&fn, t] { fn(t); });
    for (std::thread& t : started) t.join();
  };
  const auto read = [&p](int e, size_t begin, size_t end, absl::Span<double> out) {
    std::copy(p[e].begin() + begin * kArms, p[e].begin() + end * kArms, out.begin());
    return absl::OkStatus();
  };
  for (const int64_t block_bytes : {int64_t{1}, int64_t{64} << 20}) {
    DivergenceLimits limits;
    limits.max_block_bytes = block_bytes;
    DivergenceMatrix alone, spread;
    ASSERT_TRUE(ComputeDivergences(6, 96, read, kArms, kGroups, nullptr, 0, &alone, {}, {},
                                   limits)
                    .ok());
    for (const int tasks : {2, 3, 7, 64}) {
      threads.tasks = tasks;
      ASSERT_TRUE(ComputeDivergences(6, 96, read, kArms, kGroups, nullptr, 0, &spread, {}, {},
                                     limits, nullptr, threads)
                      .ok());
      EXPECT_EQ(spread.m, alone.m) << tasks;
      EXPECT_EQ(spread.sigma, alone.sigma) << tasks;
    }
  }
  threads.tasks = 6;
  DivergenceMatrix got;
  const absl::Status s = ComputeDivergences(
      6, 96,
      [](int e, size_t, size_t, absl::Span<double> out) {
        if (e >= 3) return absl::InternalError(absl::StrCat("model ", e, " broke"));
        std::fill(out.begin(), out.end(), 1.0 / kArms);
        return absl::OkStatus();
      },
      kArms, kGroups, nullptr, 0, &got, {}, {}, DivergenceLimits(), nullptr, threads);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "model 3 broke");
}

// Only what is computed is read: nothing when every pair is copied, not an absent expert,
// and the computation stops at the first error a read returns.
TEST(Divergence, ReadsOnlyWhatItComputes) {
  constexpr int kArms = 3;
  const auto p = RandomExperts(4, kArms, 8, 14);
  Reader reader{p, kArms, {}};
  DivergenceMatrix full, got;
  DivergenceWork work;
  ASSERT_TRUE(ComputeBy(&reader, 2, DivergenceLimits(), &full, &work).ok());
  ASSERT_TRUE(ComputeBy(&reader, 2, DivergenceLimits(), &got, &work, 4, &full).ok());
  EXPECT_EQ(got.m, full.m);
  EXPECT_EQ(work.rows_read, 0u);
  for (const auto& asked : reader.asked) EXPECT_TRUE(asked.empty());
  const bool absent[4] = {false, true, false, false};
  ASSERT_TRUE(ComputeBy(&reader, 2, DivergenceLimits(), &got, &work, 0, nullptr, absent).ok());
  EXPECT_TRUE(reader.asked[1].empty());
  EXPECT_FALSE(reader.asked[2].empty());
  EXPECT_EQ(got.M(2, 3), full.M(2, 3));
  const absl::Status s = ComputeDivergences(
      4, 8,
      [](int e, size_t, size_t, absl::Span<double> out) {
        if (e == 2) return absl::InternalError("model 2 broke");
        std::fill(out.begin(), out.end(), 1.0 / kArms);
        return absl::OkStatus();
      },
      kArms, 2, nullptr, 0, &got, {}, {}, DivergenceLimits());
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("model 2 broke"));
}

// Run a few pairs at a time (as the expert-pool round runs a refresh within its time
// budget), a computation gives the same bits as run to the end in one call, whatever the
// steps; a step never passes the end of a block, and an error ends the computation.
TEST(Divergence, StepsGiveTheSameBitsAsOneCall) {
  constexpr int kArms = 7, kGroups = 4;
  const auto p = RandomExperts(5, kArms, 98, 16);  // groups of 24; the last 2 rows unused
  Reader reader{p, kArms, {}};
  reader.asked.assign(5, {});
  const auto read = [&reader](int e, size_t begin, size_t end, absl::Span<double> out) {
    return reader.Read(e, begin, end, out);
  };
  DivergenceMatrix previous = DivergenceMatrix::Identity(5);
  for (size_t ij = 0; ij < previous.m.size(); ++ij) previous.m[ij] = 1.0 + 0.01 * ij;
  const bool fixed[5] = {false, false, false, true, false};
  DivergenceLimits limits;
  // Four experts read (expert 3's pairs are all kept), all four with their logarithms:
  // blocks of 5 contexts.
  limits.max_block_bytes = 5 * 2 * 4 * kArms * sizeof(double);
  DivergenceMatrix whole;
  ASSERT_TRUE(ComputeDivergences(5, 98, read, kArms, kGroups, &previous, 2, &whole, fixed, {},
                                 limits)
                  .ok());
  // Pairs computed: (i, j) of experts 0, 1, 2 and 4 (3 is fixed), i != j, not both < 2:
  // 10.
  constexpr int64_t kPairs = 10, kBlockTerms = 5 * kArms;  // a pair's terms over a block
  for (const int64_t terms : {int64_t{1}, 3 * kBlockTerms, kPairs * kBlockTerms,
                              std::numeric_limits<int64_t>::max()}) {
    absl::StatusOr<DivergenceComputation> c = DivergenceComputation::Start(
        5, 98, kArms, kGroups, &previous, 2, fixed, {}, limits);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->blocks(), 5 * kGroups);  // ceil(24 / 5) blocks a group
    EXPECT_EQ(c->work().block_rows, 5u);
    EXPECT_EQ(c->progress(), 0.0);
    const int64_t per_step = std::clamp<int64_t>(terms / kBlockTerms, 1, kPairs);
    int64_t calls = 0;
    double progress = 0.0;
    while (!c->done()) {
      const int64_t before = c->blocks_done();
      ASSERT_TRUE(c->Step(read, terms).ok());
      EXPECT_LE(c->blocks_done(), before + 1);
      EXPECT_GT(c->progress(), progress);
      progress = c->progress();
      ++calls;
    }
    EXPECT_EQ(c->progress(), 1.0);
    EXPECT_EQ(calls, c->blocks() * ((kPairs + per_step - 1) / per_step)) << terms;
    const DivergenceMatrix stepped = c->Take();
    EXPECT_EQ(stepped.m, whole.m) << terms;
    EXPECT_EQ(stepped.sigma, whole.sigma) << terms;
  }
  EXPECT_TRUE(reader.asked[3].empty());
  // Nothing to compute (every pair kept): done at the start, without a block.
  absl::StatusOr<DivergenceComputation> kept =
      DivergenceComputation::Start(5, 98, kArms, kGroups, &whole, 5, {}, {}, limits);
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->done());
  EXPECT_EQ(kept->blocks(), 0);
  EXPECT_EQ(kept->Take().m, whole.m);
  // An error in the third block (blocks of 4 contexts, every expert read) ends it.
  absl::StatusOr<DivergenceComputation> c =
      DivergenceComputation::Start(5, 98, kArms, kGroups, nullptr, 0, {}, {}, limits);
  ASSERT_TRUE(c.ok());
  const auto breaks = [&](int e, size_t begin, size_t end, absl::Span<double> out) {
    if (e == 4 && begin >= 8) return absl::InternalError("model 4 broke");
    return read(e, begin, end, out);
  };
  const int64_t block = std::numeric_limits<int64_t>::max();  // a whole block a step
  for (int b = 0; b < 2; ++b) ASSERT_TRUE(c->Step(breaks, block).ok());
  const absl::Status s = c->Step(breaks, block);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(c->blocks_done(), 2);
  EXPECT_FALSE(c->done());
  EXPECT_EQ(c->Step(read, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(DivergenceComputation::Start(5, 0, kArms, kGroups, nullptr, 0, {}, {}, limits)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ContextReservoir, BoundedAndUniform) {
  // Offer 0..999 to a reservoir of 100, many times: every value is kept ~10% of the time.
  std::vector<int> kept(1000, 0);
  std::mt19937_64 gen(7);
  const int trials = 400;
  for (int trial = 0; trial < trials; ++trial) {
    ContextReservoir r(1, 100);
    for (int v = 0; v < 1000; ++v) r.Offer(std::vector<double>{double(v)}, gen);
    ASSERT_EQ(r.size(), 100u);
    ASSERT_EQ(r.seen(), 1000);
    for (double x : r.contexts()) ++kept[static_cast<int>(x)];
  }
  // Mean kept share of the first and last hundred values: each 0.1 in expectation, with
  // standard error sqrt(0.1*0.9/40000) = 0.0015; 0.015 is 10 standard errors.
  double first = 0, last = 0;
  for (int v = 0; v < 100; ++v) {
    first += kept[v];
    last += kept[900 + v];
  }
  EXPECT_NEAR(first / (100.0 * trials), 0.1, 0.015);
  EXPECT_NEAR(last / (100.0 * trials), 0.1, 0.015);
}

}  // namespace
}  // namespace decision
