#include "core/divergence.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "core/kernels.h"
#include "core/numeric.h"
#include "core/status_macros.h"

namespace decision {

DivergenceMatrix DivergenceMatrix::Identity(int num_experts) {
  DivergenceMatrix d;
  d.num_experts = num_experts;
  d.m.assign(static_cast<size_t>(num_experts) * num_experts, 1.0);
  d.sigma.assign(static_cast<size_t>(num_experts) * num_experts, 1.0);
  return d;
}

absl::Status ValidateDivergenceOptions(const DivergenceOptions& options) {
  if (options.reservoir_capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "divergence reservoir capacity must be >= 1, got ", options.reservoir_capacity));
  }
  if (options.num_groups < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("divergence median-of-means groups must be >= 1, got ",
                     options.num_groups));
  }
  return absl::OkStatus();
}

ContextReservoir::ContextReservoir(int num_features, int capacity)
    : num_features_(num_features), capacity_(capacity) {
  rows_.reserve(static_cast<size_t>(std::min(capacity, 4096)) * num_features);
}

void ContextReservoir::Offer(absl::Span<const double> x, absl::Span<const int32_t> eligible,
                             absl::BitGenRef gen) {
  ++seen_;
  if (size_ < static_cast<size_t>(capacity_)) {
    rows_.insert(rows_.end(), x.begin(), x.end());
    stamps_.push_back(next_stamp_++);
    eligible_.emplace_back(eligible.begin(), eligible.end());
    if (!eligible.empty()) ++restricted_rows_;
    ++size_;
    return;
  }
  const int64_t slot = absl::Uniform<int64_t>(gen, 0, seen_);
  if (slot < capacity_) {
    std::copy(x.begin(), x.end(), rows_.begin() + slot * num_features_);
    stamps_[slot] = next_stamp_++;
    restricted_rows_ -= eligible_[slot].empty() ? 0 : 1;
    eligible_[slot].assign(eligible.begin(), eligible.end());
    restricted_rows_ += eligible.empty() ? 0 : 1;
  }
}

void ContextReservoir::Reset(std::vector<double> rows, int64_t seen,
                             std::vector<std::vector<int32_t>> eligible) {
  rows_ = std::move(rows);
  size_ = num_features_ == 0 ? 0 : rows_.size() / num_features_;
  seen_ = seen;
  stamps_.resize(size_);
  for (uint64_t& stamp : stamps_) stamp = next_stamp_++;
  eligible_ = std::move(eligible);
  eligible_.resize(size_);
  restricted_rows_ = 0;
  for (const std::vector<int32_t>& e : eligible_) restricted_rows_ += e.empty() ? 0 : 1;
}

namespace {

// log sum_v exp(log pi_i(v) + pi_i(v)/pi_j(v) - 1), with log pi_i given.
double LogF1TermWithLog(const double* pi_i, const double* log_pi_i, const double* pi_j,
                        size_t k) {
  double terms[64];
  std::vector<double> heap_terms;
  double* t = terms;
  if (k > 64) {
    heap_terms.resize(k);
    t = heap_terms.data();
  }
  double max_term = -HUGE_VAL;
  for (size_t v = 0; v < k; ++v) {
    t[v] = pi_i[v] > 0.0 ? log_pi_i[v] + pi_i[v] / pi_j[v] - 1.0 : -HUGE_VAL;
    max_term = std::max(max_term, t[v]);
  }
  double s = 0.0;
  for (size_t v = 0; v < k; ++v) s += std::exp(t[v] - max_term);
  return max_term + std::log(s);
}

}  // namespace

double LogF1Term(absl::Span<const double> pi_i, absl::Span<const double> pi_j) {
  std::vector<double> log_pi_i(pi_i.size());
  for (size_t v = 0; v < pi_i.size(); ++v) log_pi_i[v] = std::log(pi_i[v]);
  return LogF1TermWithLog(pi_i.data(), log_pi_i.data(), pi_j.data(), pi_i.size());
}

double F2Term(absl::Span<const double> pi_i, absl::Span<const double> pi_j) {
  double s = 0.0;
  for (size_t v = 0; v < pi_i.size(); ++v) {
    if (pi_i[v] > 0.0) s += pi_i[v] * pi_i[v] / pi_j[v];
  }
  return s;
}

absl::Status ComputeDivergences(absl::Span<const std::vector<double>> predictions,
                                int num_arms, int num_groups, const DivergenceMatrix* previous,
                                int keep, DivergenceMatrix* out,
                                absl::Span<const bool> fixed, absl::Span<const bool> absent) {
  const std::vector<absl::Span<const double>> spans(predictions.begin(), predictions.end());
  return ComputeDivergences(spans, num_arms, num_groups, previous, keep, out, fixed, absent);
}

absl::Status ComputeDivergences(absl::Span<const absl::Span<const double>> predictions,
                                int num_arms, int num_groups, const DivergenceMatrix* previous,
                                int keep, DivergenceMatrix* out,
                                absl::Span<const bool> fixed, absl::Span<const bool> absent) {
  const int n = static_cast<int>(predictions.size());
  if (num_arms < 1 || num_groups < 1) {
    return absl::InvalidArgumentError("divergences need >= 1 arm and >= 1 group");
  }
  if (!absent.empty() && absent.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(absent.size(), " absent-expert flags for ", n, " experts"));
  }
  const auto is_absent = [&](int e) { return !absent.empty() && absent[e]; };
  int first_present = 0;
  while (first_present < n && is_absent(first_present)) ++first_present;
  // Every expert absent: nothing is computed (their predictions give no row count).
  const size_t rows = first_present == n ? 1 : predictions[first_present].size() / num_arms;
  if (rows == 0) {
    return absl::InvalidArgumentError("divergences need at least one context");
  }
  for (int e = 0; e < n; ++e) {
    if (!is_absent(e) && predictions[e].size() != rows * num_arms) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert ", e, " has ", predictions[e].size(),
                       " predicted probabilities, expected ", rows, " x ", num_arms));
    }
  }
  const size_t k = static_cast<size_t>(num_arms);
  return ComputeDivergences(
      n, rows,
      [&](int e, size_t begin, size_t end, absl::Span<double> block) {
        std::copy(predictions[e].begin() + begin * k, predictions[e].begin() + end * k,
                  block.begin());
        return absl::OkStatus();
      },
      num_arms, num_groups, previous, keep, out, fixed, absent, DivergenceLimits());
}

absl::StatusOr<DivergenceComputation> DivergenceComputation::Start(
    int num_experts, size_t num_rows, int num_arms, int num_groups,
    const DivergenceMatrix* previous, int keep, absl::Span<const bool> fixed,
    absl::Span<const bool> absent, const DivergenceLimits& limits) {
  const int n = num_experts;
  if (num_arms < 1 || num_groups < 1) {
    return absl::InvalidArgumentError("divergences need >= 1 arm and >= 1 group");
  }
  DivergenceComputation c;
  c.n_ = n;
  c.k_ = static_cast<size_t>(num_arms);
  if (n == 0) {
    c.d_ = DivergenceMatrix::Identity(0);
    return c;
  }
  if (num_rows == 0) {
    return absl::InvalidArgumentError("divergences need at least one context");
  }
  if (!absent.empty() && absent.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(absent.size(), " absent-expert flags for ", n, " experts"));
  }
  if (keep > 0 && (previous == nullptr || previous->num_experts < keep)) {
    return absl::InvalidArgumentError("previous divergences do not cover the kept experts");
  }
  if (!fixed.empty() && fixed.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(fixed.size(), " fixed-expert flags for ", n, " experts"));
  }
  const auto is_absent = [&](int e) { return !absent.empty() && absent[e]; };
  const int covered = previous == nullptr ? 0 : std::min(n, previous->num_experts);
  const auto copied = [&](int i, int j) {
    return (i < keep && j < keep) ||
           (!fixed.empty() && (fixed[i] || fixed[j]) && i < covered && j < covered);
  };
  // A fixed expert's row is read by no estimate: its pairs (f, j) that are not copied are 1.
  const auto row_read = [&](int i) { return !is_absent(i) && (fixed.empty() || !fixed[i]); };

  c.d_ = DivergenceMatrix::Identity(n);
  std::vector<bool> read(n, false);  // experts whose predictions a computed pair reads
  c.logs_.assign(n, false);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const size_t ij = static_cast<size_t>(i) * n + j;
      if (copied(i, j)) {
        c.d_.m[ij] = previous->M(i, j);
        c.d_.sigma[ij] = previous->Sigma(i, j);
        continue;
      }
      if (i == j || !row_read(i) || is_absent(j)) continue;  // 1, from Identity
      c.pairs_.emplace_back(i, j);
      read[i] = read[j] = true;
      c.logs_[i] = true;
    }
  }
  const size_t k = c.k_;
  c.groups_ = static_cast<int>(std::min<size_t>(num_groups, num_rows));
  c.group_size_ = num_rows / c.groups_;
  size_t loggers = 0;
  for (int e = 0; e < n; ++e) {
    if (read[e]) c.readers_.push_back(e);
    loggers += c.logs_[e] ? 1 : 0;
  }
  const double row_bytes =
      static_cast<double>((c.readers_.size() + loggers) * k * sizeof(double));
  c.block_ = std::clamp<size_t>(
      row_bytes == 0.0 ? c.group_size_
                       : static_cast<size_t>(static_cast<double>(limits.max_block_bytes) /
                                             row_bytes),
      1, c.group_size_);
  if (c.pairs_.empty()) return c;  // nothing to read: done
  c.work_.rows_read = c.group_size_ * c.groups_;
  c.work_.block_rows = c.block_;
  c.work_.terms = static_cast<int64_t>(c.pairs_.size() * k * c.work_.rows_read);
  c.blocks_per_group_ = static_cast<int64_t>((c.group_size_ + c.block_ - 1) / c.block_);
  c.blocks_ = c.groups_ * c.blocks_per_group_;
  c.pi_.resize(n);
  c.log_pi_.resize(n);
  for (int e = 0; e < n; ++e) {
    if (read[e]) c.pi_[e].resize(c.block_ * k);
    if (c.logs_[e]) c.log_pi_[e].resize(c.block_ * k);
  }
  c.kernel_rows_ = std::clamp<size_t>((size_t{256} << 10) / (2 * k * sizeof(double)), 1,
                                      c.block_);
  c.log_means_.resize(c.pairs_.size() * c.groups_);
  c.means_.resize(c.pairs_.size() * c.groups_);
  c.lse_max_.resize(c.pairs_.size());
  c.lse_sum_.resize(c.pairs_.size());
  c.f2_sum_.resize(c.pairs_.size());
  return c;
}

absl::Status DivergenceComputation::Step(PredictContexts predict, int64_t max_terms,
                                         const DivergenceThreads& threads) {
  if (failed_) {
    return absl::FailedPreconditionError("the divergence computation failed; start a new one");
  }
  if (next_block_ == blocks_) return absl::OkStatus();
  const size_t k = k_;
  // Work split into at most `tasks` contiguous parts, each with its own scratch.
  const int tasks = static_cast<int>(
      std::clamp<size_t>(static_cast<size_t>(std::max(threads.tasks, 1)), 1,
                         std::max(readers_.size(), pairs_.size())));
  if (scratch_.size() < static_cast<size_t>(tasks)) scratch_.resize(tasks);
  const auto run = [&](size_t items, absl::FunctionRef<void(int task, size_t from, size_t to)> fn) {
    const int parts = static_cast<int>(std::min<size_t>(tasks, items));
    const auto part = [&](int t) { fn(t, items * t / parts, items * (t + 1) / parts); };
    if (threads.run == nullptr || parts < 2) {
      for (int t = 0; t < parts; ++t) part(t);
    } else {
      threads.run(parts, part);
    }
  };
  const int g = static_cast<int>(next_block_ / blocks_per_group_);
  const size_t at = static_cast<size_t>(next_block_ % blocks_per_group_) * block_;
  // A group's contexts are contiguous rows.
  const size_t begin = g * group_size_ + at;
  const size_t rows = std::min(block_, group_size_ - at);
  const size_t values = rows * k;
  if (next_pair_ == 0) {
    if (at == 0) {
      std::fill(lse_max_.begin(), lse_max_.end(), -HUGE_VAL);
      std::fill(lse_sum_.begin(), lse_sum_.end(), 0.0);
      std::fill(f2_sum_.begin(), f2_sum_.end(), 0.0);
    }
    // The block's predictions. Probabilities are in (0, 1], except for arms that were not
    // eligible for a context (Expert::PredictBatchEligible): 0 under every expert alike.
    // The first expert read first: the others are checked against it.
    const int first_read = readers_[0];
    const auto fill = [&](int e) -> absl::Status {
      DECISION_RETURN_IF_ERROR(
          predict(e, begin, begin + rows, absl::MakeSpan(pi_[e].data(), values)));
      for (size_t i = 0; i < values; ++i) {
        const double p = pi_[e][i];
        if (!(p >= 0.0 && p <= 1.0 + 1e-9)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "expert ", e, " gives probability ", p,
              "; divergences need every arm's probability in (0, 1] (smooth the expert)"));
        }
        if ((p == 0.0) != (pi_[first_read][i] == 0.0)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "expert ", e, " gives probability ", p, " to arm ", i % k, " of context ",
              begin + i / k, " and expert ", first_read, " ", pi_[first_read][i],
              "; divergences need every eligible arm's probability in (0, 1] (smooth the "
              "expert) and 0 for the others"));
        }
      }
      // log pi once per expert, context and arm (not once per pair).
      if (logs_[e]) {
        for (size_t i = 0; i < values; ++i) log_pi_[e][i] = std::log(pi_[e][i]);
      }
      return absl::OkStatus();
    };
    absl::Status first = fill(first_read);
    if (first.ok()) {
      std::vector<absl::Status> status(n_);
      run(readers_.size() - 1, [&](int, size_t from, size_t to) {
        for (size_t r = from; r < to; ++r) status[readers_[r + 1]] = fill(readers_[r + 1]);
      });
      for (size_t r = 1; r < readers_.size() && first.ok(); ++r) first = status[readers_[r]];
    }
    if (!first.ok()) {
      failed_ = true;
      return first;
    }
  }
  // The next pairs of the block, as many as max_terms allows (at least one).
  const int64_t pair_terms = static_cast<int64_t>(values);
  const size_t count = static_cast<size_t>(std::clamp<int64_t>(
      max_terms / pair_terms, 1, static_cast<int64_t>(pairs_.size() - next_pair_)));
  const size_t first_pair = next_pair_;
  run(count, [&](int task, size_t from, size_t to) {
    Scratch& own = scratch_[task];
    own.log_terms.resize(rows);
    own.f2_terms.resize(rows);
    own.terms.resize(2 * kernel_rows_ * k);
    for (size_t p = first_pair + from; p < first_pair + to; ++p) {
      const auto [i, j] = pairs_[p];
      // Vectorised passes over the block's contexts, a few at a time so that the kernel's
      // scratch stays in cache (each context's terms are its own: the same values whatever
      // the split).
      for (size_t r = 0; r < rows; r += kernel_rows_) {
        const size_t at = r * k, now = std::min(kernel_rows_, rows - r);
        DivergenceTerms(pi_[i].data() + at, log_pi_[i].data() + at, pi_[j].data() + at, now, k,
                        own.terms.data(), own.log_terms.data() + r, own.f2_terms.data() + r);
      }
      for (size_t r = 0; r < rows; ++r) f2_sum_[p] += own.f2_terms[r];
      double block_max = -HUGE_VAL;
      for (size_t r = 0; r < rows; ++r) block_max = std::max(block_max, own.log_terms[r]);
      if (block_max > lse_max_[p]) {
        if (lse_sum_[p] != 0.0) lse_sum_[p] *= std::exp(lse_max_[p] - block_max);
        lse_max_[p] = block_max;
      }
      if (!std::isinf(lse_max_[p])) {
        for (size_t r = 0; r < rows; ++r) lse_sum_[p] += std::exp(own.log_terms[r] - lse_max_[p]);
      }
    }
  });
  next_pair_ += count;
  if (next_pair_ < pairs_.size()) return absl::OkStatus();
  next_pair_ = 0;
  ++next_block_;
  if (next_block_ % blocks_per_group_ == 0) {  // the group's last block
    for (size_t p = 0; p < pairs_.size(); ++p) {
      const double lse =
          std::isinf(lse_max_[p]) ? lse_max_[p] : lse_max_[p] + std::log(lse_sum_[p]);
      log_means_[p * groups_ + g] = lse - std::log(static_cast<double>(group_size_));
      means_[p * groups_ + g] = f2_sum_[p] / group_size_;
    }
  }
  if (next_block_ == blocks_) Finish();
  return absl::OkStatus();
}

double DivergenceComputation::progress() const {
  if (blocks_ == 0) return 1.0;
  return (static_cast<double>(next_block_) +
          static_cast<double>(next_pair_) / static_cast<double>(pairs_.size())) /
         static_cast<double>(blocks_);
}

void DivergenceComputation::Finish() {
  const int n = n_, groups = groups_;
  for (size_t p = 0; p < pairs_.size(); ++p) {
    const size_t ij = static_cast<size_t>(pairs_[p].first) * n + pairs_[p].second;
    const absl::Span<double> pair_log_means(&log_means_[p * groups], groups);
    // Median in log space. For an even count the median is the mean of the two middle
    // values in linear space: log((e^a + e^b) / 2).
    std::sort(pair_log_means.begin(), pair_log_means.end());
    double log_median;
    if (groups % 2 == 1) {
      log_median = pair_log_means[groups / 2];
    } else {
      const double middle[2] = {pair_log_means[groups / 2 - 1], pair_log_means[groups / 2]};
      log_median = LogSumExp(middle) - std::log(2.0);
    }
    d_.m[ij] = 1.0 + std::max(0.0, log_median);
    d_.sigma[ij] =
        std::sqrt(std::max(1.0, MedianInPlace(absl::MakeSpan(&means_[p * groups], groups))));
  }
  // What only the computation needed.
  pi_ = {};
  log_pi_ = {};
  scratch_ = {};
}

DivergenceMatrix DivergenceComputation::Take() { return std::move(d_); }

absl::Status ComputeDivergences(int num_experts, size_t num_rows, PredictContexts predict,
                                int num_arms, int num_groups, const DivergenceMatrix* previous,
                                int keep, DivergenceMatrix* out, absl::Span<const bool> fixed,
                                absl::Span<const bool> absent, const DivergenceLimits& limits,
                                DivergenceWork* work, const DivergenceThreads& threads) {
  DECISION_ASSIGN_OR_RETURN(DivergenceComputation c,
                            DivergenceComputation::Start(num_experts, num_rows, num_arms,
                                                         num_groups, previous, keep, fixed,
                                                         absent, limits));
  if (work != nullptr) *work = c.work();
  while (!c.done()) {
    DECISION_RETURN_IF_ERROR(c.Step(predict, std::numeric_limits<int64_t>::max(), threads));
  }
  *out = c.Take();
  return absl::OkStatus();
}

absl::Status EstimateDivergences(absl::Span<const Expert* const> experts,
                                 const ContextReservoir& reservoir, int num_groups,
                                 DivergenceMatrix* out) {
  if (experts.empty()) {
    *out = DivergenceMatrix::Identity(0);
    return absl::OkStatus();
  }
  const int k = experts[0]->num_arms();
  std::vector<std::vector<double>> predictions(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    if (experts[e]->num_arms() != k) {
      return absl::InvalidArgumentError(absl::StrCat("expert ", e, " has ",
                                                     experts[e]->num_arms(),
                                                     " arms, expert 0 has ", k));
    }
    predictions[e].resize(reservoir.size() * k);
    std::vector<absl::Span<const int32_t>> eligible;
    if (reservoir.any_eligible()) {
      eligible.assign(reservoir.eligible().begin(), reservoir.eligible().end());
    }
    absl::Status s = experts[e]->PredictBatchEligible(reservoir.contexts(), reservoir.size(),
                                                      eligible, absl::MakeSpan(predictions[e]));
    if (!s.ok()) return s;
  }
  return ComputeDivergences(predictions, k, num_groups, nullptr, 0, out);
}

}  // namespace decision
