// Divergences between stochastic experts (DESIGN.md section 2), estimated from a bounded
// reservoir of contexts with a median of means over the reservoir.
//
//   D_f(pi_i || pi_j) = E_x [ sum_v pi_j(v|x) f(pi_i(v|x) / pi_j(v|x)) ]
//   f1(z) = z exp(z - 1) - 1:  M_ij = 1 + log(1 + D_f1(pi_i || pi_j))
//                                   = 1 + log E_x [ sum_v pi_i(v|x) exp(pi_i/pi_j - 1) ]
//   f2(z) = z^2 - 1:          sigma_ij^2 = 1 + D_f2(pi_i || pi_j)
//                                   = E_x [ sum_v pi_i(v|x)^2 / pi_j(v|x) ]
//
// The expectation over x is a median of means: the reservoir's contexts, in reservoir order,
// are split into G contiguous groups of floor(R/G) contexts (the last R mod G are unused);
// the estimate is the median of the G group means. M is computed in log space throughout
// (the per-context sum for f1 reaches exp(K/eta) for smoothed experts), so no intermediate
// overflows: M_ij and sigma_ij are finite and >= 1 for any distributions with positive
// entries. Results are clamped below at 1, the exact lower bound (both per-context sums are
// >= 1 by Jensen and Cauchy-Schwarz), to absorb rounding.
//
// Thread safety: ContextReservoir is not thread-safe; the free functions are pure.
#ifndef DECISION_CORE_DIVERGENCE_H_
#define DECISION_CORE_DIVERGENCE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/random/bit_gen_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/expert.h"

namespace decision {

// M_ij and sigma_ij for N experts, row-major N x N. Diagonals are 1.
struct DivergenceMatrix {
  int num_experts = 0;
  std::vector<double> m;      // M_ij = 1 + log(1 + D_f1(pi_i || pi_j))
  std::vector<double> sigma;  // sigma_ij = sqrt(1 + D_f2(pi_i || pi_j))

  // All-ones matrices: no information about divergences yet (treats experts as identical
  // for weighting; every estimator remains well defined).
  static DivergenceMatrix Identity(int num_experts);
  double M(int i, int j) const { return m[static_cast<size_t>(i) * num_experts + j]; }
  double Sigma(int i, int j) const { return sigma[static_cast<size_t>(i) * num_experts + j]; }
};

struct DivergenceOptions {
  int reservoir_capacity = 2048;  // contexts kept (uniform reservoir sample of all seen)
  int num_groups = 16;            // median-of-means groups over the reservoir
};
absl::Status ValidateDivergenceOptions(const DivergenceOptions& options);

// A uniform random sample of at most `capacity` contexts from all contexts offered
// (Vitter's algorithm R). Randomness is passed in.
// A context may carry the arms eligible for it (Expert::PredictBatchEligible), kept with
// its row.
class ContextReservoir {
 public:
  ContextReservoir(int num_features, int capacity);
  void Offer(absl::Span<const double> x, absl::BitGenRef gen) { Offer(x, {}, gen); }
  // The same draws as Offer(x, gen): the eligible arms do not change which rows are kept.
  void Offer(absl::Span<const double> x, absl::Span<const int32_t> eligible,
             absl::BitGenRef gen);
  size_t size() const { return size_; }
  int64_t seen() const { return seen_; }
  int num_features() const { return num_features_; }
  // Row-major size() x num_features().
  absl::Span<const double> contexts() const {
    return absl::MakeConstSpan(rows_.data(), size_ * num_features_);
  }
  // One stamp per row: it changes whenever the row is written (and only then), and a
  // stamp is never reused by this reservoir. A caller that kept something computed from a
  // row (an expert's prediction on it) knows it is still valid while the stamp is the same.
  absl::Span<const uint64_t> stamps() const { return stamps_; }
  // One entry per row: its eligible arms, empty for every arm. A row's stamp covers them.
  const std::vector<std::vector<int32_t>>& eligible() const { return eligible_; }
  // Whether some row has eligible arms.
  bool any_eligible() const { return restricted_rows_ > 0; }
  // Restores a reservoir from stored rows and the count of contexts seen, with the rows'
  // eligible arms (empty: none restricted; else one entry per row). Every row gets a new
  // stamp.
  void Reset(std::vector<double> rows, int64_t seen,
             std::vector<std::vector<int32_t>> eligible = {});

 private:
  int num_features_;
  int capacity_;
  size_t size_ = 0;
  int64_t seen_ = 0;
  uint64_t next_stamp_ = 1;
  std::vector<double> rows_;
  std::vector<uint64_t> stamps_;
  std::vector<std::vector<int32_t>> eligible_;
  size_t restricted_rows_ = 0;  // rows with a non-empty eligible_ entry
};

// Per-context quantities for the pair (i, j), given the two distributions over K arms:
//   log_f1_term = log sum_v pi_i(v) exp(pi_i(v)/pi_j(v) - 1)
//   f2_term     = sum_v pi_i(v)^2 / pi_j(v)
// REQUIRES: equal sizes; pi_j(v) > 0, or pi_i(v) = pi_j(v) = 0 (an arm not eligible).
double LogF1Term(absl::Span<const double> pi_i, absl::Span<const double> pi_j);
double F2Term(absl::Span<const double> pi_i, absl::Span<const double> pi_j);

// Bounds on what one divergence computation holds (ComputeDivergences). It reads N x R x K
// predictions: at a problem's caps (N = 256 experts, K = 4096 arms, R = 2048 contexts)
// 17 GB held at once, twice that with their logarithms. Its cost, O(pairs x R x K), is
// bounded where experts are admitted (the service's --max_divergence_terms).
struct DivergenceLimits {
  // Bytes of predictions (with their logarithms) held at once for all the experts read:
  // the contexts are read in blocks of rows that fit (at least one row). Only the
  // log-sum-exp over a group's contexts is taken across blocks, so smaller blocks change
  // results in the last bits only, and a block of a whole group (any problem whose
  // experts' predictions on a group of contexts fit) not at all.
  int64_t max_block_bytes = int64_t{64} << 20;
};

// What one computation read.
struct DivergenceWork {
  size_t rows_read = 0;   // contexts read: groups x their size (0 if no pair is computed)
  size_t block_rows = 0;  // contexts read at a time
  int64_t terms = 0;      // per-context terms evaluated: pairs computed x rows_read x K
};

// How a computation may spread its work over threads. Each block's predictions (by expert)
// and its terms (by pair) are split into at most `tasks` tasks, which `run(n, fn)` runs:
// fn(0), ..., fn(n - 1), each once, possibly at once on several threads, returning when
// all have run. Null `run`: in order, on the calling thread. Every pair's sums are made
// in the same order whatever the split: the results do not depend on it.
struct DivergenceThreads {
  int tasks = 1;
  std::function<void(int, absl::FunctionRef<void(int)>)> run;
};

// Writes `out` ((end - begin) x K, row-major) with `expert`'s distributions on contexts
// [begin, end) of the R. Called once per block of contexts for each expert read, blocks
// in increasing order; with DivergenceThreads, for several experts at once. An error
// stops the computation; the first expert's error (in expert order) is returned as is.
using PredictContexts = absl::FunctionRef<absl::Status(int expert, size_t begin, size_t end,
                                                       absl::Span<double> out)>;

// Divergences of `num_experts` experts from their predictions on `num_rows` contexts,
// read through `predict` in blocks within `limits` (above), spread over `threads`.
// Otherwise as the overloads below, which read the predictions from memory. `work`
// (optional) says what was read.
absl::Status ComputeDivergences(int num_experts, size_t num_rows, PredictContexts predict,
                                int num_arms, int num_groups, const DivergenceMatrix* previous,
                                int keep, DivergenceMatrix* out, absl::Span<const bool> fixed,
                                absl::Span<const bool> absent, const DivergenceLimits& limits,
                                DivergenceWork* work = nullptr,
                                const DivergenceThreads& threads = {});

// One divergence computation (the first overload of ComputeDivergences, which runs one to
// the end), resumable between steps of a few pairs of experts over a block of contexts: a
// caller with a time budget runs a few steps per visit and comes back (the service's
// expert-pool round, so that one problem's computation on thousands of arms does not hold
// up every other problem's backfill). It gives the same results bit for bit however its
// work is spread over calls. Between calls it holds the plan, one block's predictions
// (within DivergenceLimits) and a few sums per pair and group.
//
// Thread safety: none; Step spreads its own work over `threads`.
class DivergenceComputation {
 public:
  // Validates the arguments (as ComputeDivergences) and plans the pairs, the experts read
  // and the blocks: no prediction is read. `previous` is read here only.
  static absl::StatusOr<DivergenceComputation> Start(
      int num_experts, size_t num_rows, int num_arms, int num_groups,
      const DivergenceMatrix* previous, int keep, absl::Span<const bool> fixed,
      absl::Span<const bool> absent, const DivergenceLimits& limits);

  // Computes the next pairs of the current block of contexts, as many as `max_terms`
  // per-context terms allow (at least one pair), after reading the block's predictions
  // when this is its first step. A step never goes past the end of a block, so that a
  // caller with a time budget can stop between steps of a few milliseconds each. An error
  // from `predict`, or a probability it gives that divergences cannot take, is returned
  // (the first expert's, in expert order) and ends the computation: Start a new one to try
  // again.
  absl::Status Step(PredictContexts predict, int64_t max_terms,
                    const DivergenceThreads& threads = {});
  bool done() const { return next_block_ == blocks_ && !failed_; }
  // Blocks computed so far, and in all (groups x blocks per group; 0 when no pair is
  // computed); the share of the work done (1 when done).
  int64_t blocks_done() const { return next_block_; }
  int64_t blocks() const { return blocks_; }
  double progress() const;
  const DivergenceWork& work() const { return work_; }
  // REQUIRES: done(). The matrix, moved out.
  DivergenceMatrix Take();

 private:
  DivergenceComputation() = default;
  // Medians of the groups' means into d_, once every block is computed.
  void Finish();

  int n_ = 0;
  size_t k_ = 0;
  int groups_ = 0;
  size_t group_size_ = 0;
  size_t block_ = 0;               // contexts per block
  int64_t blocks_per_group_ = 0;
  int64_t blocks_ = 0;
  int64_t next_block_ = 0;         // the next block to compute: group x blocks_per_group_ + i
  size_t next_pair_ = 0;           // its next pair (0: its predictions are not read yet)
  bool failed_ = false;
  DivergenceWork work_;
  DivergenceMatrix d_;             // the copied entries from the start, the rest at Finish
  std::vector<std::pair<int, int>> pairs_;  // the pairs computed, in row-major order
  std::vector<int> readers_;       // the experts read, in order
  std::vector<bool> logs_;         // experts whose logarithms a pair reads (as pi_i)
  // One block of predictions (and logarithms) per expert read.
  std::vector<std::vector<double>> pi_, log_pi_;
  size_t kernel_rows_ = 0;         // contexts per kernel call (its scratch within 256 KB)
  struct Scratch {
    std::vector<double> log_terms, f2_terms, terms;
  };
  std::vector<Scratch> scratch_;
  // Per pair and group: the log of the mean of exp(log f1 term), and the mean f2 term.
  std::vector<double> log_means_, means_;
  // Per pair, over the current group: log-sum-exp as a running maximum and a sum shifted by
  // it (with one block per group, the same operations as LogSumExp), and the f2 sum.
  std::vector<double> lse_max_, lse_sum_, f2_sum_;
};

// Divergences from predictions on R contexts. `predictions[e]` is expert e's R x K
// distributions, row-major. Pairs (i, j) with both i, j < keep are copied from `previous`
// (which must cover them); all others are computed. keep = 0 computes everything.
// `fixed` (empty, or one flag per expert): the pairs (i, j) with a flagged i or j, both
// < previous->num_experts, are copied from `previous` too (the pairs of retired and failed
// experts, fixed at their retirement or failure: Estimator::Retire). Of the pairs of a
// flagged expert f with an expert `previous` does not cover, (j, f) is computed and (f, j)
// is 1: f's row is read by no estimate (Estimator::Retire drops it; a failed expert's
// estimate is not reported), so only what weighs f's samples in j's estimate is needed.
// `absent` (empty, or one flag per expert): the pairs with a flagged expert that are not
// copied are 1 (M and sigma), not computed, and a flagged expert's predictions are not read
// (they may be empty): an expert whose pairs weigh no sample (a retired one none of whose
// samples is kept).
// Cost: O((N^2 - keep^2 - fixed and absent pairs) * R * K).
// A context whose eligible arms were restricted (Expert::PredictBatchEligible) has
// probability 0 for the other arms under every expert: the sums run over its eligible arms.
// Returns INVALID_ARGUMENT for mismatched sizes, no contexts, a probability outside [0, 1],
// or a 0 where another expert's probability is positive.
absl::Status ComputeDivergences(absl::Span<const absl::Span<const double>> predictions,
                                int num_arms, int num_groups, const DivergenceMatrix* previous,
                                int keep, DivergenceMatrix* out,
                                absl::Span<const bool> fixed = {},
                                absl::Span<const bool> absent = {});
// The same, from one vector per expert.
absl::Status ComputeDivergences(absl::Span<const std::vector<double>> predictions,
                                int num_arms, int num_groups, const DivergenceMatrix* previous,
                                int keep, DivergenceMatrix* out,
                                absl::Span<const bool> fixed = {},
                                absl::Span<const bool> absent = {});

// Convenience: predicts every expert on the reservoir's contexts, then ComputeDivergences.
absl::Status EstimateDivergences(absl::Span<const Expert* const> experts,
                                 const ContextReservoir& reservoir, int num_groups,
                                 DivergenceMatrix* out);

}  // namespace decision

#endif  // DECISION_CORE_DIVERGENCE_H_
