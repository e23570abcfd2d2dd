#include "core/divergence.h"

#include <algorithm>
#include <cmath>

#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "core/kernels.h"
#include "core/numeric.h"

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
  if (n == 0) {
    *out = DivergenceMatrix::Identity(0);
    return absl::OkStatus();
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
  // Probabilities are in (0, 1], except for arms that were not eligible for a context
  // (Expert::PredictBatchEligible): 0 under every expert alike.
  const absl::Span<const double> first =
      first_present == n ? absl::Span<const double>() : predictions[first_present];
  for (int e = 0; e < n; ++e) {
    if (is_absent(e)) continue;
    if (predictions[e].size() != rows * num_arms) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert ", e, " has ", predictions[e].size(),
                       " predicted probabilities, expected ", rows, " x ", num_arms));
    }
    for (size_t i = 0; i < predictions[e].size(); ++i) {
      const double p = predictions[e][i];
      if (!(p >= 0.0 && p <= 1.0 + 1e-9)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "expert ", e, " gives probability ", p,
            "; divergences need every arm's probability in (0, 1] (smooth the expert)"));
      }
      if ((p == 0.0) != (first[i] == 0.0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "expert ", e, " gives probability ", p, " to arm ", i % num_arms, " of context ",
            i / num_arms, " and expert ", first_present, " ", first[i],
            "; divergences need every eligible arm's probability in (0, 1] (smooth the "
            "expert) and 0 for the others"));
      }
    }
  }
  if (keep > 0 && (previous == nullptr || previous->num_experts < keep)) {
    return absl::InvalidArgumentError("previous divergences do not cover the kept experts");
  }
  if (!fixed.empty() && fixed.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(fixed.size(), " fixed-expert flags for ", n, " experts"));
  }
  const int covered = previous == nullptr ? 0 : std::min(n, previous->num_experts);
  const auto copied = [&](int i, int j) {
    return (i < keep && j < keep) ||
           (!fixed.empty() && (fixed[i] || fixed[j]) && i < covered && j < covered);
  };
  // A fixed expert's row is read by no estimate: its pairs (f, j) that are not copied are 1.
  const auto row_read = [&](int i) { return !is_absent(i) && (fixed.empty() || !fixed[i]); };
  const int groups = static_cast<int>(std::min<size_t>(num_groups, rows));
  const size_t group_size = rows / groups;
  // log pi once per expert, context and arm (not once per pair), for the rows computed.
  std::vector<std::vector<double>> log_predictions(n);
  for (int e = 0; e < n; ++e) {
    if (!row_read(e)) continue;
    log_predictions[e].resize(predictions[e].size());
    for (size_t i = 0; i < predictions[e].size(); ++i) {
      log_predictions[e][i] = std::log(predictions[e][i]);
    }
  }

  DivergenceMatrix d = DivergenceMatrix::Identity(n);
  std::vector<double> log_means(groups), means(groups);
  std::vector<double> log_terms(group_size), f2_terms(group_size);
  std::vector<double> scratch(2 * group_size * num_arms);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const size_t ij = static_cast<size_t>(i) * n + j;
      if (copied(i, j)) {
        d.m[ij] = previous->M(i, j);
        d.sigma[ij] = previous->Sigma(i, j);
        continue;
      }
      if (i == j || !row_read(i) || is_absent(j)) continue;  // 1, from Identity
      for (int g = 0; g < groups; ++g) {
        // A group's contexts are contiguous rows: one vectorised pass over all of them.
        const size_t at = g * group_size * num_arms;
        DivergenceTerms(&predictions[i][at], &log_predictions[i][at], &predictions[j][at],
                        group_size, num_arms, scratch.data(), log_terms.data(),
                        f2_terms.data());
        double f2_sum = 0.0;
        for (double f2 : f2_terms) f2_sum += f2;
        log_means[g] = LogSumExp(log_terms) - std::log(static_cast<double>(group_size));
        means[g] = f2_sum / group_size;
      }
      // Median in log space. For an even count the median is the mean of the two middle
      // values in linear space: log((e^a + e^b) / 2).
      std::sort(log_means.begin(), log_means.end());
      double log_median;
      if (groups % 2 == 1) {
        log_median = log_means[groups / 2];
      } else {
        const double pair[2] = {log_means[groups / 2 - 1], log_means[groups / 2]};
        log_median = LogSumExp(pair) - std::log(2.0);
      }
      d.m[ij] = 1.0 + std::max(0.0, log_median);
      d.sigma[ij] = std::sqrt(std::max(1.0, MedianInPlace(absl::MakeSpan(means))));
    }
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
