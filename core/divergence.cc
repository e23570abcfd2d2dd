#include "core/divergence.h"

#include <algorithm>
#include <cmath>
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

absl::Status ComputeDivergences(int num_experts, size_t num_rows, PredictContexts predict,
                                int num_arms, int num_groups, const DivergenceMatrix* previous,
                                int keep, DivergenceMatrix* out, absl::Span<const bool> fixed,
                                absl::Span<const bool> absent, const DivergenceLimits& limits,
                                DivergenceWork* work, const DivergenceThreads& threads) {
  const int n = num_experts;
  if (num_arms < 1 || num_groups < 1) {
    return absl::InvalidArgumentError("divergences need >= 1 arm and >= 1 group");
  }
  if (n == 0) {
    *out = DivergenceMatrix::Identity(0);
    if (work != nullptr) *work = DivergenceWork();
    return absl::OkStatus();
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

  DivergenceMatrix d = DivergenceMatrix::Identity(n);
  // The pairs computed, in row-major order; the others are copied or stay 1.
  std::vector<std::pair<int, int>> pairs;
  std::vector<bool> read(n, false);  // experts whose predictions a computed pair reads
  std::vector<bool> logs(n, false);  // ... and whose logarithms it reads (as pi_i)
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const size_t ij = static_cast<size_t>(i) * n + j;
      if (copied(i, j)) {
        d.m[ij] = previous->M(i, j);
        d.sigma[ij] = previous->Sigma(i, j);
        continue;
      }
      if (i == j || !row_read(i) || is_absent(j)) continue;  // 1, from Identity
      pairs.emplace_back(i, j);
      read[i] = read[j] = logs[i] = true;
    }
  }
  const size_t k = static_cast<size_t>(num_arms);
  const int groups = static_cast<int>(std::min<size_t>(num_groups, num_rows));
  const size_t group_size = num_rows / groups;
  std::vector<int> readers;  // the experts read, in order
  size_t loggers = 0;
  for (int e = 0; e < n; ++e) {
    if (read[e]) readers.push_back(e);
    loggers += logs[e] ? 1 : 0;
  }
  const double row_bytes = static_cast<double>((readers.size() + loggers) * k * sizeof(double));
  const size_t block = std::clamp<size_t>(
      row_bytes == 0.0 ? group_size
                       : static_cast<size_t>(static_cast<double>(limits.max_block_bytes) /
                                             row_bytes),
      1, group_size);
  if (work != nullptr) {
    work->rows_read = pairs.empty() ? 0 : group_size * groups;
    work->block_rows = pairs.empty() ? 0 : block;
    work->terms = static_cast<int64_t>(pairs.size() * k * work->rows_read);
  }
  if (pairs.empty()) {
    *out = std::move(d);
    return absl::OkStatus();
  }

  const int first_read = readers[0];
  std::vector<std::vector<double>> pi(n), log_pi(n);
  for (int e = 0; e < n; ++e) {
    if (read[e]) pi[e].resize(block * k);
    if (logs[e]) log_pi[e].resize(block * k);
  }
  // Work split into at most `tasks` contiguous parts, each with its own scratch.
  const int tasks = static_cast<int>(std::clamp<size_t>(
      static_cast<size_t>(std::max(threads.tasks, 1)), 1, std::max(readers.size(), pairs.size())));
  const auto run = [&](size_t items, absl::FunctionRef<void(int task, size_t from, size_t to)> fn) {
    const int parts = static_cast<int>(std::min<size_t>(tasks, items));
    const auto part = [&](int t) { fn(t, items * t / parts, items * (t + 1) / parts); };
    if (threads.run == nullptr || parts < 2) {
      for (int t = 0; t < parts; ++t) part(t);
    } else {
      threads.run(parts, part);
    }
  };
  // Contexts per kernel call: its scratch (two values per arm and context) within 256 KB.
  const size_t kernel_rows = std::clamp<size_t>((size_t{256} << 10) / (2 * k * sizeof(double)),
                                                1, block);
  struct Scratch {
    std::vector<double> log_terms, f2_terms, terms;
  };
  std::vector<Scratch> scratch(tasks);
  // Per pair and group: the log of the mean of exp(log f1 term), and the mean f2 term.
  std::vector<double> log_means(pairs.size() * groups), means(pairs.size() * groups);
  // Per pair, over the current group: log-sum-exp as a running maximum and a sum shifted by
  // it (with one block per group, the same operations as LogSumExp), and the f2 sum.
  std::vector<double> lse_max(pairs.size()), lse_sum(pairs.size()), f2_sum(pairs.size());
  std::vector<absl::Status> status(n);
  for (int g = 0; g < groups; ++g) {
    std::fill(lse_max.begin(), lse_max.end(), -HUGE_VAL);
    std::fill(lse_sum.begin(), lse_sum.end(), 0.0);
    std::fill(f2_sum.begin(), f2_sum.end(), 0.0);
    for (size_t at = 0; at < group_size; at += block) {
      // A group's contexts are contiguous rows.
      const size_t begin = g * group_size + at;
      const size_t rows = std::min(block, group_size - at);
      const size_t values = rows * k;
      // Probabilities are in (0, 1], except for arms that were not eligible for a context
      // (Expert::PredictBatchEligible): 0 under every expert alike. The first expert read
      // first: the others are checked against it.
      const auto fill = [&](int e) -> absl::Status {
        DECISION_RETURN_IF_ERROR(
            predict(e, begin, begin + rows, absl::MakeSpan(pi[e].data(), values)));
        for (size_t i = 0; i < values; ++i) {
          const double p = pi[e][i];
          if (!(p >= 0.0 && p <= 1.0 + 1e-9)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "expert ", e, " gives probability ", p,
                "; divergences need every arm's probability in (0, 1] (smooth the expert)"));
          }
          if ((p == 0.0) != (pi[first_read][i] == 0.0)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "expert ", e, " gives probability ", p, " to arm ", i % k, " of context ",
                begin + i / k, " and expert ", first_read, " ", pi[first_read][i],
                "; divergences need every eligible arm's probability in (0, 1] (smooth the "
                "expert) and 0 for the others"));
          }
        }
        // log pi once per expert, context and arm (not once per pair).
        if (logs[e]) {
          for (size_t i = 0; i < values; ++i) log_pi[e][i] = std::log(pi[e][i]);
        }
        return absl::OkStatus();
      };
      DECISION_RETURN_IF_ERROR(fill(first_read));
      run(readers.size() - 1, [&](int, size_t from, size_t to) {
        for (size_t r = from; r < to; ++r) status[readers[r + 1]] = fill(readers[r + 1]);
      });
      for (size_t r = 1; r < readers.size(); ++r) DECISION_RETURN_IF_ERROR(status[readers[r]]);
      run(pairs.size(), [&](int task, size_t from, size_t to) {
        Scratch& own = scratch[task];
        own.log_terms.resize(rows);
        own.f2_terms.resize(rows);
        own.terms.resize(2 * kernel_rows * k);
        for (size_t p = from; p < to; ++p) {
          const auto [i, j] = pairs[p];
          // Vectorised passes over the block's contexts, a few at a time so that the
          // kernel's scratch stays in cache (each context's terms are its own: the same
          // values whatever the split).
          for (size_t r = 0; r < rows; r += kernel_rows) {
            const size_t at = r * k, now = std::min(kernel_rows, rows - r);
            DivergenceTerms(pi[i].data() + at, log_pi[i].data() + at, pi[j].data() + at, now,
                            k, own.terms.data(), own.log_terms.data() + r,
                            own.f2_terms.data() + r);
          }
          for (size_t r = 0; r < rows; ++r) f2_sum[p] += own.f2_terms[r];
          double block_max = -HUGE_VAL;
          for (size_t r = 0; r < rows; ++r) block_max = std::max(block_max, own.log_terms[r]);
          if (block_max > lse_max[p]) {
            if (lse_sum[p] != 0.0) lse_sum[p] *= std::exp(lse_max[p] - block_max);
            lse_max[p] = block_max;
          }
          if (!std::isinf(lse_max[p])) {
            for (size_t r = 0; r < rows; ++r) {
              lse_sum[p] += std::exp(own.log_terms[r] - lse_max[p]);
            }
          }
        }
      });
    }
    for (size_t p = 0; p < pairs.size(); ++p) {
      const double lse =
          std::isinf(lse_max[p]) ? lse_max[p] : lse_max[p] + std::log(lse_sum[p]);
      log_means[p * groups + g] = lse - std::log(static_cast<double>(group_size));
      means[p * groups + g] = f2_sum[p] / group_size;
    }
  }
  for (size_t p = 0; p < pairs.size(); ++p) {
    const size_t ij = static_cast<size_t>(pairs[p].first) * n + pairs[p].second;
    const absl::Span<double> pair_log_means(&log_means[p * groups], groups);
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
    d.m[ij] = 1.0 + std::max(0.0, log_median);
    d.sigma[ij] =
        std::sqrt(std::max(1.0, MedianInPlace(absl::MakeSpan(&means[p * groups], groups))));
  }
  *out = std::move(d);
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
