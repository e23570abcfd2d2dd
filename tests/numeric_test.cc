#include "core/numeric.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace decision {
namespace {

TEST(LambertW0, SatisfiesDefiningEquation) {
  for (double z : {-1.0 / M_E + 1e-12, -0.3, -0.1, -1e-8, 1e-10, 0.5, 1.0, 2.0, 10.0, 1e3,
                   1e8, 1e100, 1e300}) {
    const double w = LambertW0(z);
    // w e^w = z, checked in log space for large z: log w + w = log z.
    if (z > 1.0) {
      EXPECT_NEAR(std::log(w) + w, std::log(z), 1e-13 * std::abs(std::log(z))) << z;
    } else {
      EXPECT_NEAR(w * std::exp(w), z, 1e-14 * std::max(1e-300, std::abs(z)) + 1e-17) << z;
    }
    EXPECT_GE(w, -1.0);
  }
  EXPECT_EQ(LambertW0(0.0), 0.0);
  EXPECT_DOUBLE_EQ(LambertW0(M_E), 1.0);
  EXPECT_DOUBLE_EQ(LambertW0(-1.0 / M_E), -1.0);
  EXPECT_TRUE(std::isinf(LambertW0(std::numeric_limits<double>::infinity())));
}

TEST(InverseLogRatio, InvertsYOverLogTwoOverY) {
  for (double y : {1e-12, 1e-6, 0.01, 0.3, 1.0, 1.5, 1.99}) {
    const double x = y / std::log(2.0 / y);
    EXPECT_NEAR(InverseLogRatio(x), y, 1e-12 * y) << y;
  }
  EXPECT_EQ(InverseLogRatio(0.0), 0.0);
  EXPECT_EQ(InverseLogRatio(std::numeric_limits<double>::infinity()), 2.0);
  // Increasing and below 2.
  double previous = 0.0;
  for (double x = 1e-6; x < 1e6; x *= 1.7) {
    const double w = InverseLogRatio(x);
    EXPECT_GT(w, previous);
    EXPECT_LT(w, 2.0);
    previous = w;
  }
}

TEST(LogSumExp, StableForLargeAndEmpty) {
  const std::vector<double> big = {1000.0, 1000.0};
  EXPECT_NEAR(LogSumExp(big), 1000.0 + std::log(2.0), 1e-12);
  const std::vector<double> small = {-1000.0, -1001.0};
  EXPECT_NEAR(LogSumExp(small), -1000.0 + std::log1p(std::exp(-1.0)), 1e-12);
  EXPECT_TRUE(std::isinf(LogSumExp({})));
}

TEST(MedianInPlace, OddAndEven) {
  std::vector<double> odd = {5, 1, 3};
  EXPECT_EQ(MedianInPlace(absl::MakeSpan(odd)), 3);
  std::vector<double> even = {4, 1, 3, 2};
  EXPECT_EQ(MedianInPlace(absl::MakeSpan(even)), 2.5);
  std::vector<double> one = {7};
  EXPECT_EQ(MedianInPlace(absl::MakeSpan(one)), 7);
}

}  // namespace
}  // namespace decision
