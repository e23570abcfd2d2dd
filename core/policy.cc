#include "core/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>

#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "core/expert.h"

namespace decision {

// ---------------------------------------------------------------------------- DUcb

absl::StatusOr<DUcb> DUcb::Create(const EstimatorOptions& options, int num_experts,
                                  LogMode mode) {
  if (mode == LogMode::kNone && options.kind == EstimatorKind::kMedianOfMeans &&
      options.grouping == MedianOfMeansGrouping::kContiguous) {
    return absl::InvalidArgumentError(
        "contiguous median of means regroups the whole log when l(t) changes: it needs the "
        "log kept in memory (use round-robin grouping)");
  }
  absl::StatusOr<std::unique_ptr<Estimator>> estimator = MakeEstimator(options, num_experts);
  if (!estimator.ok()) return estimator.status();
  return DUcb(*std::move(estimator), num_experts, mode);
}

absl::StatusOr<DUcb> DUcb::Restore(const EstimatorOptions& options, absl::string_view state,
                                   std::vector<int64_t> counts,
                                   std::vector<OffPolicySums> off_policy) {
  absl::StatusOr<std::unique_ptr<Estimator>> estimator = RestoreEstimator(options, state);
  if (!estimator.ok()) return estimator.status();
  const int n = (*estimator)->num_experts();
  int64_t total = 0;
  for (int64_t c : counts) {
    if (c < 0) return absl::DataLossError("a negative selection count");
    total += c;
  }
  if (static_cast<int>(counts.size()) != n || total != (*estimator)->num_samples()) {
    return absl::DataLossError(absl::StrCat(counts.size(), " selection counts summing to ",
                                            total, " for an estimator of ", n, " experts and ",
                                            (*estimator)->num_samples(), " samples"));
  }
  if (!off_policy.empty() && static_cast<int>(off_policy.size()) != n) {
    return absl::DataLossError(absl::StrCat(off_policy.size(), " experts' off-policy sums for ",
                                            "an estimator of ", n, " experts"));
  }
  DUcb ducb(*std::move(estimator), n, LogMode::kNone);
  for (int k = 0; k < n; ++k) ducb.frozen_[k] = ducb.estimator_->Retired(k);
  ducb.counts_ = std::move(counts);
  if (!off_policy.empty()) ducb.off_policy_ = std::move(off_policy);
  return ducb;
}

absl::StatusOr<DUcb> DUcb::FromLog(const EstimatorOptions& options, SampleLog log,
                                    const DivergenceMatrix& divergences) {
  const int n = log.num_experts();
  absl::StatusOr<std::unique_ptr<Estimator>> estimator = MakeEstimator(options, n);
  if (!estimator.ok()) return estimator.status();
  DUcb ducb(*std::move(estimator), n, LogMode::kKeep);
  ducb.log_ = std::move(log);
  for (int k = 0; k < n; ++k) ducb.counts_[k] = ducb.log_.count(k);
  // Divergences first (on an estimator that has seen nothing: no rebuild), then one pass.
  SampleLog empty(n);
  if (absl::Status s = ducb.estimator_->SetDivergences(empty, divergences); !s.ok()) return s;
  if (absl::Status s = ducb.estimator_->Update(ducb.log_); !s.ok()) return s;
  return ducb;
}

absl::Status DUcb::Retire(int k) {
  if (k < 0 || k >= num_experts()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert ", k, " is not one of the ", num_experts(), " experts"));
  }
  if (absl::Status s = estimator_->Retire(k); !s.ok()) return s;
  selectable_[k] = false;
  frozen_[k] = true;
  return absl::OkStatus();
}

int DUcb::SelectExpert(absl::BitGenRef gen) const {
  if (num_samples() > 0) return estimator_->ArgmaxUcb(selectable_, gen);
  // No samples yet: a uniformly random selectable expert.
  int chosen = -1, ties = 0;
  double value = 0.0;
  for (int k = 0; k < num_experts(); ++k) {
    if (selectable_[k]) internal::OfferCandidate(k, 0.0, gen, &chosen, &value, &ties);
  }
  return chosen;
}

absl::Status DUcb::Learn(int chooser, double reward, absl::Span<const double> propensities) {
  if (mode_ == LogMode::kNone) {
    if (absl::Status s = estimator_->Add(chooser, reward, propensities); !s.ok()) return s;
    // Valid: the estimator checked them. The chooser's propensity is the logged one.
    const double logged = propensities[chooser];
    for (int k = 0; k < num_experts(); ++k) {
      if (!frozen_[k]) off_policy_[k].Add(propensities[k], logged, reward);
    }
  } else {
    if (absl::Status s = log_.Append(chooser, reward, propensities); !s.ok()) return s;
    if (absl::Status s = estimator_->Update(log_); !s.ok()) return s;
  }
  ++counts_[chooser];
  return absl::OkStatus();
}

OffPolicySums DUcb::OffPolicy(int k) const {
  if (mode_ == LogMode::kNone) return off_policy_[k];
  OffPolicySums sums;
  for (int64_t s = 0; s < log_.size(); ++s) {
    sums.Add(log_.propensity(k, s), log_.propensity(log_.chooser(s), s), log_.reward(s));
  }
  return sums;
}

namespace {

// The estimator's rows of new experts, summing their off-policy estimates as they are fed.
class OffPolicyRows final : public ExpertRows {
 public:
  OffPolicyRows(std::unique_ptr<ExpertRows> rows, int count)
      : rows_(std::move(rows)), sums_(count) {}

  absl::Status Add(int chooser, double reward, double chooser_propensity,
                   absl::Span<const double> propensities) override {
    if (absl::Status s = rows_->Add(chooser, reward, chooser_propensity, propensities);
        !s.ok()) {
      return s;
    }
    for (size_t e = 0; e < sums_.size(); ++e) {
      sums_[e].Add(propensities[e], chooser_propensity, reward);
    }
    return absl::OkStatus();
  }
  absl::Status Skip(int chooser) override { return rows_->Skip(chooser); }
  int64_t num_samples() const override { return rows_->num_samples(); }

  std::unique_ptr<ExpertRows> TakeRows() { return std::move(rows_); }
  std::vector<OffPolicySums>& sums() { return sums_; }

 private:
  std::unique_ptr<ExpertRows> rows_;
  std::vector<OffPolicySums> sums_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertRows>> DUcb::NewExpertRows(int count,
                                                                int64_t first_sample) const {
  if (mode_ == LogMode::kKeep) {
    return absl::FailedPreconditionError("this D-UCB keeps a log: use AddExperts(backfill, d)");
  }
  absl::StatusOr<std::unique_ptr<ExpertRows>> rows =
      estimator_->NewExpertRows(count, first_sample);
  if (!rows.ok()) return rows.status();
  return std::make_unique<OffPolicyRows>(*std::move(rows), count);
}

absl::Status DUcb::AddExperts(std::unique_ptr<ExpertRows> rows,
                              const DivergenceMatrix& divergences) {
  if (mode_ == LogMode::kKeep) {
    return absl::FailedPreconditionError("this D-UCB keeps a log: use AddExperts(backfill, d)");
  }
  auto* ours = dynamic_cast<OffPolicyRows*>(rows.get());
  if (ours == nullptr) {
    return absl::InvalidArgumentError("the rows were not started by this D-UCB's NewExpertRows");
  }
  std::vector<OffPolicySums> sums = std::move(ours->sums());
  const int old_n = num_experts();
  if (absl::Status s = estimator_->AddExperts(ours->TakeRows(), divergences); !s.ok()) return s;
  for (int k = old_n; k < num_experts(); ++k) {
    selectable_.push_back(true);
    counts_.push_back(0);
    off_policy_.push_back(sums[k - old_n]);
    frozen_.push_back(false);
  }
  log_ = SampleLog(num_experts());
  return absl::OkStatus();
}

namespace internal {

absl::Status ValidateNewColumns(absl::Span<const std::vector<double>> columns, int64_t samples) {
  for (size_t e = 0; e < columns.size(); ++e) {
    if (static_cast<int64_t>(columns[e].size()) != samples) {
      return absl::InvalidArgumentError(absl::StrCat("new expert ", e, " has ",
                                                     columns[e].size(),
                                                     " backfilled propensities, the log has ",
                                                     samples, " samples"));
    }
    for (double p : columns[e]) {
      if (!(p > 0.0 && p <= 1.0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "new expert ", e, " has backfilled propensity ", p, "; it must be in (0, 1]"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace internal

absl::Status DUcb::AddExperts(absl::Span<const std::vector<double>> backfill,
                              const DivergenceMatrix& divergences) {
  if (mode_ == LogMode::kNone) {
    return absl::FailedPreconditionError("this D-UCB keeps no log: use NewExpertRows");
  }
  const int new_n = num_experts() + static_cast<int>(backfill.size());
  if (absl::Status s = internal::ValidateDivergenceMatrix(divergences, new_n); !s.ok()) {
    return s;
  }
  // Validate every column before changing anything.
  if (absl::Status s = internal::ValidateNewColumns(backfill, log_.size()); !s.ok()) return s;
  for (const std::vector<double>& column : backfill) {
    absl::Status s = log_.AddExpert(column);
    if (!s.ok()) return s;  // unreachable: validated above
    selectable_.push_back(true);
    counts_.push_back(0);
    off_policy_.emplace_back();  // unused with a log (OffPolicy reads it)
    frozen_.push_back(false);
  }
  return estimator_->SetDivergences(log_, divergences);
}

absl::Status DUcb::SetDivergences(const DivergenceMatrix& divergences) {
  // Without a log, log_ is an empty one of num_experts(): new experts are refused.
  return estimator_->SetDivergences(log_, divergences);
}

absl::StatusOr<std::unique_ptr<Estimator>> DUcb::RebuildEstimator(
    const EstimatorOptions& options, const SampleLog& prefix,
    const DivergenceMatrix& divergences) {
  absl::StatusOr<std::unique_ptr<Estimator>> estimator =
      MakeEstimator(options, prefix.num_experts());
  if (!estimator.ok()) return estimator.status();
  // As in FromLog: the divergences on an estimator that has seen nothing, then one pass.
  SampleLog empty(prefix.num_experts());
  if (absl::Status s = (*estimator)->SetDivergences(empty, divergences); !s.ok()) return s;
  if (absl::Status s = (*estimator)->Update(prefix); !s.ok()) return s;
  return estimator;
}

absl::Status DUcb::SwapInEstimator(std::unique_ptr<Estimator> rebuilt) {
  if (mode_ == LogMode::kNone) {
    return absl::FailedPreconditionError("this D-UCB keeps no log to rebuild from");
  }
  if (rebuilt->num_experts() != num_experts()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the rebuilt estimator has ", rebuilt->num_experts(),
                     " experts, the log has ", num_experts(), " (experts were added)"));
  }
  if (rebuilt->num_samples() > log_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the rebuilt estimator has seen ", rebuilt->num_samples(),
                     " samples, the log has ", log_.size()));
  }
  if (absl::Status s = rebuilt->Update(log_); !s.ok()) return s;
  estimator_ = std::move(rebuilt);
  return absl::OkStatus();
}

namespace {

// Appends samples [from, to) of `source` to `wider`, each row followed by columns[e][s -
// offset] for every new expert e.
absl::Status AppendWidened(const SampleLog& source, int64_t from, int64_t to,
                           absl::Span<const std::vector<double>> columns, int64_t offset,
                           SampleLog* wider) {
  const int old_n = source.num_experts();
  std::vector<double> row(old_n + columns.size());
  for (int64_t s = from; s < to; ++s) {
    std::copy_n(source.propensities(s), old_n, row.begin());
    for (size_t e = 0; e < columns.size(); ++e) row[old_n + e] = columns[e][s - offset];
    if (absl::Status st = wider->Append(source.chooser(s), source.reward(s), row); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DUcb::Extension> DUcb::PrepareExtension(
    const EstimatorOptions& options, const SampleLog& prefix,
    absl::Span<const std::vector<double>> columns, const DivergenceMatrix& divergences) {
  if (absl::Status s = internal::ValidateNewColumns(columns, prefix.size()); !s.ok()) return s;
  Extension x;
  x.old_experts = prefix.num_experts();
  x.prefix_size = prefix.size();
  x.log = SampleLog(prefix.num_experts() + static_cast<int>(columns.size()));
  if (absl::Status s = AppendWidened(prefix, 0, prefix.size(), columns, 0, &x.log); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<Estimator>> estimator =
      RebuildEstimator(options, x.log, divergences);
  if (!estimator.ok()) return estimator.status();
  x.estimator = *std::move(estimator);
  return x;
}

absl::Status DUcb::SwapInExtension(Extension x, absl::Span<const std::vector<double>> tails) {
  if (mode_ == LogMode::kNone) {
    return absl::FailedPreconditionError("this D-UCB keeps no log: use NewExpertRows");
  }
  if (x.old_experts != num_experts() || x.prefix_size > log_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the extension was prepared for ", x.old_experts, " experts and ",
                     x.prefix_size, " samples; the log has ", num_experts(), " and ",
                     log_.size(), " (experts were added)"));
  }
  const int added = x.log.num_experts() - x.old_experts;
  if (static_cast<int>(tails.size()) != added) {
    return absl::InvalidArgumentError(
        absl::StrCat(tails.size(), " tails for ", added, " new experts"));
  }
  for (const std::vector<double>& tail : tails) {
    if (static_cast<int64_t>(tail.size()) != log_.size() - x.prefix_size) {
      return absl::InvalidArgumentError(absl::StrCat("a new expert's tail has ", tail.size(),
                                                     " propensities, expected ",
                                                     log_.size() - x.prefix_size));
    }
  }
  if (absl::Status s = AppendWidened(log_, x.prefix_size, log_.size(), tails, x.prefix_size,
                                     &x.log);
      !s.ok()) {
    return s;  // this DUcb is unchanged: only the extension was appended to
  }
  if (absl::Status s = x.estimator->Update(x.log); !s.ok()) return s;
  log_ = std::move(x.log);
  estimator_ = std::move(x.estimator);
  for (int e = 0; e < added; ++e) {
    selectable_.push_back(true);
    counts_.push_back(0);
    off_policy_.emplace_back();
    frozen_.push_back(false);
  }
  return absl::OkStatus();
}

// -------------------------------------------------------------------- BatchSchedule

absl::Status ValidateBatchOptions(const BatchOptions& options) {
  if (options.warmup_rounds_per_arm < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "warm-up rounds per arm must be >= 0, got ", options.warmup_rounds_per_arm));
  }
  if (!(std::isfinite(options.batch_multiplier) && options.batch_multiplier > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch multiplier must be finite and > 0, got ", options.batch_multiplier));
  }
  return absl::OkStatus();
}

BatchSchedule::BatchSchedule(int num_arms, const BatchOptions& options)
    : options_(options),
      warmup_rounds_(static_cast<int64_t>(options.warmup_rounds_per_arm) * num_arms),
      next_batch_start_(warmup_rounds_ + 1) {}

BatchSchedule::Round BatchSchedule::Next() {
  ++round_;
  if (round_ <= warmup_rounds_) return Round::kWarmup;
  if (round_ < next_batch_start_) return Round::kInBatch;
  const double length =
      std::floor(options_.batch_multiplier * std::sqrt(static_cast<double>(round_)));
  next_batch_start_ = round_ + std::max<int64_t>(1, static_cast<int64_t>(length));
  return Round::kBatchStart;
}

// ----------------------------------------------------------------------- DUcbPolicy

absl::StatusOr<Decision> DUcbPolicy::Decide(int num_experts, int num_arms,
                                            DistributionFn distribution,
                                            absl::BitGenRef gen) {
  const int k = ducb_.SelectExpert(gen);
  if (k < 0) return absl::FailedPreconditionError("no expert is selectable");
  scratch_.resize(num_arms);
  if (absl::Status s = distribution(k, absl::MakeSpan(scratch_)); !s.ok()) return s;
  Decision d;
  d.expert = k;
  d.arm = SampleArm(scratch_, absl::Uniform<double>(gen, 0.0, 1.0));
  d.propensity = scratch_[d.arm];
  return d;
}

absl::Status DUcbPolicy::Learn(const Decision& decision, double reward,
                               absl::Span<const double> propensities) {
  return ducb_.Learn(decision.expert, reward, propensities);
}

absl::Status DUcbPolicy::AddExperts(absl::Span<const std::vector<double>> backfill) {
  const int old_n = ducb_.num_experts();
  const int new_n = old_n + static_cast<int>(backfill.size());
  const DivergenceMatrix& old_d = ducb_.estimator().divergences();
  DivergenceMatrix d = DivergenceMatrix::Identity(new_n);
  for (int i = 0; i < old_n; ++i) {
    for (int j = 0; j < old_n; ++j) {
      d.m[static_cast<size_t>(i) * new_n + j] = old_d.M(i, j);
      d.sigma[static_cast<size_t>(i) * new_n + j] = old_d.Sigma(i, j);
    }
  }
  return ducb_.AddExperts(backfill, d);
}

// ---------------------------------------------------------------------- baselines
namespace {

absl::Status CheckReward(double reward) {
  if (!(reward >= 0.0 && reward <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("reward ", reward, " is outside [0, 1]"));
  }
  return absl::OkStatus();
}

// Follows one expert per decision and keeps per-expert on-policy reward means.
class PerExpertMeans {
 public:
  explicit PerExpertMeans(int n) : pulls_(n, 0), sums_(n, 0.0) {}
  absl::Status Learn(const Decision& d, double reward) {
    if (d.expert < 0 || d.expert >= static_cast<int>(pulls_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("decision names expert ", d.expert,
                                                     ", not one of ", pulls_.size()));
    }
    if (absl::Status s = CheckReward(reward); !s.ok()) return s;
    ++pulls_[d.expert];
    sums_[d.expert] += reward;
    ++total_;
    return absl::OkStatus();
  }
  void Grow(size_t count) {
    pulls_.resize(pulls_.size() + count, 0);
    sums_.resize(sums_.size() + count, 0.0);
  }
  // Random untried expert, or -1 if all were tried.
  int Untried(absl::BitGenRef gen) const {
    int chosen = -1, seen = 0;
    for (size_t k = 0; k < pulls_.size(); ++k) {
      if (pulls_[k] == 0 && absl::Uniform<int>(gen, 0, ++seen) == 0) chosen = static_cast<int>(k);
    }
    return chosen;
  }
  template <typename Score>
  int Argmax(Score score, absl::BitGenRef gen) const {
    double best = -std::numeric_limits<double>::infinity();
    int chosen = -1, ties = 0;
    for (size_t k = 0; k < pulls_.size(); ++k) {
      const double v = score(k);
      if (v > best) {
        best = v;
        chosen = static_cast<int>(k);
        ties = 1;
      } else if (v == best && absl::Uniform<int>(gen, 0, ++ties) == 0) {
        chosen = static_cast<int>(k);
      }
    }
    return chosen;
  }
  double mean(size_t k) const { return sums_[k] / pulls_[k]; }
  int64_t pulls(size_t k) const { return pulls_[k]; }
  int64_t total() const { return total_; }
  size_t size() const { return pulls_.size(); }

 private:
  std::vector<int64_t> pulls_;
  std::vector<double> sums_;
  int64_t total_ = 0;
};

absl::StatusOr<Decision> FollowExpert(int k, int num_arms, DistributionFn distribution,
                                      absl::BitGenRef gen, std::vector<double>& scratch) {
  scratch.resize(num_arms);
  if (absl::Status s = distribution(k, absl::MakeSpan(scratch)); !s.ok()) return s;
  Decision d;
  d.expert = k;
  d.arm = SampleArm(scratch, absl::Uniform<double>(gen, 0.0, 1.0));
  d.propensity = scratch[d.arm];
  return d;
}

// Baselines that follow one expert per decision and learn only from their own samples.
class OneExpertPolicy : public Policy {
 public:
  explicit OneExpertPolicy(int n) : stats_(n) {}
  absl::Status Learn(const Decision& d, double reward, absl::Span<const double>) override {
    return stats_.Learn(d, reward);
  }
  absl::Status AddExperts(absl::Span<const std::vector<double>> backfill) override {
    stats_.Grow(backfill.size());
    return absl::OkStatus();
  }

 protected:
  absl::StatusOr<Decision> Follow(int k, int num_arms, DistributionFn distribution,
                                  absl::BitGenRef gen) {
    if (k < 0) return absl::FailedPreconditionError("no experts");
    return FollowExpert(k, num_arms, distribution, gen, scratch_);
  }
  PerExpertMeans stats_;

 private:
  std::vector<double> scratch_;
};

class Ucb1Policy final : public OneExpertPolicy {
 public:
  explicit Ucb1Policy(int n) : OneExpertPolicy(n) {}
  std::string name() const override { return "ucb1-over-experts"; }
  absl::StatusOr<Decision> Decide(int, int num_arms, DistributionFn distribution,
                                  absl::BitGenRef gen) override {
    int k = stats_.Untried(gen);
    if (k < 0) {
      const double log_t = std::log(static_cast<double>(stats_.total()));
      k = stats_.Argmax(
          [&](size_t e) { return stats_.mean(e) + std::sqrt(2.0 * log_t / stats_.pulls(e)); },
          gen);
    }
    return Follow(k, num_arms, distribution, gen);
  }
};

class EpsilonGreedyPolicy final : public OneExpertPolicy {
 public:
  EpsilonGreedyPolicy(int n, double epsilon) : OneExpertPolicy(n), epsilon_(epsilon) {}
  std::string name() const override { return absl::StrCat("epsilon-greedy(", epsilon_, ")"); }
  absl::StatusOr<Decision> Decide(int num_experts, int num_arms, DistributionFn distribution,
                                  absl::BitGenRef gen) override {
    if (num_experts < 1) return absl::FailedPreconditionError("no experts");
    int k;
    if (absl::Bernoulli(gen, epsilon_)) {
      k = absl::Uniform<int>(gen, 0, num_experts);
    } else {
      k = stats_.Untried(gen);
      if (k < 0) k = stats_.Argmax([&](size_t e) { return stats_.mean(e); }, gen);
    }
    return Follow(k, num_arms, distribution, gen);
  }

 private:
  double epsilon_;
};

class Exp4Policy final : public Policy {
 public:
  Exp4Policy(int n, const Exp4Options& options) : options_(options), log_weights_(n, 0.0) {}
  std::string name() const override { return absl::StrCat("exp4(gamma=", options_.gamma, ")"); }
  absl::StatusOr<Decision> Decide(int num_experts, int num_arms, DistributionFn distribution,
                                  absl::BitGenRef gen) override {
    if (num_experts != static_cast<int>(log_weights_.size()) || num_experts < 1) {
      return absl::FailedPreconditionError("exp4: expert count does not match the pool");
    }
    const double max_log = *std::max_element(log_weights_.begin(), log_weights_.end());
    mixture_.assign(num_arms, 0.0);
    scratch_.resize(num_arms);
    double total = 0.0;
    for (int k = 0; k < num_experts; ++k) {
      const double w = std::exp(log_weights_[k] - max_log);
      total += w;
      if (absl::Status s = distribution(k, absl::MakeSpan(scratch_)); !s.ok()) return s;
      for (int v = 0; v < num_arms; ++v) mixture_[v] += w * scratch_[v];
    }
    // Exploration is uniform over the arms the experts can play: every arm, unless the
    // distributions are restricted to the eligible arms (RestrictToEligible), which are then
    // exactly the arms with a positive mixture.
    int playable = 0;
    for (int v = 0; v < num_arms; ++v) playable += mixture_[v] > 0.0 ? 1 : 0;
    for (int v = 0; v < num_arms; ++v) {
      mixture_[v] = mixture_[v] > 0.0 || playable == 0
                        ? (1.0 - options_.gamma) * mixture_[v] / total +
                              options_.gamma / (playable == 0 ? num_arms : playable)
                        : 0.0;
    }
    Decision d;
    d.arm = SampleArm(mixture_, absl::Uniform<double>(gen, 0.0, 1.0));
    d.propensity = mixture_[d.arm];
    return d;
  }
  absl::Status Learn(const Decision& d, double reward,
                     absl::Span<const double> propensities) override {
    if (absl::Status s = CheckReward(reward); !s.ok()) return s;
    if (propensities.size() != log_weights_.size() || !(d.propensity > 0.0)) {
      return absl::InvalidArgumentError("exp4: needs every expert's propensity and p(a) > 0");
    }
    ++t_;
    const double eta = EffectiveEta();
    for (size_t k = 0; k < log_weights_.size(); ++k) {
      log_weights_[k] += eta * propensities[k] * reward / d.propensity;
    }
    return absl::OkStatus();
  }
  absl::Status AddExperts(absl::Span<const std::vector<double>> backfill) override {
    // New experts start at the current mean log-weight: neither favoured nor ignored.
    double mean = 0.0;
    for (double w : log_weights_) mean += w;
    if (!log_weights_.empty()) mean /= log_weights_.size();
    log_weights_.resize(log_weights_.size() + backfill.size(), mean);
    return absl::OkStatus();
  }

 private:
  double EffectiveEta() const {
    if (options_.eta > 0.0) return options_.eta;
    const double n = std::max<double>(2.0, log_weights_.size());
    const double k = std::max<double>(1.0, mixture_.size());
    return std::sqrt(2.0 * std::log(n) / (k * std::max<int64_t>(1, options_.horizon)));
  }

  Exp4Options options_;
  std::vector<double> log_weights_;
  std::vector<double> mixture_;
  std::vector<double> scratch_;
  int64_t t_ = 0;
};

class UniformPolicy final : public Policy {
 public:
  std::string name() const override { return "uniform"; }
  absl::StatusOr<Decision> Decide(int, int num_arms, DistributionFn,
                                  absl::BitGenRef gen) override {
    Decision d;
    d.arm = absl::Uniform<int>(gen, 0, num_arms);
    d.propensity = 1.0 / num_arms;
    return d;
  }
  absl::Status Learn(const Decision&, double reward, absl::Span<const double>) override {
    return CheckReward(reward);
  }
  absl::Status AddExperts(absl::Span<const std::vector<double>>) override {
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Policy> MakeUcb1Policy(int num_experts) {
  return std::make_unique<Ucb1Policy>(num_experts);
}

absl::StatusOr<std::unique_ptr<Policy>> MakeEpsilonGreedyPolicy(int num_experts,
                                                                double epsilon) {
  if (!(epsilon >= 0.0 && epsilon <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("epsilon must be in [0, 1], got ", epsilon));
  }
  return std::unique_ptr<Policy>(new EpsilonGreedyPolicy(num_experts, epsilon));
}

absl::StatusOr<std::unique_ptr<Policy>> MakeExp4Policy(int num_experts,
                                                       const Exp4Options& options) {
  if (!(options.gamma > 0.0 && options.gamma <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("exp4 gamma must be in (0, 1], got ", options.gamma));
  }
  if (!std::isfinite(options.eta) || options.horizon < 1) {
    return absl::InvalidArgumentError("exp4 eta must be finite and horizon >= 1");
  }
  return std::unique_ptr<Policy>(new Exp4Policy(num_experts, options));
}

std::unique_ptr<Policy> MakeUniformPolicy() { return std::make_unique<UniformPolicy>(); }

}  // namespace decision
