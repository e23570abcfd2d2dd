// Problem: the maintenance work other than the expert pool's (problem_experts.cc): expiry
// of decisions whose reward did not come, checkpoints, log chunks, training sets, metrics.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "core/status_macros.h"
#include "server/problem.h"

namespace decision::server {

using storage::v1::CheckpointRecord;

// ------------------------------------------------------------------------------- Expiry

void Problem::PrepareExpiryLocked(const std::string& event_id, PendingDecision& decision,
                                  WriteOp* op) {
  op->decision_stored = pending_.StartJoin(decision, /*expiry=*/true);
  op->event_id = event_id;
  op->event = decision.record;
  if (decision.late_reward) op->event.set_late_reward(true);
  // A decision never delivered is dropped: learning it (with the default reward) would log
  // an impression that never happened.
  if (record_.drop_unrewarded() || decision.deliveries == 0) {
    op->kind = WriteOp::kDrop;
    return;
  }
  op->kind = WriteOp::kJoin;
  op->reward = record_.default_reward();
  op->is_default = true;
}

absl::Status Problem::ExpireDue() {
  std::vector<WriteOp> expiries;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& event_id : pending_.Due(env_.clock->NowMs())) {
      PendingDecision* d = pending_.Find(event_id);
      expiries.emplace_back();
      PrepareExpiryLocked(event_id, *d, &expiries.back());
    }
  }
  if (expiries.empty()) return absl::OkStatus();
  // Submitted together (they share group commits), then waited for.
  absl::BlockingCounter pending(static_cast<int>(expiries.size()));
  absl::Mutex error_mu;
  absl::Status first_error;
  for (WriteOp& op : expiries) {
    op.done = [&](absl::Status s) {
      if (!s.ok()) {
        absl::MutexLock lock(&error_mu);
        if (first_error.ok()) first_error = std::move(s);
      }
      pending.DecrementCount();
    };
    // The writer commits them (in few groups); this thread waits below.
    Submit(std::move(op), Committer::kWriter);
  }
  pending.Wait();
  absl::MutexLock lock(&error_mu);
  return first_error;
}

// -------------------------------------------------------------------------- Checkpoints

CheckpointRecord Problem::CheckpointLocked() const {
  CheckpointRecord c;
  c.set_samples(ducb_.log().size());
  const DivergenceMatrix& d = ducb_.estimator().divergences();
  c.set_num_experts(d.num_experts);
  *c.mutable_m() = {d.m.begin(), d.m.end()};
  *c.mutable_sigma() = {d.sigma.begin(), d.sigma.end()};
  *c.mutable_reservoir() = {reservoir_.contexts().begin(), reservoir_.contexts().end()};
  c.set_reservoir_seen(reservoir_.seen());
  c.set_next_refresh_at(next_refresh_at_);
  c.set_decisions(decisions_);
  return c;
}

absl::Status Problem::Checkpoint() {
  CheckpointRecord checkpoint;
  {
    absl::MutexLock lock(&mu_);
    checkpoint = CheckpointLocked();
  }
  return Timed([&] { return env_.store->PutCheckpoint(index_, checkpoint); });
}

// --------------------------------------------------------------------------- Log chunks

Problem::PendingChunk Problem::PendingChunkLocked(int64_t chunk) const {
  constexpr int64_t kSamples = storage::kLogChunkSamples;
  const int n_est = ducb_.num_experts();
  PendingChunk p;
  p.chunk = chunk;
  p.rows = ducb_.log().Chunk(chunk);
  // Experts whose registration is not yet written are left out: their ids may be reused.
  p.width = experts_.durable_size();
  const int others = p.width - n_est;
  if (others <= 0) {
    p.width = n_est;
    return p;
  }
  p.others.resize(kSamples * others);
  for (int64_t i = 0; i < kSamples; ++i) {
    const int64_t s = chunk * kSamples + i;
    for (int k = n_est; k < p.width; ++k) {
      const ExpertSlot& slot = experts_.at(k);
      const int64_t from = slot.record.backfill_total();
      p.others[i * others + (k - n_est)] = s >= from ? slot.tail[s - from] : NAN;
    }
  }
  return p;
}

storage::v1::LogChunk Problem::BuildLogChunk(const PendingChunk& pending) {
  constexpr int64_t kSamples = storage::kLogChunkSamples;
  const int n_est = pending.rows.num_experts;
  const int width = pending.width;
  storage::v1::LogChunk c;
  c.set_num_experts(width);
  c.mutable_chooser()->Add(pending.rows.chooser.get(), pending.rows.chooser.get() + kSamples);
  c.mutable_reward()->Add(pending.rows.reward.get(), pending.rows.reward.get() + kSamples);
  c.mutable_propensities()->Resize(kSamples * width, 0.0);
  double* out = c.mutable_propensities()->mutable_data();
  for (int64_t i = 0; i < kSamples; ++i, out += width) {
    std::copy_n(pending.rows.propensities.get() + i * n_est, n_est, out);
    std::copy_n(pending.others.data() + i * (width - n_est), width - n_est, out + n_est);
  }
  return c;
}

absl::Status Problem::WriteLogChunks() {
  std::vector<PendingChunk> chunks;
  {
    absl::MutexLock lock(&mu_);
    chunks.swap(unwritten_chunks_);
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const storage::v1::LogChunk chunk = BuildLogChunk(chunks[i]);
    absl::Status s =
        Timed([&] { return env_.store->PutLogChunk(index_, chunks[i].chunk, chunk); });
    if (!s.ok()) {
      // Chunks must be stored in order (a restart reads them as one prefix of the log):
      // this one and the later ones are retried by the next call. A restart before that
      // re-scores the samples they cover.
      absl::MutexLock lock(&mu_);
      unwritten_chunks_.insert(unwritten_chunks_.begin(),
                               std::make_move_iterator(chunks.begin() + i),
                               std::make_move_iterator(chunks.end()));
      return s;
    }
  }
  return absl::OkStatus();
}

// ----------------------------------------------------------------- Training and metrics

absl::StatusOr<TrainingSet> Problem::TrainingSetFromLog(int64_t samples) {
  TrainingSet set;
  set.num_features = record_.num_features();
  DECISION_RETURN_IF_ERROR(env_.store->ForEachSample(
      index_, 0, samples, [&](int64_t, const storage::v1::SampleRecord& s) {
        if (s.features_size() != set.num_features) {
          return absl::DataLossError(absl::StrCat("problem ", id(), ": a stored sample has ",
                                                  s.features_size(), " features"));
        }
        set.Add(absl::MakeConstSpan(s.features().data(), s.features_size()), s.arm(),
                s.reward(), s.propensity());
        return absl::OkStatus();
      }));
  if (set.size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "problem ", id(), " has no joined sample with a positive reward to train on"));
  }
  if (set.size() > kMaxTrainingSamples) {
    const size_t drop = set.size() - kMaxTrainingSamples;
    set.labels.erase(set.labels.begin(), set.labels.begin() + drop);
    set.weights.erase(set.weights.begin(), set.weights.begin() + drop);
    set.rows.erase(set.rows.begin(), set.rows.begin() + drop * set.num_features);
  }
  return set;
}

void Problem::ExportMetrics(int64_t oldest_unfinished_training) {
  int64_t batch_lag;
  int64_t log_bytes, estimator_bytes;
  {
    // What the exported values depend on; an idle problem exports nothing again.
    absl::MutexLock lock(&mu_);
    const int64_t t = ducb_.log().size();
    batch_lag = std::max<int64_t>({0, t - next_refresh_at_,
                                   oldest_unfinished_training > 0 ? t - oldest_unfinished_training
                                                                  : 0});
    const ExportedState state{t, ducb_.num_experts(), experts_.size(), estimates_generation_,
                              batch_lag};
    if (exported_.has_value() && *exported_ == state) return;
    exported_ = state;
    log_bytes = ducb_.log().memory_bytes();
    estimator_bytes = ducb_.estimator().Stats().state_bytes;
  }
  metrics_.batch_lag->Set(static_cast<double>(batch_lag));
  metrics_.memory_sample_log->Set(static_cast<double>(log_bytes));
  metrics_.memory_estimator->Set(static_cast<double>(estimator_bytes));
  const v1::Estimates estimates = GetEstimates();
  std::vector<Metrics::Pair> pairs;
  std::vector<std::pair<double, int>> active;  // (ucb, expert)
  {
    absl::MutexLock lock(&mu_);
    for (const v1::ExpertEstimate& e : estimates.experts()) {
      if (e.expert_id() >= ducb_.num_experts()) continue;
      const ExpertSlot& slot = experts_.at(e.expert_id());
      slot.metrics.estimate->Set(e.estimate());
      slot.metrics.ucb->Set(e.ucb());
      slot.metrics.effective_sample_size->Set(e.effective_sample_size());
      if (slot.record.status() == storage::v1::EXPERT_STATE_ACTIVE) {
        active.push_back({e.ucb(), e.expert_id()});
      }
    }
  }
  metrics_.estimated_regret->Set(estimates.estimated_regret());
  // The pair series only among the env_.metrics_pair_experts active experts of highest UCB
  // (ties: the lower id), in id order: the full matrix is in GetEstimates.
  std::sort(active.begin(), active.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  if (active.size() > static_cast<size_t>(std::max(0, env_.metrics_pair_experts))) {
    active.resize(std::max(0, env_.metrics_pair_experts));
  }
  std::vector<int> top;
  for (const auto& [ucb, k] : active) top.push_back(k);
  std::sort(top.begin(), top.end());
  const int n = estimates.n();
  for (int i : top) {
    for (int j : top) {
      if (i == j) continue;
      pairs.push_back({i, j, estimates.m(i * n + j), estimates.sigma(i * n + j)});
    }
  }
  env_.metrics->SetPairs(id(), pairs);
}

}  // namespace decision::server
