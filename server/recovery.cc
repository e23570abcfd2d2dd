// Problem::Load: a problem rebuilt from the store, in named steps (as LevelDB's
// DBImpl::Recover). Every size a record states is checked before it is used to index: a
// record that does not fit the problem is DATA_LOSS naming the record, never a read out of
// bounds.
//
//   1. LoadExperts        expert records and models, ids dense from 0
//   2. LoadCheckpoint     the estimators' state after the checkpoint's samples, which
//                         experts it estimates, their divergences, the reservoir
//   3. LoadRetention      what retention deleted (the first sample kept)
//   4. LoadBackfills      how far the backfill of each expert past the checkpoint got
//   5. ReplayLogChunks    the samples after the checkpoint (and, for the tails of the
//                         backfilling experts, since their registration), from the log
//                         chunks: no model is evaluated
//   6. RescoreTail        the samples the chunks do not cover, scored by the models again
//   7. Finish             the reservoir, the batch schedule, the counts
//   8. LoadPending        the decisions still waiting for their reward
//   9. MeasureCosts       the scoring cost of experts stored without one (not written)
//
// Steps 5 and 6 cost what was learned since the last checkpoint (a batch boundary: at most
// about b sqrt(t) samples), not the whole history. The stored event ids, which Choose's
// idempotency filter holds, are read once the problem serves (Problem::StepEventIdLoad,
// from maintenance): their number grows with the window kept. A checkpoint written before
// the estimators' state was (no estimator_state) makes them learn the whole log again.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/conversions.h"
#include "server/problem.h"
#include "server/validation.h"

namespace decision::server {

using storage::v1::CheckpointRecord;
using storage::v1::EventRecord;
using storage::v1::ExpertRecord;
using storage::v1::SampleRecord;

// The state of one recovery, and its steps. A friend of Problem.
class Recovery {
 public:
  Recovery(Problem* p, uint32_t index) : p_(*p), index_(index), store_(*p->env_.store) {}

  absl::Status Run() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // p_ is not shared yet
    const auto start = std::chrono::steady_clock::now();
    DECISION_RETURN_IF_ERROR(LoadExperts());
    DECISION_RETURN_IF_ERROR(LoadCheckpoint());
    DECISION_RETURN_IF_ERROR(LoadRetention());
    DECISION_RETURN_IF_ERROR(LoadBackfills());
    const auto replay = std::chrono::steady_clock::now();
    DECISION_RETURN_IF_ERROR(ReplayLogChunks());
    const int64_t from_chunks = next_ - start_;
    DECISION_RETURN_IF_ERROR(RescoreTail());
    DECISION_RETURN_IF_ERROR(Finish());
    DECISION_RETURN_IF_ERROR(LoadPending());
    // The stored event ids are read after the load, by maintenance (StepEventIdLoad): a
    // restart's time does not grow with them.
    p_.event_ids_loading_ = true;
    const auto end = std::chrono::steady_clock::now();
    MeasureCosts();
    SetMetrics();
    // What a slow load spent its time on (the operator's question at a slow restart).
    const auto seconds = [](auto d) { return std::chrono::duration<double>(d).count(); };
    if (seconds(end - start) >= 1.0) {
      std::fprintf(stderr,
                   "decisiond: problem %s loaded in %.2f s: %.2f s replaying %lld samples (%lld "
                   "from log chunks, %lld scored again; %lld learned past its estimator "
                   "state)\n",
                   p_.id().c_str(), seconds(end - start), seconds(end - replay),
                   static_cast<long long>(next_ - start_), static_cast<long long>(from_chunks),
                   static_cast<long long>(next_ - start_ - from_chunks),
                   static_cast<long long>(p_.ducb_.num_samples() - replay_from_));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status DataLoss(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("problem ", p_.id(), ": ", what));
  }
  int num_experts() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return p_.experts_.size(); }

  absl::Status LoadExperts() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const storage::v1::ProblemRecord& r = p_.record_;
    return store_.ForEachExpert(index_, [&](uint32_t id, const ExpertRecord& er) -> absl::Status {
      if (id != static_cast<uint32_t>(num_experts())) {
        return DataLoss(absl::StrCat("expert ids are not contiguous at ", id));
      }
      ExpertSlot slot;
      slot.record = er;
      slot.metrics = p_.env_.metrics->ForExpert(r.problem_id(), static_cast<int>(id));
      if (!er.failure().empty()) {
        // Quarantined: its model is not even loaded.
        slot.failure = er.failure();
        slot.model = p_.stand_in_;
      } else if (er.has_unloaded_at_sample()) {
        slot.model = p_.stand_in_;  // retired, and nothing needs its model any more
      } else {
        absl::StatusOr<std::unique_ptr<Expert>> model =
            BuildExpert(er.model(), r.num_arms(), r.num_features(), er.smoothing());
        if (model.ok()) {
          slot.model = *std::move(model);
        } else {
          // A model stored by an earlier version (or corrupted) that no longer loads fails
          // alone: the problem serves with the others.
          slot.failure = std::string(model.status().message());
          slot.model = p_.stand_in_;
          std::fprintf(stderr, "decisiond: problem %s: expert %u FAILED: %s\n",
                       r.problem_id().c_str(), id, slot.failure.c_str());
        }
      }
      // Loaded, or failed: the store keeps the payload.
      storage::DropModelPayload(slot.record.mutable_model());
      slot.metrics.failed->Set(slot.failure.empty() ? 0.0 : 1.0);
      p_.experts_.Add(std::move(slot));
      return absl::OkStatus();
    });
  }

  absl::Status LoadCheckpoint() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    absl::StatusOr<CheckpointRecord> stored = store_.GetCheckpoint(index_);
    if (stored.ok()) {
      checkpoint_ = *std::move(stored);
    } else if (!absl::IsNotFound(stored.status())) {
      return stored.status();
    }
    // Expert records are written before a checkpoint that covers them.
    if (checkpoint_.num_experts() < 0 || checkpoint_.num_experts() > num_experts()) {
      return DataLoss(absl::StrCat("the checkpoint covers ", checkpoint_.num_experts(),
                                   " experts, the store has ", num_experts()));
    }
    n_est_ = checkpoint_.num_experts();
    divergences_ = DivergenceMatrix::Identity(n_est_);
    const int cells = n_est_ * n_est_;
    if (checkpoint_.m_size() != cells || checkpoint_.sigma_size() != cells) {
      return DataLoss(absl::StrCat("the checkpoint's divergence matrices have ",
                                   checkpoint_.m_size(), " and ", checkpoint_.sigma_size(),
                                   " entries, expected ", cells));
    }
    divergences_.m.assign(checkpoint_.m().begin(), checkpoint_.m().end());
    divergences_.sigma.assign(checkpoint_.sigma().begin(), checkpoint_.sigma().end());
    const int d = p_.record_.num_features();
    const int64_t values = checkpoint_.reservoir_size();
    if (values > 0 && (d == 0 || values % d != 0 ||
                       values / d > p_.record_.divergence_reservoir())) {
      return DataLoss(absl::StrCat("the checkpoint's reservoir has ", values,
                                   " values, not at most ", p_.record_.divergence_reservoir(),
                                   " rows of ", d, " features"));
    }
    DECISION_RETURN_IF_ERROR(LoadReservoirEligible(values == 0 ? 0 : values / d));
    // Experts past the checkpoint are backfilling again; the checkpoint's are estimated.
    for (int id = 0; id < num_experts(); ++id) {
      ExpertRecord& record = p_.experts_.at(id).record;
      if (id >= n_est_ && record.status() != storage::v1::EXPERT_STATE_RETIRED) {
        record.set_status(storage::v1::EXPERT_STATE_BACKFILLING);
      } else if (id < n_est_ && record.status() == storage::v1::EXPERT_STATE_BACKFILLING) {
        record.set_status(storage::v1::EXPERT_STATE_ACTIVE);
      }
    }
    return RestoreEstimator();
  }

  // The reservoir rows' eligible arms (CheckpointRecord.reservoir_eligible_count), checked.
  absl::Status LoadReservoirEligible(int64_t rows) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const auto& counts = checkpoint_.reservoir_eligible_count();
    const auto& arms = checkpoint_.reservoir_eligible();
    if (counts.empty() && arms.empty()) return absl::OkStatus();
    if (counts.size() != rows) {
      return DataLoss(absl::StrCat("the checkpoint's reservoir has ", rows, " rows and ",
                                   counts.size(), " eligible-arm counts"));
    }
    reservoir_eligible_.resize(rows);
    int64_t at = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t count = counts[r];
      if (count < 0 || count > arms.size() - at) {
        return DataLoss(absl::StrCat("the checkpoint's reservoir row ", r, " has ", count,
                                     " eligible arms, past the ", arms.size(), " stored"));
      }
      const absl::Span<const int32_t> row = absl::MakeConstSpan(arms.data() + at, count);
      if (count > 0 && !StoredEligibleArmsValid(row, row[0], p_.record_.num_arms())) {
        return DataLoss(
            absl::StrCat("the checkpoint's reservoir row ", r, " has damaged eligible arms"));
      }
      reservoir_eligible_[r].assign(row.begin(), row.end());
      at += count;
    }
    if (at != arms.size()) {
      return DataLoss(absl::StrCat("the checkpoint's reservoir has ", arms.size(),
                                   " eligible arms, its rows count ", at));
    }
    return absl::OkStatus();
  }

  // D-UCB as the last estimator state written left it, or, for a store written before it
  // existed, with no samples (the whole log is learned again).
  absl::Status RestoreEstimator() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const EstimatorOptions options = EstimatorOptionsOf(p_.record_);
    absl::StatusOr<storage::v1::EstimatorStateRecord> stored =
        store_.GetEstimatorState(index_);
    if (!stored.ok() && !absl::IsNotFound(stored.status())) return stored.status();
    if (!stored.ok()) {
      absl::StatusOr<DUcb> fresh = DUcb::Create(options, n_est_, DUcb::LogMode::kNone);
      if (!fresh.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "problem ", p_.id(), " cannot be served: ", fresh.status().message(),
            "; its stored data is kept"));
      }
      DECISION_RETURN_IF_ERROR(fresh->SetDivergences(divergences_));
      p_.ducb_ = *std::move(fresh);
      replay_from_ = 0;
    } else {
      const storage::v1::EstimatorStateRecord& state = *stored;
      std::vector<OffPolicySums> off_policy;
      if (state.off_policy_size() % OffPolicySums::kStateValues != 0) {
        return DataLoss(absl::StrCat("estimator state: ", state.off_policy_size(),
                                     " off-policy values"));
      }
      for (int i = 0; i < state.off_policy_size(); i += OffPolicySums::kStateValues) {
        absl::StatusOr<OffPolicySums> sums = OffPolicySums::FromArray(absl::MakeConstSpan(
            state.off_policy().data() + i, OffPolicySums::kStateValues));
        if (!sums.ok()) return DataLoss(absl::StrCat("estimator state: ", sums.status().message()));
        off_policy.push_back(*sums);
      }
      absl::StatusOr<DUcb> restored = DUcb::Restore(
          options, state.state(), {state.times_selected().begin(), state.times_selected().end()},
          std::move(off_policy));
      if (!restored.ok()) {
        return DataLoss(absl::StrCat("estimator state: ", restored.status().message()));
      }
      // Written with every checkpoint that follows a change of the experts or divergences.
      if (restored->num_experts() != n_est_ || restored->num_samples() != state.samples() ||
          state.samples() > checkpoint_.samples() ||
          restored->estimator().divergences().m != divergences_.m ||
          restored->estimator().divergences().sigma != divergences_.sigma ||
          state.positive_rewards() < 0 || state.positive_rewards() > state.samples()) {
        return DataLoss(absl::StrCat(
            "the estimator state covers ", restored->num_experts(), " experts and ",
            restored->num_samples(), " samples (record: ", state.samples(),
            "), the checkpoint ", n_est_, " and ", checkpoint_.samples(),
            " (or its divergences or counts differ)"));
      }
      p_.ducb_ = *std::move(restored);
      replay_from_ = state.samples();
      positive_ = state.positive_rewards();
      p_.state_written_ = true;
      p_.state_samples_ = replay_from_;
    }
    for (int k = 0; k < n_est_; ++k) {
      const ExpertSlot& slot = p_.experts_.at(k);
      p_.ducb_.SetSelectable(k, slot.failure.empty() && !slot.record.shadow() &&
                                    slot.record.status() == storage::v1::EXPERT_STATE_ACTIVE);
    }
    return absl::OkStatus();
  }

  absl::Status LoadRetention() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    absl::StatusOr<storage::v1::RetentionRecord> cut = store_.GetRetention(index_);
    if (absl::IsNotFound(cut.status())) return absl::OkStatus();
    if (!cut.ok()) return cut.status();
    if (cut->first_sample() < 0 || cut->first_sample() % storage::kLogChunkSamples != 0 ||
        cut->first_sample() > checkpoint_.samples()) {
      return DataLoss(absl::StrCat("retention kept the samples from ", cut->first_sample(),
                                   ", the checkpoint covers ", checkpoint_.samples()));
    }
    // The restart learns from the estimators' state on: retention waits for it (Problem::
    // ApplyRetention), so a state before the cut means a store written otherwise.
    if (replay_from_ / storage::kLogChunkSamples * storage::kLogChunkSamples <
        cut->first_sample()) {
      return DataLoss(absl::StrCat("retention deleted the samples before ", cut->first_sample(),
                                   ", but the estimators' state covers only ", replay_from_,
                                   " (was the state deleted?)"));
    }
    p_.retained_from_ = cut->first_sample();
    p_.events_compacted_at_ = cut->first_sample();
    p_.events_cut_ms_ = cut->events_before_ms();
    return absl::OkStatus();
  }

  // The backfill of an expert past the checkpoint resumes after its stored chunks (from
  // the first gap a crash left, if any).
  absl::Status LoadBackfills() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (int id = 0; id < num_experts(); ++id) {
      const ExpertRecord& r = p_.experts_.at(id).record;
      if (r.backfill_total() < 0 || r.backfill_first() < 0 ||
          r.backfill_first() > r.backfill_total() ||
          r.backfill_first() % storage::kLogChunkSamples != 0) {
        return DataLoss(absl::StrCat("expert ", id, " has backfill_total ", r.backfill_total(),
                                     " and backfill_first ", r.backfill_first()));
      }
      // A backfilling expert's window is kept (retention waits for its backfill).
      if (id >= n_est_ && r.backfill_first() < p_.retained_from_ &&
          r.backfill_total() > r.backfill_first()) {
        return DataLoss(absl::StrCat("expert ", id, " backfills from sample ",
                                     r.backfill_first(), ", but retention kept the samples from ",
                                     p_.retained_from_));
      }
    }
    // From the start of the chunk the checkpoint is in at least: the samples of the chunk
    // being filled are kept in memory until it is complete (and written).
    start_ = replay_from_ / storage::kLogChunkSamples * storage::kLogChunkSamples;
    for (int id = n_est_; id < num_experts(); ++id) {
      ExpertSlot& slot = p_.experts_.at(id);
      const int64_t total = slot.record.backfill_total();
      const int64_t first = slot.record.backfill_first();
      start_ = std::min(start_, total);
      int64_t backfilled = first;
      bool gap = false;
      DECISION_RETURN_IF_ERROR(Stopped(store_.ForEachBackfillChunk(
          index_, static_cast<uint32_t>(id),
          [&](uint64_t chunk, const storage::v1::BackfillChunk& c) -> absl::Status {
            if (c.values_size() > storage::kBackfillChunkSamples) {
              return DataLoss(absl::StrCat("backfill chunk ", chunk, " of expert ", id, " has ",
                                           c.values_size(), " values"));
            }
            // A gap (a chunk lost in a crash): the rest is backfilled again.
            if (gap || static_cast<int64_t>(chunk) * storage::kBackfillChunkSamples != backfilled) {
              gap = true;
              return kStop;
            }
            backfilled += c.values_size();
            return absl::OkStatus();
          },
          static_cast<uint64_t>(first / storage::kBackfillChunkSamples))));
      slot.backfilled = std::min(backfilled, total);
    }
    return absl::OkStatus();
  }

  // Replays sample `seq` (chooser, reward, row[k] = pi_k for k < width; NaN: unknown):
  // learns it if it is past the checkpoint, and adds it to the tails of the experts
  // backfilling since before it. False (nothing done) if a value it needs is unknown.
  absl::StatusOr<bool> Replay(int64_t seq, int chooser, double reward, const double* row,
                              int width) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const bool learn = seq >= replay_from_;
    if (learn) {
      if (n_est_ > width) return false;
      for (int k = 0; k < n_est_; ++k) {
        if (std::isnan(row[k])) return false;
      }
    }
    for (int k = n_est_; k < num_experts(); ++k) {
      if (seq >= p_.experts_.at(k).record.backfill_total() && (k >= width || std::isnan(row[k]))) {
        return false;
      }
    }
    if (learn) {
      if (absl::Status s = p_.ducb_.Learn(chooser, reward, absl::MakeConstSpan(row, n_est_));
          !s.ok()) {
        return DataLoss(absl::StrCat("sample ", seq, ": ", s.message()));
      }
      positive_ += reward > 0.0;
    }
    for (int k = n_est_; k < num_experts(); ++k) {
      ExpertSlot& slot = p_.experts_.at(k);
      if (seq >= slot.record.backfill_total()) slot.tail.push_back(row[k]);
    }
    return true;
  }

  absl::Status ReplayLogChunks() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    constexpr int64_t kSamples = storage::kLogChunkSamples;
    next_ = start_;
    // A chunk is written by the maintenance round after its last sample: a crash in between
    // leaves a gap. The samples from the gap on are re-scored, and their chunks written
    // again.
    return Stopped(store_.ForEachLogChunk(
        index_,
        [&](uint64_t chunk, const storage::v1::LogChunk& c) -> absl::Status {
          if (static_cast<int64_t>(chunk) != next_ / kSamples) return kStop;
          DECISION_ASSIGN_OR_RETURN(Problem::ChunkRows rows,
                                    p_.ChunkRowsOf(static_cast<int64_t>(chunk), c, num_experts()));
          // Every expert's column, as the join scored the samples (a frozen expert's is the
          // stand-in's): expanded in a copy when some column was dropped, since `rows`
          // stays as stored for the chunk being filled.
          std::optional<Problem::ChunkRows> expanded;
          if (!rows.dropped.empty()) {
            expanded = rows;
            expanded->Expand(1.0 / p_.record_.num_arms());
          }
          const Problem::ChunkRows& full = expanded.has_value() ? *expanded : rows;
          for (int64_t s = next_; s < rows.first() + rows.size(); ++s) {
            const int64_t i = s - rows.first();
            DECISION_ASSIGN_OR_RETURN(
                const bool replayed, Replay(s, full.chooser[i], full.reward[i], full.row(s), full.width));
            if (!replayed) {
              // The rest of this chunk is re-scored: it is rebuilt in memory from here.
              rows.Truncate(i);
              partial_ = std::move(rows);
              return kStop;
            }
            ++next_;
          }
          if (rows.size() < kSamples) {
            // Written before it was complete (DeleteEvents): filled on from here.
            partial_ = std::move(rows);
            return kStop;
          }
          return absl::OkStatus();
        },
        static_cast<uint64_t>(start_ / kSamples)));
  }

  absl::Status RescoreTail() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    constexpr int64_t kSamples = storage::kLogChunkSamples;
    if (next_ > start_) {
      // The chunks replayed must not cover samples the store does not have.
      absl::StatusOr<SampleRecord> last = store_.GetSample(index_, next_ - 1);
      if (!last.ok() && !absl::IsNotFound(last.status())) return last.status();
      if (!last.ok()) {
        return DataLoss(absl::StrCat("the log chunks cover ", next_,
                                     " samples, the store has fewer"));
      }
    }
    if (partial_.has_value()) {
      p_.current_chunk_ = *std::move(partial_);
    } else {
      p_.current_chunk_.chunk = next_ / kSamples;
    }
    std::vector<Problem::Unlearned> batch;
    const auto score = [&]() -> absl::Status {
      // Scored as the learner scores a batch (Problem::ScoreBatch): the chooser's logged
      // propensity, a frozen expert's stand-in, and an expert that fails is quarantined.
      std::vector<ScoringFailure> failures;
      const std::vector<double> scored =
          p_.ScoreBatch(batch, p_.experts_.JoinModels(p_.stand_in_), "restart", &failures);
      for (const ScoringFailure& f : failures) p_.QuarantineLocked(f.expert, f.reason);
      const int width = num_experts();
      for (size_t i = 0; i < batch.size(); ++i) {
        const Problem::Unlearned& u = batch[i];
        const double* row = &scored[i * width];
        DECISION_ASSIGN_OR_RETURN(
            const bool replayed, Replay(u.sequence, u.event.expert_id(), u.reward, row, width));
        if (!replayed) return DataLoss(absl::StrCat("sample ", u.sequence, " cannot be scored"));
        p_.AppendToLogChunkLocked(u.event.expert_id(), u.reward,
                                  absl::MakeConstSpan(row, width));
      }
      batch.clear();
      return absl::OkStatus();
    };
    DECISION_RETURN_IF_ERROR(store_.ForEachSample(
        index_, next_, 0, [&](int64_t seq, const SampleRecord& s) -> absl::Status {
          if (seq != next_) return DataLoss(absl::StrCat("sample ", next_, " is missing"));
          if (s.features_size() != p_.record_.num_features() || s.arm() < 0 ||
              s.arm() >= p_.record_.num_arms() || s.expert_id() < 0 ||
              s.expert_id() >= num_experts()) {
            return DataLoss(absl::StrCat("sample ", seq, " has ", s.features_size(),
                                         " features, arm ", s.arm(), " and expert ",
                                         s.expert_id()));
          }
          if (!StoredEligibleArmsValid(
                  absl::MakeConstSpan(s.eligible_arms().data(), s.eligible_arms_size()),
                  s.arm(), p_.record_.num_arms())) {
            return DataLoss(absl::StrCat("sample ", seq, " has damaged eligible arms"));
          }
          Problem::Unlearned u;
          u.sequence = seq;
          *u.event.mutable_features() = s.features();
          *u.event.mutable_eligible_arms() = s.eligible_arms();
          u.event.set_arm(s.arm());
          u.event.set_expert_id(s.expert_id());
          u.event.set_propensity(s.propensity());
          u.reward = s.reward();
          batch.push_back(std::move(u));
          ++next_;
          if (static_cast<int64_t>(batch.size()) == kSamples) return score();
          return absl::OkStatus();
        }));
    DECISION_RETURN_IF_ERROR(score());
    if (next_ < replay_from_) {
      return DataLoss(absl::StrCat("the checkpoint covers ", replay_from_,
                                   " samples, the store has ", next_));
    }
    return absl::OkStatus();
  }

  absl::Status Finish() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const int64_t t = p_.ducb_.num_samples();
    p_.positive_rewards_ = positive_;
    p_.positive_learned_ = positive_;
    if (checkpoint_.reservoir_size() > 0) {
      p_.reservoir_.Reset(std::vector<double>(checkpoint_.reservoir().begin(),
                                              checkpoint_.reservoir().end()),
                          checkpoint_.reservoir_seen(), reservoir_eligible_);
    }
    if (checkpoint_.reservoir_reestimate_known()) {
      // The rows replaced since the last estimate get stamp 0, which no row carries.
      const absl::Span<const uint64_t> stamps = p_.reservoir_.stamps();
      p_.reestimated_stamps_.assign(stamps.size(), 0);
      for (int32_t row : checkpoint_.reservoir_unchanged_rows()) {
        if (row < 0 || static_cast<size_t>(row) >= stamps.size()) {
          return DataLoss(absl::StrCat("the checkpoint's unchanged reservoir row ", row,
                                       " is outside its ", stamps.size(), " rows"));
        }
        p_.reestimated_stamps_[row] = stamps[row];
      }
    }
    p_.next_refresh_at_ = checkpoint_.next_refresh_at() > 0 ? checkpoint_.next_refresh_at()
                                                            : NextRefresh(p_.record_, t);
    p_.decisions_ = std::max(checkpoint_.decisions(), t);
    // Experts frozen after the state was written (or by a build that kept their rows) are
    // retired in the estimator now.
    p_.FoldRetiredLocked();
    // Whether each expert chose a stored sample: D-UCB's counts now cover every sample
    // learnt, the log's included. One that never chose is unloaded once frozen and quiet,
    // as in the process that registered it, instead of waiting for a cut past the samples
    // written after this restart (ExpertSlot::may_have_chosen). The experts D-UCB does not
    // estimate yet were never selectable.
    for (int k = 0; k < num_experts(); ++k) {
      p_.experts_.at(k).may_have_chosen = k < p_.ducb_.num_experts() && p_.ducb_.count(k) > 0;
    }
    return absl::OkStatus();
  }

  absl::Status LoadPending() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const storage::v1::ProblemRecord& r = p_.record_;
    DECISION_RETURN_IF_ERROR(store_.ForEachPending(
        index_, [&](int64_t, absl::string_view event_id) -> absl::Status {
          DECISION_ASSIGN_OR_RETURN(EventRecord event, store_.GetEvent(index_, event_id));
          if (event.state() != storage::v1::EVENT_STATE_PENDING) return absl::OkStatus();
          if (event.features_size() != r.num_features() || event.arm() < 0 ||
              event.arm() >= r.num_arms() || event.expert_id() < 0 ||
              event.expert_id() >= num_experts()) {
            return DataLoss(absl::StrCat("pending event ", event_id, " has ",
                                         event.features_size(), " features, arm ", event.arm(),
                                         " and expert ", event.expert_id()));
          }
          if (!StoredEligibleArmsValid(absl::MakeConstSpan(event.eligible_arms().data(),
                                                           event.eligible_arms_size()),
                                       event.arm(), r.num_arms())) {
            return DataLoss(
                absl::StrCat("pending event ", event_id, " has damaged eligible arms"));
          }
          p_.pending_.Restore(std::string(event_id), std::move(event));
          return absl::OkStatus();
        }));
    p_.decisions_ =
        std::max<int64_t>(p_.decisions_, p_.ducb_.num_samples() + p_.pending_.answered());
    return absl::OkStatus();
  }

  // Experts stored before costs were (score_cost_us 0) are measured over the reservoir, as
  // a registration would. Kept in memory only: the next write of the record stores it.
  void MeasureCosts() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (int id = 0; id < num_experts(); ++id) {
      ExpertSlot& slot = p_.experts_.at(id);
      if (!slot.failure.empty() || p_.experts_.Unloaded(id) ||
          slot.record.score_cost_us() > 0.0) {
        continue;
      }
      slot.record.set_score_cost_us(
          p_.ScoringCostUs(slot.record.name(), *slot.model, p_.reservoir_.contexts()));
    }
  }

  void SetMetrics() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    int unloaded = 0;
    for (int id = 0; id < num_experts(); ++id) unloaded += p_.experts_.Unloaded(id);
    p_.metrics_.experts_unloaded->Set(unloaded);
    for (int id = 0; id < num_experts(); ++id) {
      const ExpertSlot& slot = p_.experts_.at(id);
      const int64_t first = slot.record.backfill_first();
      const int64_t total = slot.record.backfill_total() - first;
      slot.metrics.backfill_progress->Set(
          id < n_est_    ? 1.0
          : total == 0   ? 0.0
                         : static_cast<double>(slot.backfilled - first) / total);
      slot.metrics.score_cost->Set(slot.record.score_cost_us() * 1e-6);
    }
    p_.ExportScoringCostLocked();
    p_.metrics_.pending->Set(static_cast<double>(p_.pending_.answered()));
    p_.metrics_.samples->Set(static_cast<double>(p_.ducb_.num_samples()));
    p_.metrics_.retained_from->Set(static_cast<double>(p_.retained_from_));
  }

  // Ends a store scan early (ForEach* returns what the callback returns).
  static inline const absl::Status kStop = absl::CancelledError("recovery: scan ends here");
  static absl::Status Stopped(absl::Status s) { return s == kStop ? absl::OkStatus() : s; }

  Problem& p_;
  const uint32_t index_;
  storage::Store& store_;
  CheckpointRecord checkpoint_;
  std::vector<std::vector<int32_t>> reservoir_eligible_;  // per checkpoint reservoir row
  int n_est_ = 0;
  DivergenceMatrix divergences_;
  int64_t replay_from_ = 0;  // the samples the restored estimator has seen
  int64_t start_ = 0;        // the first sample replayed (for the backfilling experts' tails)
  int64_t next_ = 0;         // the next sample to replay
  int64_t positive_ = 0;     // samples with a positive reward among those learned
  std::optional<Problem::ChunkRows> partial_;  // a stored chunk replayed in part
};

absl::StatusOr<std::unique_ptr<Problem>> Problem::Load(uint32_t index,
                                                       storage::v1::ProblemRecord record,
                                                       const Env& env) {
  // The record sizes the problem (its reservoir, the experts' shapes, the scoring buffers)
  // and nothing else checks it: a damaged one is refused here, before anything is sized.
  DECISION_RETURN_IF_ERROR(CheckStoredProblem(record));
  // Replaced by the checkpoint's (LoadCheckpoint); an empty one until then.
  DECISION_ASSIGN_OR_RETURN(DUcb empty, DUcb::Create(EstimatorOptionsOf(record), 0));
  std::unique_ptr<Problem> p(new Problem(index, std::move(record), env, std::move(empty)));
  DECISION_RETURN_IF_ERROR(Recovery(p.get(), index).Run());
  return p;
}

}  // namespace decision::server
