#include "core/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/divergence.h"

namespace decision {
namespace {

// Distance in units in the last place between two positive doubles.
int64_t UlpDistance(double a, double b) {
  int64_t ia, ib;
  std::memcpy(&ia, &a, sizeof a);
  std::memcpy(&ib, &b, sizeof b);
  return ia > ib ? ia - ib : ib - ia;
}

TEST(ExpNonPositiveInPlace, WithinTwoUlpOfStdExp) {
  std::mt19937_64 gen(7);
  std::vector<double> x;
  for (double edge : {0.0, -0.0, -1e-300, -1e-17, -0.5 * std::log(2.0), -std::log(2.0), -1.0,
                      -20.0, -700.0, -708.0}) {
    x.push_back(edge);
  }
  std::uniform_real_distribution<double> wide(-708.0, 0.0), narrow(-2.0, 0.0);
  for (int i = 0; i < 200'000; ++i) x.push_back(i % 2 == 0 ? wide(gen) : narrow(gen));
  std::vector<double> y = x;
  ExpNonPositiveInPlace(absl::MakeSpan(y));
  int64_t worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t ulps = UlpDistance(y[i], std::exp(x[i]));
    worst = std::max(worst, ulps);
    ASSERT_LE(ulps, 2) << "x = " << x[i] << " got " << y[i] << " want " << std::exp(x[i]);
  }
  std::printf("worst error over %zu points: %lld ulp\n", x.size(), static_cast<long long>(worst));
}

TEST(ExpNonPositiveInPlace, ClampsBelowMinus708AndKeepsNaN) {
  std::vector<double> v = {-709.0, -1e6, -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(), 0.0};
  ExpNonPositiveInPlace(absl::MakeSpan(v));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(v[i], v[0]) << i;
  EXPECT_LE(UlpDistance(v[0], std::exp(-708.0)), 2);
  EXPECT_TRUE(std::isnan(v[3]));
  EXPECT_EQ(v[4], 1.0);
}

TEST(SoftmaxInPlace, MatchesTheStdExpFormula) {
  std::mt19937_64 gen(5);
  std::normal_distribution<double> normal(0.0, 10.0);
  for (int k : {1, 2, 5, 26, 100}) {
    std::vector<double> z(k);
    for (double& v : z) v = normal(gen);
    std::vector<double> p = z;
    SoftmaxInPlace(absl::MakeSpan(p));
    const double max_z = *std::max_element(z.begin(), z.end());
    double total = 0.0;
    for (double v : z) total += std::exp(v - max_z);
    double sum = 0.0;
    for (int v = 0; v < k; ++v) {
      EXPECT_NEAR(p[v], std::exp(z[v] - max_z) / total, 1e-15) << "K=" << k << " arm " << v;
      sum += p[v];
    }
    EXPECT_NEAR(sum, 1.0, 1e-15) << "K=" << k;
  }
}

TEST(LinearLogits, EqualsTheScalarLoopBitForBit) {
  std::mt19937_64 gen(3);
  std::normal_distribution<double> normal(0.0, 3.0);
  for (int k : {1, 2, 3, 26, 33}) {
    for (int d : {0, 1, 16, 17}) {
      std::vector<double> w(static_cast<size_t>(k) * d), b(k), x(d);
      for (double& v : w) v = normal(gen);
      for (double& v : b) v = normal(gen);
      for (double& v : x) v = normal(gen);
      std::vector<double> wt(w.size());
      for (int v = 0; v < k; ++v) {
        for (int f = 0; f < d; ++f) wt[static_cast<size_t>(f) * k + v] = w[static_cast<size_t>(v) * d + f];
      }
      std::vector<double> z(k);
      LinearLogits(wt, b, x, absl::MakeSpan(z));
      for (int v = 0; v < k; ++v) {
        double want = b[v];
        for (int f = 0; f < d; ++f) want += w[static_cast<size_t>(v) * d + f] * x[f];
        EXPECT_EQ(z[v], want) << "K=" << k << " d=" << d << " arm " << v;
      }
    }
  }
}

TEST(DivergenceTerms, MatchesTheScalarTermsPerContext) {
  // Three contexts of 26 arms: smoothed random distributions, one of them nearly one-hot
  // against its opposite (ratios near 500, where exp(ratio - 1) would overflow).
  const size_t rows = 3, k = 26;
  std::mt19937_64 gen(7);
  std::gamma_distribution<double> gamma(0.3, 1.0);
  std::vector<double> pi_i(rows * k), pi_j(rows * k), log_pi_i(rows * k);
  auto fill = [&](double* p) {
    double total = 0.0;
    for (size_t v = 0; v < k; ++v) total += (p[v] = gamma(gen) + 1e-12);
    for (size_t v = 0; v < k; ++v) p[v] = 0.95 * p[v] / total + 0.05 / k;
  };
  for (size_t r = 0; r < 2; ++r) {
    fill(&pi_i[r * k]);
    fill(&pi_j[r * k]);
  }
  for (size_t v = 0; v < k; ++v) {
    pi_i[2 * k + v] = (v == 0 ? 0.95 : 0.0) + 0.05 / k;
    pi_j[2 * k + v] = (v == 1 ? 0.95 : 0.0) + 0.05 / k;
  }
  for (size_t e = 0; e < rows * k; ++e) log_pi_i[e] = std::log(pi_i[e]);
  std::vector<double> scratch(2 * rows * k), log_f1(rows), f2(rows);
  DivergenceTerms(pi_i.data(), log_pi_i.data(), pi_j.data(), rows, k, scratch.data(),
                  log_f1.data(), f2.data());
  for (size_t r = 0; r < rows; ++r) {
    const absl::Span<const double> a(&pi_i[r * k], k), b(&pi_j[r * k], k);
    const double want_f1 = LogF1Term(a, b), want_f2 = F2Term(a, b);
    EXPECT_NEAR(log_f1[r], want_f1, 1e-13 * std::abs(want_f1)) << "context " << r;
    EXPECT_NEAR(f2[r], want_f2, 1e-13 * want_f2) << "context " << r;
  }
  EXPECT_GT(log_f1[2], 400.0);  // the overflow case stays finite in log space
  EXPECT_TRUE(std::isfinite(log_f1[2]));
}

}  // namespace
}  // namespace decision
