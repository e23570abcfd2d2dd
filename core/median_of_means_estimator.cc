// Incremental median-of-means importance-sampling estimator (eq. est2); see estimator.h.
//
// Group sums are differences of per-expert prefix sums over the log:
//   num_k(s) = sum_{s' < s} (1/sigma_kj) Y r_kj,   den_k(s) = sum_{s' < s} 1/sigma_kj,
// appended in O(N) per sample. The groups depend only on (l(t), m(t)); a new sample that
// leaves them unchanged lands in the unused tail and changes no estimate. The medians are
// recomputed, in O(N l), only when (l, m) changes: every ~l samples, so O(N) amortised.
//
// WART: the prefix sums cost 16 bytes per expert per sample.
#include <cmath>
#include <limits>
#include <vector>

#include "core/estimator.h"
#include "core/numeric.h"

namespace decision::internal {
namespace {

class MedianOfMeansEstimator final : public Estimator {
 public:
  MedianOfMeansEstimator(const EstimatorOptions& options, int num_experts)
      : options_(options),
        d_(DivergenceMatrix::Identity(num_experts)),
        num_(num_experts, std::vector<double>{0.0}),
        den_(num_experts, std::vector<double>{0.0}),
        mean_(num_experts, 0.0),
        min_weight_(num_experts, 0.0) {}

  absl::Status Update(const SampleLog& log) override {
    if (absl::Status s = CheckLogMatches(log, d_.num_experts, t_); !s.ok()) return s;
    if (log.size() == t_) return absl::OkStatus();
    for (int64_t s = t_; s < log.size(); ++s) Append(log, s, 0);
    t_ = log.size();
    RefreshGroups(/*force=*/false);
    return absl::OkStatus();
  }

  absl::Status SetDivergences(const SampleLog& log, const DivergenceMatrix& d) override {
    if (absl::Status s = ValidateDivergenceMatrix(d, log.num_experts()); !s.ok()) return s;
    if (log.size() < t_) return CheckLogMatches(log, log.num_experts(), t_);
    const int old_n = d_.num_experts;
    const int first = SameBlock(d_, d) ? old_n : 0;
    d_ = d;
    num_.resize(d.num_experts);
    den_.resize(d.num_experts);
    mean_.resize(d.num_experts, 0.0);
    min_weight_.resize(d.num_experts, 0.0);
    for (int k = first; k < d.num_experts; ++k) {
      num_[k].assign(1, 0.0);
      den_[k].assign(1, 0.0);
      num_[k].reserve(t_ + 1);
      den_[k].reserve(t_ + 1);
    }
    for (int64_t s = 0; s < t_; ++s) Append(log, s, first);
    RefreshGroups(/*force=*/true);
    return absl::OkStatus();
  }

  ExpertEstimate Estimate(int k) const override {
    if (t_ == 0) return {0.0, std::numeric_limits<double>::infinity()};
    const double tt = static_cast<double>(t_);
    const double log_inv_delta = 2.0 * std::log(tt);
    return {mean_[k],
            std::sqrt(options_.constants.c3 * log_inv_delta / tt) / min_weight_[k]};
  }
  int64_t num_samples() const override { return t_; }
  int num_experts() const override { return d_.num_experts; }
  const DivergenceMatrix& divergences() const override { return d_; }

 private:
  // Appends sample s to the prefix sums of experts [first_k, N).
  void Append(const SampleLog& log, int64_t s, int first_k) {
    const int j = log.chooser(s);
    const double y = log.reward(s);
    const double pj = log.propensity(j, s);
    for (int k = first_k; k < d_.num_experts; ++k) {
      const double inv_sigma = 1.0 / d_.Sigma(k, j);
      const double value = y == 0.0 ? 0.0 : inv_sigma * y * (log.propensity(k, s) / pj);
      num_[k].push_back(num_[k].back() + value);
      den_[k].push_back(den_[k].back() + inv_sigma);
    }
  }

  void RefreshGroups(bool force) {
    if (t_ == 0) return;
    const int64_t l = MedianOfMeansGroups(options_, t_);
    const int64_t m = t_ / l;
    if (!force && l == groups_ && m == group_size_) return;
    groups_ = l;
    group_size_ = m;
    group_means_.resize(l);
    for (int k = 0; k < d_.num_experts; ++k) {
      const std::vector<double>& num = num_[k];
      const std::vector<double>& den = den_[k];
      double min_weight = std::numeric_limits<double>::infinity();
      for (int64_t r = 0; r < l; ++r) {
        const double w = den[(r + 1) * m] - den[r * m];
        group_means_[r] = (num[(r + 1) * m] - num[r * m]) / w;
        min_weight = std::min(min_weight, w / static_cast<double>(m));
      }
      mean_[k] = MedianInPlace(group_means_);
      min_weight_[k] = min_weight;
    }
  }

  const EstimatorOptions options_;
  DivergenceMatrix d_;
  int64_t t_ = 0;
  std::vector<std::vector<double>> num_;  // [k][s], size t_ + 1
  std::vector<std::vector<double>> den_;
  int64_t groups_ = 0;      // l of the cached medians
  int64_t group_size_ = 0;  // m of the cached medians
  std::vector<double> mean_;
  std::vector<double> min_weight_;
  std::vector<double> group_means_;  // scratch
};

}  // namespace

std::unique_ptr<Estimator> MakeMedianOfMeansEstimator(const EstimatorOptions& options,
                                                      int num_experts) {
  return std::make_unique<MedianOfMeansEstimator>(options, num_experts);
}

}  // namespace decision::internal
