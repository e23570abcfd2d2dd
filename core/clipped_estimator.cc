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
        a_(num_experts, 0.0) {}

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
    for (int k = first_k; k < n; ++k) {
      const double m = d_.M(k, j);
      z_[k] += 1.0 / m;
      if (y == 0.0) continue;
      const double r = log.propensity(k, s) / pj;
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

  const EstimatorOptions options_;
  DivergenceMatrix d_;
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
