#include "core/numeric.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace decision {

double LambertW0(double z) {
  assert(z >= -1.0 / M_E - 1e-15);
  if (std::isinf(z)) return z;
  if (z == 0.0) return 0.0;
  if (z <= -1.0 / M_E) return -1.0;
  // Initial guess: series near the branch point, log-based asymptotics for large z.
  double w;
  if (z < -0.25) {
    const double p = std::sqrt(2.0 * (M_E * z + 1.0));
    w = -1.0 + p - p * p / 3.0;
  } else if (z < 3.0) {
    w = std::log1p(z);
    w = w * (1.0 - std::log1p(w) / (2.0 + w));
  } else {
    const double l1 = std::log(z);
    const double l2 = std::log(l1);
    w = l1 - l2 + l2 / l1;
  }
  // Halley iterations; converges cubically from these starts.
  for (int i = 0; i < 32; ++i) {
    const double ew = std::exp(w);
    const double f = w * ew - z;
    const double wp1 = w + 1.0;
    if (wp1 == 0.0) break;
    const double step = f / (ew * wp1 - (w + 2.0) * f / (2.0 * wp1));
    w -= step;
    if (std::abs(step) <= 4 * std::numeric_limits<double>::epsilon() * (1.0 + std::abs(w))) {
      break;
    }
  }
  return w;
}

double InverseLogRatio(double x) {
  assert(x >= 0.0);
  if (x == 0.0) return 0.0;
  if (std::isinf(x)) return 2.0;
  return x * LambertW0(2.0 / x);
}

double LogSumExp(absl::Span<const double> v) {
  if (v.empty()) return -std::numeric_limits<double>::infinity();
  const double m = *std::max_element(v.begin(), v.end());
  if (std::isinf(m)) return m;
  double s = 0.0;
  for (double x : v) s += std::exp(x - m);
  return m + std::log(s);
}

double MedianInPlace(absl::Span<double> v) {
  assert(!v.empty());
  const size_t n = v.size();
  const size_t mid = n / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (n % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return 0.5 * (lower + upper);
}

}  // namespace decision
