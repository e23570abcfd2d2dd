// Off-policy estimates of a policy's value from decisions another policy made (importance
// sampling). Sample s: the arm played had probability p_s under the policy that decided
// (the logged propensity) and q_s under the evaluated one, and earned y_s in [0, 1]; its
// weight is w_s = q_s / p_s. Over n samples:
//   ips          sum w y / n                  unbiased for the evaluated policy's value
//   ips interval empirical Bernstein (Maurer and Pontil 2009, theorem 4) around ips, 95%
//                (2.5% each side), with w_s y_s <= 1 / p_s; clamped to [0, 1]
//   snips        sum w y / sum w              self-normalised: lower variance, slightly biased
//   clipped ips  sum min(w, clip) y / n       biased down, lower variance
//   ess          (sum w)^2 / sum w^2          how many on-policy samples the log is worth
// The sums are O(1) to update and to read: a caller keeps one per policy and adds every
// sample as it is learnt (core/policy.h keeps one per D-UCB expert).
//
// Thread safety: a value type; not thread-safe.
#ifndef DECISION_CORE_OFF_POLICY_H_
#define DECISION_CORE_OFF_POLICY_H_

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace decision {

// The clip of the clipped IPS when a caller does not choose one.
inline constexpr double kDefaultOffPolicyClip = 100.0;

struct OffPolicyEstimate {
  int64_t samples = 0;
  double ips = 0.0;
  double ips_lower = 0.0;
  double ips_upper = 1.0;
  double snips = 0.0;
  double clipped_ips = 0.0;
  double effective_sample_size = 0.0;
  double mean_weight = 0.0;
  double max_weight = 0.0;
};

class OffPolicySums {
 public:
  explicit OffPolicySums(double clip = kDefaultOffPolicyClip) : clip_(clip) {}

  // Adds a sample: q the evaluated policy's probability of the arm played, p the logged
  // one, y the reward. REQUIRES: p in (0, 1], q in [0, 1], y in [0, 1] (callers validate).
  void Add(double q, double p, double y);

  int64_t samples() const { return static_cast<int64_t>(n_); }
  double clip() const { return clip_; }
  OffPolicyEstimate Estimate() const;

  // The state as kStateValues numbers, and back: DATA_LOSS unless they are what
  // ToArray() of some sums gives (finite, non-negative, consistent).
  static constexpr int kStateValues = 9;
  std::array<double, kStateValues> ToArray() const;
  static absl::StatusOr<OffPolicySums> FromArray(absl::Span<const double> values);

  friend bool operator==(const OffPolicySums& a, const OffPolicySums& b) {
    return a.ToArray() == b.ToArray();
  }

 private:
  double clip_;
  double n_ = 0.0;
  double sum_w_ = 0.0;
  double sum_w2_ = 0.0;
  double sum_wy_ = 0.0;
  double sum_wy2_ = 0.0;
  double sum_clipped_wy_ = 0.0;
  double max_w_ = 0.0;
  double max_inverse_p_ = 0.0;  // bounds every w_s y_s (q_s, y_s <= 1)
};

}  // namespace decision

#endif  // DECISION_CORE_OFF_POLICY_H_
