// Incremental clipped importance-sampling estimator (eq. est1) in bounded state; see
// estimator.h.
//
// A_k = sum_j (1/M_kj) sum Y r_kj over the samples chosen by j whose clip test is within
// L(t) M_kj, Z_k = sum_j n_j / M_kj. Since M >= 1 and L(t) never decreases from t = 3 on
// (ClipLevel), a (sample, expert) entry with test <= L(t) is included now and for ever,
// whatever the divergences become: it is folded into the divergence-free sum
// folded[j][k] and forgotten. Only entries with Y > 0 and a larger test are kept, in two
// min-heaps: waiting (clipped now, keyed by test / M_kj, moved when L(t) M_kj reaches the
// test) and included (counted in A_k, keyed by test, folded when L(t) passes it). A change
// of M recomputes Z and A from the folded sums and the kept entries, O(N^2 + kept), and the
// dip of the paper's L at t = 3 does the same. Samples with Y = 0 add nothing to any
// numerator and are only counted. The kept entries are capped (max_kept_clipped).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/estimator.h"
#include "core/estimator_state.h"

namespace decision::internal {
namespace {

class ClippedEstimator final : public Estimator {
 public:
  ClippedEstimator(const EstimatorOptions& options, int num_experts)
      : options_(options), d_(DivergenceMatrix::Identity(0)) {
    Widen(num_experts);
    d_ = DivergenceMatrix::Identity(num_experts);
    Transpose();
  }

  absl::Status Add(int chooser, double reward, absl::Span<const double> p) override {
    if (absl::Status s = CheckSample(chooser, reward, p, n_); !s.ok()) return s;
    Learn(chooser, reward, p.data());
    return absl::OkStatus();
  }

  absl::Status Update(const SampleLog& log) override {
    if (absl::Status s = CheckLogMatches(log, n_, t_); !s.ok()) return s;
    for (int64_t s = t_; s < log.size(); ++s) {
      Learn(log.chooser(s), log.reward(s), log.propensities(s));
    }
    return absl::OkStatus();
  }

  absl::Status SetDivergences(const SampleLog& log, const DivergenceMatrix& d) override {
    // The log is read only for new experts' rows (their backfill).
    if (absl::Status s = CheckNewDivergences(log, d, n_, t_); !s.ok()) return s;
    const int old_n = n_;
    Widen(d.num_experts);
    d_ = d;
    Transpose();
    for (int64_t s = 0; s < t_ && n_ > old_n; ++s) {
      Insert(log.chooser(s), log.reward(s), log.propensities(s), old_n, /*classify=*/false);
    }
    Reclassify();
    EnforceCap();
    return absl::OkStatus();
  }

  ExpertEstimate Estimate(int k) const override {
    if (t_ == 0) return {0.0, std::numeric_limits<double>::infinity()};
    return {a_[k] / z_[k], ClippedWidth(options_, t_, z_[k])};
  }

  // The paper's width needs Lambert W per expert (~90 ns). Bound it first from a table
  // (a few ns), and evaluate it exactly only for experts whose upper bound reaches the best
  // lower bound: the result is the exact argmax.
  int ArgmaxUcb(const std::vector<bool>& selectable, absl::BitGenRef gen) const override {
    if (options_.width_rule != WidthRule::kPaper || t_ == 0) {
      return Estimator::ArgmaxUcb(selectable, gen);
    }
    const int n = d_.num_experts;
    const double tt = static_cast<double>(t_);
    const double scale = 1.5 * options_.constants.C;
    const double numerator = std::sqrt(options_.constants.c1 * tt * std::log(tt));
    // Pass 1: the best lower bound. Pass 2: exact values where the upper bound reaches it.
    // (Bounds are recomputed rather than stored so that const calls share no scratch.)
    double best_lower = -std::numeric_limits<double>::infinity();
    for (int k = 0; k < n; ++k) {
      double w_low, w_high;
      if (selectable[k] && InverseLogRatioBounds(numerator / z_[k], &w_low, &w_high)) {
        best_lower = std::max(best_lower, a_[k] / z_[k] + scale * w_low);
      }
    }
    int best = -1, ties = 0;
    double best_value = 0.0;
    for (int k = 0; k < n; ++k) {
      if (!selectable[k]) continue;
      double w_low, w_high;
      if (InverseLogRatioBounds(numerator / z_[k], &w_low, &w_high) &&
          a_[k] / z_[k] + scale * w_high < best_lower) {
        continue;
      }
      const ExpertEstimate e = Estimate(k);
      OfferCandidate(k, e.mean + e.width, gen, &best, &best_value, &ties);
    }
    return best;
  }
  absl::StatusOr<std::unique_ptr<ExpertRows>> NewExpertRows(int count,
                                                            int64_t first) const override {
    if (count < 1) {
      return absl::InvalidArgumentError(absl::StrCat("cannot add ", count, " experts"));
    }
    if (first != 0) {
      return absl::UnimplementedError(
          "the clipped estimator has no windows: new experts' rows cover every sample");
    }
    return std::make_unique<Rows>(options_, n_, count, fold_level_);
  }

  absl::Status AddExperts(std::unique_ptr<ExpertRows> rows,
                          const DivergenceMatrix& d) override {
    Rows* r = dynamic_cast<Rows*>(rows.get());
    if (r == nullptr) {
      return absl::InvalidArgumentError("the rows were not started by this kind of estimator");
    }
    if (r->old_n != n_ || r->seen != t_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the rows were started for ", r->old_n, " experts and cover ", r->seen,
          " samples; the estimator has ", n_, " and ", t_));
    }
    if (absl::Status s = ValidateDivergenceMatrix(d, n_ + r->m); !s.ok()) return s;
    const int old_n = n_;
    Widen(n_ + r->m);
    d_ = d;
    Transpose();
    for (int j = 0; j < old_n; ++j) {
      for (int e = 0; e < r->m; ++e) {
        folded_[Cell(j, old_n + e)] += r->folded[static_cast<size_t>(j) * r->m + e];
      }
    }
    for (Entry& e : r->kept) {
      e.k += old_n;
      waiting_.push_back(e);  // Reclassify sorts it
    }
    dropped_ += r->dropped;
    Reclassify();
    EnforceCap();
    return absl::OkStatus();
  }

  absl::Status SnapshotTo(std::string* buffer) const override {
    std::string& out = *buffer;
    out.clear();
    out.reserve(8 * (d_.m.size() + d_.sigma.size() + counts_.size() + folded_.size() +
                     z_.size() + a_.size()) +
                sizeof(Entry) * (waiting_.size() + included_.size()) + 256);
    StateWriter w(&out);
    w.Raw(kStateMagic, 4);
    const uint8_t kind = static_cast<uint8_t>(EstimatorKind::kClipped);
    w.Raw(&kind, 1);
    WriteDivergences(w, d_);
    w.Int(t_);
    w.Array(counts_);
    w.Array(folded_);
    w.Array(z_);
    w.Array(a_);
    w.Array(waiting_);
    w.Array(included_);
    w.Int(dropped_);
    w.Int(folded_early_);
    return absl::OkStatus();
  }

  // The state Snapshot() wrote, checked before anything is sized from it. The levels are
  // recomputed from t (as Learn computes them), not read.
  static absl::StatusOr<std::unique_ptr<Estimator>> Restore(const EstimatorOptions& options,
                                                            StateReader& in) {
    auto e = std::make_unique<ClippedEstimator>(options, 0);
    DivergenceMatrix d;
    if (!ReadDivergences(in, &d)) return in.Error("divergences");
    if (absl::Status s = ValidateDivergenceMatrix(d, d.num_experts); !s.ok()) {
      return in.Error(s.message());
    }
    const int64_t n = d.num_experts;
    int64_t t;
    if (!in.Int(&t) || t < 0) return in.Error("the sample count");
    constexpr int64_t kAny = std::numeric_limits<int64_t>::max();
    if (!in.Array(&e->counts_, n) || !in.Array(&e->folded_, n * n) || !in.Array(&e->z_, n) ||
        !in.Array(&e->a_, n) || !in.ArrayUpTo(&e->waiting_, kAny) ||
        !in.ArrayUpTo(&e->included_, kAny) || !in.Int(&e->dropped_) ||
        !in.Int(&e->folded_early_)) {
      return in.Error("arrays");
    }
    // The values' domains, which the estimates rely on (a damaged value that passes gives
    // wrong estimates, never an invalid computation): counts that sum to t, Z > 0 once there
    // are samples, sums and entries finite and >= 0.
    double total = 0.0;
    for (double c : e->counts_) total += c;
    if (!AllWithin(e->counts_, 0.0, static_cast<double>(t)) || total != static_cast<double>(t) ||
        !AllWithin(e->z_, t > 0 ? 1e-300 : 0.0, kAnyFinite) ||
        !AllWithin(e->a_, 0.0, kAnyFinite) || !AllWithin(e->folded_, 0.0, kAnyFinite) ||
        e->dropped_ < 0 || e->folded_early_ < 0) {
      return in.Error("a count or sum out of its domain");
    }
    for (const std::vector<Entry>* heap : {&e->waiting_, &e->included_}) {
      for (const Entry& entry : *heap) {
        if (entry.k < 0 || entry.k >= n || entry.j < 0 || entry.j >= n) {
          return in.Error("a kept entry of an expert out of range");
        }
        if (!(entry.test >= 0.0 && entry.test <= kAnyFinite && entry.value >= 0.0 &&
              entry.value <= kAnyFinite && entry.key >= 0.0 && entry.key <= kAnyFinite)) {
          return in.Error("a kept entry's value out of its domain");
        }
      }
      if (!std::is_heap(heap->begin(), heap->end(), Later)) return in.Error("a heap out of order");
    }
    e->n_ = static_cast<int>(n);
    e->d_ = std::move(d);
    e->Transpose();
    e->t_ = t;
    if (t > 0) {
      e->level_ = ClipLevel(options, t);
      e->fold_level_ =
          t >= 3 ? e->level_ * (1.0 - 1e-9) : -std::numeric_limits<double>::infinity();
    }
    return e;
  }

  double EffectiveSampleSize(int k) const override { return z_[k]; }
  EstimatorStats Stats() const override {
    EstimatorStats stats;
    stats.state_bytes = static_cast<int64_t>(
        8 * (folded_.size() + counts_.size() + z_.size() + a_.size() + m_by_chooser_.size() +
             inv_m_by_chooser_.size() + d_.m.size() + d_.sigma.size()) +
        sizeof(Entry) * (waiting_.capacity() + included_.capacity()));
    stats.clipped_kept = static_cast<int64_t>(waiting_.size() + included_.size());
    stats.clipped_dropped = dropped_;
    stats.clipped_folded_early = folded_early_;
    return stats;
  }
  int64_t num_samples() const override { return t_; }
  int num_experts() const override { return n_; }
  const DivergenceMatrix& divergences() const override { return d_; }

 private:
  // A (sample, expert k) pair with Y > 0 that some M_kj >= 1 could still clip: its test
  // exceeds the fold level. In waiting_ (test > L(t) M_kj: clipped now) keyed by test / M_kj,
  // or in included_ (counted in A_k) keyed by test, until L(t) passes the test.
  struct Entry {
    double key;
    double test;   // the clip test value, compared exactly against L(t) * M_kj
    double value;  // Y r_kj, counted in A_k as value / M_kj
    int32_t k;
    int32_t j;
  };
  static_assert(sizeof(Entry) == 32, "Entry is stored as raw bytes (Snapshot)");
  static bool Later(const Entry& a, const Entry& b) { return a.key > b.key; }  // min-heap

  // New experts' rows over the samples seen (see NewExpertRows): the folded sums of the
  // entries under the fold level when the rows were started (it only grows), and the other
  // entries with Y > 0, which AddExperts reclassifies. Past 2 max_kept_clipped kept entries
  // those with the largest tests are dropped, down to max_kept_clipped (their M is not
  // known yet), and counted as dropped.
  struct Rows final : public ExpertRows {
    Rows(const EstimatorOptions& options, int old_experts, int new_experts, double fold)
        : clip_test(options.clip_test),
          cap(options.max_kept_clipped),
          old_n(old_experts),
          m(new_experts),
          fold_level(fold),
          folded(static_cast<size_t>(old_experts) * new_experts, 0.0) {}

    absl::Status Add(int j, double y, double pj, absl::Span<const double> p) override {
      if (absl::Status s = CheckRowSample(j, y, pj, p, old_n, m); !s.ok()) return s;
      ++seen;
      if (y == 0.0) return absl::OkStatus();
      for (int e = 0; e < m; ++e) {
        const double r = p[e] / pj;
        const double value = y * r;
        const double test = clip_test == ClipTest::kRatio ? r : value;
        if (test <= fold_level) {
          folded[static_cast<size_t>(j) * m + e] += value;
        } else {
          kept.push_back({0.0, test, value, e, j});
        }
      }
      if (cap > 0 && static_cast<int64_t>(kept.size()) > 2 * cap) {
        const int64_t drop = static_cast<int64_t>(kept.size()) - cap;
        std::nth_element(kept.begin(), kept.begin() + drop, kept.end(),
                         [](const Entry& a, const Entry& b) { return a.test > b.test; });
        kept.erase(kept.begin(), kept.begin() + drop);
        dropped += drop;
      }
      return absl::OkStatus();
    }
    int64_t num_samples() const override { return seen; }

    const ClipTest clip_test;
    const int64_t cap;
    const int old_n;
    const int m;
    const double fold_level;
    int64_t seen = 0;
    std::vector<double> folded;  // [j][e]
    std::vector<Entry> kept;     // k = the new expert's index e, until AddExperts
    int64_t dropped = 0;
  };

  size_t Cell(int j, int k) const { return static_cast<size_t>(j) * n_ + k; }

  void Learn(int j, double y, const double* p) {
    ++t_;
    const double level = ClipLevel(options_, t_);
    const bool dipped = level < level_;
    level_ = level;
    // L(t) never decreases from t = 3 on (estimator.h), so an entry whose test is below
    // it is included under every later level and every M >= 1. The margin absorbs the
    // rounding of L's evaluation.
    fold_level_ = t_ >= 3 ? level_ * (1.0 - 1e-9) : -std::numeric_limits<double>::infinity();
    if (dipped) {
      Reclassify();
    } else {
      Release();
    }
    Insert(j, y, p, 0, /*classify=*/true);
    EnforceCap();
  }

  // Re-lays the per-pair state out for n >= n_ experts; new entries are zero.
  void Widen(int n) {
    if (n == n_) return;
    std::vector<double> folded(static_cast<size_t>(n) * n, 0.0);
    for (int j = 0; j < n_; ++j) {
      std::copy_n(&folded_[Cell(j, 0)], n_, &folded[static_cast<size_t>(j) * n]);
    }
    folded_.swap(folded);
    counts_.resize(n, 0.0);
    z_.resize(n, 0.0);
    a_.resize(n, 0.0);
    n_ = n;
  }

  // Adds a sample (chooser j, reward y, propensities p) to the rows of experts
  // [first_k, N). With `classify`, at the current levels and M (a new sample: counts it and
  // keeps Z and A); otherwise the caller reclassifies (only the folded sums are final).
  void Insert(int j, double y, const double* p, int first_k, bool classify) {
    if (classify) {
      counts_[j] += 1.0;
      const double* inv_m_row = &inv_m_by_chooser_[Cell(j, 0)];
      for (int k = first_k; k < n_; ++k) z_[k] += inv_m_row[k];
    }
    if (y == 0.0) return;
    const double pj = p[j];
    const double* m_row = &m_by_chooser_[Cell(j, 0)];
    const double* inv_m_row = &inv_m_by_chooser_[Cell(j, 0)];
    double* folded_row = &folded_[Cell(j, 0)];
    for (int k = first_k; k < n_; ++k) {
      const double r = p[k] / pj;
      const double value = y * r;
      const double test = options_.clip_test == ClipTest::kRatio ? r : value;
      if (test <= fold_level_) {
        folded_row[k] += value;
        if (classify) a_[k] += value * inv_m_row[k];
      } else if (!classify) {
        waiting_.push_back({0.0, test, value, k, j});  // Reclassify sorts it
      } else if (test <= level_ * m_row[k]) {
        a_[k] += value * inv_m_row[k];
        Push(&included_, {test, test, value, k, j});
      } else {
        Push(&waiting_, {test / m_row[k], test, value, k, j});
      }
    }
  }

  static void Push(std::vector<Entry>* heap, const Entry& e) {
    heap->push_back(e);
    std::push_heap(heap->begin(), heap->end(), Later);
  }
  static Entry Pop(std::vector<Entry>* heap) {
    std::pop_heap(heap->begin(), heap->end(), Later);
    const Entry e = heap->back();
    heap->pop_back();
    return e;
  }

  // After L(t) grew: entries it now includes move to included_, and included entries below
  // the fold level into the folded sums.
  void Release() {
    while (!waiting_.empty()) {
      const Entry& w = waiting_.front();
      if (!(w.test <= level_ * m_by_chooser_[Cell(w.j, w.k)])) break;
      Entry e = Pop(&waiting_);
      a_[e.k] += e.value * inv_m_by_chooser_[Cell(e.j, e.k)];
      e.key = e.test;
      Push(&included_, e);
    }
    while (!included_.empty() && included_.front().test <= fold_level_) {
      const Entry e = Pop(&included_);
      folded_[Cell(e.j, e.k)] += e.value;
    }
  }

  // Z, A and both heaps from the folded sums, the counts and the kept entries, under the
  // current M and levels.
  void Reclassify() {
    std::vector<Entry> kept;
    kept.reserve(waiting_.size() + included_.size());
    kept.insert(kept.end(), waiting_.begin(), waiting_.end());
    kept.insert(kept.end(), included_.begin(), included_.end());
    waiting_.clear();
    included_.clear();
    std::fill(z_.begin(), z_.end(), 0.0);
    std::fill(a_.begin(), a_.end(), 0.0);
    for (int j = 0; j < n_; ++j) {
      const double* inv_m_row = &inv_m_by_chooser_[Cell(j, 0)];
      const double* folded_row = &folded_[Cell(j, 0)];
      for (int k = 0; k < n_; ++k) {
        z_[k] += counts_[j] * inv_m_row[k];
        a_[k] += folded_row[k] * inv_m_row[k];
      }
    }
    for (Entry& e : kept) {
      const double m = m_by_chooser_[Cell(e.j, e.k)];
      if (e.test <= fold_level_) {
        folded_[Cell(e.j, e.k)] += e.value;
        a_[e.k] += e.value / m;
      } else if (e.test <= level_ * m) {
        a_[e.k] += e.value / m;
        e.key = e.test;
        included_.push_back(e);
      } else {
        e.key = e.test / m;
        waiting_.push_back(e);
      }
    }
    std::make_heap(waiting_.begin(), waiting_.end(), Later);
    std::make_heap(included_.begin(), included_.end(), Later);
  }

  // Keeps at most max_kept_clipped entries: beyond it, down to three quarters of it, first
  // the waiting entries that would be released last are dropped (clipped for good), then
  // the included entries nearest to the fold level are folded (counted for good).
  void EnforceCap() {
    const int64_t cap = options_.max_kept_clipped;
    const auto kept = [&] { return static_cast<int64_t>(waiting_.size() + included_.size()); };
    if (cap == 0 || kept() <= cap) return;
    int64_t excess = kept() - cap * 3 / 4;
    if (excess > 0 && !waiting_.empty()) {
      const int64_t drop = std::min<int64_t>(excess, static_cast<int64_t>(waiting_.size()));
      std::nth_element(waiting_.begin(), waiting_.begin() + drop, waiting_.end(),
                       [](const Entry& a, const Entry& b) { return a.key > b.key; });
      waiting_.erase(waiting_.begin(), waiting_.begin() + drop);
      std::make_heap(waiting_.begin(), waiting_.end(), Later);
      dropped_ += drop;
      excess -= drop;
    }
    for (; excess > 0 && !included_.empty(); --excess) {
      const Entry e = Pop(&included_);
      folded_[Cell(e.j, e.k)] += e.value;
      ++folded_early_;
    }
  }

  // M and 1/M indexed [chooser j][expert k], so one sample reads one contiguous row.
  void Transpose() {
    m_by_chooser_.resize(static_cast<size_t>(n_) * n_);
    inv_m_by_chooser_.resize(static_cast<size_t>(n_) * n_);
    for (int j = 0; j < n_; ++j) {
      for (int k = 0; k < n_; ++k) {
        m_by_chooser_[Cell(j, k)] = d_.M(k, j);
        inv_m_by_chooser_[Cell(j, k)] = 1.0 / d_.M(k, j);
      }
    }
  }

  const EstimatorOptions options_;
  DivergenceMatrix d_;
  int n_ = 0;
  std::vector<double> m_by_chooser_;
  std::vector<double> inv_m_by_chooser_;
  int64_t t_ = 0;
  double level_ = -std::numeric_limits<double>::infinity();       // L(t_)
  double fold_level_ = -std::numeric_limits<double>::infinity();  // see Update
  std::vector<double> counts_;  // n_j
  std::vector<double> folded_;  // [j][k]: sum of Y r_kj over folded entries
  std::vector<double> z_;       // Z_k
  std::vector<double> a_;       // A_k
  std::vector<Entry> waiting_;  // heaps, see Entry
  std::vector<Entry> included_;
  int64_t dropped_ = 0;
  int64_t folded_early_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Estimator>> RestoreClippedEstimator(const EstimatorOptions& options,
                                                                   StateReader& in) {
  return ClippedEstimator::Restore(options, in);
}

std::unique_ptr<Estimator> MakeClippedEstimator(const EstimatorOptions& options,
                                                int num_experts) {
  return std::make_unique<ClippedEstimator>(options, num_experts);
}

}  // namespace decision::internal
