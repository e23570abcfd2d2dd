// The two importance-sampling estimators of "Contextual Bandits with Stochastic Experts"
// (Sen, Shanmugam, Sharma, Shakkottai), in their incremental serving form.
//
// Notation (DESIGN.md section 2): t samples in the log; sample s chose expert j(s), got
// reward Y_s; r_kj(s) = pi_k(V_s|X_s) / pi_j(V_s|X_s); n_j = samples chosen by j; M and
// sigma from the DivergenceMatrix.
//
// Clipped estimator (eq. est1):
//   mu_c[k] = 1/Z_k * sum_s (1/M_kj) Y_s r_kj(s) 1{ test(s) <= 2 log(2/eps(t)) M_kj },
//   Z_k = sum_j n_j / M_kj,  j = j(s),
//   test(s) = r_kj(s) (paper) or Y_s r_kj(s) (ClipTest::kRewardTimesRatio, authors' code),
//   eps(t) = C w(sqrt(c1 log t / t)) (paper appendix) or 2/t (EpsilonRule::kTwoOverT),
//   width  = 1.5 C w(sqrt(c1 t log t) / Z_k) (paper, eq. ucb1)
//            or sqrt(C t log t) / Z_k (WidthRule::kAuthorsCode),
//   w(x) = the y with y / log(2/y) = x (see InverseLogRatio).
//   If eps(t) >= 2 the threshold is <= 0 and every sample is clipped (mu_c = 0).
//
// Median-of-means estimator (eq. est2):
//   l(t) = floor(c2 log(1/delta(t))), delta(t) = 1/t^2, clamped to [1, t] (the paper's l(t)
//   exceeds t, or is 0, for very small t); m = floor(t / l); group r (0-based) holds samples
//   r*m .. r*m + m - 1 in arrival order, or with round-robin grouping the samples
//   s < l*m with s mod l = r (either way the t - l*m newest samples are not used);
//   W_k(r) = sum_{s in r} 1/sigma_kj(s);
//   mu_r[k] = 1/W_k(r) * sum_{s in r} (1/sigma_kj) Y_s r_kj(s);  mu_m[k] = median_r mu_r[k]
//   (the mean of the two middle values for an even l);
//   width = 1/W_k * sqrt(c3 log(1/delta(t)) / t),  W_k = min_r W_k(r) / m.
//
// With no samples (t = 0) every estimate is {mean 0, width +inf}.
//
// Incremental form: Update() is O(N) amortised per new sample plus O(log) per clipped
// sample; Estimate() is O(1) and ArgmaxUcb() O(N). Changing the divergences rebuilds the
// state from the log in O(N t); the clipped estimator adds experts while keeping the old
// divergences in O(t) per new expert (the median-of-means estimator rebuilds, O(N t)).
// The literal from-scratch forms of both equations live in tests/reference_estimators.h
// and the two agree to 1e-9 relative (tests/estimator_test.cc).
//
// Thread safety: const methods may run concurrently with each other; Update and
// SetDivergences need exclusive access (the owner serialises them).
#ifndef DECISION_CORE_ESTIMATOR_H_
#define DECISION_CORE_ESTIMATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/random/bit_gen_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/divergence.h"
#include "core/sample_log.h"

namespace decision {

enum class EstimatorKind { kClipped = 0, kMedianOfMeans = 1 };
enum class EpsilonRule { kPaper = 0, kTwoOverT = 1 };
enum class WidthRule { kPaper = 0, kAuthorsCode = 1 };
enum class ClipTest { kRatio = 0, kRewardTimesRatio = 1 };
// How the median-of-means estimator splits the first l m samples into l groups of m:
// contiguous blocks in arrival order (the paper), or round-robin (group r holds the samples
// with s mod l = r). Both are fixed in advance of the data, which the variance argument
// needs. Round-robin mixes every period of the log into every group, so a policy that
// changed over time (early poor experts, later good ones) does not make whole groups
// unrepresentative.
enum class MedianOfMeansGrouping { kContiguous = 0, kRoundRobin = 1 };

// The constants of the analysis. Practical() is the set the paper's experiments use for
// every data set (and the default); Analysis() is the set the regret proof uses, which
// depends on problem quantities the operator must supply (M, gap gamma, sigma).
struct EstimatorConstants {
  double C = 1.0;
  double c1 = 1.0;
  double c2 = 4.0;
  double c3 = 2.0;
  static EstimatorConstants Practical() { return {}; }
  static EstimatorConstants Analysis(double max_m, double gap, double max_sigma) {
    return {16.0 * max_m / gap, 1.0, 8.0, 32.0 * max_sigma * max_sigma};
  }
};

struct EstimatorOptions {
  EstimatorKind kind = EstimatorKind::kMedianOfMeans;
  EstimatorConstants constants;
  // Clipped-estimator variants; the defaults are the paper's forms.
  EpsilonRule epsilon_rule = EpsilonRule::kPaper;
  WidthRule width_rule = WidthRule::kPaper;
  ClipTest clip_test = ClipTest::kRatio;
  // Median-of-means grouping. Default round-robin: with experts trained from the log (the
  // batched algorithm) the paper's contiguous blocks lose badly (letter, order s1:
  // progressive loss 0.96 vs 0.88 at 5000 rounds, 0.62 final; docs/ENGINE.md).
  MedianOfMeansGrouping grouping = MedianOfMeansGrouping::kRoundRobin;
};
absl::Status ValidateEstimatorOptions(const EstimatorOptions& options);
std::string DescribeEstimatorOptions(const EstimatorOptions& options);

struct ExpertEstimate {
  double mean = 0.0;
  double width = 0.0;  // the UCB is mean + width
};

// The clip level L(t) = 2 log(2 / eps(t)) of the clipped estimator (threshold = L(t) M_kj).
// +inf when eps(t) = 0 (t = 1 under the paper's rule). REQUIRES: t >= 1.
double ClipLevel(const EstimatorOptions& options, int64_t t);
// The clipped estimator's width for a given t and Z_k. REQUIRES: t >= 1, z > 0.
double ClippedWidth(const EstimatorOptions& options, int64_t t, double z);
// The median-of-means group count l(t), clamped to [1, t]. REQUIRES: t >= 1.
int64_t MedianOfMeansGroups(const EstimatorOptions& options, int64_t t);

class Estimator {
 public:
  virtual ~Estimator() = default;

  // Brings the state up to date with samples [num_samples(), log.size()) of `log`, which
  // must extend the log this estimator has seen.
  // Returns FAILED_PRECONDITION (state unchanged) if the log has fewer samples than
  // already seen or a different number of experts.
  virtual absl::Status Update(const SampleLog& log) = 0;

  // Replaces the divergences. `d` may cover more experts than before (experts appended to
  // the log): if the block of the old experts is unchanged only the new experts' rows are
  // computed (O(t) each), otherwise the whole state is rebuilt from the log (O(N t)).
  // Returns INVALID_ARGUMENT (state unchanged) if d.num_experts != log.num_experts() or
  // d has entries that are not finite and >= 1.
  virtual absl::Status SetDivergences(const SampleLog& log, const DivergenceMatrix& d) = 0;

  virtual ExpertEstimate Estimate(int k) const = 0;

  // The expert with the largest mean + width among those with selectable[k], ties broken
  // uniformly at random; -1 if none is selectable. Equivalent to comparing Estimate(k) for
  // every k, but implementations may skip work (e.g. bound the width cheaply first).
  // REQUIRES: selectable.size() == num_experts(), num_samples() > 0.
  virtual int ArgmaxUcb(const std::vector<bool>& selectable, absl::BitGenRef gen) const;

  // The importance-weighted sample count behind expert k's estimate: Z_k for the clipped
  // estimator, sum_s 1/sigma_k,j(s) for median of means. 0 with no samples.
  virtual double EffectiveSampleSize(int k) const = 0;

  virtual int64_t num_samples() const = 0;
  virtual int num_experts() const = 0;
  virtual const DivergenceMatrix& divergences() const = 0;
};

// Creates an estimator for `num_experts` experts with identity divergences and no samples.
absl::StatusOr<std::unique_ptr<Estimator>> MakeEstimator(const EstimatorOptions& options,
                                                         int num_experts);

namespace internal {
absl::Status ValidateDivergenceMatrix(const DivergenceMatrix& d, int num_experts);
absl::Status CheckLogMatches(const SampleLog& log, int num_experts, int64_t num_samples);
// True if new_d covers at least old_d's experts with identical entries for them.
bool SameBlock(const DivergenceMatrix& old_d, const DivergenceMatrix& new_d);
// Reservoir choice among ties: call with each candidate in index order; keeps the running
// argmax in *best / *best_value and the tie count in *ties.
void OfferCandidate(int k, double value, absl::BitGenRef gen, int* best, double* best_value,
                    int* ties);
// Lower and upper bounds on InverseLogRatio(x) from a table over geometric buckets
// (relative bucket width 2^-6): w_low <= w(x) <= w_high. Returns false if x is outside the
// table's range (then compute w exactly).
bool InverseLogRatioBounds(double x, double* w_low, double* w_high);
std::unique_ptr<Estimator> MakeClippedEstimator(const EstimatorOptions& options,
                                                int num_experts);
std::unique_ptr<Estimator> MakeMedianOfMeansEstimator(const EstimatorOptions& options,
                                                      int num_experts);
}  // namespace internal

}  // namespace decision

#endif  // DECISION_CORE_ESTIMATOR_H_
