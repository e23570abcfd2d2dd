#include "tests/reference_estimators.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/numeric.h"

namespace decision::reference {
namespace {

// w(x): the y with y / log(2/y) = x. Solved here by bisection on the defining equation,
// independently of core's closed form through Lambert W.
double W(double x) {
  if (x == 0.0) return 0.0;
  double lo = 0.0, hi = 2.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (mid / std::log(2.0 / mid) < x) lo = mid; else hi = mid;
  }
  return 0.5 * (lo + hi);
}

double Ratio(const SampleLog& log, int k, int64_t s) {
  const int j = log.chooser(s);
  return log.propensity(k, s) / log.propensity(j, s);
}

}  // namespace

ExpertEstimate Clipped(const SampleLog& log, int64_t t, const DivergenceMatrix& d,
                       const EstimatorOptions& o, int k) {
  if (t == 0) return {0.0, std::numeric_limits<double>::infinity()};
  const double tt = static_cast<double>(t);
  const double C = o.constants.C, c1 = o.constants.c1;
  // eps(t): the paper's appendix sets eps(t) = beta'(t) = C w(sqrt(c1 log t / t)).
  const double eps = o.epsilon_rule == EpsilonRule::kTwoOverT
                         ? 2.0 / tt
                         : C * W(std::sqrt(c1 * std::log(tt) / tt));
  // n_j(t) and Z_k(t) = sum_j n_j(t) / M_kj.
  std::vector<int64_t> n(log.num_experts(), 0);
  for (int64_t s = 0; s < t; ++s) ++n[log.chooser(s)];
  double z = 0.0;
  for (int j = 0; j < log.num_experts(); ++j) z += n[j] / d.M(k, j);
  // sum_j sum_{s in T_j} (1/M_kj) Y_s r_kj(s) 1{ r_kj(s) <= 2 log(2/eps) M_kj }.
  double numerator = 0.0;
  for (int64_t s = 0; s < t; ++s) {
    const int j = log.chooser(s);
    const double m = d.M(k, j);
    const double y = log.reward(s);
    const double r = Ratio(log, k, s);
    const double tested = o.clip_test == ClipTest::kRatio ? r : y * r;
    const double threshold = eps > 0.0 ? 2.0 * std::log(2.0 / eps) * m
                                       : std::numeric_limits<double>::infinity();
    if (tested <= threshold) numerator += (1.0 / m) * y * r;
  }
  double width;
  if (o.width_rule == WidthRule::kAuthorsCode) {
    width = std::sqrt(C * tt * std::log(tt)) / z;
  } else {
    const double beta = C * W(std::sqrt(c1 * tt * std::log(tt)) / z);
    width = 1.5 * beta;
  }
  return {numerator / z, width};
}

namespace {

// The paper's l(t) = floor(c2 log(1/delta(t))), delta = 1/t^2, kept within [1, t].
int64_t PaperGroups(const EstimatorOptions& o, int64_t t) {
  const double tt = static_cast<double>(t);
  int64_t l = static_cast<int64_t>(std::floor(o.constants.c2 * std::log(tt * tt)));
  return std::max<int64_t>(1, std::min<int64_t>(l, t));
}

// Round-robin: L = the smallest 240 * 2^a >= the paper's l(10^13), and l(t) the divisor of
// L nearest to the paper's l(t) in ratio (ties: the larger), the smaller one if the larger
// exceeds t; L if the paper's l(t) exceeds L.
int64_t RoundRobinGroups(const EstimatorOptions& o, int64_t t) {
  int64_t fine = 240;
  while (fine < PaperGroups(o, 10'000'000'000'000)) fine *= 2;
  const int64_t paper = PaperGroups(o, t);
  if (paper > fine) return fine;
  std::vector<int64_t> divisors;
  for (int64_t l = 1; l <= fine; ++l) {
    if (fine % l == 0) divisors.push_back(l);
  }
  const int64_t above = *std::lower_bound(divisors.begin(), divisors.end(), paper);
  const int64_t below = *(std::upper_bound(divisors.begin(), divisors.end(), paper) - 1);
  if (above > t) return below;
  const double up = static_cast<double>(above) / paper, down = static_cast<double>(paper) / below;
  return up <= down ? above : below;
}

}  // namespace

ExpertEstimate MedianOfMeans(const SampleLog& log, int64_t t, const DivergenceMatrix& d,
                             const EstimatorOptions& o, int k, int64_t first,
                             const std::vector<int64_t>& excluded) {
  if (t == 0) return {0.0, std::numeric_limits<double>::infinity()};
  const double tt = static_cast<double>(t);
  const double delta = 1.0 / (tt * tt);
  const bool round_robin = o.grouping == MedianOfMeansGrouping::kRoundRobin;
  int64_t l, used;
  if (round_robin) {
    // u(t) = max(u(t - 1), l(t) floor(t / l(t))): the used prefix never shrinks.
    used = 0;
    for (int64_t step = 1; step <= t; ++step) {
      const int64_t l_step = RoundRobinGroups(o, step);
      used = std::max(used, l_step * (step / l_step));
    }
    l = RoundRobinGroups(o, t);
  } else {
    l = PaperGroups(o, t);
    used = l * (t / l);
  }
  std::vector<double> group_means;
  double min_weight = std::numeric_limits<double>::infinity();
  for (int64_t r = 0; r < l; ++r) {
    // Group r: contiguous samples r*m .. r*m + m - 1 (m = t / l), or round-robin: the
    // samples s < u with s mod l = r.
    // A window keeps only its samples (s >= first) in each group.
    std::vector<int64_t> members;
    for (int64_t s = first; s < used; ++s) {
      if (std::binary_search(excluded.begin(), excluded.end(), s)) continue;
      if (round_robin ? s % l == r : s / (used / l) == r) members.push_back(s);
    }
    if (members.empty()) continue;  // a window's group without samples: not in its median
    std::vector<int64_t> n_r(log.num_experts(), 0);
    double numerator = 0.0;
    for (int64_t s : members) {
      const int j = log.chooser(s);
      ++n_r[j];
      numerator += (1.0 / d.Sigma(k, j)) * log.reward(s) * Ratio(log, k, s);
    }
    double w = 0.0;  // W_k(r,t) = sum_i n_i(r,t) / sigma_ki
    for (int i = 0; i < log.num_experts(); ++i) w += n_r[i] / d.Sigma(k, i);
    group_means.push_back(numerator / w);
    min_weight = std::min(min_weight, w / static_cast<double>(members.size()));
  }
  if (group_means.empty()) return {0.0, std::numeric_limits<double>::infinity()};
  std::sort(group_means.begin(), group_means.end());
  const size_t g = group_means.size();
  const double median = g % 2 == 1 ? group_means[g / 2]
                                   : 0.5 * (group_means[g / 2 - 1] + group_means[g / 2]);
  // t_k: the samples of the window (all t without one).
  int64_t left_out = 0;
  for (int64_t s : excluded) left_out += s >= first && s < t;
  const double tk = static_cast<double>(t - first - left_out);
  const double width = (1.0 / min_weight) * std::sqrt(o.constants.c3 * std::log(1.0 / delta) / tk);
  return {median, width};
}

ExpertEstimate Estimate(const SampleLog& log, int64_t t, const DivergenceMatrix& d,
                        const EstimatorOptions& options, int k) {
  return options.kind == EstimatorKind::kClipped ? Clipped(log, t, d, options, k)
                                                 : MedianOfMeans(log, t, d, options, k);
}

}  // namespace decision::reference
