// Incremental clipped importance-sampling estimator (eq. est1); see estimator.h.
//
// State per expert k: Z_k and A_k = sum over included samples of (1/M_kj) Y r_kj, so the
// estimate is A_k / Z_k. A sample whose clip test exceeds the threshold L(t) M_kj waits in
// one min-heap shared by all pairs, keyed by test / M_kj; since L(t) only grows (for t >= 3
// under the paper's rule, always under 2/t) each waiting entry is released at most once,
// when L(t) passes its key. If L(t) ever decreases, or the divergences change, the state is
// rebuilt from the log. Samples with Y = 0 add nothing to any numerator and never enter
// the heap.
#include <cmath>
#include <limits>
#include <queue>
#include <vector>

#include "core/estimator.h"

namespace decision::internal {
namespace {

class ClippedEstimator final : public Estimator {
 public:
  ClippedEstimator(const EstimatorOptions& options, int num_experts)
      : options_(options),
        d_(DivergenceMatrix::Identity(num_experts)),
        z_(num_experts, 0.0),
        a_(num_experts, 0.0) {
    Transpose();
  }

  absl::Status Update(const SampleLog& log) override {
    if (absl::Status s = CheckLogMatches(log, d_.num_experts, t_); !s.ok()) return s;
    for (int64_t s = t_; s < log.size(); ++s) {
      const double level = ClipLevel(options_, s + 1);
      if (level < level_) {
        Rebuild(log, s + 1);
        continue;
      }
      level_ = level;
      Release();
      Insert(log, s, 0);
      t_ = s + 1;
    }
    return absl::OkStatus();
  }

  absl::Status SetDivergences(const SampleLog& log, const DivergenceMatrix& d) override {
    if (absl::Status s = ValidateDivergenceMatrix(d, log.num_experts()); !s.ok()) return s;
    if (log.size() < t_) return CheckLogMatches(log, log.num_experts(), t_);
    const int old_n = d_.num_experts;
    const bool extend = SameBlock(d_, d);
    d_ = d;
    Transpose();
    z_.resize(d.num_experts, 0.0);
    a_.resize(d.num_experts, 0.0);
    if (extend) {
      for (int64_t s = 0; s < t_; ++s) Insert(log, s, old_n);
    } else {
      Rebuild(log, t_);
    }
    return absl::OkStatus();
  }

  ExpertEstimate Estimate(int k) const override {
    if (t_ == 0) return {0.0, std::numeric_limits<double>::infinity()};
    return {a_[k] / z_[k], ClippedWidth(options_, t_, z_[k])};
  }

  // The paper's width needs Lambert W per expert (~90 ns). Bound it first from a table
  // (a few ns), and evaluate it exactly only for experts whose upper bound reaches the best
  // lower bound: the result is the exact argmax.
  int ArgmaxUcb(const std::vector<bool>& selectable, absl::BitGenRef gen) const override {
    if (options_.width_rule != WidthRule::kPaper || t_ == 0) {
      return Estimator::ArgmaxUcb(selectable, gen);
    }
    const int n = d_.num_experts;
    const double tt = static_cast<double>(t_);
    const double scale = 1.5 * options_.constants.C;
    const double numerator = std::sqrt(options_.constants.c1 * tt * std::log(tt));
    // Pass 1: the best lower bound. Pass 2: exact values where the upper bound reaches it.
    // (Bounds are recomputed rather than stored so that const calls share no scratch.)
    double best_lower = -std::numeric_limits<double>::infinity();
    for (int k = 0; k < n; ++k) {
      double w_low, w_high;
      if (selectable[k] && InverseLogRatioBounds(numerator / z_[k], &w_low, &w_high)) {
        best_lower = std::max(best_lower, a_[k] / z_[k] + scale * w_low);
      }
    }
    int best = -1, ties = 0;
    double best_value = 0.0;
    for (int k = 0; k < n; ++k) {
      if (!selectable[k]) continue;
      double w_low, w_high;
      if (InverseLogRatioBounds(numerator / z_[k], &w_low, &w_high) &&
          a_[k] / z_[k] + scale * w_high < best_lower) {
        continue;
      }
      const ExpertEstimate e = Estimate(k);
      OfferCandidate(k, e.mean + e.width, gen, &best, &best_value, &ties);
    }
    return best;
  }
  double EffectiveSampleSize(int k) const override { return z_[k]; }
  int64_t num_samples() const override { return t_; }
  int num_experts() const override { return d_.num_experts; }
  const DivergenceMatrix& divergences() const override { return d_; }

 private:
  struct Waiting {
    double key;    // test / M_kj: released once L(t) >= key
    double test;   // the clip test value, compared exactly against L(t) * M_kj
    double value;  // (1/M_kj) Y r_kj, added to A_k on release
    int32_t k;
    int32_t j;
    bool operator>(const Waiting& o) const { return key > o.key; }
  };

  // Recomputes everything from samples [0, t) at clip level L(t).
  void Rebuild(const SampleLog& log, int64_t t) {
    std::fill(z_.begin(), z_.end(), 0.0);
    std::fill(a_.begin(), a_.end(), 0.0);
    heap_ = {};
    t_ = t;
    level_ = t > 0 ? ClipLevel(options_, t) : -std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s < t; ++s) Insert(log, s, 0);
  }

  // Adds sample s to the rows of experts [first_k, N) at the current clip level.
  void Insert(const SampleLog& log, int64_t s, int first_k) {
    const int j = log.chooser(s);
    const double y = log.reward(s);
    const double pj = log.propensity(j, s);
    const int n = d_.num_experts;
    const double* m_row = &m_by_chooser_[static_cast<size_t>(j) * n];
    const double* inv_m_row = &inv_m_by_chooser_[static_cast<size_t>(j) * n];
    for (int k = first_k; k < n; ++k) z_[k] += inv_m_row[k];
    if (y == 0.0) return;
    const double* p = log.propensities(s);
    for (int k = first_k; k < n; ++k) {
      const double m = m_row[k];
      const double r = p[k] / pj;
      const double value = y * r / m;
      const double test = options_.clip_test == ClipTest::kRatio ? r : y * r;
      if (test <= level_ * m) {
        a_[k] += value;
      } else {
        heap_.push({test / m, test, value, k, j});
      }
    }
  }

  void Release() {
    while (!heap_.empty()) {
      const Waiting& w = heap_.top();
      if (!(w.test <= level_ * d_.M(w.k, w.j))) break;
      a_[w.k] += w.value;
      heap_.pop();
    }
  }

  // M and 1/M indexed [chooser j][expert k], so one sample reads one contiguous row.
  void Transpose() {
    const int n = d_.num_experts;
    m_by_chooser_.resize(static_cast<size_t>(n) * n);
    inv_m_by_chooser_.resize(static_cast<size_t>(n) * n);
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k < n; ++k) {
        m_by_chooser_[static_cast<size_t>(j) * n + k] = d_.M(k, j);
        inv_m_by_chooser_[static_cast<size_t>(j) * n + k] = 1.0 / d_.M(k, j);
      }
    }
  }

  const EstimatorOptions options_;
  DivergenceMatrix d_;
  std::vector<double> m_by_chooser_;
  std::vector<double> inv_m_by_chooser_;
  int64_t t_ = 0;
  double level_ = -std::numeric_limits<double>::infinity();  // L(t_)
  std::vector<double> z_;
  std::vector<double> a_;
  std::priority_queue<Waiting, std::vector<Waiting>, std::greater<Waiting>> heap_;
};

}  // namespace

std::unique_ptr<Estimator> MakeClippedEstimator(const EstimatorOptions& options,
                                                int num_experts) {
  return std::make_unique<ClippedEstimator>(options, num_experts);
}

}  // namespace decision::internal
