// Engine micro-benchmarks (Google Benchmark): the incremental estimators behind D-UCB
// against the literal from-scratch reference, and the Choose decision. See bench/README.md.
//
//   BM_IncrementalUpdate/<estimator>/N   one reward update, DUcb::Learn (log append +
//                                        incremental estimator update), N experts, after a
//                                        10k-sample warm-up. items/s = updates/s.
//   BM_Choose/<estimator>/N              DUcb::SelectExpert after a 10k-sample warm-up: the
//                                        argmax of mean + width over N experts (no model is
//                                        evaluated). items/s = decisions/s.
//   BM_Choose/median_of_means/161/<how>128  the same with 128 of 161 experts out of the
//                                        choice: "unselectable" (the baseline) or "retired"
//                                        (Estimator::Retire, the estimator's own loop).
//   BM_IncrementalAt/<estimator>/t       DUcb::Learn with N = 32 and the log pre-filled to t.
//   BM_ReferenceEstimateAll/<estimator>/t
//                                        reference::Estimate for all 32 experts from samples
//                                        [0, t): what a service without incremental state
//                                        would do per reward. Counter speedup_vs_incremental
//                                        = this time / the incremental update time measured
//                                        in the same run at the same t (inc_ns_per_update).
//   BM_DivergenceRefresh/<estimator>/N   DUcb::SetDivergences with a changed matrix over a
//                                        10k-sample log (the O(N t) rebuild).
//   BM_RefreshLockHold/<estimator>/<form>/t  what a divergence refresh holds the server's
//                                        problem lock for, N = 32, log of t samples:
//                                        "set_divergences" is SetDivergences (the O(N t)
//                                        rebuild, the baseline); "swap_in" is
//                                        SwapInEstimator after RebuildEstimator ran on a
//                                        shared prefix (untimed; counter rebuild_ms) and
//                                        1000 samples arrived meanwhile (the catch-up).
//   BM_StateSnapshot/<estimator>/<form>/N  the estimator's state after 10k samples, N
//                                        experts: "save" is DUcb::Snapshot (what decisiond
//                                        does under the problem lock when a checkpoint
//                                        carries the state) into a fresh string,
//                                        "save_reused" DUcb::SnapshotTo into a kept buffer
//                                        (what decisiond does), "restore" RestoreEstimator
//                                        (a restart). Counter state_mb = its size.
//   BM_ScoreLinearExperts/<form>/32      the propensities of one joined sample under 32
//                                        linear softmax experts (K = 26, d = 16): "scalar"
//                                        is the plain loop with std::exp (the baseline),
//                                        "expert" the experts' vectorised kernels.
//   BM_DivergenceTerms/<form>/32         the per-context terms of the divergences between
//                                        all 992 ordered pairs of 32 linear experts over 256
//                                        contexts (K = 26): "scalar" is the per-context loop
//                                        with std::exp (the baseline, the form before the
//                                        kernel), "kernel" DivergenceTerms (core/kernels.h).
//                                        items/s = (pair, context) terms per second.
//   BM_NewExpertDivergences/<form>       the divergences of one new expert against 160
//                                        others, as a letter replay's last boundaries
//                                        compute them (N = 161: 128 retired, 32 live, the
//                                        new one; R = 2048 contexts, K = 26, 16 groups):
//                                        "every_pair" computes both directions with every
//                                        expert (the baseline, before retired experts'
//                                        rows were left at 1), "retired_rows" leaves the
//                                        128 retired rows at 1, "unloaded" also skips 80
//                                        retired experts unloaded (no kept sample of
//                                        theirs). Items = pairs computed.
//   BM_DivergenceRefreshThreads/<n>x<K>/<t>  a whole refresh (every ordered pair of n
//                                        experts, R = 2048, 16 groups) split into t tasks
//                                        (DivergenceThreads), t - 1 of them on threads
//                                        started per step; real time. Items = terms.
//   BM_UpdateLatency/<estimator>/32      the distribution of single-Learn latencies (p50,
//                                        p99, p99.9, max, in us) over the first 300k samples
//                                        of a fresh D-UCB with N = 32: the mean hides the
//                                        occasional expensive update (group refresh, storage
//                                        growth). One iteration; read the counters.
//   BM_ScoreXgboost/<model>/<form>       the cost per row of scoring trained XGBoost experts
//                                        (K = 26, d = 16, trained on bench/data/letter.csv
//                                        with core/xgboost_trainer): "row" is one
//                                        Expert::Predict per row (what every Reward does per
//                                        expert), "batch<n>" one PredictBatch over n rows
//                                        (what a backfill or a divergence refresh can do).
//                                        items/s = rows scored per second. Counters:
//                                        speedup_vs_row = the per-row cost of "row" (timed
//                                        in the same benchmark before the loop) / this
//                                        form's; read_syscalls_per_call = read(2) calls
//                                        per Predict/PredictBatch (/proc/self/io syscr).
//                                        /threads:2: two threads scoring on one expert at
//                                        once; items/s is the total over both (real time).
//                                        Models score with their compiled form
//                                        (core/xgboost_forest.h: trees or gblinear);
//                                        <model>-libxgboost is the same model through
//                                        libxgboost's predictor.
//
// Data: a fixed-seed synthetic stream of K = 26 arm samples. Every context has a base
// distribution over arms (Dirichlet(0.3)); expert k's distribution is the base tilted by a
// fixed per-expert log-normal factor per arm, normalised, and smoothed with eta = 0.05, so
// every propensity is in [eta/K, 1]. The chooser is uniform over the experts, the arm is
// drawn from the chooser's distribution (so the propensities are consistent with the
// chooser), and the reward is Bernoulli(0.3). The divergence matrix is synthetic, M and
// sigma in [1, 3], nearly symmetric, diagonal 1. Estimators use the paper's options.
//
// The log grows while an update benchmark runs, so those benchmarks run a fixed number of
// iterations (the --benchmark_min_time flag does not apply to them); the stream is cycled
// when the log outgrows it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "benchmark/benchmark.h"
#include "core/divergence.h"
#include "core/expert.h"
#include "core/kernels.h"
#include "core/estimator.h"
#include "core/policy.h"
#include "core/sample_log.h"
#include "core/xgboost_expert.h"
#include "core/xgboost_trainer.h"
#include "bench/dataset.h"
#include "tests/read_syscalls.h"
#include "tests/reference_estimators.h"

namespace decision {
namespace {

constexpr int kArms = 26;
constexpr double kEta = 0.05;
constexpr double kRewardRate = 0.3;
constexpr int64_t kStreamSize = int64_t{1} << 15;  // samples per pre-generated stream
constexpr int64_t kWarmup = 10000;                 // samples learnt before timing
constexpr int kReferenceExperts = 32;
constexpr uint64_t kSeed = 0x5eedbe11c0ffeeULL;

// ------------------------------------------------------------------------ the data

struct Stream {
  int num_experts = 0;
  std::vector<int> chooser;
  std::vector<double> reward;
  std::vector<double> propensity;  // row-major: sample x expert

  int64_t size() const { return static_cast<int64_t>(chooser.size()); }
  absl::Span<const double> propensities(int64_t i) const {
    return absl::MakeConstSpan(propensity.data() + i * num_experts, num_experts);
  }
};

std::unique_ptr<Stream> GenerateStream(int n) {
  std::mt19937_64 rng(kSeed + static_cast<uint64_t>(n));
  std::normal_distribution<double> normal(0.0, 0.7);
  std::gamma_distribution<double> gamma(0.3, 1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> expert(0, n - 1);
  std::bernoulli_distribution click(kRewardRate);

  // Per-expert noise: expert k weighs arm v by tilt[k][v] = exp(N(0, 0.7^2)).
  std::vector<double> tilt(static_cast<size_t>(n) * kArms);
  for (double& x : tilt) x = std::exp(normal(rng));

  auto s = std::make_unique<Stream>();
  s->num_experts = n;
  s->chooser.resize(kStreamSize);
  s->reward.resize(kStreamSize);
  s->propensity.resize(static_cast<size_t>(kStreamSize) * n);
  std::vector<double> base(kArms), chooser_probs(kArms);
  for (int64_t i = 0; i < kStreamSize; ++i) {
    // The context's base distribution, Dirichlet(0.3, ..., 0.3).
    double total = 0.0;
    for (double& b : base) total += (b = gamma(rng) + 1e-12);
    for (double& b : base) b /= total;
    // pi_k(v|x) = (1 - eta) * base(v) tilt_k(v) / norm_k + eta / K.
    const int j = expert(rng);
    const double* tj = &tilt[static_cast<size_t>(j) * kArms];
    double norm_j = 0.0;
    for (int v = 0; v < kArms; ++v) norm_j += base[v] * tj[v];
    for (int v = 0; v < kArms; ++v) {
      chooser_probs[v] = (1.0 - kEta) * base[v] * tj[v] / norm_j + kEta / kArms;
    }
    // The arm is drawn from the chooser's distribution.
    const double u = unit(rng);
    int arm = kArms - 1;
    double cumulative = 0.0;
    for (int v = 0; v < kArms; ++v) {
      cumulative += chooser_probs[v];
      if (u < cumulative) {
        arm = v;
        break;
      }
    }
    double* row = &s->propensity[static_cast<size_t>(i) * n];
    for (int k = 0; k < n; ++k) {
      const double* tk = &tilt[static_cast<size_t>(k) * kArms];
      double norm = 0.0;
      for (int v = 0; v < kArms; ++v) norm += base[v] * tk[v];
      row[k] = std::min(1.0, (1.0 - kEta) * base[arm] * tk[arm] / norm + kEta / kArms);
    }
    s->chooser[i] = j;
    s->reward[i] = click(rng) ? 1.0 : 0.0;
  }
  return s;
}

// One stream per expert count, generated on first use (not timed).
const Stream& GetStream(int n) {
  static auto* streams = new std::map<int, std::unique_ptr<Stream>>();
  std::unique_ptr<Stream>& s = (*streams)[n];
  if (s == nullptr) s = GenerateStream(n);
  return *s;
}

// A synthetic divergence matrix: M and sigma in [1, 3], nearly symmetric, diagonal 1.
DivergenceMatrix MakeDivergences(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  DivergenceMatrix d = DivergenceMatrix::Identity(n);
  auto nudge = [&](double x) { return std::clamp(x + 0.2 * (unit(rng) - 0.5), 1.0, 3.0); };
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      const size_t ij = static_cast<size_t>(i) * n + j, ji = static_cast<size_t>(j) * n + i;
      d.m[ij] = 1.0 + 2.0 * unit(rng);
      d.m[ji] = nudge(d.m[ij]);
      d.sigma[ij] = 1.0 + 2.0 * unit(rng);
      d.sigma[ji] = nudge(d.sigma[ij]);
    }
  }
  return d;
}

EstimatorOptions Options(EstimatorKind kind) {
  EstimatorOptions o;  // the paper's forms and the practical constants
  o.kind = kind;
  return o;
}

const char* KindName(EstimatorKind kind) {
  return kind == EstimatorKind::kClipped ? "clipped" : "median_of_means";
}

// Learns stream samples [from, to) (cycling the stream). Aborts the benchmark on error.
bool LearnRange(DUcb& ducb, const Stream& stream, int64_t from, int64_t to,
                benchmark::State& state) {
  for (int64_t i = from; i < to; ++i) {
    const int64_t x = i % stream.size();
    absl::Status s = ducb.Learn(stream.chooser[x], stream.reward[x], stream.propensities(x));
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return false;
    }
  }
  return true;
}

// A D-UCB over n experts with the synthetic divergences, having learnt `samples` samples.
std::unique_ptr<DUcb> MakeFilled(EstimatorKind kind, int n, int64_t samples,
                                 benchmark::State& state) {
  absl::StatusOr<DUcb> created = DUcb::Create(Options(kind), n);
  if (!created.ok()) {
    state.SkipWithError(std::string(created.status().message()).c_str());
    return nullptr;
  }
  auto ducb = std::make_unique<DUcb>(*std::move(created));
  if (absl::Status s = ducb->SetDivergences(MakeDivergences(n, kSeed ^ n)); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return nullptr;
  }
  if (!LearnRange(*ducb, GetStream(n), 0, samples, state)) return nullptr;
  return ducb;
}

// ------------------------------------------------------------------ the benchmarks

// The timed loop shared by BM_IncrementalUpdate and BM_IncrementalAt: one Learn per
// iteration, continuing the stream after the pre-fill.
void TimeUpdates(benchmark::State& state, EstimatorKind kind, int n, int64_t prefill) {
  const Stream& stream = GetStream(n);
  std::unique_ptr<DUcb> ducb = MakeFilled(kind, n, prefill, state);
  if (ducb == nullptr) return;
  int64_t i = prefill;
  for (auto _ : state) {
    const int64_t x = i % stream.size();
    absl::Status s = ducb->Learn(stream.chooser[x], stream.reward[x], stream.propensities(x));
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    ++i;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["t_start"] = static_cast<double>(prefill);
  state.counters["t_end"] = static_cast<double>(ducb->log().size());
  if (kind == EstimatorKind::kClipped) {
    // Not timed: the share of (expert, sample) pairs with Y > 0 that the clip test
    // excludes at the final t (these wait in the estimator's heap), to show that the
    // clipping path is exercised.
    const SampleLog& log = ducb->log();
    const DivergenceMatrix& d = ducb->estimator().divergences();
    const double level = ClipLevel(Options(kind), log.size());
    int64_t clipped = 0, rewarded = 0;
    for (int64_t s = 0; s < log.size(); ++s) {
      if (log.reward(s) == 0.0) continue;
      const int j = log.chooser(s);
      for (int k = 0; k < n; ++k) {
        ++rewarded;
        if (log.propensity(k, s) / log.propensity(j, s) > level * d.M(k, j)) ++clipped;
      }
    }
    state.counters["clipped_share"] =
        rewarded > 0 ? static_cast<double>(clipped) / static_cast<double>(rewarded) : 0.0;
  }
}

void BM_IncrementalUpdate(benchmark::State& state, EstimatorKind kind, int n) {
  TimeUpdates(state, kind, n, kWarmup);
}

void BM_IncrementalAt(benchmark::State& state, EstimatorKind kind, int64_t t) {
  TimeUpdates(state, kind, kReferenceExperts, t);
}

// `out`: experts 1..out are out of the choice, unselectable (how decisiond excluded
// retired experts before Estimator::Retire) or retired in the estimator (`retire`).
void BM_Choose(benchmark::State& state, EstimatorKind kind, int n, int out = 0,
               bool retire = false) {
  std::unique_ptr<DUcb> ducb = MakeFilled(kind, n, kWarmup, state);
  if (ducb == nullptr) return;
  for (int k = 1; k <= out; ++k) {
    if (!retire) {
      ducb->SetSelectable(k, false);
    } else if (absl::Status s = ducb->Retire(k); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
  }
  std::mt19937_64 bitgen(kSeed);
  absl::BitGenRef gen(bitgen);
  for (auto _ : state) {
    benchmark::DoNotOptimize(ducb->SelectExpert(gen));
  }
  state.SetItemsProcessed(state.iterations());
}

// Updates timed outside the benchmark loop (std::chrono) for the speed-up counter of
// BM_ReferenceEstimateAll: the median over `chunks` chunks of ns per Learn.
double ChronoNsPerUpdate(DUcb& ducb, const Stream& stream, int64_t from, int64_t count,
                         int chunks, benchmark::State& state) {
  std::vector<double> per_update;
  const int64_t chunk = std::max<int64_t>(1, count / chunks);
  for (int c = 0; c < chunks; ++c) {
    const auto start = std::chrono::steady_clock::now();
    if (!LearnRange(ducb, stream, from + c * chunk, from + (c + 1) * chunk, state)) return 0.0;
    const auto stop = std::chrono::steady_clock::now();
    per_update.push_back(std::chrono::duration<double, std::nano>(stop - start).count() /
                         static_cast<double>(chunk));
  }
  std::sort(per_update.begin(), per_update.end());
  return per_update[per_update.size() / 2];
}

int64_t IncrementalIterations(int64_t t) { return std::max<int64_t>(2000, t / 10); }

void BM_ReferenceEstimateAll(benchmark::State& state, EstimatorKind kind, int64_t t) {
  const int n = kReferenceExperts;
  const Stream& stream = GetStream(n);
  std::unique_ptr<DUcb> ducb = MakeFilled(kind, n, t, state);
  if (ducb == nullptr) return;
  // The incremental cost at the same t, from the same log: samples [t, t + count) are
  // learnt, the reference below only reads samples [0, t).
  const double inc_ns =
      ChronoNsPerUpdate(*ducb, stream, t, IncrementalIterations(t), 5, state);
  if (state.error_occurred()) return;
  const SampleLog& log = ducb->log();
  const DivergenceMatrix& d = ducb->estimator().divergences();
  const EstimatorOptions options = Options(kind);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (int k = 0; k < n; ++k) {
      benchmark::DoNotOptimize(reference::Estimate(log, t, d, options, k));
    }
  }
  const auto stop = std::chrono::steady_clock::now();
  const double ref_ns = std::chrono::duration<double, std::nano>(stop - start).count() /
                        static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations());
  state.counters["inc_ns_per_update"] = inc_ns;
  state.counters["speedup_vs_incremental"] = ref_ns / inc_ns;
}

void BM_DivergenceRefresh(benchmark::State& state, EstimatorKind kind, int n) {
  std::unique_ptr<DUcb> ducb = MakeFilled(kind, n, kWarmup, state);
  if (ducb == nullptr) return;
  // Alternate between two different matrices so that every call rebuilds.
  const DivergenceMatrix d[2] = {MakeDivergences(n, kSeed + 1), MakeDivergences(n, kSeed + 2)};
  int which = 0;
  for (auto _ : state) {
    absl::Status s = ducb->SetDivergences(d[which]);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    which ^= 1;
  }
  state.SetItemsProcessed(state.iterations());
}

enum class SnapshotForm { kSave, kSaveReused, kRestore };

void BM_StateSnapshot(benchmark::State& state, EstimatorKind kind, SnapshotForm form, int n) {
  std::unique_ptr<DUcb> ducb = MakeFilled(kind, n, kWarmup, state);
  if (ducb == nullptr) return;
  const absl::StatusOr<std::string> saved = ducb->Snapshot();
  if (!saved.ok()) {
    state.SkipWithError(std::string(saved.status().message()).c_str());
    return;
  }
  std::string buffer;  // kSaveReused: kept across iterations, as decisiond keeps it
  for (auto _ : state) {
    if (form == SnapshotForm::kRestore) {
      absl::StatusOr<std::unique_ptr<Estimator>> back = RestoreEstimator(Options(kind), *saved);
      benchmark::DoNotOptimize(back);
    } else if (form == SnapshotForm::kSaveReused) {
      benchmark::DoNotOptimize(ducb->SnapshotTo(&buffer));
    } else {
      absl::StatusOr<std::string> again = ducb->Snapshot();
      benchmark::DoNotOptimize(again);
    }
  }
  state.counters["state_mb"] = static_cast<double>(saved->size()) / 1048576.0;
}

void BM_RefreshLockHold(benchmark::State& state, EstimatorKind kind, bool swap_in,
                        int64_t t) {
  constexpr int n = 32;
  constexpr int64_t kCatchUp = 1000;
  std::unique_ptr<DUcb> ducb = MakeFilled(kind, n, t, state);
  if (ducb == nullptr) return;
  const DivergenceMatrix d[2] = {MakeDivergences(n, kSeed + 1), MakeDivergences(n, kSeed + 2)};
  int which = 0;
  int64_t next = t;
  double rebuild_ms = 0.0;  // untimed: RebuildEstimator, which runs without the lock
  int rebuilds = 0;
  for (auto _ : state) {
    absl::Status s;
    if (swap_in) {
      state.PauseTiming();
      const auto start = std::chrono::steady_clock::now();
      const SampleLog prefix = ducb->log().SharedPrefix();
      absl::StatusOr<std::unique_ptr<Estimator>> rebuilt =
          DUcb::RebuildEstimator(Options(kind), prefix, d[which]);
      rebuild_ms += std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start).count();
      ++rebuilds;
      const bool learnt = LearnRange(*ducb, GetStream(n), next, next + kCatchUp, state);
      next += kCatchUp;
      state.ResumeTiming();
      if (!learnt) break;
      s = rebuilt.ok() ? ducb->SwapInEstimator(*std::move(rebuilt)) : rebuilt.status();
    } else {
      s = ducb->SetDivergences(d[which]);
    }
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    which ^= 1;
  }
  state.counters["t"] = static_cast<double>(t);
  state.counters["catch_up"] = swap_in ? static_cast<double>(kCatchUp) : 0.0;
  state.counters["rebuild_ms"] = rebuilds > 0 ? rebuild_ms / rebuilds : 0.0;
}

// Per-call latencies of 300k Learn calls from an empty log, timed one by one.
void BM_UpdateLatency(benchmark::State& state, EstimatorKind kind, int n) {
  constexpr int64_t kSamples = 300000;
  const Stream& stream = GetStream(n);
  std::vector<double> us;
  us.reserve(kSamples);
  int64_t worst_at = 0;
  for (auto _ : state) {
    std::unique_ptr<DUcb> ducb = MakeFilled(kind, n, 0, state);
    if (ducb == nullptr) return;
    us.clear();
    for (int64_t i = 0; i < kSamples; ++i) {
      const int64_t x = i % stream.size();
      const auto start = std::chrono::steady_clock::now();
      absl::Status s = ducb->Learn(stream.chooser[x], stream.reward[x], stream.propensities(x));
      const auto stop = std::chrono::steady_clock::now();
      if (!s.ok()) {
        state.SkipWithError(std::string(s.message()).c_str());
        return;
      }
      us.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
    }
    worst_at = std::max_element(us.begin(), us.end()) - us.begin();
  }
  const double worst = us[worst_at];
  double total = 0.0;
  for (double x : us) total += x;
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[static_cast<size_t>(q * (us.size() - 1))]; };
  state.counters["mean_us"] = total / static_cast<double>(us.size());
  state.counters["p50_us"] = at(0.5);
  state.counters["p99_us"] = at(0.99);
  state.counters["p999_us"] = at(0.999);
  state.counters["max_us"] = worst;
  state.counters["max_at_t"] = static_cast<double>(worst_at);
}

// The propensities of one joined sample (a Reward): pi_k(arm | x) of 32 linear softmax
// experts, K = 26, d = 16. "scalar" is the straightforward form (row-major weights, a dot
// product per arm, std::exp), the baseline; "expert" is LinearSoftmaxExpert::Predict (the
// vectorised kernels of core/kernels.h). Both compute the same distribution.
constexpr int kScoreExperts = 32, kScoreFeatures = 16;

struct LinearBank {
  std::vector<std::vector<double>> weights, bias;  // row-major K x d per expert
  std::vector<std::unique_ptr<Expert>> experts;
  std::vector<double> x;
};

const LinearBank& GetLinearBank() {
  static const LinearBank* bank = [] {
    auto* b = new LinearBank;
    std::mt19937_64 gen(kSeed);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (int e = 0; e < kScoreExperts; ++e) {
      std::vector<double> w(kArms * kScoreFeatures), bias(kArms);
      for (double& v : w) v = normal(gen);
      for (double& v : bias) v = normal(gen);
      b->weights.push_back(w);
      b->bias.push_back(bias);
      b->experts.push_back(*MakeLinearSoftmaxExpert(kArms, kScoreFeatures, w, bias));
    }
    for (int f = 0; f < kScoreFeatures; ++f) b->x.push_back(normal(gen));
    return b;
  }();
  return *bank;
}

void BM_ScoreLinearExperts(benchmark::State& state, bool kernels) {
  const LinearBank& bank = GetLinearBank();
  std::vector<double> probs(kArms);
  double sink = 0.0;
  for (auto _ : state) {
    for (int e = 0; e < kScoreExperts; ++e) {
      if (kernels) {
        (void)bank.experts[e]->Predict(bank.x, absl::MakeSpan(probs));
      } else {
        const std::vector<double>& w = bank.weights[e];
        double max_logit = -HUGE_VAL;
        for (int v = 0; v < kArms; ++v) {
          double z = bank.bias[e][v];
          for (int f = 0; f < kScoreFeatures; ++f) z += w[v * kScoreFeatures + f] * bank.x[f];
          probs[v] = z;
          max_logit = std::max(max_logit, z);
        }
        double total = 0.0;
        for (double& p : probs) total += (p = std::exp(p - max_logit));
        for (double& p : probs) p = (1.0 - kEta) * p / total + kEta / kArms;
      }
      sink += probs[e % kArms];
    }
  }
  benchmark::DoNotOptimize(sink);
  state.SetItemsProcessed(state.iterations());  // items/s = samples scored per second
}

// n contexts of kScoreFeatures standard normal features, row-major.
std::vector<double> RandomContexts(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> rows(n * kScoreFeatures);
  for (double& v : rows) v = normal(gen);
  return rows;
}

// The same propensities for a batch of 256 joined samples, expert by expert
// (Expert::PredictBatch): each expert's weights are read once per batch instead of once per
// sample. items/s = samples scored per second, comparable with BM_ScoreLinearExperts.
void BM_ScoreLinearExpertsBatch(benchmark::State& state) {
  constexpr size_t kBatch = 256;
  const LinearBank& bank = GetLinearBank();
  const std::vector<double> rows = RandomContexts(kBatch, kSeed + 2);
  std::vector<double> probs(kBatch * kArms);
  double sink = 0.0;
  for (auto _ : state) {
    for (int e = 0; e < kScoreExperts; ++e) {
      (void)bank.experts[e]->PredictBatch(rows, kBatch, absl::MakeSpan(probs));
      sink += probs[e % kArms];
    }
  }
  benchmark::DoNotOptimize(sink);
  state.SetItemsProcessed(state.iterations() * kBatch);
}

// The divergence refresh's inner work: for every ordered pair of the 32 linear experts and
// every one of 256 contexts, log sum_v pi_i exp(pi_i / pi_j - 1) and sum_v pi_i^2 / pi_j
// (core/divergence.cc; a refresh does this over the 2048-context reservoir).
void BM_DivergenceTerms(benchmark::State& state, bool kernel) {
  constexpr size_t kRows = 256;
  const LinearBank& bank = GetLinearBank();
  const std::vector<double> rows = RandomContexts(kRows, kSeed + 1);
  std::vector<std::vector<double>> pi(kScoreExperts, std::vector<double>(kRows * kArms));
  std::vector<std::vector<double>> log_pi(kScoreExperts, std::vector<double>(kRows * kArms));
  for (int e = 0; e < kScoreExperts; ++e) {
    (void)bank.experts[e]->PredictBatch(rows, kRows, absl::MakeSpan(pi[e]));
    for (size_t a = 0; a < pi[e].size(); ++a) log_pi[e][a] = std::log(pi[e][a]);
  }
  std::vector<double> scratch(2 * kRows * kArms), log_f1(kRows), f2(kRows), terms(kArms);
  double sink = 0.0;
  for (auto _ : state) {
    for (int i = 0; i < kScoreExperts; ++i) {
      for (int j = 0; j < kScoreExperts; ++j) {
        if (i == j) continue;
        if (kernel) {
          DivergenceTerms(pi[i].data(), log_pi[i].data(), pi[j].data(), kRows, kArms,
                          scratch.data(), log_f1.data(), f2.data());
        } else {
          for (size_t r = 0; r < kRows; ++r) {
            const double* a = &pi[i][r * kArms];
            const double* la = &log_pi[i][r * kArms];
            const double* b = &pi[j][r * kArms];
            double max_term = -HUGE_VAL;
            for (int v = 0; v < kArms; ++v) {
              terms[v] = la[v] + a[v] / b[v] - 1.0;
              max_term = std::max(max_term, terms[v]);
            }
            double s = 0.0, s2 = 0.0;
            for (int v = 0; v < kArms; ++v) {
              s += std::exp(terms[v] - max_term);
              s2 += a[v] * a[v] / b[v];
            }
            log_f1[r] = max_term + std::log(s);
            f2[r] = s2;
          }
        }
        sink += log_f1[i % kRows] + f2[j % kRows];
      }
    }
  }
  benchmark::DoNotOptimize(sink);
  state.SetItemsProcessed(state.iterations() * kScoreExperts * (kScoreExperts - 1) * kRows);
}

// ------------------------------------------------------------ scoring XGBoost experts

// Experts trained as auto-training trains them (core/xgboost_trainer.h, SampleExpertOptions:
// hist trees at learning rate 0.3, column sampling 0.8; gblinear at 0.1 for 30 rounds), with
// the depth and rounds fixed to the smallest, middle and largest of the recipe, on the
// first kXgbTrainRows rows of letter (K = 26, d = 16) as importance-weighted samples of a
// uniform logging policy that paid 1 for the label. Trained once per process (not timed).
constexpr int kXgbTrainRows = 4000;
constexpr size_t kXgbScoreRows = 4096;  // rows scored, cycled: letter rows 4000..8095

struct XgbModel {
  const char* name;
  bool linear;
  int max_depth;
  int rounds;
};
constexpr XgbModel kXgbModels[] = {
    {"tree_d3_r10", false, 3, 10},
    {"tree_d6_r20", false, 6, 20},
    {"tree_d10_r40", false, 10, 40},
    {"linear_r30", true, 0, 30},
};

struct XgbBank {
  std::string error;  // not empty if the data could not be read or a model not trained
  int num_features = 0;
  int num_arms = 0;
  std::vector<double> rows;  // kXgbScoreRows x num_features
  std::map<std::string, std::unique_ptr<Expert>> experts;
};

const XgbBank& GetXgbBank() {
  static const XgbBank* bank = [] {
    auto* b = new XgbBank;
    absl::StatusOr<bench::Dataset> data =
        bench::LoadCsv(std::string(DECISION_SOURCE_DIR) + "/bench/data/letter.csv");
    if (!data.ok()) {
      b->error = std::string(data.status().message());
      return b;
    }
    b->num_features = data->num_features;
    b->num_arms = data->num_classes;
    TrainingSet set;
    set.num_features = data->num_features;
    for (int i = 0; i < kXgbTrainRows; ++i) {
      set.Add(data->row(i), data->labels[i], 1.0, 1.0 / data->num_classes);
    }
    for (size_t i = 0; i < kXgbScoreRows; ++i) {
      const absl::Span<const double> x = data->row(kXgbTrainRows + i);
      b->rows.insert(b->rows.end(), x.begin(), x.end());
    }
    for (const XgbModel& m : kXgbModels) {
      XgboostTrainOptions o;
      o.linear = m.linear;
      o.rounds = m.rounds;
      if (m.linear) {
        o.learning_rate = 0.1;
      } else {
        o.max_depth = m.max_depth;
        o.colsample_bytree = 0.8;
      }
      o.seed = 7;
      o.threads = 2;  // training is not timed
      absl::StatusOr<std::string> bytes = TrainXgboostModel(set, b->num_arms, o);
      absl::StatusOr<std::unique_ptr<Expert>> expert =
          bytes.ok() ? MakeXgboostExpert(b->num_arms, b->num_features, *bytes)
                     : absl::StatusOr<std::unique_ptr<Expert>>(bytes.status());
      if (!expert.ok()) {
        b->error = absl::StrCat(m.name, ": ", expert.status().message());
        return b;
      }
      b->experts[m.name] = *std::move(expert);
      {
        // The same model predicted by libxgboost itself: the baseline of the compiled form
        // (core/xgboost_forest.h: trees or gblinear weights), which the experts above use.
        absl::StatusOr<std::unique_ptr<Expert>> reference =
            MakeXgboostExpert(b->num_arms, b->num_features, *bytes, kDefaultSmoothing,
                              XgboostPredictor::kLibxgboost);
        if (!reference.ok()) {
          b->error = absl::StrCat(m.name, ": ", reference.status().message());
          return b;
        }
        b->experts[absl::StrCat(m.name, "-libxgboost")] = *std::move(reference);
      }
    }
    return b;
  }();
  return *bank;
}

using ::decision::testutil::ReadSyscalls;

// Scores `calls` batches of `batch` rows on `expert`, starting at batch number `first`
// (cycling over the bank's rows). Returns false after SkipWithError.
bool ScoreBatches(const Expert& expert, const XgbBank& bank, size_t batch, int64_t first,
                  int64_t calls, std::vector<double>& probs, benchmark::State& state) {
  const size_t d = bank.num_features;
  for (int64_t c = first; c < first + calls; ++c) {
    const size_t start = (static_cast<size_t>(c) * batch) % (kXgbScoreRows - batch + 1);
    const absl::Status s = expert.PredictBatch(
        absl::MakeConstSpan(bank.rows).subspan(start * d, batch * d), batch,
        absl::MakeSpan(probs).subspan(0, batch * bank.num_arms));
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return false;
    }
  }
  return true;
}

void BM_ScoreXgboost(benchmark::State& state, std::string model, size_t batch) {
  const XgbBank& bank = GetXgbBank();
  if (!bank.error.empty()) {
    state.SkipWithError(bank.error.c_str());
    return;
  }
  const Expert& expert = *bank.experts.at(model);
  std::vector<double> probs(kXgbScoreRows * bank.num_arms);
  // The one-row cost, for the speedup counter: median of 5 chunks of 400 rows (thread 0).
  double row_ns = 0.0;
  if (state.thread_index() == 0 && state.threads() == 1 && batch > 1) {
    std::vector<double> per_row;
    for (int chunk = 0; chunk < 5; ++chunk) {
      const auto start = std::chrono::steady_clock::now();
      if (!ScoreBatches(expert, bank, 1, chunk * 400, 400, probs, state)) return;
      per_row.push_back(std::chrono::duration<double, std::nano>(
                            std::chrono::steady_clock::now() - start).count() / 400.0);
    }
    std::sort(per_row.begin(), per_row.end());
    row_ns = per_row[2];
  }
  // ReadSyscalls itself reads: its own count is measured and taken off.
  int64_t syscr_before = 0, syscr_own = 0;
  if (state.thread_index() == 0) {
    const int64_t first = ReadSyscalls();
    syscr_before = ReadSyscalls();
    syscr_own = syscr_before - first;
  }
  int64_t c = static_cast<int64_t>(state.thread_index()) * 1000;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (!ScoreBatches(expert, bank, batch, c++, 1, probs, state)) break;
  }
  const double ns_per_row = std::chrono::duration<double, std::nano>(
                                std::chrono::steady_clock::now() - start).count() /
                            static_cast<double>(state.iterations() * batch);
  benchmark::DoNotOptimize(probs.data());
  state.SetItemsProcessed(state.iterations() * batch);
  if (state.thread_index() == 0) {
    const int64_t syscr_after = ReadSyscalls();
    // Both threads' calls are in the difference; each thread runs state.iterations().
    if (syscr_before >= 0 && syscr_after >= 0) {
      state.counters["read_syscalls_per_call"] =
          static_cast<double>(syscr_after - syscr_before - syscr_own) /
          static_cast<double>(state.iterations() * state.threads());
    }
    if (batch > 1 && state.threads() == 1) state.counters["speedup_vs_row"] = row_ns / ns_per_row;
  }
}

// Training one tree expert (depth 6, 20 rounds, one thread) on the first `rows` rows of
// letter logged under uniform play (a random arm, reward 1 if it is the label), with each
// objective: the likelihood trains on every row, the importance-weighted classifier on
// the ~1/26 rewarded ones. And the same on a log whose rows are all rewarded (as under a
// policy that is always right), where both train on every row.
// The first `rows` rows of letter as a log: a uniformly random arm per row (or, with
// `all_rewarded`, the label), reward 1 if it is the label, propensity 1/26. Null (and the
// benchmark skipped) if bench/data/letter.csv is missing or short.
const bench::Dataset* LetterLog(benchmark::State& state, int rows, bool all_rewarded,
                                std::mt19937_64& gen, TrainingSet* set) {
  static const absl::StatusOr<bench::Dataset>* data = new absl::StatusOr<bench::Dataset>(
      bench::LoadCsv(std::string(DECISION_SOURCE_DIR) + "/bench/data/letter.csv"));
  if (!data->ok() || (*data)->size() < static_cast<size_t>(rows)) {
    state.SkipWithError("bench/data/letter.csv is missing or short");
    return nullptr;
  }
  const bench::Dataset& d = **data;
  set->num_features = d.num_features;
  for (int i = 0; i < rows; ++i) {
    const int arm = all_rewarded ? d.labels[i]
                                 : std::uniform_int_distribution<int>(0, d.num_classes - 1)(gen);
    set->Add(d.row(i), arm, arm == d.labels[i] ? 1.0 : 0.0, 1.0 / d.num_classes);
  }
  return &d;
}

void BM_TrainExpert(benchmark::State& state, TrainingObjective objective, bool all_rewarded) {
  TrainingSet set;
  std::mt19937_64 gen(5);
  const bench::Dataset* data =
      LetterLog(state, static_cast<int>(state.range(0)), all_rewarded, gen, &set);
  if (data == nullptr) return;
  const bench::Dataset& d = *data;
  const int rows = static_cast<int>(set.size());
  XgboostTrainOptions o;
  o.rounds = 20;
  o.max_depth = 6;
  o.colsample_bytree = 0.8;
  o.seed = 7;
  o.objective = objective;
  for (auto _ : state) {
    absl::StatusOr<std::string> model = TrainXgboostModel(set, d.num_classes, o);
    if (!model.ok()) {
      state.SkipWithError(std::string(model.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(model->data());
  }
  state.SetItemsProcessed(state.iterations() * rows);
}
BENCHMARK_CAPTURE(BM_TrainExpert, importance_weighted/uniform_log,
                  TrainingObjective::kImportanceWeighted, false)
    ->Arg(4000)->Arg(16000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainExpert, likelihood/uniform_log, TrainingObjective::kLikelihood, false)
    ->Arg(4000)->Arg(16000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainExpert, importance_weighted/all_rewarded,
                  TrainingObjective::kImportanceWeighted, true)
    ->Arg(4000)->Arg(16000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainExpert, likelihood/all_rewarded, TrainingObjective::kLikelihood, true)
    ->Arg(4000)->Arg(16000)->Unit(benchmark::kMillisecond);

// Training an expert of a batch as decisiond and bench/regret do: on a bootstrap resample
// (likelihood, letter logged under uniform play, as above), `copies`: each drawn sample
// once with its number of draws (Bootstrap), `rows`: every draw its own row (the same
// model up to the order of sums, tests/xgboost_trainer_test.cc). Trees of depth 6 and 10
// (20 and 40 rounds) and the gblinear expert (30 rounds).
enum class BootstrapForm { kRows, kCopies };

void BM_TrainBootstrap(benchmark::State& state, BootstrapForm form) {
  const int rows = static_cast<int>(state.range(0));
  const int depth = static_cast<int>(state.range(1));  // 0: gblinear
  TrainingSet set;
  std::mt19937_64 gen(5);
  const bench::Dataset* data = LetterLog(state, rows, /*all_rewarded=*/false, gen, &set);
  if (data == nullptr) return;
  const bench::Dataset& d = *data;
  TrainingSet boot = Bootstrap(set, TrainingObjective::kLikelihood, gen);
  if (form == BootstrapForm::kRows) {
    TrainingSet drawn;
    drawn.num_features = boot.num_features;
    for (size_t i = 0; i < boot.size(); ++i) {
      for (float c = 0; c < boot.copies[i]; c += 1) {
        drawn.rows.insert(drawn.rows.end(), boot.rows.begin() + i * boot.num_features,
                          boot.rows.begin() + (i + 1) * boot.num_features);
        drawn.labels.push_back(boot.labels[i]);
        drawn.rewards.push_back(boot.rewards[i]);
        drawn.propensities.push_back(boot.propensities[i]);
      }
    }
    boot = std::move(drawn);
  }
  XgboostTrainOptions o;
  o.linear = depth == 0;
  o.rounds = depth == 0 ? 30 : depth == 6 ? 20 : 40;
  o.max_depth = std::max(depth, 1);
  o.learning_rate = depth == 0 ? 0.1 : 0.3;
  o.colsample_bytree = 0.8;
  o.seed = 7;
  for (auto _ : state) {
    absl::StatusOr<std::string> model = TrainXgboostModel(boot, d.num_classes, o);
    if (!model.ok()) {
      state.SkipWithError(std::string(model.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(model->data());
  }
  state.counters["training_rows"] = static_cast<double>(boot.size());
  state.SetItemsProcessed(state.iterations() * rows);
}
// The gblinear expert (30 rounds, learning rate 0.1, L2 1) on the whole log of letter rows,
// as auto-training trains it by default: `own` is TrainXgboostModel's own coordinate
// descent, `libxgboost` libxgboost's shotgun updater, which it reproduces bit for bit
// (XgboostTrainer.GblinearIsTrainedAsLibxgboostTrainsIt).
void BM_TrainGblinear(benchmark::State& state, bool libxgboost) {
  TrainingSet set;
  std::mt19937_64 gen(5);
  const bench::Dataset* data =
      LetterLog(state, static_cast<int>(state.range(0)), /*all_rewarded=*/false, gen, &set);
  if (data == nullptr) return;
  XgboostTrainOptions o;
  o.linear = true;
  o.rounds = 30;
  o.learning_rate = 0.1;
  o.seed = 7;
  o.libxgboost_linear = libxgboost;
  for (auto _ : state) {
    absl::StatusOr<std::string> model = TrainXgboostModel(set, data->num_classes, o);
    if (!model.ok()) {
      state.SkipWithError(std::string(model.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(model->data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK_CAPTURE(BM_TrainGblinear, own, false)
    ->Arg(4000)->Arg(16000)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainGblinear, libxgboost, true)
    ->Arg(4000)->Arg(16000)->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(BM_TrainBootstrap, rows, BootstrapForm::kRows)
    ->ArgsProduct({{16000}, {6, 10, 0}})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainBootstrap, copies, BootstrapForm::kCopies)
    ->ArgsProduct({{16000}, {6, 10, 0}})->Unit(benchmark::kMillisecond);

enum class NewExpertForm { kEveryPair, kRetiredRows, kUnloaded };

// `n` experts' softmax distributions of random logits (spread 3) over `k` arms on `rows`
// contexts, row-major.
std::vector<std::vector<double>> RandomSoftmaxPredictions(int n, size_t rows, int k,
                                                          uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> logit(0.0, 3.0);
  std::vector<std::vector<double>> predictions(n, std::vector<double>(rows * k));
  for (std::vector<double>& p : predictions) {
    for (size_t r = 0; r < rows; ++r) {
      double* row = &p[r * k];
      for (int a = 0; a < k; ++a) row[a] = logit(gen);
      SoftmaxInPlace(absl::MakeSpan(row, k));
    }
  }
  return predictions;
}

void BM_NewExpertDivergences(benchmark::State& state, NewExpertForm form) {
  constexpr int kExperts = 161, kRetired = 128, kUnloaded = 80;
  constexpr size_t kRows = 2048;
  const std::vector<std::vector<double>> predictions =
      RandomSoftmaxPredictions(kExperts, kRows, kArms, kSeed + 3);
  const DivergenceMatrix previous = DivergenceMatrix::Identity(kExperts - 1);
  const std::unique_ptr<bool[]> fixed(new bool[kExperts]());
  const std::unique_ptr<bool[]> absent(new bool[kExperts]());
  for (int e = 0; e < kRetired; ++e) {
    fixed[e] = form != NewExpertForm::kEveryPair;
    absent[e] = form == NewExpertForm::kUnloaded && e < kUnloaded;
  }
  DivergenceMatrix out;
  int64_t pairs = 0;
  for (int i = 0; i < kExperts; ++i) {
    for (int j = 0; j < kExperts; ++j) {
      if (i == j || (i < kExperts - 1 && j < kExperts - 1) || absent[i] || absent[j]) continue;
      pairs += !fixed[i];
    }
  }
  for (auto _ : state) {
    absl::Status s = ComputeDivergences(predictions, kArms, 16, &previous, kExperts - 1, &out,
                                        absl::MakeConstSpan(fixed.get(), kExperts),
                                        absl::MakeConstSpan(absent.get(), kExperts));
    if (!s.ok()) state.SkipWithError(std::string(s.message()).c_str());
    benchmark::DoNotOptimize(out.m.data());
  }
  state.SetItemsProcessed(state.iterations() * pairs);
  state.counters["pairs"] = static_cast<double>(pairs);
}

// A whole refresh of n experts over K arms and 2048 contexts (every ordered pair), with the
// work split into `tasks` tasks (DivergenceThreads): one is the caller's, the others run on
// threads started for each step, as ParallelFor hands tasks to the scorer threads.
void BM_DivergenceRefreshThreads(benchmark::State& state, int n, int k, int tasks) {
  constexpr size_t kRows = 2048;
  const std::vector<std::vector<double>> predictions =
      RandomSoftmaxPredictions(n, kRows, k, kSeed + 4);
  DivergenceThreads threads;
  threads.tasks = tasks;
  threads.run = [](int count, absl::FunctionRef<void(int)> fn) {
    std::vector<std::thread> helpers;
    for (int t = 1; t < count; ++t) helpers.emplace_back([&fn, t] { fn(t); });
    fn(0);
    for (std::thread& h : helpers) h.join();
  };
  const auto read = [&](int e, size_t begin, size_t end, absl::Span<double> out) {
    std::copy(predictions[e].begin() + begin * k, predictions[e].begin() + end * k,
              out.begin());
    return absl::OkStatus();
  };
  DivergenceMatrix out;
  for (auto _ : state) {
    absl::Status s = ComputeDivergences(n, kRows, read, k, 16, nullptr, 0, &out, {}, {},
                                        DivergenceLimits(), nullptr, threads);
    if (!s.ok()) state.SkipWithError(std::string(s.message()).c_str());
    benchmark::DoNotOptimize(out.m.data());
  }
  state.SetItemsProcessed(state.iterations() * int64_t{n} * (n - 1) * int64_t{kRows} * k);
}

// Fixed iteration counts for the benchmarks whose log grows: enough for a stable figure,
// small enough to keep the log (and the memory) bounded.
int64_t UpdateIterations(int n) { return n <= 8 ? 400000 : n <= 32 ? 200000 : 60000; }

void RegisterAll() {
  benchmark::RegisterBenchmark("BM_ScoreLinearExperts/scalar/32", BM_ScoreLinearExperts, false);
  benchmark::RegisterBenchmark("BM_ScoreLinearExperts/expert/32", BM_ScoreLinearExperts, true);
  benchmark::RegisterBenchmark("BM_ScoreLinearExperts/batch256/32", BM_ScoreLinearExpertsBatch);
  benchmark::RegisterBenchmark("BM_DivergenceTerms/scalar/32", BM_DivergenceTerms, false);
  benchmark::RegisterBenchmark("BM_DivergenceTerms/kernel/32", BM_DivergenceTerms, true);
  benchmark::RegisterBenchmark("BM_NewExpertDivergences/every_pair", BM_NewExpertDivergences,
                               NewExpertForm::kEveryPair)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_NewExpertDivergences/retired_rows", BM_NewExpertDivergences,
                               NewExpertForm::kRetiredRows)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_NewExpertDivergences/unloaded", BM_NewExpertDivergences,
                               NewExpertForm::kUnloaded)->Unit(benchmark::kMillisecond);
  for (const auto& [n, k] : {std::pair{32, 26}, std::pair{8, 4096}}) {
    for (int tasks : {1, 2}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("BM_DivergenceRefreshThreads/", n, "x", k, "/", tasks).c_str(),
          BM_DivergenceRefreshThreads, n, k, tasks)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (EstimatorKind kind : {EstimatorKind::kMedianOfMeans, EstimatorKind::kClipped}) {
    const std::string k = KindName(kind);
    for (int n : {8, 32, 128}) {
      benchmark::RegisterBenchmark(absl::StrCat("BM_IncrementalUpdate/", k, "/", n).c_str(),
                                   BM_IncrementalUpdate, kind, n)
          ->Iterations(UpdateIterations(n))
          ->Unit(benchmark::kNanosecond);
    }
  }
  for (EstimatorKind kind : {EstimatorKind::kMedianOfMeans, EstimatorKind::kClipped}) {
    const std::string k = KindName(kind);
    for (int n : {8, 32, 128}) {
      benchmark::RegisterBenchmark(absl::StrCat("BM_Choose/", k, "/", n).c_str(), BM_Choose,
                                   kind, n, 0, false)
          ->Unit(benchmark::kNanosecond);
    }
  }
  // What auto-training leaves on letter: 161 experts, 128 of them retired.
  for (const bool retire : {false, true}) {
    benchmark::RegisterBenchmark(
        absl::StrCat("BM_Choose/median_of_means/161/", retire ? "retired" : "unselectable",
                     "128")
            .c_str(),
        BM_Choose, EstimatorKind::kMedianOfMeans, 161, 128, retire)
        ->Unit(benchmark::kNanosecond);
  }
  for (EstimatorKind kind : {EstimatorKind::kMedianOfMeans, EstimatorKind::kClipped}) {
    const std::string k = KindName(kind);
    for (int64_t t : {int64_t{10000}, int64_t{100000}}) {
      benchmark::RegisterBenchmark(absl::StrCat("BM_IncrementalAt/", k, "/", t).c_str(),
                                   BM_IncrementalAt, kind, t)
          ->Iterations(IncrementalIterations(t))
          ->Unit(benchmark::kNanosecond);
      benchmark::RegisterBenchmark(
          absl::StrCat("BM_ReferenceEstimateAll/", k, "/", t).c_str(), BM_ReferenceEstimateAll,
          kind, t)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (EstimatorKind kind : {EstimatorKind::kMedianOfMeans, EstimatorKind::kClipped}) {
    const std::string k = KindName(kind);
    for (int n : {8, 32}) {
      benchmark::RegisterBenchmark(absl::StrCat("BM_DivergenceRefresh/", k, "/", n).c_str(),
                                   BM_DivergenceRefresh, kind, n)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (EstimatorKind kind : {EstimatorKind::kMedianOfMeans, EstimatorKind::kClipped}) {
    for (const auto& [form, name] : {std::pair{SnapshotForm::kSave, "save/"},
                                     std::pair{SnapshotForm::kSaveReused, "save_reused/"},
                                     std::pair{SnapshotForm::kRestore, "restore/"}}) {
      for (int n : {32, 160}) {
        benchmark::RegisterBenchmark(
            absl::StrCat("BM_StateSnapshot/", KindName(kind), "/", name, n).c_str(),
            BM_StateSnapshot, kind, form, n)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  for (EstimatorKind kind : {EstimatorKind::kMedianOfMeans, EstimatorKind::kClipped}) {
    for (int64_t t : {100000, 400000}) {
      for (bool swap_in : {false, true}) {
        benchmark::RegisterBenchmark(
            absl::StrCat("BM_RefreshLockHold/", KindName(kind), "/",
                         swap_in ? "swap_in/" : "set_divergences/", t)
                .c_str(),
            BM_RefreshLockHold, kind, swap_in, t)
            ->Iterations(5)
            ->Unit(benchmark::kMicrosecond);
      }
    }
    benchmark::RegisterBenchmark(absl::StrCat("BM_UpdateLatency/", KindName(kind), "/32").c_str(),
                                 BM_UpdateLatency, kind, 32)
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  for (const XgbModel& m : kXgbModels) {
    for (const std::string& name : {std::string(m.name), absl::StrCat(m.name, "-libxgboost")}) {
      for (size_t batch : {size_t{1}, size_t{64}, size_t{512}, size_t{4096}}) {
        const std::string form = batch == 1 ? "row" : absl::StrCat("batch", batch);
        for (int threads : {1, 2}) {
          if (threads == 2 && batch > 64) continue;
          benchmark::RegisterBenchmark(absl::StrCat("BM_ScoreXgboost/", name, "/", form).c_str(),
                                       BM_ScoreXgboost, name, batch)
              ->Threads(threads)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

}  // namespace
}  // namespace decision

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  decision::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
