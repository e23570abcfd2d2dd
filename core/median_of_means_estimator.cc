// Median of means (eq. est2) with the paper's contiguous groups; see estimator.h. Kept as
// the paper's literal grouping, for experiments: unlike round-robin it reads the log, and
// its state grows with t (2N doubles per 8 samples).
//
// Group sums are differences of per-expert prefix sums over the log:
//   num_k(s) = sum_{s' < s} (1/sigma_kj) Y r_kj,   den_k(s) = sum_{s' < s} 1/sigma_kj.
// The prefix sums are kept every kBlock samples (one row of 2N values per block); the prefix
// at any other position is the block's row plus at most kBlock - 1 samples read from the
// log, added in the same order as the running sum, so the result is bit-identical to a
// prefix kept at every sample.
//
// The groups depend only on (l(t), m(t)); a new sample that leaves them unchanged lands in
// the unused tail and changes no estimate. The medians are recomputed, in O(N l), only when
// (l, m) changes: every ~l samples, so O(N) amortised per sample. Changing divergences
// rebuilds from the log, O(N t).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/chunked_rows.h"
#include "core/estimator.h"
#include "core/numeric.h"

namespace decision::internal {
namespace {

constexpr int64_t kBlock = 8;

class ContiguousMedianOfMeans final : public Estimator {
 public:
  ContiguousMedianOfMeans(const EstimatorOptions& options, int num_experts)
      : options_(options), d_(DivergenceMatrix::Identity(num_experts)) {
    Reset();
  }

  absl::Status Update(const SampleLog& log) override {
    if (absl::Status s = CheckLogMatches(log, d_.num_experts, t_); !s.ok()) return s;
    if (log.size() == t_) return absl::OkStatus();
    for (int64_t s = t_; s < log.size(); ++s) Append(log, s);
    RefreshGroups(log, /*force=*/false);
    return absl::OkStatus();
  }

  absl::Status SetDivergences(const SampleLog& log, const DivergenceMatrix& d) override {
    if (absl::Status s = ValidateDivergenceMatrix(d, log.num_experts()); !s.ok()) return s;
    if (log.size() < t_) return CheckLogMatches(log, log.num_experts(), t_);
    const int64_t t = t_;
    d_ = d;
    Reset();
    for (int64_t s = 0; s < t; ++s) Append(log, s);
    RefreshGroups(log, /*force=*/true);
    return absl::OkStatus();
  }

  ExpertEstimate Estimate(int k) const override {
    if (t_ == 0) return {0.0, std::numeric_limits<double>::infinity()};
    return {mean_[k], WidthFactor() * inv_min_weight_[k]};
  }

  int ArgmaxUcb(const std::vector<bool>& selectable, absl::BitGenRef gen) const override {
    return ArgmaxMeanPlusWidth(mean_, inv_min_weight_, WidthFactor(), selectable, gen);
  }

  double EffectiveSampleSize(int k) const override { return running_[n() + k]; }
  EstimatorStats Stats() const override {
    EstimatorStats stats;
    stats.state_bytes = static_cast<int64_t>(8 * (blocks_.rows() * blocks_.width() +
                                                  running_.size() + group_sums_.size() +
                                                  boundaries_.size() + group_means_.size()));
    return stats;
  }
  int64_t num_samples() const override { return t_; }
  int num_experts() const override { return d_.num_experts; }
  const DivergenceMatrix& divergences() const override { return d_; }

 private:
  int n() const { return d_.num_experts; }

  // sqrt(c3 log(1/delta(t)) / t), delta(t) = 1/t^2.
  double WidthFactor() const {
    const double tt = static_cast<double>(t_);
    return std::sqrt(options_.constants.c3 * (2.0 * std::log(tt)) / tt);
  }

  void Reset() {
    const int num = n();
    t_ = 0;
    groups_ = group_size_ = 0;
    inv_sigma_by_chooser_.assign(static_cast<size_t>(num) * num, 1.0);
    for (int j = 0; j < num; ++j) {
      for (int k = 0; k < num; ++k) {
        inv_sigma_by_chooser_[static_cast<size_t>(j) * num + k] = 1.0 / d_.Sigma(k, j);
      }
    }
    running_.assign(2 * static_cast<size_t>(num), 0.0);
    blocks_.Reset(2 * static_cast<size_t>(num));
    std::fill_n(blocks_.AppendRow(), 2 * num, 0.0);  // the prefix at position 0
    mean_.assign(num, 0.0);
    inv_min_weight_.assign(num, 0.0);
  }

  // Adds sample s's terms to the 2N prefix values in `sums` (numerators, then denominators).
  void AddSample(const SampleLog& log, int64_t s, double* sums) const {
    const int num = n();
    const int j = log.chooser(s);
    const double y = log.reward(s);
    const double* inv_sigma = &inv_sigma_by_chooser_[static_cast<size_t>(j) * num];
    double* den = sums + num;
    for (int k = 0; k < num; ++k) den[k] += inv_sigma[k];
    if (y == 0.0) return;
    const double* p = log.propensities(s);
    const double pj = p[j];
    for (int k = 0; k < num; ++k) sums[k] += inv_sigma[k] * y * (p[k] / pj);
  }

  void Append(const SampleLog& log, int64_t s) {
    AddSample(log, s, running_.data());
    t_ = s + 1;
    if (t_ % kBlock == 0) {
      std::copy(running_.begin(), running_.end(), blocks_.AppendRow());
    }
  }

  // The 2N prefix values at position `pos` (<= t_) into `out`.
  void PrefixAt(const SampleLog& log, int64_t pos, double* out) const {
    const int64_t block = pos / kBlock;
    std::copy_n(blocks_.row(block), 2 * n(), out);
    for (int64_t s = block * kBlock; s < pos; ++s) AddSample(log, s, out);
  }

  void RefreshGroups(const SampleLog& log, bool force) {
    if (t_ == 0) return;
    const int64_t l = MedianOfMeansGroups(options_, t_);
    const int64_t m = t_ / l;
    if (!force && l == groups_ && m == group_size_) return;
    const int num = n();
    const size_t width = 2 * static_cast<size_t>(num);
    group_sums_.resize(l * width);
    // Group r is [r m, (r + 1) m): a difference of prefix rows.
    boundaries_.resize((l + 1) * width);
    for (int64_t r = 0; r <= l; ++r) PrefixAt(log, r * m, &boundaries_[r * width]);
    for (size_t i = 0; i < l * width; ++i) {
      group_sums_[i] = boundaries_[i + width] - boundaries_[i];
    }
    groups_ = l;
    group_size_ = m;
    // Group means into a [k][r] matrix, then one median per expert.
    group_means_.resize(static_cast<size_t>(num) * l);
    std::fill(inv_min_weight_.begin(), inv_min_weight_.end(), 0.0);
    const double inv_m = 1.0 / static_cast<double>(m);
    for (int64_t r = 0; r < l; ++r) {
      const double* sums = &group_sums_[r * width];
      for (int k = 0; k < num; ++k) {
        const double w = sums[num + k];
        group_means_[static_cast<size_t>(k) * l + r] = sums[k] / w;
        // Track max 1/W_k(r) = 1 / min W_k(r).
        inv_min_weight_[k] = std::max(inv_min_weight_[k], 1.0 / (w * inv_m));
      }
    }
    for (int k = 0; k < num; ++k) {
      mean_[k] = MedianInPlace(absl::MakeSpan(&group_means_[static_cast<size_t>(k) * l], l));
    }
  }

  const EstimatorOptions options_;
  DivergenceMatrix d_;
  std::vector<double> inv_sigma_by_chooser_;  // [j][k] = 1 / sigma_kj
  int64_t t_ = 0;
  std::vector<double> running_;  // prefix sums at t_
  ChunkedRows<double> blocks_;   // row b: prefix sums at position b * kBlock
  int64_t groups_ = 0;           // l of the cached medians
  int64_t group_size_ = 0;       // m of the cached medians
  std::vector<double> mean_;
  std::vector<double> inv_min_weight_;  // 1 / W_k(t)
  std::vector<double> boundaries_;      // scratch: prefix rows at r * m (contiguous)
  std::vector<double> group_sums_;      // scratch: [r][2N]
  std::vector<double> group_means_;     // scratch: [k][r]
};

}  // namespace

std::unique_ptr<Estimator> MakeMedianOfMeansEstimator(const EstimatorOptions& options,
                                                      int num_experts) {
  if (options.grouping == MedianOfMeansGrouping::kRoundRobin) {
    return MakeRoundRobinMedianOfMeansEstimator(options, num_experts);
  }
  return std::make_unique<ContiguousMedianOfMeans>(options, num_experts);
}

}  // namespace decision::internal
