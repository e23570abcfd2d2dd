#include "core/off_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace decision {

void OffPolicySums::Add(double q, double p, double y) {
  const double w = q / p;
  const double wy = w * y;
  n_ += 1.0;
  sum_w_ += w;
  sum_w2_ += w * w;
  sum_wy_ += wy;
  sum_wy2_ += wy * wy;
  sum_clipped_wy_ += std::min(w, clip_) * y;
  max_w_ = std::max(max_w_, w);
  max_inverse_p_ = std::max(max_inverse_p_, 1.0 / p);
}

OffPolicyEstimate OffPolicySums::Estimate() const {
  OffPolicyEstimate out;
  out.samples = samples();
  if (n_ == 0.0) return out;
  const double n = n_;
  out.ips = sum_wy_ / n;
  out.snips = sum_w_ > 0.0 ? sum_wy_ / sum_w_ : 0.0;
  out.clipped_ips = sum_clipped_wy_ / n;
  out.effective_sample_size = sum_w2_ > 0.0 ? sum_w_ * sum_w_ / sum_w2_ : 0.0;
  out.mean_weight = sum_w_ / n;
  out.max_weight = max_w_;
  // Empirical Bernstein for the mean of w y in [0, max 1/p], each side at 2.5%.
  if (n >= 2.0) {
    const double variance = std::max(0.0, (sum_wy2_ - n * out.ips * out.ips) / (n - 1.0));
    const double log_term = std::log(2.0 / 0.025);
    const double half = std::sqrt(2.0 * variance * log_term / n) +
                        7.0 * max_inverse_p_ * log_term / (3.0 * (n - 1.0));
    out.ips_lower = std::max(0.0, out.ips - half);
    out.ips_upper = std::min(1.0, out.ips + half);
  }
  return out;
}

std::array<double, OffPolicySums::kStateValues> OffPolicySums::ToArray() const {
  return {clip_, n_, sum_w_, sum_w2_, sum_wy_, sum_wy2_, sum_clipped_wy_, max_w_,
          max_inverse_p_};
}

absl::StatusOr<OffPolicySums> OffPolicySums::FromArray(absl::Span<const double> v) {
  if (v.size() != kStateValues) {
    return absl::DataLossError(absl::StrCat("off-policy sums have ", v.size(),
                                            " values, expected ", kStateValues));
  }
  for (double x : v) {
    if (!std::isfinite(x) || x < 0.0) {
      return absl::DataLossError(absl::StrCat("off-policy sums hold ", x));
    }
  }
  OffPolicySums s(v[0]);
  s.n_ = v[1];
  s.sum_w_ = v[2];
  s.sum_w2_ = v[3];
  s.sum_wy_ = v[4];
  s.sum_wy2_ = v[5];
  s.sum_clipped_wy_ = v[6];
  s.max_w_ = v[7];
  s.max_inverse_p_ = v[8];
  if (!(s.clip_ > 0.0) || s.n_ != std::floor(s.n_) ||
      (s.n_ > 0.0 && s.max_inverse_p_ < 1.0)) {
    return absl::DataLossError("off-policy sums are inconsistent");
  }
  return s;
}

}  // namespace decision
