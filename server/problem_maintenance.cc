// Problem: the maintenance work other than the expert pool's (problem_experts.cc): expiry
// of decisions whose reward did not come, checkpoints, log chunks, training sets, metrics.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "server/conversions.h"
#include "server/problem.h"

namespace decision::server {

using storage::v1::CheckpointRecord;

// ---------------------------------------------------------------------------- Event ids

absl::Status Problem::StepEventIdLoad(bool* worked) {
  *worked = false;
  {
    absl::MutexLock lock(&mu_);
    if (!event_ids_loading_) return absl::OkStatus();
  }
  if (event_ids_loaded_ == 0) event_ids_load_start_ = std::chrono::steady_clock::now();
  // Read without mu_ (store I/O), inserted in slices: a Choose waits for one slice at most.
  std::vector<std::string> ids;
  ids.reserve(kEventIdLoadStep);
  absl::StatusOr<bool> more =
      env_.store->ScanEventIds(index_, &event_ids_cursor_, kEventIdLoadStep,
                               [&](absl::string_view id) { ids.emplace_back(id); });
  if (!more.ok()) return more.status();
  // Stamped with the load time: under retention the filter forgets them one window after
  // the restart, not at their own age.
  const int64_t now_ms = env_.clock->NowMs();
  for (size_t i = 0; i < ids.size(); i += kEventIdInsertsPerLock) {
    absl::MutexLock lock(&mu_);
    const size_t end = std::min(ids.size(), i + static_cast<size_t>(kEventIdInsertsPerLock));
    for (size_t j = i; j < end; ++j) event_ids_.Insert(ids[j], now_ms);
  }
  event_ids_loaded_ += static_cast<int64_t>(ids.size());
  *worked = true;
  if (*more) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    event_ids_loading_ = false;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                       event_ids_load_start_)
                             .count();
  if (seconds >= 1.0) {
    std::fprintf(stderr,
                 "decisiond: problem %s read its %lld stored event ids in %.2f s (until then "
                 "every Choose with an event id looked it up in the store)\n",
                 id().c_str(), static_cast<long long>(event_ids_loaded_), seconds);
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------- Expiry

void Problem::PrepareExpiryLocked(const std::string& event_id, PendingDecision& decision,
                                  WriteOp* op) {
  op->decision_stored = pending_.StartJoin(decision, /*expiry=*/true);
  op->event_id = event_id;
  op->event = decision.record;
  if (decision.late_reward) op->event.set_late_reward(true);
  // A decision never delivered is dropped: learning it (with the default reward) would log
  // an impression that never happened.
  // A slate slot the problem does not learn is dropped too.
  if (record_.drop_unrewarded() || decision.deliveries == 0 ||
      decision.record.awaiting_activation() || UnlearnedSlot(decision.record)) {
    op->kind = WriteOp::kDrop;
    // Chosen deferred and never shown: no impression to learn from.
    op->never_activated = decision.record.awaiting_activation();
    op->unlearned_slot = UnlearnedSlot(decision.record);
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

Problem::CheckpointWrite Problem::CheckpointLocked(bool with_state) const {
  CheckpointWrite w;
  CheckpointRecord& c = w.checkpoint;
  c.set_samples(ducb_.num_samples());
  w.generation = estimator_generation_;
  // The estimators' state only when learning samples is not all that changed it since it
  // was last written, or a restart would learn too many samples again.
  if (with_state || !state_written_ || state_generation_ != estimator_generation_ ||
      ducb_.num_samples() - state_samples_ >= kMaxReplaySamples) {
    // Always available: the estimators decisiond runs keep no log (DUcb::LogMode::kNone).
    // Into the buffer of the last state written (WriteCheckpoint gives it back), unless
    // that was made for a larger state (before experts were retired): it is given back.
    if (static_cast<int64_t>(state_buffer_.capacity()) >
        2 * ducb_.estimator().Stats().state_bytes) {
      std::string().swap(state_buffer_);
    }
    if (ducb_.SnapshotTo(&state_buffer_).ok()) {
      w.state.emplace();
      w.state->set_samples(ducb_.num_samples());
      w.state->mutable_state()->swap(state_buffer_);
      *w.state->mutable_times_selected() = {ducb_.counts().begin(), ducb_.counts().end()};
      w.state->set_positive_rewards(positive_learned_);
      for (const OffPolicySums& sums : ducb_.off_policy_sums()) {
        for (double v : sums.ToArray()) w.state->add_off_policy(v);
      }
    }
  }
  const DivergenceMatrix& d = ducb_.estimator().divergences();
  c.set_num_experts(d.num_experts);
  *c.mutable_m() = {d.m.begin(), d.m.end()};
  *c.mutable_sigma() = {d.sigma.begin(), d.sigma.end()};
  *c.mutable_reservoir() = {reservoir_.contexts().begin(), reservoir_.contexts().end()};
  c.set_reservoir_seen(reservoir_.seen());
  if (reservoir_.any_eligible()) {
    for (const std::vector<int32_t>& arms : reservoir_.eligible()) {
      c.add_reservoir_eligible_count(static_cast<int32_t>(arms.size()));
      c.mutable_reservoir_eligible()->Add(arms.begin(), arms.end());
    }
  }
  c.set_reservoir_reestimate_known(true);
  const absl::Span<const uint64_t> stamps = reservoir_.stamps();
  for (size_t i = 0; i < stamps.size() && i < reestimated_stamps_.size(); ++i) {
    if (reestimated_stamps_[i] == stamps[i]) {
      c.add_reservoir_unchanged_rows(static_cast<int32_t>(i));
    }
  }
  c.set_next_refresh_at(next_refresh_at_);
  c.set_decisions(decisions_);
  return w;
}

int64_t Problem::MemoryBound(const storage::v1::ProblemRecord& record, int num_experts,
                             int num_retired) {
  // The state, and the buffer its checkpoints are written from. Under retention every
  // expert may come with a window of its own (EstimatorStateBound).
  const bool retention = record.retention_max_samples() > 0 || record.retention_max_age_ms() > 0;
  return 2 * EstimatorStateBound(EstimatorOptionsOf(record), num_experts,
                                 retention ? num_experts : 0, num_retired) +
         storage::kLogChunkSamples * (20 + 8 * int64_t{num_experts});
}

absl::Status Problem::WriteCheckpoint(CheckpointWrite& w) {
  const absl::Status written = Timed([&] {
    return env_.store->PutCheckpoint(index_, w.checkpoint, w.state ? &*w.state : nullptr);
  });
  if (written.ok()) {
    metrics_.checkpoints->Increment();
    metrics_.checkpoint_bytes->Increment(static_cast<double>(
        w.checkpoint.ByteSizeLong() + (w.state.has_value() ? w.state->ByteSizeLong() : 0)));
  }
  if (!w.state.has_value()) return written;
  absl::MutexLock lock(&mu_);
  if (w.state->state().capacity() > state_buffer_.capacity()) {
    state_buffer_.swap(*w.state->mutable_state());
  }
  DECISION_RETURN_IF_ERROR(written);
  if (!state_written_ || w.state->samples() >= state_samples_) {
    state_written_ = true;
    state_generation_ = w.generation;
    state_samples_ = w.state->samples();
  }
  return absl::OkStatus();
}

absl::Status Problem::Checkpoint() {
  CheckpointWrite w;
  {
    absl::MutexLock lock(&mu_);
    w = CheckpointLocked(/*with_state=*/true);
  }
  return WriteCheckpoint(w);
}

// ---------------------------------------------------------------------------- Moving

absl::Status Problem::EnterCall() {
  absl::MutexLock lock(&call_mu_);
  if (!fence_.ok()) return fence_;
  ++calls_in_flight_;
  return absl::OkStatus();
}

void Problem::LeaveCall() {
  absl::MutexLock lock(&call_mu_);
  --calls_in_flight_;
}

absl::Status Problem::Fence(absl::Status why, absl::Duration timeout) {
  {
    absl::MutexLock lock(&call_mu_);
    if (!fence_.ok()) return absl::FailedPreconditionError(fence_.message());
    fence_ = std::move(why);
    fenced_.store(true, std::memory_order_release);
    const auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(call_mu_) {
      return calls_in_flight_ == 0;
    };
    if (!call_mu_.AwaitWithTimeout(absl::Condition(&idle), timeout)) {
      const int64_t left = calls_in_flight_;
      fence_ = absl::OkStatus();
      fenced_.store(false, std::memory_order_release);
      return absl::UnavailableError(absl::StrCat(
          "problem ", id(), " still had ", left, " calls in flight after ",
          absl::FormatDuration(timeout), ": not fenced; retry the move"));
    }
  }
  // A registration that started before the fence (a training job's) ends first.
  absl::MutexLock writes(&expert_writes_mu_);
  return absl::OkStatus();
}

void Problem::Unfence() {
  absl::MutexLock lock(&call_mu_);
  fence_ = absl::OkStatus();
  fenced_.store(false, std::memory_order_release);
}

std::string Problem::GeneratorState() const {
  absl::MutexLock lock(&mu_);
  std::ostringstream out;
  out << gen_;
  return out.str();
}

absl::StatusOr<std::mt19937_64> Problem::ParseGeneratorState(const std::string& state) {
  std::istringstream in(state);
  std::mt19937_64 gen;
  in >> gen;
  if (in.fail()) {
    return absl::InvalidArgumentError(
        "generator_state is not a std::mt19937_64 state (BeginMoveResponse.generator_state)");
  }
  return gen;
}

void Problem::SetGenerator(const std::mt19937_64& generator) {
  absl::MutexLock lock(&mu_);
  gen_ = generator;
}

// --------------------------------------------------------------------------- Log chunks

void Problem::ChunkRows::Start(int n, std::vector<int32_t> drop) {
  const int64_t at = chunk;
  *this = ChunkRows();
  chunk = at;
  width = n;
  dropped = std::move(drop);
  size_t d = 0;
  for (int k = 0; k < n; ++k) {
    if (d < dropped.size() && dropped[d] == k) {
      ++d;
    } else {
      columns.push_back(k);
    }
  }
}

void Problem::ChunkRows::Widen(int n) {
  if (n <= width) return;
  const int old_stored = stored();
  for (int k = width; k < n; ++k) columns.push_back(k);
  width = n;
  std::vector<double> widened(chooser.size() * stored(), NAN);
  for (size_t i = 0; i < chooser.size(); ++i) {
    std::copy_n(&propensities[i * old_stored], old_stored, &widened[i * stored()]);
  }
  propensities.swap(widened);
}

void Problem::ChunkRows::Append(int chooser_id, double reward_value,
                                absl::Span<const double> p) {
  // An expert registered meanwhile: the earlier samples have no value of it here.
  Widen(static_cast<int>(p.size()));
  if (propensities.capacity() == 0) {
    propensities.reserve(storage::kLogChunkSamples * std::max(stored(), 1));
    chooser.reserve(storage::kLogChunkSamples);
    reward.reserve(storage::kLogChunkSamples);
    chooser_propensity.reserve(storage::kLogChunkSamples);
  }
  chooser.push_back(chooser_id);
  reward.push_back(reward_value);
  chooser_propensity.push_back(p[chooser_id]);
  for (int k : columns) {
    propensities.push_back(k < static_cast<int>(p.size()) ? p[k] : NAN);
  }
}

void Problem::ChunkRows::Narrow(int n) {
  if (n >= width) return;
  const int old_stored = stored();
  while (!columns.empty() && columns.back() >= n) columns.pop_back();
  while (!dropped.empty() && dropped.back() >= n) dropped.pop_back();
  width = n;
  for (size_t i = 0; i < chooser.size(); ++i) {
    std::copy_n(&propensities[i * old_stored], stored(), &propensities[i * stored()]);
  }
  propensities.resize(chooser.size() * stored());
}

void Problem::ChunkRows::Truncate(int64_t n) {
  if (n >= size()) return;
  chooser.resize(n);
  reward.resize(n);
  chooser_propensity.resize(n);
  propensities.resize(n * stored());
}

void Problem::ChunkRows::Expand(double fill) {
  if (dropped.empty()) return;
  std::vector<double> full(chooser.size() * width, fill);
  for (size_t i = 0; i < chooser.size(); ++i) {
    double* row = &full[i * width];
    for (int c = 0; c < stored(); ++c) row[columns[c]] = propensities[i * stored() + c];
    row[chooser[i]] = chooser_propensity[i];
  }
  propensities.swap(full);
  dropped.clear();
  columns.clear();
  for (int k = 0; k < width; ++k) columns.push_back(k);
}

void Problem::AppendToLogChunkLocked(int chooser, double reward, absl::Span<const double> p) {
  if (current_chunk_.size() == 0 && current_chunk_.width == 0) {
    std::vector<int32_t> frozen;
    for (int k = 0; k < static_cast<int>(p.size()); ++k) {
      if (experts_.Frozen(k)) frozen.push_back(k);
    }
    current_chunk_.Start(static_cast<int>(p.size()), std::move(frozen));
  }
  current_chunk_.Append(chooser, reward, p);
  if (current_chunk_.size() < storage::kLogChunkSamples) return;
  // Written by WriteLogChunks, outside the lock. Experts whose registration is not written
  // yet are left out: their ids may be reused.
  current_chunk_.Narrow(experts_.durable_size());
  const int64_t next = current_chunk_.chunk + 1;
  unwritten_chunks_.push_back(std::move(current_chunk_));
  current_chunk_ = ChunkRows();
  current_chunk_.chunk = next;
}

storage::v1::LogChunk Problem::BuildLogChunk(const ChunkRows& rows) {
  storage::v1::LogChunk c;
  c.set_num_experts(rows.width);
  c.mutable_chooser()->Add(rows.chooser.begin(), rows.chooser.end());
  c.mutable_reward()->Add(rows.reward.begin(), rows.reward.end());
  c.mutable_propensities()->Add(rows.propensities.begin(), rows.propensities.end());
  if (!rows.dropped.empty()) {
    c.mutable_dropped()->Add(rows.dropped.begin(), rows.dropped.end());
    c.mutable_chooser_propensity()->Add(rows.chooser_propensity.begin(),
                                        rows.chooser_propensity.end());
  }
  return c;
}

absl::StatusOr<Problem::ChunkRows> Problem::ChunkRowsOf(int64_t chunk,
                                                       const storage::v1::LogChunk& c,
                                                       int max_width) const {
  constexpr int64_t kSamples = storage::kLogChunkSamples;
  const int width = c.num_experts();
  const auto damaged = [&](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("problem ", id(), ": log chunk ", chunk, ": ", what));
  };
  // Experts registered after the chunk was written are not in it (their values are in
  // their backfill): the width may be anything up to the experts stored. A chunk written
  // before it was complete (DeleteEvents) holds its first samples only.
  if (width < 0 || width > max_width) {
    return damaged(absl::StrCat(width, " experts; expected at most ", max_width));
  }
  std::vector<int32_t> dropped(c.dropped().begin(), c.dropped().end());
  for (size_t i = 0; i < dropped.size(); ++i) {
    if (dropped[i] < 0 || dropped[i] >= width || (i > 0 && dropped[i] <= dropped[i - 1])) {
      return damaged(absl::StrCat("dropped expert ", dropped[i], " is not an ascending id of ",
                                  width, " experts"));
    }
  }
  ChunkRows rows;
  rows.chunk = chunk;
  rows.Start(width, std::move(dropped));
  const int n = c.chooser_size();
  const int expected_chooser = rows.dropped.empty() ? 0 : n;
  if (n < 1 || n > kSamples || c.reward_size() != n ||
      c.propensities_size() != static_cast<int64_t>(n) * rows.stored() ||
      c.chooser_propensity_size() != expected_chooser) {
    return damaged(absl::StrCat(
        c.chooser_size(), " choosers, ", c.reward_size(), " rewards, ",
        c.propensities_size(), " propensities of ", rows.stored(), " experts and ",
        c.chooser_propensity_size(), " chooser propensities; expected 1 to ", kSamples,
        " samples with one of each, a propensity per kept expert, and a chooser propensity "
        "if an expert was dropped"));
  }
  rows.chooser.assign(c.chooser().begin(), c.chooser().end());
  rows.reward.assign(c.reward().begin(), c.reward().end());
  rows.propensities.assign(c.propensities().begin(), c.propensities().end());
  rows.chooser_propensity.resize(n);
  for (int i = 0; i < n; ++i) {
    const int j = c.chooser(i);
    if (j < 0 || j >= width) {
      return damaged(absl::StrCat("sample ", chunk * kSamples + i, " has chooser ", j, " of ",
                                  width, " experts"));
    }
    // Without dropped experts every column is stored, the chooser's among them.
    rows.chooser_propensity[i] =
        rows.dropped.empty() ? rows.propensities[static_cast<size_t>(i) * width + j]
                             : c.chooser_propensity(i);
  }
  return rows;
}

absl::StatusOr<Problem::ChunkRows> Problem::ReadChunkRows(int64_t chunk, int width) {
  std::optional<ChunkRows> rows;
  std::vector<int64_t> backfill_totals;
  int stored_experts;
  {
    absl::MutexLock lock(&mu_);
    if (current_chunk_.chunk == chunk) rows = current_chunk_;
    for (const ChunkRows& c : unwritten_chunks_) {
      if (c.chunk == chunk) rows = c;
    }
    stored_experts = experts_.size();
    for (int k = 0; k < std::min(width, experts_.size()); ++k) {
      backfill_totals.push_back(experts_.at(k).record.backfill_total());
    }
  }
  if (!rows.has_value()) {
    DECISION_ASSIGN_OR_RETURN(storage::v1::LogChunk stored,
                              env_.store->GetLogChunk(index_, static_cast<uint64_t>(chunk)));
    DECISION_ASSIGN_OR_RETURN(rows, ChunkRowsOf(chunk, stored, stored_experts));
  }
  // Every expert's column (a frozen expert's value is the stand-in's, as the join scored
  // it), then the values the chunk lacks (experts registered after its samples were
  // learned) from the experts' backfill chunks, which cover the same samples.
  rows->Expand(1.0 / record_.num_arms());
  rows->Widen(width);
  for (int k = 0; k < static_cast<int>(backfill_totals.size()); ++k) {
    bool missing = false;
    for (int64_t i = 0; i < rows->size() && !missing; ++i) {
      missing = std::isnan(rows->propensities[i * rows->width + k]);
    }
    if (!missing || backfill_totals[k] <= rows->first()) continue;
    absl::StatusOr<storage::v1::BackfillChunk> backfill = env_.store->GetBackfillChunk(
        index_, static_cast<uint32_t>(k), static_cast<uint64_t>(chunk));
    if (absl::IsNotFound(backfill.status())) continue;
    if (!backfill.ok()) return backfill.status();
    const int64_t n = std::min<int64_t>(backfill->values_size(), rows->size());
    for (int64_t i = 0; i < n; ++i) {
      double& v = rows->propensities[i * rows->width + k];
      if (std::isnan(v)) v = backfill->values(i);
    }
  }
  return *std::move(rows);
}

absl::Status Problem::WriteLogChunks() {
  absl::MutexLock writes(&chunk_writes_mu_);
  return WriteLogChunksLocked();
}

absl::Status Problem::WriteLogChunksLocked() {
  std::vector<ChunkRows> chunks;
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
  // The importance-weighted objective trains on the rewarded samples only.
  const bool rewarded_only =
      TrainingObjectiveOf(record_) == TrainingObjective::kImportanceWeighted;
  // The samples retention kept, of the first `samples` (0: all).
  const absl::Status enough = absl::CancelledError("the first samples are read");
  const size_t max_samples = MaxTrainingSamples(record_.num_arms(), record_.num_features());
  absl::Status read = env_.store->ForEachSample(
      index_, 0, 0, [&](int64_t seq, const storage::v1::SampleRecord& s) {
        if (samples > 0 && seq >= samples) return enough;
        if (s.redacted()) return absl::OkStatus();  // its context was deleted (DeleteEvents)
        if (rewarded_only && !(s.reward() > 0)) return absl::OkStatus();
        if (s.features_size() != set.num_features) {
          return absl::DataLossError(absl::StrCat("problem ", id(), ": a stored sample has ",
                                                  s.features_size(), " features"));
        }
        set.Add(absl::MakeConstSpan(s.features().data(), s.features_size()), s.arm(),
                s.reward(), s.propensity());
        // The newest max_samples are kept: memory stays within twice that.
        if (set.size() >= 2 * max_samples) set.DropOldest(set.size() - max_samples);
        return absl::OkStatus();
      });
  if (read.ok() || read == enough) read = absl::OkStatus();
  DECISION_RETURN_IF_ERROR(read);
  if (set.size() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("problem ", id(), " has no joined sample",
                     rewarded_only ? " with a positive reward" : "", " to train on"));
  }
  if (set.size() > max_samples) set.DropOldest(set.size() - max_samples);
  return set;
}

void Problem::ExportMetrics(int64_t oldest_unfinished_training) {
  int64_t batch_lag;
  int64_t log_bytes, estimator_bytes, event_id_bytes;
  Metrics::ProblemMetrics::ExpertStateCounts by_state{};  // indexed by v1::ExpertStatus
  {
    // What the exported values depend on; an idle problem exports nothing again.
    absl::MutexLock lock(&mu_);
    const int64_t t = ducb_.num_samples();
    batch_lag = std::max<int64_t>({0, t - next_refresh_at_,
                                   oldest_unfinished_training > 0 ? t - oldest_unfinished_training
                                                                  : 0});
    for (int k = 0; k < experts_.size(); ++k) ++by_state[experts_.WireStatus(k)];
    const ExportedState state{t, ducb_.num_experts(), experts_.size(), estimates_generation_,
                              batch_lag, by_state};
    if (exported_.has_value() && *exported_ == state) return;
    exported_ = state;
    // What is kept per sample: the log chunk being filled, the complete ones not written
    // yet, and the tails of the experts still backfilling.
    log_bytes = current_chunk_.memory_bytes();
    for (const ChunkRows& c : unwritten_chunks_) log_bytes += c.memory_bytes();
    for (int k = ducb_.num_experts(); k < experts_.size(); ++k) {
      log_bytes += static_cast<int64_t>(8 * experts_.at(k).tail.capacity());
    }
    // The state, and the buffer checkpoints write it from.
    estimator_bytes = ducb_.estimator().Stats().state_bytes +
                      static_cast<int64_t>(state_buffer_.capacity());
    // Choose's idempotency filter: the event ids of the reward wait and the retained window.
    event_id_bytes = event_ids_.memory_bytes();
  }
  metrics_.batch_lag->Set(static_cast<double>(batch_lag));
  for (size_t s = 0; s < by_state.size(); ++s) {
    if (metrics_.experts_by_state[s] != nullptr) {
      metrics_.experts_by_state[s]->Set(static_cast<double>(by_state[s]));
    }
  }
  metrics_.memory_sample_log->Set(static_cast<double>(log_bytes));
  metrics_.memory_estimator->Set(static_cast<double>(estimator_bytes));
  metrics_.memory_event_ids->Set(static_cast<double>(event_id_bytes));
  const v1::Estimates estimates = GetEstimates();
  std::vector<Metrics::Pair> pairs;
  std::vector<std::pair<double, int>> active;  // (ucb, expert)
  {
    absl::MutexLock lock(&mu_);
    for (const v1::ExpertEstimate& e : estimates.experts()) {
      // The experts `estimates` has estimates and matrix entries for: a backfill may have
      // completed since it was taken (the expert-pool thread), so not ducb_'s count now.
      if (e.expert_id() >= estimates.n()) continue;
      const ExpertSlot& slot = experts_.at(e.expert_id());
      slot.metrics.estimate->Set(e.estimate());
      slot.metrics.ucb->Set(e.ucb());
      slot.metrics.effective_sample_size->Set(e.effective_sample_size());
      if (e.has_off_policy()) {
        const v1::ModelEvaluation& o = e.off_policy();
        slot.metrics.off_policy_ips->Set(o.ips());
        slot.metrics.off_policy_ips_lower->Set(o.ips_lower());
        slot.metrics.off_policy_snips->Set(o.snips());
        slot.metrics.off_policy_clipped_ips->Set(o.clipped_ips());
        slot.metrics.off_policy_ess->Set(o.effective_sample_size());
      }
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
