// Problem::Load: a problem rebuilt from the store, in named steps (as LevelDB's
// DBImpl::Recover). Every size a record states is checked before it is used to index: a
// record that does not fit the problem is DATA_LOSS naming the record, never a read out of
// bounds.
//
//   1. LoadExperts        expert records and models, ids dense from 0
//   2. LoadCheckpoint     which experts D-UCB estimates, their divergences, the reservoir
//   3. LoadBackfills      the backfilled columns of experts registered after samples
//   4. LoadLogChunks      the estimators' view of complete chunks of the log
//   5. RescoreTail        the samples after the last chunk, scored by the models again
//   6. BuildEstimator     D-UCB over the log (one pass)
//   7. LoadPending        the decisions still waiting for their reward
//   8. LoadEventIds       every stored event id, for Choose's idempotency filter
//   9. MeasureCosts       the scoring cost of experts stored without one (not written)
#include <cmath>
#include <cstdio>
#include <utility>

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
    DECISION_RETURN_IF_ERROR(LoadExperts());
    DECISION_RETURN_IF_ERROR(LoadCheckpoint());
    DECISION_RETURN_IF_ERROR(LoadBackfills());
    DECISION_RETURN_IF_ERROR(LoadLogChunks());
    DECISION_RETURN_IF_ERROR(RescoreTail());
    DECISION_RETURN_IF_ERROR(BuildEstimator());
    DECISION_RETURN_IF_ERROR(LoadPending());
    DECISION_RETURN_IF_ERROR(LoadEventIds());
    MeasureCosts();
    SetMetrics();
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
    // Experts past the checkpoint are backfilling again; the checkpoint's are estimated.
    for (int id = 0; id < num_experts(); ++id) {
      ExpertRecord& record = p_.experts_.at(id).record;
      if (id >= n_est_ && record.status() != storage::v1::EXPERT_STATE_RETIRED) {
        record.set_status(storage::v1::EXPERT_STATE_BACKFILLING);
      } else if (id < n_est_ && record.status() == storage::v1::EXPERT_STATE_BACKFILLING) {
        record.set_status(storage::v1::EXPERT_STATE_ACTIVE);
      }
    }
    return absl::OkStatus();
  }

  absl::Status LoadBackfills() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    columns_.resize(num_experts());
    for (int id = 0; id < num_experts(); ++id) {
      const int64_t total = p_.experts_.at(id).record.backfill_total();
      if (total < 0) {
        return DataLoss(absl::StrCat("expert ", id, " has backfill_total ", total));
      }
      if (total == 0) continue;
      std::vector<double>& column = columns_[id];
      DECISION_RETURN_IF_ERROR(store_.ForEachBackfillChunk(
          index_, static_cast<uint32_t>(id),
          [&](uint64_t chunk, const storage::v1::BackfillChunk& c) -> absl::Status {
            if (c.values_size() > storage::kBackfillChunkSamples) {
              return DataLoss(absl::StrCat("backfill chunk ", chunk, " of expert ", id, " has ",
                                           c.values_size(), " values"));
            }
            // A gap (a chunk lost in a crash): the rest is backfilled again.
            if (chunk * storage::kBackfillChunkSamples != column.size()) return absl::OkStatus();
            column.insert(column.end(), c.values().begin(), c.values().end());
            return absl::OkStatus();
          }));
      if (static_cast<int64_t>(column.size()) > total) column.resize(total);
    }
    for (int id = n_est_; id < num_experts(); ++id) p_.experts_.at(id).backfill = columns_[id];
    return absl::OkStatus();
  }

  // Appends sample `seq` with row_[k] = pi_k for every expert k (NaN: from its backfill).
  absl::Status Append(int64_t seq, int chooser, double reward) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (int k = 0; k < num_experts(); ++k) {
      ExpertSlot& slot = p_.experts_.at(k);
      if (std::isnan(row_[k]) && seq < static_cast<int64_t>(columns_[k].size())) {
        row_[k] = columns_[k][seq];
      }
      if (k >= n_est_ && seq >= slot.record.backfill_total()) slot.tail.push_back(row_[k]);
      if (k < n_est_ && std::isnan(row_[k])) {
        return DataLoss(absl::StrCat("sample ", seq, " has no propensity for expert ", k));
      }
    }
    if (absl::Status s = log_.Append(chooser, reward, absl::MakeConstSpan(row_).subspan(0, n_est_));
        !s.ok()) {
      return DataLoss(absl::StrCat("sample ", seq, ": ", s.message()));
    }
    return absl::OkStatus();
  }

  absl::Status LoadLogChunks() {
    constexpr int64_t kSamples = storage::kLogChunkSamples;
    log_ = SampleLog(n_est_);
    row_.assign(num_experts(), NAN);
    // A chunk is written by the maintenance round after its last sample: a crash in between
    // leaves a gap. The log then continues from the samples, and the chunks from the gap on
    // are written again.
    bool gap = false;
    DECISION_RETURN_IF_ERROR(store_.ForEachLogChunk(
        index_, [&](uint64_t chunk, const storage::v1::LogChunk& c) -> absl::Status {
          if (gap || static_cast<int64_t>(chunk) * kSamples != log_.size()) {
            gap = true;
            return absl::OkStatus();
          }
          const int width = c.num_experts();
          // Experts registered after the chunk was written are not in it (their values are
          // in their backfill): the width may be anything up to the experts stored.
          if (c.chooser_size() != kSamples || c.reward_size() != kSamples || width < 0 ||
              width > num_experts() ||
              c.propensities_size() != static_cast<int64_t>(kSamples) * width) {
            return DataLoss(absl::StrCat("log chunk ", chunk, " has ", c.chooser_size(),
                                         " choosers, ", c.reward_size(), " rewards and ",
                                         c.propensities_size(), " propensities of ", width,
                                         " experts; expected ", kSamples,
                                         " samples of at most ", num_experts(), " experts"));
          }
          for (int i = 0; i < kSamples; ++i) {
            for (int k = 0; k < num_experts(); ++k) {
              row_[k] = k < width ? c.propensities(i * width + k) : NAN;
            }
            DECISION_RETURN_IF_ERROR(Append(log_.size(), c.chooser(i), c.reward(i)));
          }
          return absl::OkStatus();
        }));
    chunks_read_ = log_.size() / kSamples;
    return absl::OkStatus();
  }

  absl::Status RescoreTail() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::vector<SampleRecord> tail;
    DECISION_RETURN_IF_ERROR(store_.ForEachSample(
        index_, log_.size(), 0, [&](int64_t seq, const SampleRecord& s) -> absl::Status {
          if (seq != log_.size() + static_cast<int64_t>(tail.size())) {
            return DataLoss(absl::StrCat("sample ", seq, " is out of order"));
          }
          if (s.features_size() != p_.record_.num_features() || s.arm() < 0 ||
              s.arm() >= p_.record_.num_arms()) {
            return DataLoss(absl::StrCat("sample ", seq, " has ", s.features_size(),
                                         " features and arm ", s.arm()));
          }
          tail.push_back(s);
          return absl::OkStatus();
        }));
    // Scored as the learner scores a batch (Problem::ScoreBatch): the chooser's logged
    // propensity, a frozen expert's stand-in, and an expert that fails is quarantined.
    std::vector<Problem::Unlearned> batch(tail.size());
    for (size_t i = 0; i < tail.size(); ++i) {
      const SampleRecord& s = tail[i];
      batch[i].sequence = log_.size() + static_cast<int64_t>(i);
      *batch[i].event.mutable_features() = s.features();
      batch[i].event.set_arm(s.arm());
      batch[i].event.set_expert_id(s.expert_id());
      batch[i].event.set_propensity(s.propensity());
    }
    std::vector<ScoringFailure> failures;
    const std::vector<double> scored =
        p_.ScoreBatch(batch, p_.experts_.JoinModels(p_.stand_in_), "restart", &failures);
    for (const ScoringFailure& f : failures) p_.QuarantineLocked(f.expert, f.reason);
    const int width = num_experts();
    for (size_t i = 0; i < tail.size(); ++i) {
      std::copy_n(&scored[i * width], width, row_.begin());
      DECISION_RETURN_IF_ERROR(Append(log_.size(), tail[i].expert_id(), tail[i].reward()));
    }
    return absl::OkStatus();
  }

  absl::Status BuildEstimator() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    DECISION_ASSIGN_OR_RETURN(DUcb ducb, DUcb::FromLog(EstimatorOptionsOf(p_.record_),
                                                       std::move(log_), divergences_));
    for (int k = 0; k < n_est_; ++k) {
      const ExpertSlot& slot = p_.experts_.at(k);
      ducb.SetSelectable(k, slot.failure.empty() &&
                                slot.record.status() == storage::v1::EXPERT_STATE_ACTIVE);
    }
    p_.ducb_ = std::move(ducb);
    const int64_t t = p_.ducb_.log().size();
    for (int64_t s = 0; s < t; ++s) p_.positive_rewards_ += p_.ducb_.log().reward(s) > 0.0;
    for (int64_t chunk = chunks_read_; (chunk + 1) * storage::kLogChunkSamples <= t; ++chunk) {
      p_.unwritten_chunks_.push_back(p_.PendingChunkLocked(chunk));
    }
    if (checkpoint_.reservoir_size() > 0) {
      p_.reservoir_.Reset(std::vector<double>(checkpoint_.reservoir().begin(),
                                              checkpoint_.reservoir().end()),
                          checkpoint_.reservoir_seen());
    }
    p_.next_refresh_at_ = checkpoint_.next_refresh_at() > 0 ? checkpoint_.next_refresh_at()
                                                            : NextRefresh(p_.record_, t);
    p_.decisions_ = std::max(checkpoint_.decisions(), t);
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
          p_.pending_.Restore(std::string(event_id), std::move(event));
          return absl::OkStatus();
        }));
    p_.decisions_ =
        std::max<int64_t>(p_.decisions_, p_.ducb_.log().size() + p_.pending_.answered());
    return absl::OkStatus();
  }

  absl::Status LoadEventIds() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return store_.ForEachEventId(
        index_, [&](absl::string_view event_id) { p_.event_ids_.Insert(event_id); });
  }

  // Experts stored before costs were (score_cost_us 0) are measured over the reservoir, as
  // a registration would. Kept in memory only: the next write of the record stores it.
  void MeasureCosts() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (int id = 0; id < num_experts(); ++id) {
      ExpertSlot& slot = p_.experts_.at(id);
      if (!slot.failure.empty() || slot.record.score_cost_us() > 0.0) continue;
      slot.record.set_score_cost_us(
          p_.ScoringCostUs(slot.record.name(), *slot.model, p_.reservoir_.contexts()));
    }
  }

  void SetMetrics() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (int id = 0; id < num_experts(); ++id) {
      const ExpertSlot& slot = p_.experts_.at(id);
      const int64_t total = slot.record.backfill_total();
      slot.metrics.backfill_progress->Set(
          id < n_est_    ? 1.0
          : total == 0   ? 0.0
                         : static_cast<double>(slot.backfill.size()) / total);
      slot.metrics.score_cost->Set(slot.record.score_cost_us() * 1e-6);
    }
    p_.ExportScoringCostLocked();
    p_.metrics_.pending->Set(static_cast<double>(p_.pending_.answered()));
    p_.metrics_.samples->Set(static_cast<double>(p_.ducb_.log().size()));
  }

  Problem& p_;
  const uint32_t index_;
  storage::Store& store_;
  CheckpointRecord checkpoint_;
  int n_est_ = 0;
  DivergenceMatrix divergences_;
  std::vector<std::vector<double>> columns_;  // backfilled propensities, by expert
  SampleLog log_;
  std::vector<double> row_;  // the sample being appended: pi_k for every expert k
  int64_t chunks_read_ = 0;
};

absl::StatusOr<std::unique_ptr<Problem>> Problem::Load(uint32_t index,
                                                       storage::v1::ProblemRecord record,
                                                       const Env& env) {
  // The record sizes the problem (its reservoir, the experts' shapes, the scoring buffers)
  // and nothing else checks it: a damaged one is refused here, before anything is sized.
  DECISION_RETURN_IF_ERROR(CheckStoredProblem(record));
  DECISION_ASSIGN_OR_RETURN(DUcb empty, DUcb::Create(EstimatorOptionsOf(record), 0));
  std::unique_ptr<Problem> p(new Problem(index, std::move(record), env, std::move(empty)));
  DECISION_RETURN_IF_ERROR(Recovery(p.get(), index).Run());
  return p;
}

}  // namespace decision::server
