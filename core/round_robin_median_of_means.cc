// Round-robin median of means (eq. est2) in state that does not grow with t; see estimator.h.
//
// Every sample s is added once, when it enters the used prefix [0, u), to fine group
// f = s mod L (L = MedianOfMeansFineGroups, 240 with the practical constants). Because l(t)
// divides L, group r of the l(t) groups (s mod l = r) is the union of the fine groups
// f with f mod l = r: a change of l regroups fine-group sums, never samples. The at most
// l - 1 samples in [u, t) wait in a small tail buffer.
//
// A fine group keeps, per chooser j and expert k, S[f][j][k] = sum of Y r_kj over its
// samples chosen by j, and the count n[f][j]. These do not depend on the divergences, so a
// divergence refresh recomputes the sigma-weighted sums F[f][k] = sum_j S / sigma_kj and
// D[f][k] = sum_j n / sigma_kj from them in O(L N^2), without the log. Between refreshes F
// and D are kept incrementally, O(N) per sample. Medians are recomputed, O(L N + N l),
// when (l, u) changes: about every l samples.
//
// Memory: 8 L N (N + 4) bytes plus the tail (2.3 MB at N = 32, L = 240), whatever t.
// A new expert's row is computed from the log's new column (its backfill), O(t).
//
// A retired expert r (Retire) keeps no row, and its column S[f][r][.] is folded with its
// divergences, fixed from then on, into R[f][k] = sum over retired j of S[f][j][k] /
// sigma_kj: S is kept for the A live experts only, 8 L (A^2 + 4 N) bytes.
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/estimator.h"
#include "core/estimator_state.h"
#include "core/numeric.h"

namespace decision::internal {
namespace {

class RoundRobinMedianOfMeans final : public Estimator {
 public:
  RoundRobinMedianOfMeans(const EstimatorOptions& options, int num_experts)
      : options_(options),
        fine_(MedianOfMeansFineGroups(options)),
        d_(DivergenceMatrix::Identity(num_experts)) {
    Widen(num_experts);
    SetInverseSigma();
  }

  absl::Status Add(int chooser, double reward, absl::Span<const double> p) override {
    if (absl::Status s = CheckSample(chooser, reward, p, n_); !s.ok()) return s;
    Learn(chooser, reward, p.data());
    MaybeRegroup();
    return absl::OkStatus();
  }

  // The medians are a function of the fine-group sums at the end: a batch (a rebuild, a
  // restart) regroups once, not every l samples.
  absl::Status Update(const SampleLog& log) override {
    if (absl::Status s = CheckLogMatches(log, n_, t_); !s.ok()) return s;
    for (int64_t s = t_; s < log.size(); ++s) {
      Learn(log.chooser(s), log.reward(s), log.propensities(s));
    }
    MaybeRegroup();
    return absl::OkStatus();
  }

  absl::Status SetDivergences(const SampleLog& log, const DivergenceMatrix& d) override {
    // The log is read only for new experts' rows (their backfill).
    if (absl::Status s = CheckNewDivergences(log, d, n_, t_); !s.ok()) return s;
    const int old_n = n_;
    DivergenceMatrix merged = d;
    KeepFixedPairs(&merged);
    if (d.num_experts > old_n) Widen(d.num_experts);
    d_ = std::move(merged);
    SetInverseSigma();
    if (n_ > old_n) AddExpertRows(log, old_n);
    RecomputeWeightedSums();
    if (t_ > 0) Regroup(groups_);
    return absl::OkStatus();
  }

  ExpertEstimate Estimate(int k) const override {
    if (retired_[k]) return frozen_[k];
    if (t_ == 0) return {0.0, std::numeric_limits<double>::infinity()};
    return {mean_[k], WidthFactor(k) * inv_min_weight_[k]};
  }

  int ArgmaxUcb(const std::vector<bool>& selectable, absl::BitGenRef gen) const override {
    const double base = WidthFactor();
    if (windows_.empty() && live() == n_) {
      return ArgmaxMeanPlusWidth(mean_, inv_min_weight_, base, selectable, gen);
    }
    int best = -1, ties = 0;
    double best_value = 0.0;
    for (int k = 0; k < n_; ++k) {
      if (!selectable[k] || retired_[k]) continue;
      const double factor = window_of_[k] < 0 ? base : WidthFactor(k);
      OfferCandidate(k, mean_[k] + factor * inv_min_weight_[k], gen, &best, &best_value,
                     &ties);
    }
    return best;
  }

  int64_t WindowStart(int k) const override {
    return window_of_[k] < 0 ? 0 : windows_[window_of_[k]].start;
  }

  absl::Status Retire(int k) override {
    if (k < 0 || k >= n_) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert ", k, " is not one of the ", n_, " experts"));
    }
    if (retired_[k]) return absl::OkStatus();
    frozen_[k] = Estimate(k);
    frozen_effective_[k] = effective_[k];
    // Its column under its divergences, fixed from now on. F is unchanged: it already
    // holds these terms.
    const int a = live();
    const int slot = slot_[k];
    for (int64_t f = 0; f < fine_; ++f) {
      const double* s = &sums_[(static_cast<size_t>(f) * a + slot) * a];
      double* folded = &retired_weighted_[static_cast<size_t>(f) * n_];
      const double* inv_sigma = &inv_sigma_by_chooser_[static_cast<size_t>(k) * n_];
      for (int b = 0; b < a; ++b) {
        if (b != slot) folded[live_[b]] += inv_sigma[live_[b]] * s[b];
      }
    }
    // S without its row and column.
    std::vector<double> kept(static_cast<size_t>(fine_) * (a - 1) * (a - 1));
    double* out = kept.data();
    for (int64_t f = 0; f < fine_; ++f) {
      for (int j = 0; j < a; ++j) {
        if (j == slot) continue;
        const double* row = &sums_[(static_cast<size_t>(f) * a + j) * a];
        out = std::copy(row, row + slot, out);
        out = std::copy(row + slot + 1, row + a, out);
      }
    }
    sums_.swap(kept);
    retired_[k] = 1;
    SetLive();
    if (window_of_[k] >= 0) ReleaseWindowIfRetired(window_of_[k]);
    return absl::OkStatus();
  }
  bool Retired(int k) const override { return retired_[k] != 0; }

  absl::StatusOr<std::unique_ptr<ExpertRows>> NewExpertRows(int count,
                                                            int64_t first) const override {
    if (count < 1) {
      return absl::InvalidArgumentError(absl::StrCat("cannot add ", count, " experts"));
    }
    if (first < 0 || first > used_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a window from sample ", first, ": it must start at or before sample ", used_,
          ", the end of the samples in groups"));
    }
    return std::make_unique<Rows>(fine_, n_, count, first);
  }

  absl::Status AddExperts(std::unique_ptr<ExpertRows> rows,
                          const DivergenceMatrix& d) override {
    Rows* r = dynamic_cast<Rows*>(rows.get());
    if (r == nullptr) {
      return absl::InvalidArgumentError("the rows were not started by this kind of estimator");
    }
    if (r->old_n != n_ || r->fine != fine_ || r->seen != t_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the rows were started for ", r->old_n, " experts and cover the samples up to ",
          r->seen, "; the estimator has ", n_, " and ", t_));
    }
    if (absl::Status s = ValidateDivergenceMatrix(d, n_ + r->m); !s.ok()) return s;
    DivergenceMatrix merged = d;
    KeepFixedPairs(&merged);
    const int old_n = n_;
    const int m = r->m;
    const int64_t first = r->seen - static_cast<int64_t>(r->chooser.size());
    const bool windowed = r->first > 0 || r->skipped_total > 0;
    if (windowed) {
      // The window's grouped samples left out, per fine group and chooser: the grouped
      // samples' counts less those of the samples the rows were fed that are grouped.
      // Skipped ones still in the tail are left out as they are grouped (FoldTail).
      Window w;
      w.start = r->first;
      w.n = old_n;
      w.skipped = r->skipped_total;
      w.before = counts_;
      const int index = static_cast<int>(windows_.size());
      for (size_t i = 0; i < r->chooser.size(); ++i) {
        const int64_t s = first + static_cast<int64_t>(i);
        if (s >= used_) {
          if (r->skipped[i]) excluded_tail_.push_back({s, index});
        } else if (!r->skipped[i]) {
          r->counts[static_cast<size_t>(s % fine_) * old_n + r->chooser[i]] += 1.0;
        }
      }
      std::sort(excluded_tail_.begin(), excluded_tail_.end());
      for (size_t c = 0; c < w.before.size(); ++c) w.before[c] -= r->counts[c];
      SetWindowTotals(&w);
      window_of_.resize(n_, -1);
      windows_.push_back(std::move(w));
    }
    Widen(n_ + m);
    if (windowed) {
      for (int e = 0; e < m; ++e) window_of_[old_n + e] = static_cast<int>(windows_.size()) - 1;
    }
    d_ = std::move(merged);
    SetInverseSigma();
    // The committed samples' sums, then the last (at most L) samples in order: those below
    // u join their fine groups as AddExpertRows adds them, the others are in the tail. A
    // retired chooser's go straight into the folded sums, under the new experts' sigma.
    const int first_slot = slot_[old_n];  // the new experts' slots follow in order
    for (int64_t f = 0; f < fine_; ++f) {
      for (int j = 0; j < old_n; ++j) {
        const double* from = &r->sums[(static_cast<size_t>(f) * old_n + j) * m];
        if (!retired_[j]) {
          std::copy_n(from, m, &sums_[Cell(f, j) + first_slot]);
          continue;
        }
        const double* inv_sigma = &inv_sigma_by_chooser_[static_cast<size_t>(j) * n_ + old_n];
        double* folded = &retired_weighted_[static_cast<size_t>(f) * n_ + old_n];
        for (int e = 0; e < m; ++e) folded[e] += inv_sigma[e] * from[e];
      }
    }
    for (size_t i = 0; i < r->chooser.size(); ++i) {
      const int64_t s = first + static_cast<int64_t>(i);
      const double* p = &r->propensities[i * m];
      if (s < used_) {
        const double y = r->scaled_reward[i];
        if (y == 0.0) continue;
        const int j = r->chooser[i];
        if (!retired_[j]) {
          double* row = &sums_[Cell(s % fine_, j) + first_slot];
          for (int e = 0; e < m; ++e) row[e] += y * p[e];
          continue;
        }
        const double* inv_sigma = &inv_sigma_by_chooser_[static_cast<size_t>(j) * n_ + old_n];
        double* folded = &retired_weighted_[static_cast<size_t>(s % fine_) * n_ + old_n];
        for (int e = 0; e < m; ++e) folded[e] += inv_sigma[e] * (y * p[e]);
      } else {
        std::copy_n(p, m, &tail_propensities_[static_cast<size_t>(s - used_) * n_ + old_n]);
      }
    }
    RecomputeWeightedSums();
    if (t_ > 0) Regroup(groups_);
    return absl::OkStatus();
  }

  absl::Status SnapshotTo(std::string* buffer) const override {
    std::string& out = *buffer;
    out.clear();
    out.reserve(8 * (d_.m.size() + d_.sigma.size() + tail_chooser_.size() +
                     tail_reward_.size() + tail_propensities_.size() + sums_.size() +
                     counts_.size() + weighted_.size() + weights_.size() + effective_.size() +
                     retired_weighted_.size() + 4 * (n_ - live())) +
                256);
    StateWriter w(&out);
    w.Raw(kStateMagic, 4);
    const uint8_t kind = static_cast<uint8_t>(EstimatorKind::kMedianOfMeans);
    w.Raw(&kind, 1);
    w.Int(fine_);
    WriteDivergences(w, d_);
    w.Int(t_);
    w.Int(used_);
    // The retired experts and their values at retirement (version 3).
    std::vector<int64_t> retired;
    std::vector<double> means, widths, effective;
    for (int k = 0; k < n_; ++k) {
      if (!retired_[k]) continue;
      retired.push_back(k);
      means.push_back(frozen_[k].mean);
      widths.push_back(frozen_[k].width);
      effective.push_back(frozen_effective_[k]);
    }
    w.Array(retired);
    w.Array(means);
    w.Array(widths);
    w.Array(effective);
    w.Array(tail_chooser_);
    w.Array(tail_reward_);
    w.Array(tail_propensities_);
    w.Array(sums_);
    w.Array(counts_);
    w.Array(weighted_);
    w.Array(weights_);
    w.Array(effective_);
    w.Array(retired_weighted_);
    w.Int(cached_paper_);
    w.Int(cached_groups_);
    w.Int(groups_);
    w.Int(static_cast<int64_t>(windows_.size()));
    for (const Window& window : windows_) {
      w.Int(window.start);
      w.Int(window.n);
      w.Int(window.skipped);
      w.Array(window.before);
    }
    w.Array(window_of_);
    std::vector<int64_t> excluded_samples, excluded_windows;
    for (const auto& [s, wi] : excluded_tail_) {
      excluded_samples.push_back(s);
      excluded_windows.push_back(wi);
    }
    w.Array(excluded_samples);
    w.Array(excluded_windows);
    return absl::OkStatus();
  }

  // The state Snapshot() wrote, checked before anything is sized from it.
  static absl::StatusOr<std::unique_ptr<Estimator>> Restore(const EstimatorOptions& options,
                                                            StateReader& in) {
    auto e = std::make_unique<RoundRobinMedianOfMeans>(options, 0);
    int64_t fine;
    if (!in.Int(&fine) || fine != e->fine_) {
      return in.Error(absl::StrCat("it has other than the problem's ", e->fine_,
                                   " fine groups"));
    }
    DivergenceMatrix d;
    if (!ReadDivergences(in, &d)) return in.Error("divergences");
    if (absl::Status s = ValidateDivergenceMatrix(d, d.num_experts); !s.ok()) {
      return in.Error(s.message());
    }
    const int64_t n = d.num_experts;
    int64_t t, used;
    if (!in.Int(&t) || !in.Int(&used) || used < 0 || t < used || t - used >= fine) {
      return in.Error("sample counts");
    }
    e->retired_.assign(n, 0);
    e->frozen_.assign(n, ExpertEstimate{});
    e->frozen_effective_.assign(n, 0.0);
    if (in.version() >= 3) {  // versions 1 and 2 retired no expert
      std::vector<int64_t> retired;
      std::vector<double> means, widths, effective;
      if (!in.ArrayUpTo(&retired, n) || !in.Array(&means, retired.size()) ||
          !in.Array(&widths, retired.size()) || !in.Array(&effective, retired.size())) {
        return in.Error("the retired experts");
      }
      for (size_t i = 0; i < retired.size(); ++i) {
        const int64_t k = retired[i];
        if (k < 0 || k >= n || (i > 0 && k <= retired[i - 1]) ||
            !(means[i] >= 0.0 && means[i] <= kAnyFinite) || !(widths[i] >= 0.0) ||
            !(effective[i] >= 0.0 && effective[i] <= kAnyFinite)) {
          return in.Error("a retired expert or its values");
        }
        e->retired_[k] = 1;
        e->frozen_[k] = {means[i], widths[i]};
        e->frozen_effective_[k] = effective[i];
      }
    }
    const int64_t a = n - std::count(e->retired_.begin(), e->retired_.end(), 1);
    const int64_t tail = t - used;
    if (!in.Array(&e->tail_chooser_, tail) || !in.Array(&e->tail_reward_, tail) ||
        !in.Array(&e->tail_propensities_, tail * n) ||
        !in.Array(&e->sums_, fine * a * a) || !in.Array(&e->counts_, fine * n) ||
        !in.Array(&e->weighted_, fine * n) || !in.Array(&e->weights_, fine * n) ||
        !in.Array(&e->effective_, n)) {
      return in.Error("arrays");
    }
    if (in.version() >= 3) {
      if (!in.Array(&e->retired_weighted_, fine * n)) return in.Error("the retired columns");
    } else {
      e->retired_weighted_.assign(static_cast<size_t>(fine * n), 0.0);
    }
    if (!in.Int(&e->cached_paper_) || !in.Int(&e->cached_groups_) || !in.Int(&e->groups_)) {
      return in.Error("the group counts");
    }
    for (int j : e->tail_chooser_) {
      if (j < 0 || j >= n) return in.Error("a chooser out of range");
    }
    // The values' domains, which the estimates rely on (a damaged value that passes gives
    // wrong estimates, never an invalid computation).
    double grouped = 0.0;
    for (double c : e->counts_) grouped += c;
    if (!AllWithin(e->counts_, 0.0, static_cast<double>(used)) ||
        grouped != static_cast<double>(used) || !AllWithin(e->tail_reward_, 0.0, 1.0) ||
        !AllWithin(e->tail_propensities_, 1e-300, 1.0) || !AllWithin(e->sums_, 0.0, kAnyFinite) ||
        !AllWithin(e->weighted_, 0.0, kAnyFinite) || !AllWithin(e->weights_, 0.0, kAnyFinite) ||
        !AllWithin(e->effective_, 0.0, kAnyFinite) ||
        !AllWithin(e->retired_weighted_, 0.0, kAnyFinite)) {
      return in.Error("a count, sum or sample out of its domain");
    }
    if (t > 0 && (e->groups_ < 1 || fine % e->groups_ != 0 || e->cached_groups_ < 1 ||
                  fine % e->cached_groups_ != 0)) {
      return in.Error("a group count that does not divide the fine groups");
    }
    if (in.version() >= 2) {  // version 1 had no windows
      int64_t count;
      if (!in.Int(&count) || count < 0 || count > n) return in.Error("the window count");
      e->windows_.resize(count);
      for (Window& w : e->windows_) {
        int64_t wn;
        if (!in.Int(&w.start) || !in.Int(&wn) || !in.Int(&w.skipped) || w.start < 0 ||
            w.start > used || wn < 1 || wn > n || w.skipped < 0 || w.skipped > t - w.start ||
            !in.Array(&w.before, fine * wn)) {
          return in.Error("a window");
        }
        w.n = static_cast<int>(wn);
        for (int64_t f = 0; f < fine; ++f) {
          for (int j = 0; j < w.n; ++j) {
            const double b = w.before[static_cast<size_t>(f) * w.n + j];
            if (!(b >= 0.0 && b <= e->counts_[static_cast<size_t>(f) * n + j])) {
              return in.Error("a window's count out of its domain");
            }
          }
        }
        SetWindowTotals(&w);
      }
      if (!in.Array(&e->window_of_, n)) return in.Error("the experts' windows");
      for (int w : e->window_of_) {
        if (w < -1 || w >= count) return in.Error("an expert's window out of range");
      }
      std::vector<int64_t> samples, windows;
      if (!in.ArrayUpTo(&samples, t - used) || !in.Array(&windows, samples.size())) {
        return in.Error("the excluded samples of the tail");
      }
      for (size_t i = 0; i < samples.size(); ++i) {
        if (samples[i] < used || samples[i] >= t || windows[i] < 0 || windows[i] >= count ||
            (i > 0 && samples[i] < samples[i - 1])) {
          return in.Error("an excluded sample of the tail");
        }
        e->excluded_tail_.push_back({samples[i], static_cast<int>(windows[i])});
      }
    } else {
      e->window_of_.assign(n, -1);
    }
    e->d_ = std::move(d);
    e->n_ = static_cast<int>(n);
    e->t_ = t;
    e->used_ = used;
    e->mean_.assign(n, 0.0);
    e->inv_min_weight_.assign(n, 0.0);
    e->SetLive();
    e->SetInverseSigma();
    if (t > 0) e->Regroup(e->groups_);
    return e;
  }

  double EffectiveSampleSize(int k) const override {
    return retired_[k] ? frozen_effective_[k] : effective_[k];
  }
  // The state at its bound, which depends on L, N and the windows alone: the fine groups
  // (S, n, F, D), a full tail (< L samples), the group scratch (at most L groups), the
  // divergences and the windows' counts.
  EstimatorStats Stats() const override {
    EstimatorStats stats;
    stats.state_bytes = EstimatorStateBound(options_, n_, static_cast<int>(windows_.size()),
                                            n_ - live());
    return stats;
  }
  int64_t num_samples() const override { return t_; }
  int num_experts() const override { return n_; }
  const DivergenceMatrix& divergences() const override { return d_; }

 private:
  // New experts' rows over the samples seen (see NewExpertRows): per fine group and
  // chooser, the sums of Y r_kj of the samples more than L back, and the last L samples as
  // they came (the ones below u when they are added join the fine groups, the others the
  // tail). O(L N m) values.
  struct Rows final : public ExpertRows {
    Rows(int64_t fine_groups, int old_experts, int new_experts, int64_t first_sample)
        : fine(fine_groups),
          old_n(old_experts),
          m(new_experts),
          first(first_sample),
          seen(first_sample),
          sums(static_cast<size_t>(fine_groups) * old_experts * new_experts, 0.0),
          counts(static_cast<size_t>(fine_groups) * old_experts, 0.0) {}

    absl::Status Skip(int j) override {
      if (j < 0 || j >= old_n) {
        return absl::InvalidArgumentError(
            absl::StrCat("chooser ", j, " is not one of the ", old_n, " experts"));
      }
      chooser.push_back(j);
      scaled_reward.push_back(0.0);
      propensities.insert(propensities.end(), m, 0.0);  // adds nothing to the sums
      skipped.push_back(true);
      ++skipped_total;
      ++seen;
      FoldOldest();
      return absl::OkStatus();
    }

    absl::Status Add(int j, double y, double pj, absl::Span<const double> p) override {
      if (absl::Status s = CheckRowSample(j, y, pj, p, old_n, m); !s.ok()) return s;
      chooser.push_back(j);
      scaled_reward.push_back(y == 0.0 ? 0.0 : y / pj);
      propensities.insert(propensities.end(), p.begin(), p.end());
      skipped.push_back(false);
      ++seen;
      FoldOldest();
      return absl::OkStatus();
    }
    // The oldest sample, once more than L back (below u for good), into the sums.
    void FoldOldest() {
      if (static_cast<int64_t>(chooser.size()) <= fine) return;
      const int64_t s = seen - static_cast<int64_t>(chooser.size());
      if (!skipped.front()) {
        counts[static_cast<size_t>(s % fine) * old_n + chooser.front()] += 1.0;
        if (scaled_reward.front() != 0.0) {
          double* row = &sums[(static_cast<size_t>(s % fine) * old_n + chooser.front()) * m];
          for (int e = 0; e < m; ++e) row[e] += scaled_reward.front() * propensities[e];
        }
      }
      chooser.pop_front();
      scaled_reward.pop_front();
      propensities.erase(propensities.begin(), propensities.begin() + m);
      skipped.pop_front();
    }
    int64_t num_samples() const override { return seen; }

    const int64_t fine;
    const int old_n;
    const int m;
    const int64_t first;  // the window's first sample (0: all of them)
    int64_t seen;         // fed the samples [first, seen)
    int64_t skipped_total = 0;   // samples skipped (left out of the window)
    std::vector<double> sums;    // [f][j][e]
    std::vector<double> counts;  // [f][j] of the samples folded into sums (not skipped)
    std::deque<bool> skipped;    // per sample of the deques
    std::deque<int> chooser;   // the last samples, at most L
    std::deque<double> scaled_reward;  // Y / pi_j
    std::deque<double> propensities;   // [sample][e]
  };

  // sqrt(c3 log(1/delta(t)) / t), delta(t) = 1/t^2.
  double WidthFactor() const {
    const double tt = static_cast<double>(t_);
    return std::sqrt(options_.constants.c3 * (2.0 * std::log(tt)) / tt);
  }
  // Expert k's: sqrt(c3 log(1/delta(t)) / t_k), t_k = the samples of its window.
  double WidthFactor(int k) const {
    if (window_of_[k] < 0) return WidthFactor();
    const Window& w = windows_[window_of_[k]];
    const double tk = static_cast<double>(t_ - w.start - w.skipped);
    if (tk <= 0.0) return std::numeric_limits<double>::infinity();
    return std::sqrt(options_.constants.c3 * (2.0 * std::log(static_cast<double>(t_))) / tk);
  }

  // A window (experts added with rows from sample `start` on): the grouped samples before
  // it, per fine group and chooser j < n (later experts chose only later samples).
  struct Window {
    int64_t start = 0;
    int n = 0;
    int64_t skipped = 0;               // samples of [start, t) left out (ExpertRows::Skip)
    std::vector<double> before;        // [f][j]: grouped samples left out (s < start, skipped)
    std::vector<double> before_total;  // [f]: sum over j
  };
  // Window w, once every expert added with it is retired, is read by no estimate (a retired
  // expert's is the one it had at retirement): it goes, and the experts that had it count as
  // windowless from then on (WindowStart 0). Without this the windows of retired experts
  // would grow the state by 8 L N bytes per registration for good (a problem under
  // retention that registers experts all the time).
  void ReleaseWindowIfRetired(int w) {
    for (int k = 0; k < n_; ++k) {
      if (window_of_[k] == w && !retired_[k]) return;
    }
    windows_.erase(windows_.begin() + w);
    for (int& v : window_of_) {
      if (v == w) {
        v = -1;
      } else if (v > w) {
        --v;
      }
    }
    auto kept = excluded_tail_.begin();
    for (auto [sample, window] : excluded_tail_) {
      if (window == w) continue;
      *kept++ = {sample, window > w ? window - 1 : window};
    }
    excluded_tail_.erase(kept, excluded_tail_.end());
  }
  static void SetWindowTotals(Window* w) {
    const size_t fine = w->before.size() / w->n;
    w->before_total.assign(fine, 0.0);
    for (size_t f = 0; f < fine; ++f) {
      for (int j = 0; j < w->n; ++j) w->before_total[f] += w->before[f * w->n + j];
    }
  }

  void Learn(int j, double reward, const double* p) {
    const double* inv_sigma = &inv_sigma_by_chooser_[static_cast<size_t>(j) * n_];
    for (int k = 0; k < n_; ++k) effective_[k] += inv_sigma[k];
    tail_chooser_.push_back(j);
    tail_reward_.push_back(reward);
    tail_propensities_.insert(tail_propensities_.end(), p, p + n_);
    ++t_;
    const int64_t l = Groups();
    const int64_t used = std::max(used_, l * (t_ / l));
    if (used != used_) FoldTail(used - used_);
  }

  void MaybeRegroup() {
    if (t_ == 0) return;
    if (cached_groups_ != groups_ || used_ != grouped_used_) Regroup(cached_groups_);
  }

  // l(t_): MedianOfMeansGroups, with the rounding cached (it depends on t only through the
  // paper's l(t) once t >= L).
  int64_t Groups() {
    const int64_t paper = PaperMedianOfMeansGroups(options_, t_);
    if (paper != cached_paper_ || t_ < fine_) {
      cached_paper_ = paper;
      cached_groups_ = RoundGroupsToDivisor(fine_, paper, t_);
    }
    return cached_groups_;
  }

  int live() const { return static_cast<int>(live_.size()); }
  // live_ and slot_ from retired_.
  void SetLive() {
    live_.clear();
    slot_.assign(n_, -1);
    for (int k = 0; k < n_; ++k) {
      if (retired_[k]) continue;
      slot_[k] = live();
      live_.push_back(k);
    }
  }
  // index of S[f][j][slot 0], j live: S holds the live experts' rows and columns.
  size_t Cell(int64_t f, int j) const {
    const size_t a = live_.size();
    return (static_cast<size_t>(f) * a + slot_[j]) * a;
  }
  // The pairs with a retired expert, among the experts there now, keep their values.
  void KeepFixedPairs(DivergenceMatrix* d) const {
    if (live() == n_) return;
    const int to = d->num_experts;
    for (int i = 0; i < n_; ++i) {
      for (int j = 0; j < n_; ++j) {
        if (!retired_[i] && !retired_[j]) continue;
        d->m[static_cast<size_t>(i) * to + j] = d_.M(i, j);
        d->sigma[static_cast<size_t>(i) * to + j] = d_.Sigma(i, j);
      }
    }
  }

  // Re-lays the per-expert state out for `n` experts (n >= n_), the new ones live; new
  // entries are zero.
  void Widen(int n) {
    const int old_n = n_;
    const size_t old_a = live_.size(), a = old_a + (n - old_n);
    std::vector<double> s(static_cast<size_t>(fine_) * a * a, 0.0);
    std::vector<double> count(static_cast<size_t>(fine_) * n, 0.0);
    std::vector<double> folded(static_cast<size_t>(fine_) * n, 0.0);
    for (int64_t f = 0; f < fine_ && old_n > 0; ++f) {
      for (size_t j = 0; j < old_a; ++j) {
        std::copy_n(&sums_[(static_cast<size_t>(f) * old_a + j) * old_a], old_a,
                    &s[(static_cast<size_t>(f) * a + j) * a]);
      }
      std::copy_n(&counts_[static_cast<size_t>(f) * old_n], old_n,
                  &count[static_cast<size_t>(f) * n]);
      std::copy_n(&retired_weighted_[static_cast<size_t>(f) * old_n], old_n,
                  &folded[static_cast<size_t>(f) * n]);
    }
    sums_.swap(s);
    counts_.swap(count);
    retired_weighted_.swap(folded);
    retired_.resize(n, 0);
    frozen_.resize(n);
    frozen_effective_.resize(n, 0.0);
    std::vector<double> props;
    props.reserve(tail_chooser_.size() * n);
    for (size_t i = 0; i < tail_chooser_.size(); ++i) {
      props.insert(props.end(), &tail_propensities_[i * old_n],
                   &tail_propensities_[i * old_n] + old_n);
      props.resize(props.size() + (n - old_n), 0.0);
    }
    tail_propensities_.swap(props);
    weighted_.assign(static_cast<size_t>(fine_) * n, 0.0);
    weights_.assign(static_cast<size_t>(fine_) * n, 0.0);
    effective_.resize(n, 0.0);
    mean_.resize(n, 0.0);
    inv_min_weight_.resize(n, 0.0);
    window_of_.resize(n, -1);
    n_ = n;
    SetLive();
  }

  // Rows of experts [first_k, n_) for the samples stored so far, read from the log (their
  // backfill): the folded samples into S, the tail's propensities into the tail.
  void AddExpertRows(const SampleLog& log, int first_k) {
    for (int64_t s = 0; s < used_; ++s) {
      const double y = log.reward(s);
      if (y == 0.0) continue;
      const int j = log.chooser(s);
      const double yj = y / log.propensity(j, s);
      if (retired_[j]) {
        const double* inv_sigma = &inv_sigma_by_chooser_[static_cast<size_t>(j) * n_];
        double* folded = &retired_weighted_[static_cast<size_t>(s % fine_) * n_];
        for (int k = first_k; k < n_; ++k) folded[k] += inv_sigma[k] * (yj * log.propensity(k, s));
        continue;
      }
      double* row = &sums_[Cell(s % fine_, j)];
      for (int k = first_k; k < n_; ++k) row[slot_[k]] += yj * log.propensity(k, s);
    }
    for (size_t i = 0; i < tail_chooser_.size(); ++i) {
      const int64_t s = used_ + static_cast<int64_t>(i);
      for (int k = first_k; k < n_; ++k) {
        tail_propensities_[i * n_ + k] = log.propensity(k, s);
      }
    }
  }

  void SetInverseSigma() {
    inv_sigma_by_chooser_.resize(static_cast<size_t>(n_) * n_);
    for (int j = 0; j < n_; ++j) {
      for (int k = 0; k < n_; ++k) {
        inv_sigma_by_chooser_[static_cast<size_t>(j) * n_ + k] = 1.0 / d_.Sigma(k, j);
      }
    }
  }

  // F and D of every fine group from S and n under the current sigma, and the effective
  // sample sizes over all t samples.
  void RecomputeWeightedSums() {
    // F starts from the retired columns' folded sums (all zero while none is retired).
    weighted_ = retired_weighted_;
    std::fill(weights_.begin(), weights_.end(), 0.0);
    std::fill(effective_.begin(), effective_.end(), 0.0);
    const int a = live();
    for (int64_t f = 0; f < fine_; ++f) {
      double* num = &weighted_[static_cast<size_t>(f) * n_];
      double* den = &weights_[static_cast<size_t>(f) * n_];
      for (int j = 0; j < n_; ++j) {
        const double count = counts_[static_cast<size_t>(f) * n_ + j];
        if (count == 0.0) continue;
        const double* inv_sigma = &inv_sigma_by_chooser_[static_cast<size_t>(j) * n_];
        for (int k = 0; k < n_; ++k) den[k] += inv_sigma[k] * count;
        if (retired_[j]) continue;
        const double* s = &sums_[Cell(f, j)];
        for (int b = 0; b < a; ++b) num[live_[b]] += inv_sigma[live_[b]] * s[b];
      }
      // A windowed expert's D counts only its window's samples (exactly 0 if none).
      for (int k = 0; k < n_ && !windows_.empty(); ++k) {
        if (window_of_[k] < 0) continue;
        const Window& w = windows_[window_of_[k]];
        den[k] = 0.0;
        for (int j = 0; j < n_; ++j) {
          double count = counts_[static_cast<size_t>(f) * n_ + j];
          if (j < w.n) count -= w.before[static_cast<size_t>(f) * w.n + j];
          if (count != 0.0) den[k] += inv_sigma_by_chooser_[static_cast<size_t>(j) * n_ + k] * count;
        }
      }
      for (int k = 0; k < n_; ++k) effective_[k] += den[k];
    }
    for (int j : tail_chooser_) {
      const double* inv_sigma = &inv_sigma_by_chooser_[static_cast<size_t>(j) * n_];
      for (int k = 0; k < n_; ++k) effective_[k] += inv_sigma[k];
    }
    for (const auto& [s, w] : excluded_tail_) {
      const double* inv_sigma =
          &inv_sigma_by_chooser_[static_cast<size_t>(tail_chooser_[s - used_]) * n_];
      for (int k = 0; k < n_; ++k) {
        if (window_of_[k] == w) effective_[k] -= inv_sigma[k];
      }
    }
  }

  // Moves the first `count` tail samples into their fine groups.
  void FoldTail(int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t s = used_ + i;
      const int64_t f = s % fine_;
      const int j = tail_chooser_[i];
      const double y = tail_reward_[i];
      const double* p = &tail_propensities_[static_cast<size_t>(i) * n_];
      const double* inv_sigma = &inv_sigma_by_chooser_[static_cast<size_t>(j) * n_];
      counts_[static_cast<size_t>(f) * n_ + j] += 1.0;
      double* den = &weights_[static_cast<size_t>(f) * n_];
      for (int k = 0; k < n_; ++k) den[k] += inv_sigma[k];
      // Left out of some windows (skipped while in the tail): their experts' counts and D
      // exclude it (their propensities of it are 0, so their sums have nothing of it).
      while (!excluded_tail_.empty() && excluded_tail_.front().first == s) {
        Window& w = windows_[excluded_tail_.front().second];
        w.before[static_cast<size_t>(f) * w.n + j] += 1.0;
        w.before_total[f] += 1.0;
        for (int k = 0; k < n_; ++k) {
          if (window_of_[k] == excluded_tail_.front().second) den[k] -= inv_sigma[k];
        }
        excluded_tail_.erase(excluded_tail_.begin());
      }
      if (y == 0.0) continue;
      const double yj = y / p[j];
      double* num = &weighted_[static_cast<size_t>(f) * n_];
      if (retired_[j]) {  // into the folded sums, under its fixed sigma
        double* folded = &retired_weighted_[static_cast<size_t>(f) * n_];
        for (int k : live_) {
          const double v = inv_sigma[k] * (yj * p[k]);
          folded[k] += v;
          num[k] += v;
        }
        continue;
      }
      double* sum = &sums_[Cell(f, j)];
      if (live() == n_) {
        for (int k = 0; k < n_; ++k) {
          const double v = yj * p[k];
          sum[k] += v;
          num[k] += inv_sigma[k] * v;
        }
        continue;
      }
      for (int b = 0; b < live(); ++b) {
        const int k = live_[b];
        const double v = yj * p[k];
        sum[b] += v;
        num[k] += inv_sigma[k] * v;
      }
    }
    tail_chooser_.erase(tail_chooser_.begin(), tail_chooser_.begin() + count);
    tail_reward_.erase(tail_reward_.begin(), tail_reward_.begin() + count);
    tail_propensities_.erase(tail_propensities_.begin(),
                             tail_propensities_.begin() + count * n_);
    used_ += count;
  }

  // Group means and widths for l groups over the used prefix [0, used_). A windowed
  // expert's groups hold its window's samples only; those with none are left out of its
  // median (none at all: mean 0, width +inf).
  void Regroup(int64_t l) {
    groups_ = l;
    grouped_used_ = used_;
    group_num_.assign(static_cast<size_t>(n_), 0.0);
    group_den_.assign(static_cast<size_t>(n_), 0.0);
    group_means_.resize(static_cast<size_t>(n_) * l);
    group_filled_.assign(static_cast<size_t>(n_), 0);
    window_sizes_.assign(windows_.size(), 0.0);
    std::fill(inv_min_weight_.begin(), inv_min_weight_.end(), 0.0);
    for (int64_t r = 0; r < l; ++r) {
      std::fill(group_num_.begin(), group_num_.end(), 0.0);
      std::fill(group_den_.begin(), group_den_.end(), 0.0);
      std::fill(window_sizes_.begin(), window_sizes_.end(), 0.0);
      for (int64_t f = r; f < fine_; f += l) {
        const double* num = &weighted_[static_cast<size_t>(f) * n_];
        const double* den = &weights_[static_cast<size_t>(f) * n_];
        for (int k = 0; k < n_; ++k) {
          group_num_[k] += num[k];
          group_den_[k] += den[k];
        }
        if (windows_.empty()) continue;
        double total = 0.0;
        for (int j = 0; j < n_; ++j) total += counts_[static_cast<size_t>(f) * n_ + j];
        for (size_t w = 0; w < windows_.size(); ++w) {
          window_sizes_[w] += total - windows_[w].before_total[f];
        }
      }
      // |group r| = the number of s < u with s mod l = r.
      const double size = static_cast<double>(used_ / l + (r < used_ % l ? 1 : 0));
      for (int k = 0; k < n_; ++k) {
        const double size_k = window_of_[k] < 0 ? size : window_sizes_[window_of_[k]];
        if (size_k == 0.0 || retired_[k]) continue;
        group_means_[static_cast<size_t>(k) * l + group_filled_[k]++] =
            group_num_[k] / group_den_[k];
        inv_min_weight_[k] = std::max(inv_min_weight_[k], size_k / group_den_[k]);
      }
    }
    for (int k = 0; k < n_; ++k) {
      if (retired_[k]) continue;  // Estimate reports its values at retirement
      if (group_filled_[k] == 0) {
        mean_[k] = 0.0;
        inv_min_weight_[k] = std::numeric_limits<double>::infinity();
        continue;
      }
      mean_[k] = MedianInPlace(
          absl::MakeSpan(&group_means_[static_cast<size_t>(k) * l], group_filled_[k]));
    }
  }

  const EstimatorOptions options_;
  const int64_t fine_;  // L
  DivergenceMatrix d_;
  int n_ = 0;
  std::vector<double> inv_sigma_by_chooser_;  // [j][k] = 1 / sigma_kj
  int64_t t_ = 0;
  int64_t used_ = 0;  // u(t): samples [0, u) are in the fine groups
  // Samples [used_, t_): choosers, rewards, propensities [sample][k].
  std::vector<int> tail_chooser_;
  std::vector<double> tail_reward_;
  std::vector<double> tail_propensities_;
  // The retired experts (Retire), their values at retirement, and the live ones in order
  // (live_[slot_[k]] = k; slot_[k] = -1 if retired).
  std::vector<char> retired_;
  std::vector<ExpertEstimate> frozen_;
  std::vector<double> frozen_effective_;
  std::vector<int> live_;
  std::vector<int> slot_;
  std::vector<double> sums_;      // S[f][slot j][slot k] = sum of Y r_kj, j and k live
  // R[f][k] = sum over retired choosers j of S[f][j][k] / sigma_kj (fixed sigma), k live
  std::vector<double> retired_weighted_;
  std::vector<double> counts_;    // n[f][j]
  std::vector<double> weighted_;  // F[f][k] = sum_j S[f][j][k] / sigma_kj
  std::vector<double> weights_;   // D[f][k] = sum_j n[f][j] / sigma_kj
  std::vector<double> effective_;  // sum over all t samples of 1 / sigma_kj
  int64_t cached_paper_ = -1;      // see Groups()
  int64_t cached_groups_ = 0;      // l(t_) once t_ > 0
  int64_t groups_ = 0;             // l of the cached medians
  int64_t grouped_used_ = 0;       // u of the cached medians
  std::vector<double> mean_;
  std::vector<double> inv_min_weight_;  // max_r |r| / W_k(r)
  std::vector<double> group_num_;       // scratch
  std::vector<double> group_den_;       // scratch
  std::vector<double> group_means_;     // scratch: [k][r]
  std::vector<int64_t> group_filled_;   // scratch: [k] groups with samples of k
  std::vector<double> window_sizes_;    // scratch: [w] samples of window w in a group
  std::vector<Window> windows_;
  std::vector<int> window_of_;  // [k]: expert k's window in windows_, or -1 (all samples)
  // Tail samples (s, window) a window leaves out, by s: applied as they are grouped.
  std::vector<std::pair<int64_t, int>> excluded_tail_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Estimator>> RestoreRoundRobinMedianOfMeans(
    const EstimatorOptions& options, StateReader& in) {
  return RoundRobinMedianOfMeans::Restore(options, in);
}

std::unique_ptr<Estimator> MakeRoundRobinMedianOfMeansEstimator(const EstimatorOptions& options,
                                                                int num_experts) {
  return std::make_unique<RoundRobinMedianOfMeans>(options, num_experts);
}

}  // namespace decision::internal
