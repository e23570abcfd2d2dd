// Decision policies over a pool of stochastic experts: D-UCB (Algorithm 1 of the paper),
// the batch schedule of batched D-UCB (Algorithm 2), and the baselines the benchmarks
// compare against (UCB1 over experts, epsilon-greedy over experts, EXP4, uniform).
//
// Every policy is deterministic given the random generator passed to Decide, so a run is
// reproducible from a seed. Thread safety: none of these classes is thread-safe.
#ifndef DECISION_CORE_POLICY_H_
#define DECISION_CORE_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/random/bit_gen_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/estimator.h"
#include "core/off_policy.h"
#include "core/sample_log.h"

namespace decision {

// One decision: the expert followed (-1 for policies that mix experts, such as EXP4 and
// uniform), the arm drawn, and the probability with which that arm was drawn.
struct Decision {
  int expert = -1;
  int arm = 0;
  double propensity = 0.0;
};

// D-UCB: an incremental estimator, and (LogMode::kKeep) the sample log, and selects
// k(t) = argmax_k mu[k](t-1) + s[k](t-1) among the selectable experts.
//
// Without a log (LogMode::kNone, what the service uses) its memory does not grow with t.
// New experts then come through NewExpertRows and AddExperts(rows, d), fed the past
// samples by the caller (from storage), and the state is saved and restored as bytes
// (Snapshot, Restore). The estimators that read the log (contiguous median of means) need
// kKeep.
class DUcb {
 public:
  enum class LogMode { kKeep, kNone };
  // Returns INVALID_ARGUMENT for invalid options or num_experts < 0, and for kNone with an
  // estimator that reads the log.
  static absl::StatusOr<DUcb> Create(const EstimatorOptions& options, int num_experts,
                                     LogMode mode = LogMode::kKeep);
  // A DUcb without a log from an Estimator::Snapshot and the experts' selection counts.
  // Every expert is selectable. DATA_LOSS if the state is damaged or the counts do not
  // match it.
  // `off_policy`: the experts' off-policy sums (off_policy_sums()); empty for a state saved
  // without them, which then count the samples learnt from here on.
  static absl::StatusOr<DUcb> Restore(const EstimatorOptions& options, absl::string_view state,
                                      std::vector<int64_t> counts,
                                      std::vector<OffPolicySums> off_policy = {});
  // D-UCB over an existing log with the given divergences: the estimator is built in one
  // pass (O(N t)), cheaper than learning the samples one by one. INVALID_ARGUMENT if the
  // divergences do not match the log's experts.
  static absl::StatusOr<DUcb> FromLog(const EstimatorOptions& options, SampleLog log,
                                      const DivergenceMatrix& divergences);

  // The expert to follow next: argmax of mean + width over selectable experts, ties broken
  // uniformly at random; with no samples yet, a uniformly random selectable expert.
  // Returns -1 if no expert is selectable. O(N).
  int SelectExpert(absl::BitGenRef gen) const;

  // Learns one joined sample: chooser, reward in [0, 1], and pi_k(arm|x) for every expert.
  // Returns INVALID_ARGUMENT (nothing learnt) for out-of-range input. O(N) amortised.
  absl::Status Learn(int chooser, double reward, absl::Span<const double> propensities);

  // Appends experts. backfill[e][s] is new expert e's propensity of sample s's arm, for every
  // sample learnt so far. `divergences` must cover old and new experts; if it keeps the old
  // block unchanged only the new rows are computed. Returns INVALID_ARGUMENT (nothing
  // changed) on size mismatches or invalid values.
  absl::Status AddExperts(absl::Span<const std::vector<double>> backfill,
                          const DivergenceMatrix& divergences);

  // Replaces the divergence estimates (same expert count), in place: O(L N^2) for
  // round-robin median of means, O(N^2 + kept) for clipped, an O(N t) rebuild from the log
  // for contiguous median of means (core/estimator.h).
  absl::Status SetDivergences(const DivergenceMatrix& divergences);

  // SetDivergences in two steps, for a caller that must not hold its lock through the
  // work and wants a restart's result bit for bit. RebuildEstimator builds an estimator with the new divergences over
  // `prefix`, a log().SharedPrefix(); it reads nothing else of this DUcb, so it can run
  // while samples keep being learnt. SwapInEstimator then teaches it the samples learnt
  // since (O(N) amortised each) and makes it this DUcb's estimator. The estimates are the
  // same, bit for bit, as those of FromLog over the whole log (what a restart computes).
  static absl::StatusOr<std::unique_ptr<Estimator>> RebuildEstimator(
      const EstimatorOptions& options, const SampleLog& prefix,
      const DivergenceMatrix& divergences);
  // FAILED_PRECONDITION (nothing changed) if experts were added since the prefix was taken,
  // or if `rebuilt` has seen samples this log does not have.
  absl::Status SwapInEstimator(std::unique_ptr<Estimator> rebuilt);

  // AddExperts in two steps, for a caller that must not hold its lock through the O(N t)
  // copy of the log. PrepareExtension builds, from `prefix` (a log().SharedPrefix()) and a
  // column per new expert covering the prefix's samples, a wider log and its estimator with
  // `divergences` (old and new experts); it reads nothing else of this DUcb, so it can run
  // while samples keep being learnt. SwapInExtension appends the samples learnt since, with
  // tails[e] = new expert e's propensities of samples [prefix size, log().size()), and
  // makes the result this DUcb's log and estimator. The estimates equal those of FromLog
  // over the whole wider log, bit for bit (what a restart computes).
  struct Extension {
    SampleLog log;
    std::unique_ptr<Estimator> estimator;
    int old_experts = 0;
    int64_t prefix_size = 0;
  };
  // INVALID_ARGUMENT on a size mismatch or a propensity outside (0, 1].
  static absl::StatusOr<Extension> PrepareExtension(
      const EstimatorOptions& options, const SampleLog& prefix,
      absl::Span<const std::vector<double>> columns, const DivergenceMatrix& divergences);
  // FAILED_PRECONDITION (nothing changed) if experts were added since the prefix was taken;
  // INVALID_ARGUMENT (nothing changed) if a tail has the wrong size or a bad value.
  absl::Status SwapInExtension(Extension extension,
                               absl::Span<const std::vector<double>> tails);

  // Without a log (LogMode::kNone): the rows of `count` new experts over the samples
  // learnt so far, to be fed by the caller (Estimator::NewExpertRows; they also sum the
  // new experts' off-policy estimates), then appended with divergences covering old and
  // new experts (Estimator::AddExperts; INVALID_ARGUMENT for rows this D-UCB did not
  // start); the new experts are selectable. FAILED_PRECONDITION with a log (use
  // AddExperts(backfill, d)). With first_sample > 0 the rows cover samples
  // [first_sample, t) only (a window: Estimator::NewExpertRows).
  absl::StatusOr<std::unique_ptr<ExpertRows>> NewExpertRows(int count,
                                                            int64_t first_sample = 0) const;
  absl::Status AddExperts(std::unique_ptr<ExpertRows> rows, const DivergenceMatrix& divergences);
  // The estimator's state (Estimator::Snapshot); with counts(), what Restore needs.
  absl::StatusOr<std::string> Snapshot() const { return estimator_->Snapshot(); }
  absl::Status SnapshotTo(std::string* out) const { return estimator_->SnapshotTo(out); }

  // Retired or not-yet-backfilled experts keep being estimated but are never selected.
  // REQUIRES: 0 <= k < num_experts().
  void SetSelectable(int k, bool selectable) { selectable_[k] = selectable; }
  bool selectable(int k) const { return selectable_[k]; }
  // Retires expert k for good (Estimator::Retire: its row is freed, its column folded
  // under fixed divergences) and makes it unselectable. UNIMPLEMENTED (nothing changed)
  // for the estimators that keep every row; INVALID_ARGUMENT for k out of range.
  absl::Status Retire(int k);

  ExpertEstimate Estimate(int k) const { return estimator_->Estimate(k); }
  // Expert k's value estimated off-policy (core/off_policy.h, clip kDefaultOffPolicyClip)
  // from the samples its estimate counts: every sample learnt since it was added, with
  // those it was backfilled over (NewExpertRows' window), up to its retirement. Without a
  // log the sums are kept as samples are learnt (O(N) per sample, 72 bytes per expert);
  // with one they are computed from it (O(t)). REQUIRES: 0 <= k < num_experts().
  OffPolicySums OffPolicy(int k) const;
  // Without a log: every expert's sums, for Restore.
  const std::vector<OffPolicySums>& off_policy_sums() const { return off_policy_; }
  int num_experts() const { return estimator_->num_experts(); }
  int64_t num_samples() const { return estimator_->num_samples(); }
  // n_k: the samples expert k chose. REQUIRES: 0 <= k < num_experts().
  int64_t count(int k) const { return counts_[k]; }
  const std::vector<int64_t>& counts() const { return counts_; }
  // The log: empty (of num_experts() experts) without one.
  const SampleLog& log() const { return log_; }
  bool keeps_log() const { return mode_ == LogMode::kKeep; }
  const Estimator& estimator() const { return *estimator_; }

 private:
  DUcb(std::unique_ptr<Estimator> estimator, int num_experts, LogMode mode)
      : mode_(mode),
        log_(num_experts),
        estimator_(std::move(estimator)),
        selectable_(num_experts, true),
        counts_(num_experts, 0),
        off_policy_(num_experts),
        frozen_(num_experts, false) {}

  LogMode mode_;
  SampleLog log_;
  std::unique_ptr<Estimator> estimator_;
  std::vector<bool> selectable_;
  std::vector<int64_t> counts_;
  std::vector<OffPolicySums> off_policy_;  // without a log; frozen at Retire
  std::vector<bool> frozen_;
};

namespace internal {
// INVALID_ARGUMENT unless every column has `samples` propensities, each in (0, 1].
absl::Status ValidateNewColumns(absl::Span<const std::vector<double>> columns, int64_t samples);
}  // namespace internal

// The schedule of batched D-UCB: a uniform warm-up of warmup_rounds_per_arm * K rounds,
// then batches; a batch that starts at round t lasts max(1, floor(batch_multiplier *
// sqrt(t))) rounds. At every batch start the caller adds experts and refreshes divergences.
struct BatchOptions {
  int warmup_rounds_per_arm = 3;
  double batch_multiplier = 7.0;  // the authors' code: 7 * floor(sqrt(t))
};
absl::Status ValidateBatchOptions(const BatchOptions& options);

class BatchSchedule {
 public:
  enum class Round { kWarmup, kBatchStart, kInBatch };
  BatchSchedule(int num_arms, const BatchOptions& options);
  // Advances to the next round (rounds are numbered from 1) and says what it is.
  Round Next();
  int64_t round() const { return round_; }
  int64_t next_batch_start() const { return next_batch_start_; }

 private:
  BatchOptions options_;
  int64_t warmup_rounds_;
  int64_t round_ = 0;
  int64_t next_batch_start_;
};

// Expert k's distribution over arms for the current context: writes pi_k(.|x) to probs.
using DistributionFn = absl::FunctionRef<absl::Status(int k, absl::Span<double> probs)>;

// A policy that decides with a pool of experts, as the simulations and benchmarks drive it.
class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  // Chooses an arm for the current context. `distribution` evaluates experts on it.
  virtual absl::StatusOr<Decision> Decide(int num_experts, int num_arms,
                                          DistributionFn distribution,
                                          absl::BitGenRef gen) = 0;
  // Learns the reward of `decision`. propensities[k] = pi_k(arm|x) for every expert k.
  virtual absl::Status Learn(const Decision& decision, double reward,
                             absl::Span<const double> propensities) = 0;
  // Experts were appended to the pool; backfill as in DUcb::AddExperts (policies that do
  // not learn from the log ignore it).
  virtual absl::Status AddExperts(absl::Span<const std::vector<double>> backfill) = 0;
};

// D-UCB as a Policy. New experts get identity divergences until SetDivergences.
class DUcbPolicy final : public Policy {
 public:
  explicit DUcbPolicy(DUcb ducb, std::string name = "d-ucb")
      : ducb_(std::move(ducb)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  absl::StatusOr<Decision> Decide(int num_experts, int num_arms, DistributionFn distribution,
                                  absl::BitGenRef gen) override;
  absl::Status Learn(const Decision& decision, double reward,
                     absl::Span<const double> propensities) override;
  absl::Status AddExperts(absl::Span<const std::vector<double>> backfill) override;
  absl::Status SetDivergences(const DivergenceMatrix& d) { return ducb_.SetDivergences(d); }
  DUcb& ducb() { return ducb_; }

 private:
  DUcb ducb_;
  std::string name_;
  std::vector<double> scratch_;
};

// UCB1 treating each expert as an arm: every expert once, then
// argmax mean_k + sqrt(2 ln t / n_k), using only the samples each expert chose.
std::unique_ptr<Policy> MakeUcb1Policy(int num_experts);

// With probability epsilon a uniformly random expert, otherwise the expert with the best
// mean of its own samples (untried experts first).
absl::StatusOr<std::unique_ptr<Policy>> MakeEpsilonGreedyPolicy(int num_experts,
                                                                double epsilon);

// EXP4 (Auer et al. 2002) with exploration gamma: plays the mixture
// p(a) = (1 - gamma) sum_k w_k pi_k(a|x) / sum_k w_k + gamma / K and updates
// log w_k += eta * pi_k(a|x) * y / p(a). eta = sqrt(2 ln N / (K horizon)) when eta <= 0.
struct Exp4Options {
  double gamma = 0.05;
  double eta = 0.0;
  int64_t horizon = 10000;
};
absl::StatusOr<std::unique_ptr<Policy>> MakeExp4Policy(int num_experts,
                                                       const Exp4Options& options);

// Draws every arm with probability 1/K (ignores the experts).
std::unique_ptr<Policy> MakeUniformPolicy();

}  // namespace decision

#endif  // DECISION_CORE_POLICY_H_
