// Problem: the backfill of a new expert. Its probabilities of the stored samples' arms are
// scored a chunk at a time from the sample records and written as backfill chunks; each
// chunk also feeds the expert's estimator rows (Estimator::NewExpertRows), so that no
// sample log is needed in memory. The completion computes its divergences, feeds the rows
// the samples learnt meanwhile (from the store without mu_, the last ones from the log
// chunks in memory under it) and appends them to D-UCB.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/problem.h"
#include "server/validation.h"

namespace decision::server {

using storage::v1::ExpertRecord;

absl::Status Problem::StepBackfill(bool* worked) {
  *worked = false;
  int expert_id;
  std::shared_ptr<const Expert> model;
  int64_t from, total;
  {
    absl::MutexLock lock(&mu_);
    expert_id = ducb_.num_experts();
    if (expert_id >= experts_.durable_size()) return absl::OkStatus();
    const ExpertSlot& slot = experts_.at(expert_id);
    model = slot.model;
    from = slot.backfilled;
    total = slot.record.backfill_total();
  }
  *worked = true;
  if (from < total) {
    DECISION_RETURN_IF_ERROR(BackfillChunk(expert_id, model, from, total));
    absl::MutexLock lock(&mu_);
    if (experts_.at(expert_id).backfilled < total) {
      return absl::OkStatus();
    }
  }
  return CompleteBackfill(expert_id);
}

absl::Status Problem::ScoreRows(const Expert& model, absl::Span<const double> rows, size_t n,
                               absl::Span<const absl::Span<const int32_t>> eligible,
                               absl::Span<double> probs) const {
  // Parts of at least this many rows: a few hundred microseconds of a small tree model,
  // against the few microseconds that handing a part to another thread costs.
  constexpr size_t kMinPartRows = 256;
  const int helpers = env_.scorers != nullptr ? env_.scorers->threads() : 0;
  const size_t parts =
      std::min<size_t>(1 + helpers, std::max<size_t>(1, n / kMinPartRows));
  const size_t d = static_cast<size_t>(model.num_features());
  const size_t k = static_cast<size_t>(model.num_arms());
  std::vector<absl::Status> status(parts);
  ParallelFor(env_.scorers, static_cast<int>(parts), [&](int part) {
    const size_t first = n * part / parts, end = n * (part + 1) / parts;
    status[part] = model.PredictBatchEligible(
        rows.subspan(first * d, (end - first) * d), end - first,
        eligible.empty() ? eligible : eligible.subspan(first, end - first),
        probs.subspan(first * k, (end - first) * k));
  });
  for (absl::Status& s : status) DECISION_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status Problem::BackfillChunk(int expert_id, const std::shared_ptr<const Expert>& model,
                                    int64_t from, int64_t total) {
  const int64_t count = std::min<int64_t>(storage::kBackfillChunkSamples, total - from);
  const int d = record_.num_features();
  const int k = record_.num_arms();
  // Scored in batches of at most kBatchDoubles feature values, so that the memory of one
  // step does not grow with num_features (validation.h bounds the rest).
  constexpr int64_t kBatchDoubles = int64_t{1} << 20;
  const int64_t batch_rows = std::max<int64_t>(1, kBatchDoubles / std::max(1, d));
  storage::v1::BackfillChunk chunk;
  std::vector<double> rows, probs;
  std::vector<int> arms;
  // Each sample's eligible arms (as it was decided), and whether any batch row has some.
  std::vector<std::vector<int32_t>> eligible_arms;
  std::vector<absl::Span<const int32_t>> eligible;
  bool restricted = false;
  // What the estimator rows need of each sample besides the expert's value.
  std::vector<int> choosers;
  std::vector<double> rewards, logged;
  for (int64_t start = from; start < from + count; start += batch_rows) {
    const int64_t n = std::min(batch_rows, from + count - start);
    rows.clear();
    arms.clear();
    eligible_arms.clear();
    restricted = false;
    DECISION_RETURN_IF_ERROR(env_.store->ForEachSample(
        index_, start, n, [&](int64_t, const storage::v1::SampleRecord& s) {
          if (s.redacted()) {
            // Its context was deleted (DeleteEvents): not scored (a NaN value), and left
            // out of the expert's window (ExpertRows::Skip).
            rows.resize(rows.size() + d, 0.0);
            arms.push_back(-1);
            eligible_arms.emplace_back();
            choosers.push_back(s.expert_id());
            rewards.push_back(s.reward());
            logged.push_back(s.propensity());
            return absl::OkStatus();
          }
          if (s.features_size() != d || s.arm() < 0 || s.arm() >= k) {
            return absl::DataLossError(absl::StrCat("problem ", id(), ": a stored sample has ",
                                                    s.features_size(), " features and arm ",
                                                    s.arm()));
          }
          const absl::Span<const int32_t> allowed =
              absl::MakeConstSpan(s.eligible_arms().data(), s.eligible_arms_size());
          if (!StoredEligibleArmsValid(allowed, s.arm(), k)) {
            return absl::DataLossError(absl::StrCat(
                "problem ", id(), ": a stored sample has damaged eligible arms"));
          }
          rows.insert(rows.end(), s.features().begin(), s.features().end());
          arms.push_back(s.arm());
          eligible_arms.emplace_back(allowed.begin(), allowed.end());
          restricted = restricted || !allowed.empty();
          choosers.push_back(s.expert_id());
          rewards.push_back(s.reward());
          logged.push_back(s.propensity());
          return absl::OkStatus();
        }));
    if (static_cast<int64_t>(arms.size()) != n) {
      return absl::DataLossError(absl::StrCat("problem ", id(), ": backfill found ",
                                              arms.size(), " samples, expected ", n));
    }
    probs.resize(static_cast<size_t>(n) * k);
    eligible.clear();
    if (restricted) eligible.assign(eligible_arms.begin(), eligible_arms.end());
    absl::Status scored = ScoreRows(*model, rows, static_cast<size_t>(n), eligible,
                                    absl::MakeSpan(probs));
    for (int64_t i = 0; scored.ok() && i < n; ++i) {
      if (arms[i] < 0) {
        chunk.add_values(std::nan(""));
        continue;
      }
      const double p = probs[i * k + arms[i]];
      if (!(p > 0.0 && p <= 1.0)) {
        scored = absl::InvalidArgumentError(
            absl::StrCat("sample ", start + i, " gets probability ", p, " for its arm"));
      }
      chunk.add_values(p);
    }
    if (!scored.ok()) {
      // The expert cannot score the stored log: quarantined; the next step backfills the
      // rest of this chunk with its stand-in.
      absl::MutexLock lock(&mu_);
      QuarantineLocked(expert_id, absl::StrCat("backfill: ", scored.message()));
      return absl::OkStatus();
    }
  }
  if (env_.hooks != nullptr && env_.hooks->after_backfill_scoring) {
    env_.hooks->after_backfill_scoring(expert_id);
  }
  DECISION_RETURN_IF_ERROR(Timed([&] {
    return env_.store->PutBackfillChunk(index_, expert_id, from / storage::kBackfillChunkSamples,
                                        chunk);
  }));
  absl::MutexLock lock(&mu_);
  ExpertSlot& slot = experts_.at(expert_id);
  const int64_t first = slot.record.backfill_first();
  if (from == first && slot.rows == nullptr && ducb_.num_experts() == expert_id) {
    absl::StatusOr<std::unique_ptr<ExpertRows>> started = ducb_.NewExpertRows(1, first);
    if (started.ok()) slot.rows = *std::move(started);
  }
  if (slot.rows != nullptr && slot.rows->num_samples() == from &&
      static_cast<int64_t>(choosers.size()) == chunk.values_size()) {
    for (int i = 0; i < chunk.values_size(); ++i) {
      const double v = chunk.values(i);
      if (!(std::isnan(v) ? slot.rows->Skip(choosers[i])
                          : slot.rows->Add(choosers[i], rewards[i], logged[i], {v}))
               .ok()) {
        slot.rows = nullptr;  // the completion reads the store, and says what is wrong
        break;
      }
    }
  }
  slot.backfilled += chunk.values_size();
  slot.metrics.backfill_progress->Set(static_cast<double>(slot.backfilled - first) /
                                      static_cast<double>(total - first));
  return absl::OkStatus();
}

absl::Status Problem::FeedRowsFromStore(int expert_id, int64_t total, int64_t from, int64_t to,
                                        absl::Span<const double> tail, ExpertRows* rows) {
  // Samples below `total` have the expert's value in its backfill chunks (chunk c covers the
  // samples of log chunk c), the later ones in `tail` (its values of [from, to)).
  if (from == to) return absl::OkStatus();  // (a limit of 0 would scan every sample)
  storage::v1::BackfillChunk backfill;
  int64_t backfill_chunk = -1;
  int64_t seen = 0;
  DECISION_RETURN_IF_ERROR(env_.store->ForEachSample(
      index_, from, to - from, [&](int64_t seq, const storage::v1::SampleRecord& s) {
        if (seq != from + seen) {
          return absl::DataLossError(absl::StrCat("problem ", id(), ": sample ", from + seen,
                                                  " is missing from the store"));
        }
        double value;
        if (seq < total) {
          const int64_t chunk = seq / storage::kBackfillChunkSamples;
          if (chunk != backfill_chunk) {
            DECISION_ASSIGN_OR_RETURN(
                backfill, env_.store->GetBackfillChunk(index_, static_cast<uint32_t>(expert_id),
                                                       static_cast<uint64_t>(chunk)));
            backfill_chunk = chunk;
          }
          const int64_t i = seq - chunk * storage::kBackfillChunkSamples;
          if (i >= backfill.values_size()) {
            return absl::DataLossError(absl::StrCat("problem ", id(), ": expert ", expert_id,
                                                    " has no backfilled value of sample ", seq));
          }
          value = backfill.values(i);
        } else {
          value = tail[seq - from];
        }
        ++seen;
        // NaN: a redacted sample the backfill could not score (left out of the window).
        absl::Status added = std::isnan(value)
                                 ? rows->Skip(s.expert_id())
                                 : rows->Add(s.expert_id(), s.reward(), s.propensity(), {value});
        if (!added.ok()) {
          return absl::DataLossError(absl::StrCat("problem ", id(), ": sample ", seq,
                                                  " cannot be learned: ", added.message()));
        }
        return absl::OkStatus();
      }));
  if (from + seen != to) {
    return absl::DataLossError(absl::StrCat("problem ", id(), ": the store has samples up to ",
                                            from + seen, ", the log ", to));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Problem::FeedRowsFromMemoryLocked(int expert_id, ExpertRows* rows) {
  const int64_t from = rows->num_samples();
  const int64_t to = ducb_.num_samples();
  if (from == to) return true;
  const int64_t earliest =
      unwritten_chunks_.empty() ? current_chunk_.first() : unwritten_chunks_.front().first();
  const int64_t total = experts_.at(expert_id).record.backfill_total();
  if (from < earliest || from < total) return false;
  const std::vector<double>& tail = experts_.at(expert_id).tail;
  const auto feed = [&](const ChunkRows& c) -> absl::Status {
    for (int64_t s = std::max(from, c.first()); s < c.first() + c.size() && s < to; ++s) {
      const int64_t i = s - c.first();
      const int j = c.chooser[i];
      absl::Status added = rows->Add(j, c.reward[i], c.chooser_propensity[i], {tail[s - total]});
      if (!added.ok()) {
        return absl::InternalError(absl::StrCat("problem ", id(), ": sample ", s,
                                                " cannot be learned: ", added.message()));
      }
    }
    return absl::OkStatus();
  };
  for (const ChunkRows& c : unwritten_chunks_) DECISION_RETURN_IF_ERROR(feed(c));
  DECISION_RETURN_IF_ERROR(feed(current_chunk_));
  if (rows->num_samples() != to) {
    return absl::InternalError(absl::StrCat("problem ", id(), ": the chunks in memory cover ",
                                            rows->num_samples(), " samples, the log ", to));
  }
  return true;
}

absl::Status Problem::CompleteBackfill(int expert_id) {
  // Divergences of the new expert against the estimated ones, without mu_.
  std::vector<std::shared_ptr<const Expert>> models;
  ReservoirCopy reservoir;
  DivergenceMatrix previous;
  std::unique_ptr<ExpertRows> rows;
  int64_t total;
  {
    absl::MutexLock lock(&mu_);
    models = experts_.Models(expert_id + 1);
    reservoir = CopyReservoirLocked();
    previous = ducb_.estimator().divergences();
    ExpertSlot& slot = experts_.at(expert_id);
    total = slot.record.backfill_total();
    rows = std::move(slot.rows);
    if (rows == nullptr || rows->num_samples() > total) {
      DECISION_ASSIGN_OR_RETURN(rows, ducb_.NewExpertRows(1, slot.record.backfill_first()));
    }
  }
  DECISION_ASSIGN_OR_RETURN(DivergenceMatrix d,
                            ComputeDivergencesFor(std::move(models), std::move(reservoir),
                                                  std::move(previous), expert_id));
  // Its rows over every learned sample, with no log in memory: the samples before its
  // registration were fed as they were backfilled (or, after a restart, are read from the
  // store: their choosers and rewards, and its backfill chunks); the later ones come in
  // passes without mu_ while the learner goes on, until the rest is in the chunks in
  // memory; those are fed under mu_, and the rows swapped in (O(L N^2)).
  DECISION_RETURN_IF_ERROR(
      FeedRowsFromStore(expert_id, total, rows->num_samples(), total, {}, rows.get()));
  absl::MutexLock writes(&expert_writes_mu_);
  CheckpointWrite checkpoint;
  bool skip_checkpoint = false;
  ExpertRecord active;
  bool retired;
  for (;;) {
    int64_t from, to;
    std::vector<double> tail;
    {
      absl::MutexLock lock(&mu_);
      DECISION_ASSIGN_OR_RETURN(const bool fed, FeedRowsFromMemoryLocked(expert_id, rows.get()));
      if (fed) {
        ExpertSlot& slot = experts_.at(expert_id);
        DECISION_RETURN_IF_ERROR(ducb_.AddExperts(std::move(rows), d));
        // A FAILED expert keeps its stored state (BACKFILLING): a restart that loads its
        // model again backfills it for real.
        retired = slot.record.status() == storage::v1::EXPERT_STATE_RETIRED ||
                  !slot.failure.empty();
        ducb_.SetSelectable(expert_id, !retired && !slot.record.shadow());
        slot.tail = {};
        slot.metrics.backfill_progress->Set(1.0);
        ++estimator_generation_;
        // Several experts waiting (a training job's): one checkpoint, with the estimators'
        // state, after the last. A restart before it backfills the others again from their
        // stored backfill.
        skip_checkpoint = experts_.durable_size() > ducb_.num_experts();
        if (!skip_checkpoint) checkpoint = CheckpointLocked();
        active = slot.record;
        active.set_status(storage::v1::EXPERT_STATE_ACTIVE);
        break;
      }
      from = rows->num_samples();
      to = ducb_.num_samples();
      const std::vector<double>& t = experts_.at(expert_id).tail;
      tail.assign(t.begin() + (from - total), t.begin() + (to - total));
    }
    DECISION_RETURN_IF_ERROR(FeedRowsFromStore(expert_id, total, from, to, tail, rows.get()));
  }
  // The checkpoint (which experts are estimated) first, then the expert's state: a restart
  // between the two finds the expert estimated and marks it active. (One past the last
  // checkpoint is backfilling again after a restart, whatever its record says.)
  if (!skip_checkpoint) DECISION_RETURN_IF_ERROR(WriteCheckpoint(checkpoint));
  if (retired) return absl::OkStatus();
  return WriteExpertRecord(expert_id, active);
}

}  // namespace decision::server
