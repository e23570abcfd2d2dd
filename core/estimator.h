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
//   l(t): the paper's floor(c2 log(1/delta(t))), delta(t) = 1/t^2, clamped to [1, t] (the
//   paper's l(t) exceeds t, or is 0, for very small t), then, for round-robin grouping,
//   rounded to the divisor of L = MedianOfMeansFineGroups() nearest in ratio (ties: the
//   larger; the smaller if the larger exceeds t; L if the paper's l(t) > L, which needs
//   t > 10^13);
//   u(t) = max(u(t - 1), l(t) floor(t / l(t))), u(0) = 0: the used prefix, which never
//   shrinks; the at most l(t) - 1 newest samples [u, t) are not used yet;
//   group r (0-based) holds, round-robin, the samples s < u with s mod l = r (sizes
//   floor(u/l) or one more), or, contiguous (the paper's), samples r*m .. r*m + m - 1 with
//   m = floor(t / l) and u = l m;
//   W_k(r) = sum_{s in r} 1/sigma_kj(s);
//   mu_r[k] = 1/W_k(r) * sum_{s in r} (1/sigma_kj) Y_s r_kj(s);  mu_m[k] = median_r mu_r[k]
//   (the mean of the two middle values for an even l);
//   width = 1/W_k * sqrt(c3 log(1/delta(t)) / t),  W_k = min_r W_k(r) / |r|.
//   docs/ENGINE.md shows that the rounded l stays within 1.23x of the paper's (1.42x above
//   120) and the groups within one sample of each other, which the analysis needs.
//
// With no samples (t = 0) every estimate is {mean 0, width +inf}.
//
// Incremental form, with state that does not grow with t (docs/ENGINE.md):
//   - Round-robin median of means keeps, per fine group f = s mod L, per chooser j and
//     expert k, the divergence-free sums S = sum Y r_kj and counts n_j: 8 L N (N + 4) bytes,
//     8 L (A^2 + 4 N) once N - A experts are retired (Retire). Update() is O(N) amortised per
//     sample and reads each sample once; SetDivergences() recomputes from S in O(L N^2),
//     adding each new expert's row from the log in O(t).
//   - Clipped keeps sums per (chooser, expert) of the samples no divergence can clip any
//     more (ratio test <= L(t): M >= 1 and L only grows), and only the other (sample,
//     expert) entries with Y > 0, at most max_kept_clipped of them. Update() is O(N) plus
//     O(log) per kept entry; SetDivergences() is O(N^2 + kept), plus O(t) per new expert.
//   - Contiguous median of means (the paper's grouping) is kept for experiments: it stores
//     prefix sums (2N doubles per 8 samples) and rebuilds from the log, O(N t), when the
//     divergences change.
// Estimate() is O(1) and ArgmaxUcb() O(N). The literal from-scratch forms of both equations
// live in tests/reference_estimators.h and the two agree to 1e-9 relative
// (tests/estimator_test.cc).
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
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
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

// The constants of the analysis. The defaults are the paper's practical set with a
// narrower median-of-means width, c3 = 0.25 instead of 2: with the experts trained on the
// whole log it learned better on five data sets of bench/regret and as well on the sixth
// (bench/results/short_data). Practical() is the set the paper's experiments use for every
// data set; Analysis() is the set the regret proof uses, which depends on problem
// quantities the operator must supply (M, gap gamma, sigma).
struct EstimatorConstants {
  double C = 1.0;
  double c1 = 1.0;
  double c2 = 4.0;
  double c3 = 0.25;
  static EstimatorConstants Practical() { return {1.0, 1.0, 4.0, 2.0}; }
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
  // Clipped estimator: the most (sample, expert) entries kept because some divergence could
  // still clip them (32 bytes each). Beyond it the entries that would be released last
  // (largest test / M) are dropped, i.e. clipped for good, and included ones that wait to
  // be folded are folded (counted for good); EstimatorStats counts both. 0: no limit.
  int64_t max_kept_clipped = int64_t{1} << 18;
};
// c2 sets how many fine groups round-robin median of means keeps; above this it is refused.
inline constexpr double kMaxC2 = 16.0;
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
// The median-of-means group count l(t) (see above). REQUIRES: t >= 1.
int64_t MedianOfMeansGroups(const EstimatorOptions& options, int64_t t);
// L, the number of fine groups of round-robin median of means: the smallest 240 * 2^a that
// is >= the paper's l(10^13) (240 for c2 <= 4). Every l(t) divides it.
int64_t MedianOfMeansFineGroups(const EstimatorOptions& options);

// The most state an estimator of `num_experts` experts holds under `options`, whatever t:
// round-robin median of means 8 L N (N + 4) bytes and its tail, and 8 L (N + 1) per
// window (NewExpertRows with a first sample: at most `num_windows` of them); clipped
// 48 N^2 bytes and 32 per kept entry (max_kept_clipped of them; without that cap the
// N-dependent part only). Contiguous median of means keeps prefix sums that grow with t:
// the N-dependent part only.
// Of the experts, `num_retired` retired (Estimator::Retire): round-robin median of means
// then keeps the fine groups' sums of the others only, 8 L (N - R)^2 bytes and 8 L N for
// the folded columns.
int64_t EstimatorStateBound(const EstimatorOptions& options, int num_experts,
                            int num_windows = 0, int num_retired = 0);

// What an estimator holds, for tests, metrics and capacity planning.
struct EstimatorStats {
  int64_t state_bytes = 0;      // the estimator's own state (not the log's)
  int64_t clipped_kept = 0;     // clipped: (sample, expert) entries kept in memory
  int64_t clipped_dropped = 0;  // clipped: entries given up to max_kept_clipped
  int64_t clipped_folded_early = 0;  // clipped: entries folded early to max_kept_clipped
};

// The rows of experts about to be added to an estimator, built from the samples it has
// seen, in log order, without a log (Estimator::NewExpertRows, then AddExperts). A caller
// that keeps no log streams the past samples from storage into it.
class ExpertRows {
 public:
  virtual ~ExpertRows() = default;
  // The next sample: the expert that chose it, its reward, the chooser's propensity of the
  // arm played and each new expert's. INVALID_ARGUMENT (nothing added) for a chooser that
  // is not one of the estimator's experts, a reward outside [0, 1], or propensities not in
  // (0, 1] or not one per new expert.
  virtual absl::Status Add(int chooser, double reward, double chooser_propensity,
                           absl::Span<const double> propensities) = 0;
  // The next sample, chosen by `chooser`, is left out of the new experts' estimates (its
  // context was deleted: they cannot score it). Round-robin median of means only: its
  // window then excludes the sample (Estimator::NewExpertRows). UNIMPLEMENTED for the
  // clipped estimator; INVALID_ARGUMENT for a chooser that is not one of its experts.
  virtual absl::Status Skip(int chooser) {
    return absl::UnimplementedError("this estimator's new experts cover every sample");
  }
  virtual int64_t num_samples() const = 0;
};

class Estimator {
 public:
  virtual ~Estimator() = default;

  // Learns one sample: the expert that chose, the reward, every expert's propensity of the
  // arm played. The round-robin and clipped estimators need nothing else of the past, so a
  // caller need not keep a log. Returns INVALID_ARGUMENT (state unchanged) for a chooser
  // out of range, a reward outside [0, 1], or propensities not N values in (0, 1];
  // UNIMPLEMENTED for contiguous median of means, which reads the log (use Update).
  virtual absl::Status Add(int chooser, double reward, absl::Span<const double> propensities);

  // Brings the state up to date with samples [num_samples(), log.size()) of `log`, which
  // must extend the log this estimator has seen.
  // Returns FAILED_PRECONDITION (state unchanged) if the log has fewer samples than
  // already seen or a different number of experts.
  virtual absl::Status Update(const SampleLog& log) = 0;

  // Replaces the divergences. `d` may cover more experts than before (experts appended to
  // the log): their rows are computed from the log's new columns (O(t) each). Round-robin
  // and clipped read the log for nothing else (for the same experts any log with their
  // number of experts will do, even an empty one); contiguous rebuilds from it (O(N t)).
  // Returns INVALID_ARGUMENT (state unchanged) if d.num_experts != log.num_experts() or
  // d has entries that are not finite and >= 1, FAILED_PRECONDITION if d covers fewer
  // experts than the estimator.
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

  // Starts the rows of `count` (>= 1) new experts over this estimator's samples. They keep
  // O(L N count) values (round-robin) or the clipped entries they cannot fold yet (at most
  // about max_kept_clipped), whatever t, and read nothing of this estimator afterwards: they
  // may be fed while it keeps learning. UNIMPLEMENTED for contiguous median of means.
  absl::StatusOr<std::unique_ptr<ExpertRows>> NewExpertRows(int count) const {
    return NewExpertRows(count, 0);
  }
  // The same over a window: the rows are fed samples [first_sample, t) only (the samples a
  // store still keeps), and the new experts' estimates count only the samples from
  // first_sample on, less those the rows were told to skip (ExpertRows::Skip). Round-robin
  // median of means only (the definition: docs/ENGINE.md, "Windows"): a windowed expert's
  // group r holds its window's samples s < u with s mod l = r, groups without any are left
  // out of its median, and its width is
  //   1/W_k * sqrt(c3 log(1/delta(t)) / t_k),  t_k = its window's samples,
  // with W_k over its non-empty groups. INVALID_ARGUMENT if first_sample is negative or
  // past the samples already in groups (u(t), at most l(t) - 1 behind t); UNIMPLEMENTED
  // with first_sample > 0 for the clipped estimator. The window costs 8 L N bytes (one per
  // AddExperts, shared by the experts it adds).
  virtual absl::StatusOr<std::unique_ptr<ExpertRows>> NewExpertRows(int count,
                                                                    int64_t first_sample) const;
  // The first sample expert k's estimate counts (0 unless it was added with a window, and
  // 0 again once every expert of that window is retired: Retire frees the window).
  virtual int64_t WindowStart(int k) const { return 0; }

  // Retires expert k for good: it chooses no new decision and nothing needs its live
  // estimate any more. Round-robin median of means then frees its row and folds its
  // column, so that the state grows with the live experts only (docs/ENGINE.md, "Retired
  // experts"):
  //   - Estimate(k) and EffectiveSampleSize(k) return their values at retirement, and
  //     ArgmaxUcb never picks k;
  //   - the divergences of every pair with k among the experts there now are fixed at
  //     their current values: SetDivergences and AddExperts keep them whatever `d` says
  //     there (divergences() shows them). A later expert's pair with k is taken from the
  //     `d` that adds it, then fixed too;
  //   - the samples k chose still weigh in the others' estimates under those fixed sigma,
  //     including samples decided before and learnt after (Add with chooser k stays valid);
  //   - the window k was added with (NewExpertRows with a first sample) is freed once every
  //     expert added with it is retired.
  // The others' estimates are unchanged by the call. OK if k is already retired;
  // INVALID_ARGUMENT if k is out of range; UNIMPLEMENTED for the other estimators.
  virtual absl::Status Retire(int k) {
    return absl::UnimplementedError("this estimator keeps every expert's row");
  }
  virtual bool Retired(int k) const { return false; }
  // Appends the experts of `rows`, which must have been fed exactly the samples this
  // estimator has seen, and replaces the divergences with `d` (old and new experts): the
  // same estimates as SetDivergences(log, d) over the log widened by their columns (to
  // rounding). FAILED_PRECONDITION (nothing changed) if the rows cover another number of
  // samples or were started for another number of experts; INVALID_ARGUMENT for a bad `d`
  // or rows this estimator did not start.
  virtual absl::Status AddExperts(std::unique_ptr<ExpertRows> rows, const DivergenceMatrix& d);

  // The whole state as bytes, from which RestoreEstimator makes an estimator that goes on
  // bit for bit as this one would. Round-robin: 8 L (A^2 + 4 N) bytes (A live experts of
  // N) and the tail; clipped:
  // 16 N^2 bytes and 32 per kept entry. UNIMPLEMENTED for contiguous median of means.
  absl::StatusOr<std::string> Snapshot() const {
    std::string out;
    if (absl::Status s = SnapshotTo(&out); !s.ok()) return s;
    return out;
  }
  // The same into *out, replaced, reusing its capacity: a caller that snapshots often
  // keeps one buffer and spares the page faults of a fresh large allocation each time
  // (48 MB at N = 160: 31 ms against a few, bench/core_bench BM_StateSnapshot).
  virtual absl::Status SnapshotTo(std::string* out) const;

  virtual EstimatorStats Stats() const = 0;
  virtual int64_t num_samples() const = 0;
  virtual int num_experts() const = 0;
  virtual const DivergenceMatrix& divergences() const = 0;
};

// Creates an estimator for `num_experts` experts with identity divergences and no samples.
absl::StatusOr<std::unique_ptr<Estimator>> MakeEstimator(const EstimatorOptions& options,
                                                         int num_experts);

// The estimator a Snapshot() was taken of. DATA_LOSS if `state` is damaged or was taken
// under other options (another kind or number of fine groups).
absl::StatusOr<std::unique_ptr<Estimator>> RestoreEstimator(const EstimatorOptions& options,
                                                            absl::string_view state);

namespace internal {
absl::Status ValidateDivergenceMatrix(const DivergenceMatrix& d, int num_experts);
absl::Status CheckLogMatches(const SampleLog& log, int num_experts, int64_t num_samples);
// The paper's l(t) = floor(c2 log(1/delta(t))), clamped to [1, t].
int64_t PaperMedianOfMeansGroups(const EstimatorOptions& options, int64_t t);
// Round-robin's l(t) from the paper's l(t): the divisor of `fine_groups` nearest to it in
// ratio (see MedianOfMeansGroups).
int64_t RoundGroupsToDivisor(int64_t fine_groups, int64_t paper_groups, int64_t t);
// The argument checks of SetDivergences for the estimators that read the log only for new
// experts' rows: d valid for the log, not fewer experts than `num_experts`, and a log
// covering the `num_samples` seen if d adds experts.
absl::Status CheckNewDivergences(const SampleLog& log, const DivergenceMatrix& d,
                                 int num_experts, int64_t num_samples);
// The expert with the largest mean[k] + factor * scale[k] among the selectable (see
// Estimator::ArgmaxUcb).
int ArgmaxMeanPlusWidth(const std::vector<double>& mean, const std::vector<double>& scale,
                        double factor, const std::vector<bool>& selectable,
                        absl::BitGenRef gen);
// The argument checks of Estimator::Add.
absl::Status CheckSample(int chooser, double reward, absl::Span<const double> propensities,
                         int num_experts);
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
std::unique_ptr<Estimator> MakeRoundRobinMedianOfMeansEstimator(const EstimatorOptions& options,
                                                                int num_experts);
class StateReader;
absl::StatusOr<std::unique_ptr<Estimator>> RestoreClippedEstimator(const EstimatorOptions& options,
                                                                   StateReader& in);
absl::StatusOr<std::unique_ptr<Estimator>> RestoreRoundRobinMedianOfMeans(
    const EstimatorOptions& options, StateReader& in);
// The argument checks of ExpertRows::Add.
absl::Status CheckRowSample(int chooser, double reward, double chooser_propensity,
                            absl::Span<const double> propensities, int num_experts,
                            int num_new);
}  // namespace internal

}  // namespace decision

#endif  // DECISION_CORE_ESTIMATOR_H_
