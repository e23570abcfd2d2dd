// Stochastic experts: models that map a dense context x (d features) to a probability
// distribution pi(.|x) over K arms.
//
// Every expert is smoothed: the distribution it reports is
//     pi'(v|x) = (1 - eta) * pi(v|x) + eta / K
// so that every arm has probability at least eta / K. This bounds every importance ratio
// pi_k(v|x) / pi_j(v|x) by K / eta and keeps the divergences of DESIGN.md section 2 finite.
// The cost is at most eta of the expert's reward. The default eta = 0.05 (see
// kDefaultSmoothing) caps ratios at 20K and costs at most 5% of reward, the same share of
// exploration Vowpal Wabbit's epsilon-greedy uses by default.
//
// Thread safety: every Expert is immutable after construction; Predict may be called
// concurrently from any number of threads.
//
// Errors: constructors validate everything and return INVALID_ARGUMENT with a message that
// names the offending value; Predict returns INVALID_ARGUMENT for a context of the wrong
// size or with a non-finite entry. Nothing here crashes on bad input.
#ifndef DECISION_CORE_EXPERT_H_
#define DECISION_CORE_EXPERT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace decision {

inline constexpr double kDefaultSmoothing = 0.05;
inline constexpr int kMaxArms = 1 << 16;
inline constexpr int kMaxFeatures = 1 << 20;

// Checks the shape shared by every expert: 1 <= num_arms <= kMaxArms,
// 0 <= num_features <= kMaxFeatures, 0 <= smoothing <= 1 (finite).
absl::Status ValidateExpertShape(int num_arms, int num_features, double smoothing);

// Checks that `x` has `num_features` entries, all finite.
absl::Status ValidateContext(absl::Span<const double> x, int num_features);

// The arms eligible for one decision (an ad server's per-request eligibility): distinct arm
// ids in [0, num_arms). Empty means every arm. INVALID_ARGUMENT names the first offending
// entry (out of range, or repeated).
absl::Status ValidateEligibleArms(absl::Span<const int32_t> arms, int num_arms);

// Restricts a distribution to the eligible arms E, in place: `probs` holds the unsmoothed
// pi(.|x) over every arm and becomes
//     pi_E(v|x) = (1 - eta) * pi(v|x) / sum_{u in E} pi(u|x) + eta / |E|   for v in E,
//     pi_E(v|x) = 0                                                      otherwise,
// i.e. renormalised over E and smoothed over E (uniform over E if pi gives E no mass).
// Empty E: every arm, the plain smoothing (1 - eta) pi + eta / K.
// REQUIRES: ValidateEligibleArms(eligible, probs.size()).
void RestrictToEligible(absl::Span<const int32_t> eligible, double smoothing,
                        absl::Span<double> probs);

class Expert {
 public:
  virtual ~Expert() = default;
  Expert(const Expert&) = delete;
  Expert& operator=(const Expert&) = delete;

  int num_arms() const { return num_arms_; }
  int num_features() const { return num_features_; }
  double smoothing() const { return smoothing_; }
  // A short name of the model kind: "uniform", "table", "linear_softmax", "xgboost".
  virtual const char* kind() const = 0;

  // Writes the smoothed distribution pi'(.|x) into `probs`.
  // REQUIRES: probs.size() == num_arms().
  // Returns INVALID_ARGUMENT if x.size() != num_features() or x has NaN/Inf.
  absl::Status Predict(absl::Span<const double> x, absl::Span<double> probs) const;

  // Batch form: `rows` holds n contexts row-major (n * num_features() values); writes n
  // distributions row-major into `probs` (n * num_arms() values).
  // REQUIRES: probs.size() == n * num_arms().
  absl::Status PredictBatch(absl::Span<const double> rows, size_t n,
                            absl::Span<double> probs) const;

  // Per-request eligibility: each row's distribution restricted to its eligible arms
  // (RestrictToEligible: renormalised and smoothed over them, 0 for the other arms).
  // `eligible` is empty (no row restricted) or has one entry per row, each empty (every
  // arm) or ascending distinct arms in [0, K) (sort a request's set first: it is checked
  // in O(|E|)); a row with every arm eligible gets exactly PredictBatch's distribution.
  // INVALID_ARGUMENT for a bad set or a count that is not n.
  absl::Status PredictBatchEligible(absl::Span<const double> rows, size_t n,
                                    absl::Span<const absl::Span<const int32_t>> eligible,
                                    absl::Span<double> probs) const;
  absl::Status PredictEligible(absl::Span<const double> x, absl::Span<const int32_t> eligible,
                               absl::Span<double> probs) const;

 protected:
  Expert(int num_arms, int num_features, double smoothing)
      : num_arms_(num_arms), num_features_(num_features), smoothing_(smoothing) {}

  // The unsmoothed distributions of n validated rows. Each output row must be a
  // probability vector (non-negative, summing to 1).
  virtual absl::Status PredictRaw(absl::Span<const double> rows, size_t n,
                                  absl::Span<double> probs) const = 0;

 private:
  void Smooth(absl::Span<double> probs) const;
  // Checks the batch's sizes and finiteness, then PredictRaw.
  absl::Status PredictRawChecked(absl::Span<const double> rows, size_t n,
                                 absl::Span<double> probs) const;

  const int num_arms_;
  const int num_features_;
  const double smoothing_;
};

// pi(v|x) = 1/K for every x. Smoothing does not change it.
absl::StatusOr<std::unique_ptr<Expert>> MakeUniformExpert(int num_arms, int num_features);

// A fixed table of distributions. With one row the distribution ignores x. With R > 1 rows,
// row floor(x[key_feature]) is used; a key outside [0, R) is INVALID_ARGUMENT at Predict.
// Each row must have num_arms finite, non-negative entries summing to 1 (within 1e-6; the
// row is then renormalised exactly).
absl::StatusOr<std::unique_ptr<Expert>> MakeTableExpert(
    int num_arms, int num_features, std::vector<std::vector<double>> rows, int key_feature,
    double smoothing = kDefaultSmoothing);

// Linear softmax: pi(v|x) = softmax_v((W x + b) / temperature), W row-major K x d.
// REQUIRES (checked): weights.size() == K * d, bias.size() == K, all finite,
// temperature finite and > 0.
absl::StatusOr<std::unique_ptr<Expert>> MakeLinearSoftmaxExpert(
    int num_arms, int num_features, std::vector<double> weights, std::vector<double> bias,
    double temperature = 1.0, double smoothing = kDefaultSmoothing);

// Draws an arm from `probs` with the uniform variate `u` in [0, 1). Returns the last arm
// with positive probability if rounding leaves u above the cumulative sum.
int SampleArm(absl::Span<const double> probs, double u);

}  // namespace decision

#endif  // DECISION_CORE_EXPERT_H_
