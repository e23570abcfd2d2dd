#include "core/estimator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "core/estimator_state.h"
#include "core/numeric.h"

namespace decision {

absl::Status ValidateEstimatorOptions(const EstimatorOptions& o) {
  const EstimatorConstants& c = o.constants;
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"C", c.C}, {"c1", c.c1}, {"c2", c.c2}, {"c3", c.c3}}) {
    if (!(std::isfinite(value) && value > 0.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("estimator constant ", name, " must be finite and > 0, got ", value));
    }
  }
  if (c.c2 > kMaxC2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "estimator constant c2 must be <= ", kMaxC2,
        " (it sets how many median-of-means fine groups are kept: 240 for c2 <= 4, 480 for "
        "c2 <= 8, 960 for c2 <= 16), got ", c.c2));
  }
  if (o.max_kept_clipped < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_kept_clipped must be >= 0, got ", o.max_kept_clipped));
  }
  if (o.kind != EstimatorKind::kClipped && o.kind != EstimatorKind::kMedianOfMeans) {
    return absl::InvalidArgumentError("unknown estimator kind");
  }
  if (o.grouping != MedianOfMeansGrouping::kContiguous &&
      o.grouping != MedianOfMeansGrouping::kRoundRobin) {
    return absl::InvalidArgumentError("unknown median-of-means grouping");
  }
  return absl::OkStatus();
}

std::string DescribeEstimatorOptions(const EstimatorOptions& o) {
  const EstimatorConstants& c = o.constants;
  if (o.kind == EstimatorKind::kMedianOfMeans) {
    return absl::StrCat("median_of_means(c2=", c.c2, ", c3=", c.c3, ", grouping=",
                        o.grouping == MedianOfMeansGrouping::kContiguous ? "contiguous"
                                                                        : "round_robin",
                        ")");
  }
  return absl::StrCat(
      "clipped(C=", c.C, ", c1=", c.c1,
      ", eps=", o.epsilon_rule == EpsilonRule::kPaper ? "paper" : "2/t",
      ", width=", o.width_rule == WidthRule::kPaper ? "paper" : "authors_code",
      ", clip_test=", o.clip_test == ClipTest::kRatio ? "ratio" : "reward_times_ratio", ")");
}

double ClipLevel(const EstimatorOptions& o, int64_t t) {
  const double tt = static_cast<double>(t);
  double eps;
  if (o.epsilon_rule == EpsilonRule::kTwoOverT) {
    eps = 2.0 / tt;
  } else {
    eps = o.constants.C * InverseLogRatio(std::sqrt(o.constants.c1 * std::log(tt) / tt));
  }
  if (eps <= 0.0) return std::numeric_limits<double>::infinity();
  return 2.0 * std::log(2.0 / eps);
}

double ClippedWidth(const EstimatorOptions& o, int64_t t, double z) {
  const double tt = static_cast<double>(t);
  if (o.width_rule == WidthRule::kAuthorsCode) {
    return std::sqrt(o.constants.C * tt * std::log(tt)) / z;
  }
  return 1.5 * o.constants.C * InverseLogRatio(std::sqrt(o.constants.c1 * tt * std::log(tt)) / z);
}

namespace {

// The t up to which MedianOfMeansFineGroups keeps the paper's l(t) (see estimator.h).
constexpr int64_t kFineGroupHorizon = 10'000'000'000'000;

}  // namespace

int64_t MedianOfMeansFineGroups(const EstimatorOptions& o) {
  const int64_t needed = internal::PaperMedianOfMeansGroups(o, kFineGroupHorizon);
  int64_t fine = 240;
  while (fine < needed) fine *= 2;
  return fine;
}

int64_t MedianOfMeansGroups(const EstimatorOptions& o, int64_t t) {
  const int64_t paper = internal::PaperMedianOfMeansGroups(o, t);
  if (o.grouping == MedianOfMeansGrouping::kContiguous) return paper;
  return internal::RoundGroupsToDivisor(MedianOfMeansFineGroups(o), paper, t);
}

int64_t EstimatorStateBound(const EstimatorOptions& o, int num_experts, int num_windows,
                            int num_retired) {
  const int64_t n = num_experts;
  const int64_t live = std::max<int64_t>(n - std::max(num_retired, 0), 0);
  if (o.kind == EstimatorKind::kClipped) {
    // M and 1/M by chooser, the folded sums, the divergences (M, sigma): 5 N^2; the counts,
    // Z and A; the kept entries.
    return 8 * (5 * n * n + 3 * n) + 32 * o.max_kept_clipped;
  }
  if (o.grouping == MedianOfMeansGrouping::kContiguous) return 8 * 3 * n * n;
  // The fine groups (S of the live experts; n, F, D and the retired columns' folded sums
  // of all), a full tail (< L samples), the group scratch (at most L groups), the
  // divergences and the retired experts' frozen values.
  const int64_t fine = MedianOfMeansFineGroups(o);
  return 8 * (fine * live * live + 4 * fine * n + fine * (n + 1) + fine * n + 3 * n * n +
              3 * n) +
         4 * fine + 8 * fine * (n + 1) * std::max(num_windows, 0);
}

absl::Status Estimator::Add(int, double, absl::Span<const double>) {
  return absl::UnimplementedError(
      "this estimator reads its groups from the log: use Update(log)");
}

absl::StatusOr<std::unique_ptr<ExpertRows>> Estimator::NewExpertRows(int, int64_t) const {
  return absl::UnimplementedError(
      "this estimator reads new experts' rows from the log: use SetDivergences(log, d)");
}

absl::Status Estimator::AddExperts(std::unique_ptr<ExpertRows>, const DivergenceMatrix&) {
  return absl::UnimplementedError(
      "this estimator reads new experts' rows from the log: use SetDivergences(log, d)");
}

absl::Status Estimator::SnapshotTo(std::string*) const {
  return absl::UnimplementedError("this estimator's state is its log: it has no snapshot");
}

absl::StatusOr<std::unique_ptr<Estimator>> RestoreEstimator(const EstimatorOptions& options,
                                                            absl::string_view state) {
  if (absl::Status s = ValidateEstimatorOptions(options); !s.ok()) return s;
  internal::StateReader in(state);
  char magic[4];
  uint8_t kind;
  const bool header = in.Raw(magic, 4);
  const int version = header ? magic[3] - '0' : 0;
  if (!header || std::memcmp(magic, internal::kStateMagic, 3) != 0 || version < 1 ||
      version > internal::kStateVersion || !in.Raw(&kind, 1)) {
    return absl::DataLossError("the estimator state is damaged: it has no valid header");
  }
  in.set_version(version);
  absl::StatusOr<std::unique_ptr<Estimator>> restored;
  if (kind == static_cast<uint8_t>(EstimatorKind::kClipped) &&
      options.kind == EstimatorKind::kClipped) {
    restored = internal::RestoreClippedEstimator(options, in);
  } else if (kind == static_cast<uint8_t>(EstimatorKind::kMedianOfMeans) &&
             options.kind == EstimatorKind::kMedianOfMeans &&
             options.grouping == MedianOfMeansGrouping::kRoundRobin) {
    restored = internal::RestoreRoundRobinMedianOfMeans(options, in);
  } else {
    return absl::DataLossError(
        absl::StrCat("the estimator state is of kind ", static_cast<int>(kind),
                     ", not of the problem's estimator ", DescribeEstimatorOptions(options)));
  }
  if (restored.ok() && !in.AtEnd()) return in.Error("trailing bytes");
  return restored;
}

int Estimator::ArgmaxUcb(const std::vector<bool>& selectable, absl::BitGenRef gen) const {
  int best = -1, ties = 0;
  double best_value = 0.0;
  for (int k = 0; k < num_experts(); ++k) {
    if (!selectable[k]) continue;
    const ExpertEstimate e = Estimate(k);
    internal::OfferCandidate(k, e.mean + e.width, gen, &best, &best_value, &ties);
  }
  return best;
}

absl::StatusOr<std::unique_ptr<Estimator>> MakeEstimator(const EstimatorOptions& options,
                                                         int num_experts) {
  if (absl::Status s = ValidateEstimatorOptions(options); !s.ok()) return s;
  if (num_experts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of experts must be >= 0, got ", num_experts));
  }
  if (options.kind == EstimatorKind::kClipped) {
    return internal::MakeClippedEstimator(options, num_experts);
  }
  return internal::MakeMedianOfMeansEstimator(options, num_experts);
}

namespace internal {

absl::Status ValidateDivergenceMatrix(const DivergenceMatrix& d, int num_experts) {
  if (d.num_experts != num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("divergences cover ", d.num_experts,
                                                   " experts, the log has ", num_experts));
  }
  const size_t cells = static_cast<size_t>(num_experts) * num_experts;
  if (d.m.size() != cells || d.sigma.size() != cells) {
    return absl::InvalidArgumentError("divergence matrices are not N x N");
  }
  for (size_t i = 0; i < cells; ++i) {
    if (!(std::isfinite(d.m[i]) && d.m[i] >= 1.0 && std::isfinite(d.sigma[i]) &&
          d.sigma[i] >= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("divergence entry (", i / num_experts, ", ", i % num_experts,
                       ") has M = ", d.m[i], ", sigma = ", d.sigma[i],
                       "; both must be finite and >= 1"));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace decision

namespace decision::internal {

absl::Status CheckLogMatches(const SampleLog& log, int num_experts, int64_t num_samples) {
  if (log.num_experts() != num_experts) {
    return absl::FailedPreconditionError(
        absl::StrCat("the log has ", log.num_experts(), " experts, the estimator ",
                     num_experts, "; call SetDivergences after adding experts"));
  }
  if (log.size() < num_samples) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the log has ", log.size(), " samples, fewer than the ", num_samples, " already seen"));
  }
  return absl::OkStatus();
}

int64_t PaperMedianOfMeansGroups(const EstimatorOptions& o, int64_t t) {
  const double log_inv_delta = 2.0 * std::log(static_cast<double>(t));
  const double l = std::floor(o.constants.c2 * log_inv_delta);
  if (!(l >= 1.0)) return 1;
  if (l >= static_cast<double>(t)) return t;
  return static_cast<int64_t>(l);
}

int64_t RoundGroupsToDivisor(int64_t fine, int64_t paper, int64_t t) {
  if (paper >= fine) return fine;  // paper <= t, so fine <= t
  // The divisors of `fine` on either side of paper; the nearer one in ratio (ties: the
  // larger), unless the larger exceeds t.
  int64_t below = 1, above = fine;
  for (int64_t l = 1; l <= fine; ++l) {
    if (fine % l != 0) continue;
    if (l <= paper) below = l;
    if (l >= paper) {
      above = l;
      break;
    }
  }
  if (above > t) return below;
  return static_cast<double>(above) * below <= static_cast<double>(paper) * paper ? above
                                                                                  : below;
}

absl::Status CheckNewDivergences(const SampleLog& log, const DivergenceMatrix& d,
                                 int num_experts, int64_t num_samples) {
  if (absl::Status s = ValidateDivergenceMatrix(d, log.num_experts()); !s.ok()) return s;
  if (d.num_experts < num_experts) {
    return absl::FailedPreconditionError(absl::StrCat(
        "divergences cover ", d.num_experts, " experts, the estimator has ", num_experts));
  }
  if (d.num_experts > num_experts && log.size() < num_samples) {
    return CheckLogMatches(log, log.num_experts(), num_samples);
  }
  return absl::OkStatus();
}

int ArgmaxMeanPlusWidth(const std::vector<double>& mean, const std::vector<double>& scale,
                        double factor, const std::vector<bool>& selectable,
                        absl::BitGenRef gen) {
  int best = -1, ties = 0;
  double best_value = 0.0;
  for (size_t k = 0; k < mean.size(); ++k) {
    if (!selectable[k]) continue;
    OfferCandidate(static_cast<int>(k), mean[k] + factor * scale[k], gen, &best, &best_value,
                   &ties);
  }
  return best;
}

absl::Status CheckRowSample(int chooser, double reward, double chooser_propensity,
                            absl::Span<const double> propensities, int num_experts,
                            int num_new) {
  if (propensities.size() != static_cast<size_t>(num_new)) {
    return absl::InvalidArgumentError(
        absl::StrCat(propensities.size(), " propensities for ", num_new, " new experts"));
  }
  if (chooser < 0 || chooser >= num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("chooser ", chooser, " is not one of the ", num_experts, " experts"));
  }
  if (!(reward >= 0.0 && reward <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("reward ", reward, " is not in [0, 1]"));
  }
  if (!(chooser_propensity > 0.0 && chooser_propensity <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the chooser's propensity is ", chooser_propensity, ", not in (0, 1]"));
  }
  for (size_t e = 0; e < propensities.size(); ++e) {
    if (!(propensities[e] > 0.0 && propensities[e] <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "propensity of new expert ", e, " is ", propensities[e], ", not in (0, 1]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSample(int chooser, double reward, absl::Span<const double> propensities,
                         int num_experts) {
  if (chooser < 0 || chooser >= num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("chooser ", chooser, " is not one of the ", num_experts, " experts"));
  }
  if (!(reward >= 0.0 && reward <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("reward ", reward, " is not in [0, 1]"));
  }
  if (propensities.size() != static_cast<size_t>(num_experts)) {
    return absl::InvalidArgumentError(absl::StrCat(
        propensities.size(), " propensities for ", num_experts, " experts"));
  }
  for (size_t k = 0; k < propensities.size(); ++k) {
    if (!(propensities[k] > 0.0 && propensities[k] <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "propensity of expert ", k, " is ", propensities[k], ", not in (0, 1]"));
    }
  }
  return absl::OkStatus();
}

void OfferCandidate(int k, double value, absl::BitGenRef gen, int* best, double* best_value,
                    int* ties) {
  if (*best < 0 || value > *best_value) {
    *best = k;
    *best_value = value;
    *ties = 1;
  } else if (value == *best_value && absl::Uniform<int>(gen, 0, ++*ties) == 0) {
    *best = k;
  }
}

namespace {

// Buckets of x by the top bits of its double representation: exponent and the first
// kMantissaBits of the mantissa. The bucket index is monotone in x and costs no log.
constexpr int kMantissaBits = 6;
constexpr int kShift = 52 - kMantissaBits;
constexpr double kTableMin = 0x1p-40;
constexpr double kTableMax = 0x1p40;

uint64_t BitsOf(double x) {
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

struct InverseLogRatioTable {
  uint64_t first_bucket;
  std::vector<double> edge_w;  // w at the lower edge of each bucket, plus the last upper edge
  InverseLogRatioTable() {
    first_bucket = BitsOf(kTableMin) >> kShift;
    const uint64_t last_bucket = BitsOf(kTableMax) >> kShift;
    for (uint64_t b = first_bucket; b <= last_bucket + 1; ++b) {
      const uint64_t bits = b << kShift;
      double edge;
      std::memcpy(&edge, &bits, sizeof(edge));
      edge_w.push_back(InverseLogRatio(edge));
    }
  }
};

}  // namespace

bool InverseLogRatioBounds(double x, double* w_low, double* w_high) {
  static const InverseLogRatioTable* const table = new InverseLogRatioTable();
  if (!(x >= kTableMin && x < kTableMax)) return false;
  const size_t i = (BitsOf(x) >> kShift) - table->first_bucket;
  // Widen by a few ulps: the computed w need not be exactly monotone at rounding level.
  *w_low = table->edge_w[i] * (1.0 - 1e-12);
  *w_high = table->edge_w[i + 1] * (1.0 + 1e-12);
  return true;
}

bool SameBlock(const DivergenceMatrix& old_d, const DivergenceMatrix& new_d) {
  const int n = old_d.num_experts;
  if (new_d.num_experts < n) return false;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (old_d.M(i, j) != new_d.M(i, j) || old_d.Sigma(i, j) != new_d.Sigma(i, j)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace decision::internal
