// Problem: the divergences between its experts (DESIGN.md section 2): the computation over
// the reservoir's contexts for a new expert's pairs (the backfill's completion) and the
// refresh at a batch boundary, which the expert-pool round runs a step at a time
// (DivergenceJob). The O(N^2 R K) divergences are computed without mu_ and applied in place
// under it (no pass over the samples).
#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/problem.h"

namespace decision::server {

Problem::ReservoirCopy Problem::CopyReservoirLocked() const {
  ReservoirCopy copy{{reservoir_.contexts().begin(), reservoir_.contexts().end()},
                     {reservoir_.stamps().begin(), reservoir_.stamps().end()},
                     {}};
  if (reservoir_.any_eligible()) copy.eligible = reservoir_.eligible();
  return copy;
}

absl::StatusOr<DivergenceMatrix> Problem::ComputeDivergencesFor(
    std::vector<std::shared_ptr<const Expert>> models, ReservoirCopy reservoir,
    DivergenceMatrix previous, int keep) {
  DECISION_ASSIGN_OR_RETURN(
      std::unique_ptr<DivergenceJob> job,
      StartDivergences(std::move(models), std::move(reservoir), std::move(previous), keep));
  DECISION_RETURN_IF_ERROR(
      StepDivergences(*job, std::chrono::steady_clock::time_point::max()).status());
  return std::move(job->result);
}

namespace {
absl::Status CheckProbabilities(absl::Span<const double> p) {
  for (const double v : p) {
    if (!(v >= 0.0 && v <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("a probability of ", v));
    }
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<std::unique_ptr<Problem::DivergenceJob>> Problem::StartDivergences(
    std::vector<std::shared_ptr<const Expert>> models, ReservoirCopy reservoir,
    DivergenceMatrix previous, int keep) {
  auto job = std::make_unique<DivergenceJob>();
  const int n = static_cast<int>(models.size());
  job->models = std::move(models);
  job->reservoir = std::move(reservoir);
  job->eligible.assign(job->reservoir.eligible.begin(), job->reservoir.eligible.end());
  job->previous = std::move(previous);
  job->keep = keep;
  const std::vector<double>& contexts = job->reservoir.contexts;
  const int d = record_.num_features();
  job->rows = d == 0 ? (contexts.empty() ? 0 : 1) : contexts.size() / d;
  if (job->rows == 0) {
    // No context seen yet: new experts get identity rows until the first refresh.
    job->result = DivergenceMatrix::Identity(n);
    for (int i = 0; i < keep; ++i) {
      for (int j = 0; j < keep; ++j) {
        job->result.m[i * n + j] = job->previous.M(i, j);
        job->result.sigma[i * n + j] = job->previous.Sigma(i, j);
      }
    }
    return job;
  }
  // The pairs of retired (frozen) and failed experts stay as they are (ComputeDivergences'
  // `fixed`; the estimator keeps them fixed too, Estimator::Retire). A failed expert's
  // pairs weigh the samples chosen while it was healthy, and the stand-in is not the
  // policy that chose them. A fixed expert is scored only for a pair with a new expert.
  // An unloaded expert's pairs with the new ones weigh no kept sample: not computed
  // (ComputeDivergences' `absent`), and neither are a fixed expert's when every pair of it
  // is copied.
  const int covered = std::min(n, job->previous.num_experts);
  job->fixed.reset(new bool[n]());  // (a span of vector<bool> is not)
  job->absent.reset(new bool[n]());
  {
    absl::MutexLock lock(&mu_);
    for (int e = 0; e < covered; ++e) {
      job->fixed[e] = !experts_.at(e).failure.empty() || experts_.Frozen(e);
      job->absent[e] = experts_.Unloaded(e) || (job->fixed[e] && covered == n);
    }
  }
  job->held.resize(n);
  return job;
}

absl::Status Problem::StartComputation(DivergenceJob& job) {
  const int n = static_cast<int>(job.models.size());
  DECISION_ASSIGN_OR_RETURN(
      job.computation,
      DivergenceComputation::Start(n, job.rows, record_.num_arms(), record_.divergence_groups(),
                                   &job.previous, job.keep, absl::MakeConstSpan(job.fixed.get(), n),
                                   absl::MakeConstSpan(job.absent.get(), n),
                                   env_.divergence_limits));
  return absl::OkStatus();
}

absl::StatusOr<bool> Problem::StepDivergences(DivergenceJob& job,
                                             std::chrono::steady_clock::time_point deadline) {
  // Terms per step against a deadline: 2 to 11 ms of CPU at 3.1 to 5.3 ns a term (26 to
  // 4096 arms), shared with the scorer threads.
  constexpr int64_t kTermsPerStep = int64_t{1} << 21;
  if (job.rows == 0) return true;  // no context: job.result is set
  const int n = static_cast<int>(job.models.size());
  const int k = record_.num_arms();
  const int d = record_.num_features();
  const std::vector<double>& contexts = job.reservoir.contexts;
  const int covered = std::min(n, job.previous.num_experts);
  // An expert that failed just now is scored as its stand-in (which does not fail) and
  // keeps its pairs; its quarantine, to pass to QuarantineFailures.
  const auto fail = [&](int e, absl::string_view reason) -> ScoringFailure {
    job.models[e] = stand_in_;
    job.held[e] = nullptr;
    if (e < covered) job.fixed[e] = true;
    return {e, absl::StrCat("divergence estimation: ", reason)};
  };
  // The experts whose predictions the cache keeps are predicted in full (the rows that
  // changed since the last computation) and held, shared with the cache, one expert a step;
  // then the computation starts. The others are predicted by the computation a block of
  // contexts at a time, only the contexts it reads, so that a computation holds at most
  // the cache's budget plus DivergenceLimits::max_block_bytes: tens of experts on
  // thousands of arms held in full would be gigabytes (64 MB an expert at 4096 arms).
  while (!job.computation.has_value()) {
    if (job.cached_next == n) {
      DECISION_RETURN_IF_ERROR(StartComputation(job));
      break;
    }
    const int e = job.cached_next++;
    if (job.absent[e] || !reservoir_predictions_.WouldKeep(e, job.rows, k)) continue;
    absl::StatusOr<ReservoirPredictions::Shared> p = reservoir_predictions_.Predict(
        e, job.models[e], contexts, job.reservoir.stamps, job.reservoir.eligible);
    const absl::Status s = p.ok() ? CheckProbabilities(**p) : p.status();
    if (s.ok()) {
      job.held[e] = *std::move(p);
    } else {
      QuarantineFailures({fail(e, s.message())});
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
  // Why each expert failed on a block of contexts, if it did (written by the scorer
  // threads, one entry each).
  std::vector<absl::Status> failed_now(n);
  const auto predict = [&](int e, size_t begin, size_t end,
                           absl::Span<double> out) -> absl::Status {
    if (job.held[e] != nullptr) {
      std::copy(job.held[e]->begin() + begin * k, job.held[e]->begin() + end * k, out.begin());
      return absl::OkStatus();
    }
    absl::Status s = job.models[e]->PredictBatchEligible(
        absl::MakeConstSpan(contexts).subspan(begin * d, (end - begin) * d), end - begin,
        job.eligible.empty() ? absl::Span<const absl::Span<const int32_t>>()
                             : absl::MakeConstSpan(job.eligible).subspan(begin, end - begin),
        out);
    if (s.ok()) s = CheckProbabilities(out);
    failed_now[e] = s;
    return s;
  };
  // The blocks' predictions (by expert) and terms (by pair) on the scorer threads too.
  DivergenceThreads threads;
  threads.tasks = 1 + (env_.scorers != nullptr ? env_.scorers->threads() : 0);
  threads.run = [this](int tasks, absl::FunctionRef<void(int)> fn) {
    ParallelFor(env_.scorers, tasks, fn);
  };
  const bool unbounded = deadline == std::chrono::steady_clock::time_point::max();
  DivergenceComputation& c = *job.computation;
  do {
    std::fill(failed_now.begin(), failed_now.end(), absl::OkStatus());
    const absl::Status s =
        c.Step(predict, unbounded ? std::numeric_limits<int64_t>::max() : kTermsPerStep, threads);
    if (s.ok()) continue;
    // Again from the start, with the experts that failed as their stand-in.
    std::vector<ScoringFailure> failures;
    for (int e = 0; e < n; ++e) {
      if (!failed_now[e].ok() && job.models[e] != stand_in_) {
        failures.push_back(fail(e, failed_now[e].message()));
      }
    }
    if (failures.empty()) return s;
    QuarantineFailures(failures);
    DECISION_RETURN_IF_ERROR(StartComputation(job));
  } while (!c.done() && std::chrono::steady_clock::now() < deadline);
  if (!c.done()) return false;
  job.result = c.Take();
  return true;
}

absl::Status Problem::MaybeRefreshDivergences(std::vector<int64_t>* boundaries,
                                              int64_t min_interval_ms,
                                              std::chrono::steady_clock::time_point deadline) {
  if (refresh_ == nullptr) {
    std::vector<std::shared_ptr<const Expert>> models;
    ReservoirCopy reservoir;
    DivergenceMatrix previous;
    std::optional<CheckpointWrite> kept;
    {
      absl::MutexLock lock(&mu_);
      if (ducb_.num_samples() < next_refresh_at_ || reservoir_.size() == 0) {
        return absl::OkStatus();
      }
      if (min_interval_ms > 0 && env_.clock->NowMs() - last_refresh_ms_ < min_interval_ms) {
        return absl::OkStatus();
      }
      if (ReservoirTurnoverLocked() < record_.divergence_refresh_turnover()) {
        // Too little of the reservoir changed for a re-estimate to be more than fresh
        // noise: the estimated experts' divergences stand, and the boundaries pass (their
        // training jobs run; a new expert's divergences are estimated when its backfill
        // completes).
        PassBoundariesLocked(boundaries, min_interval_ms);
        metrics_.divergences_kept->Increment();
        kept = CheckpointLocked();
      } else {
        models = experts_.Models(ducb_.num_experts());
        reservoir = CopyReservoirLocked();
        previous = ducb_.estimator().divergences();
      }
    }
    if (kept.has_value()) return WriteCheckpoint(*kept);
    DECISION_ASSIGN_OR_RETURN(refresh_, StartDivergences(std::move(models), std::move(reservoir),
                                                         std::move(previous), /*keep=*/0));
  }
  absl::StatusOr<bool> done = StepDivergences(*refresh_, deadline);
  if (!done.ok() || !*done) {
    metrics_.divergence_refresh_progress->Set(
        done.ok() && refresh_->computation.has_value() ? refresh_->computation->progress() : 0.0);
    if (!done.ok()) refresh_ = nullptr;  // the next round starts again
    return done.status();
  }
  metrics_.divergence_refresh_progress->Set(0.0);
  const std::unique_ptr<DivergenceJob> job = std::move(refresh_);
  DivergenceMatrix d = std::move(job->result);
  const int n = static_cast<int>(job->models.size());
  CheckpointWrite checkpoint;
  {
    absl::MutexLock lock(&mu_);
    const int now = ducb_.num_experts();
    if (now < n) return absl::OkStatus();  // cannot happen; the next round starts again
    // What changed while the refresh was computed (between rounds): experts whose backfill
    // completed keep the pairs their backfill computed, and experts quarantined since it
    // started keep theirs (a failed expert's pairs stay as they were); the refresh gives
    // the rest.
    std::vector<bool> failed_since(n);
    bool changed = now > n;
    for (int e = 0; e < n; ++e) {
      // (No flags when no context was seen: a problem without features.)
      const bool fixed = job->fixed != nullptr && job->fixed[e];
      failed_since[e] = !experts_.at(e).failure.empty() && !fixed;
      changed = changed || failed_since[e];
    }
    if (changed) {
      DivergenceMatrix merged = ducb_.estimator().divergences();
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          if (failed_since[i] || failed_since[j]) continue;
          merged.m[static_cast<size_t>(i) * now + j] = d.M(i, j);
          merged.sigma[static_cast<size_t>(i) * now + j] = d.Sigma(i, j);
        }
      }
      d = std::move(merged);
    }
    // In place: the estimators keep divergence-free sums, so this reads no sample.
    DECISION_RETURN_IF_ERROR(ducb_.SetDivergences(d));
    ++estimator_generation_;
    PassBoundariesLocked(boundaries, min_interval_ms);
    ++estimates_generation_;
    MarkPoolWork();  // retirement under the new estimates
    reestimated_stamps_ = std::move(job->reservoir.stamps);
    metrics_.divergences_reestimated->Increment();
    checkpoint = CheckpointLocked();
  }
  return WriteCheckpoint(checkpoint);
}

void Problem::PassBoundariesLocked(std::vector<int64_t>* boundaries, int64_t min_interval_ms) {
  const int64_t t = ducb_.num_samples();
  if (min_interval_ms > 0) {
    // The throttle merges the boundaries passed into one, here.
    if (boundaries != nullptr) boundaries->push_back(t);
    next_refresh_at_ = NextRefresh(record_, t);
  } else {
    // Every boundary passed, each at its own round.
    while (next_refresh_at_ <= t) {
      if (boundaries != nullptr) boundaries->push_back(next_refresh_at_);
      next_refresh_at_ = NextRefresh(record_, next_refresh_at_);
    }
  }
  last_refresh_ms_ = env_.clock->NowMs();
}

double Problem::ReservoirTurnoverLocked() const {
  const absl::Span<const uint64_t> stamps = reservoir_.stamps();
  if (stamps.empty()) return 0.0;
  size_t changed = 0;
  for (size_t i = 0; i < stamps.size(); ++i) {
    changed += i >= reestimated_stamps_.size() || reestimated_stamps_[i] != stamps[i];
  }
  return static_cast<double>(changed) / static_cast<double>(stamps.size());
}

}  // namespace decision::server
