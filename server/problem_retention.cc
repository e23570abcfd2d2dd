// Problem: what the store keeps of a problem's history. Retention follows its setting
// (ProblemConfig.retention): the maintenance deletes whole log chunks of samples, with
// their log and backfill chunks, by range deletions, and sets the time before which the
// events family's compactions drop its events (Store::ApplyRetention). DeleteEvents deletes
// single events on request and redacts their samples. The estimators are not touched:
// they learned those samples already.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/problem.h"

namespace decision::server {

namespace {
constexpr int64_t kChunk = storage::kLogChunkSamples;
constexpr int64_t kAgeCheckIntervalMs = 1000;
}  // namespace

absl::Status Problem::SetRetention(const v1::RetentionConfig& retention) {
  absl::MutexLock writes(&expert_writes_mu_);
  storage::v1::ProblemRecord record = record_;
  record.set_retention_max_samples(retention.max_samples());
  record.set_retention_max_age_ms(retention.max_age_ms());
  DECISION_RETURN_IF_ERROR(Timed([&] { return env_.store->PutProblem(index_, record); }));
  absl::MutexLock lock(&mu_);
  retention_max_samples_ = retention.max_samples();
  retention_max_age_ms_ = retention.max_age_ms();
  next_age_check_ms_ = 0;
  MarkPoolWork();  // applied by the next round
  return absl::OkStatus();
}

absl::Status Problem::ApplyRetention() {
  absl::MutexLock writes(&expert_writes_mu_);
  const int64_t now_ms = env_.clock->NowMs();
  int64_t t, retained, events_cut, max_samples, max_age_ms, limit;
  // Per expert, the samples its backfill chunks cover: [backfill_first, backfill_total).
  std::vector<std::pair<int64_t, int64_t>> backfilled;
  bool check_age;
  // The first sample a restart reads (from the chunk of the estimators' state on), and the
  // first a backfill reads (its window).
  const auto state_pin_locked = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_written_ ? state_samples_ / kChunk * kChunk : int64_t{0};
  };
  int64_t state_pin, backfill_pin = std::numeric_limits<int64_t>::max();
  {
    absl::MutexLock lock(&mu_);
    max_samples = retention_max_samples_;
    max_age_ms = retention_max_age_ms_;
    if (max_samples == 0 && max_age_ms == 0) return absl::OkStatus();
    t = ducb_.num_samples();
    retained = retained_from_;
    events_cut = events_cut_ms_;
    // Never the chunk being filled, nor the one before it (a new expert's window must
    // start below the samples its estimator has grouped), nor one not written yet.
    limit = std::max<int64_t>(0, current_chunk_.chunk - 1) * kChunk;
    if (!unwritten_chunks_.empty()) limit = std::min(limit, unwritten_chunks_.front().first());
    state_pin = state_pin_locked();
    for (int k = ducb_.num_experts(); k < experts_.size(); ++k) {
      backfill_pin = std::min(backfill_pin, experts_.at(k).record.backfill_first());
    }
    for (int k = 0; k < experts_.size(); ++k) {
      const storage::v1::ExpertRecord& r = experts_.at(k).record;
      backfilled.emplace_back(r.backfill_first(), r.backfill_total());
    }
    check_age = max_age_ms > 0 && now_ms >= next_age_check_ms_;
    if (check_age) next_age_check_ms_ = now_ms + kAgeCheckIntervalMs;
  }
  int64_t target = retained;
  if (max_samples > 0 && t - max_samples > target) {
    target = (t - max_samples) / kChunk * kChunk;
  }
  target = std::min(target, limit);
  int64_t events_before = events_cut;
  if (check_age) {
    // The first chunk whose first sample joined within the age: one read per chunk passed.
    const int64_t young = now_ms - max_age_ms;
    events_before = std::max(events_before, young);
    for (int64_t c = target; c < limit; c += kChunk) {
      absl::StatusOr<storage::v1::SampleRecord> first = env_.store->GetSample(index_, c);
      if (!first.ok() && !absl::IsNotFound(first.status())) return first.status();
      if (!first.ok() || first->joined_at_ms() >= young) break;
      target = c + kChunk;
    }
  }
  if (std::min(target, backfill_pin) - state_pin >= std::max(kChunk, (t - target) / 8)) {
    // The estimators' state a restart would start from holds retention back (a backfill
    // does not): write it now (the next checkpoint would only write it 2^20 samples after
    // the last).
    DECISION_RETURN_IF_ERROR(Checkpoint());
    absl::MutexLock lock(&mu_);
    state_pin = state_pin_locked();
  }
  const int64_t cut = std::max(retained, std::min({target, state_pin, backfill_pin}));
  if (cut > retained && max_samples > 0) {
    // Count-based retention also ends the events never joined that were decided before the
    // first sample kept (the joined ones follow their samples: Store::ApplyRetention).
    absl::StatusOr<storage::v1::SampleRecord> first = env_.store->GetSample(index_, cut);
    if (!first.ok() && !absl::IsNotFound(first.status())) return first.status();
    if (first.ok()) events_before = std::max(events_before, first->decided_at_ms());
  }
  if (cut == retained && events_before == events_cut) return absl::OkStatus();
  storage::v1::RetentionRecord record;
  record.set_first_sample(cut);
  record.set_events_before_ms(events_before);
  // The experts with backfill chunks this cut may delete (ones registered before any
  // sample have none; ones the last cut passed have none left): a range deletion each.
  std::vector<uint32_t> experts;
  for (size_t k = 0; k < backfilled.size(); ++k) {
    const auto [first, total] = backfilled[k];
    if (total > first && total > retained && first < cut) experts.push_back(k);
  }
  DECISION_RETURN_IF_ERROR(
      Timed([&] { return env_.store->ApplyRetention(index_, experts, record); }));
  absl::MutexLock lock(&mu_);
  retained_from_ = cut;
  metrics_.retained_from->Set(static_cast<double>(cut));
  events_cut_ms_ = events_before;
  // The events the cut ends go only where a compaction rewrites their files, which with
  // event ids in time order RocksDB's own compactions never do for old ones (bench/scale,
  // 1M of 8M samples kept: the events family grew 30 bytes a sample). Once half the kept
  // samples were cut since the last compaction of this problem's events, another: at most
  // about one and a half windows of events stay on disk, for two rewrites per window.
  if (cut - events_compacted_at_ >= std::max(kEventCompactionMinSamples, (t - cut) / 2)) {
    env_.store->CompactEventsSoon(index_);
    events_compacted_at_ = cut;
  }
  // The ids of events still stored must stay: a kept sample joined after the first kept
  // one, so it was decided at most a reward wait before that one's decision (or the age).
  event_ids_.DropBefore(events_before - record_.reward_wait_ms());
  return absl::OkStatus();
}

absl::Status Problem::StoreLogChunksThrough(int64_t sequence) {
  absl::MutexLock writes(&chunk_writes_mu_);
  for (;;) {
    DECISION_RETURN_IF_ERROR(WriteLogChunksLocked());
    ChunkRows partial;
    {
      absl::MutexLock lock(&mu_);
      // Completed meanwhile: written by the next pass.
      if (!unwritten_chunks_.empty() && unwritten_chunks_.front().first() <= sequence) continue;
      if (sequence < current_chunk_.first()) return absl::OkStatus();  // stored
      partial = current_chunk_;
      partial.Narrow(experts_.durable_size());
    }
    // Under chunk_writes_mu_: the complete chunk, if this one completes meanwhile, is
    // written after it (WriteLogChunks), never before.
    const storage::v1::LogChunk chunk = BuildLogChunk(partial);
    return Timed([&] { return env_.store->PutLogChunk(index_, partial.chunk, chunk); });
  }
}

absl::Status Problem::DeleteEvents(const std::vector<std::string>& event_ids,
                                   v1::DeleteEventsResponse* response) {
  // Every acknowledged reward learned: its sample is in a log chunk, stored or in memory.
  DECISION_RETURN_IF_ERROR(WaitLearned());
  // No registration meanwhile: every expert the partial chunk leaves out is durable later
  // than its samples, so a restart never needs its values of them.
  absl::MutexLock writes(&expert_writes_mu_);
  const auto still_pending = [&](const std::vector<std::string>& ids) {
    return absl::FailedPreconditionError(absl::StrCat(
        "problem ", id(), ": ", ids.size(), " of the events still wait for their reward (",
        ids.front(), ids.size() > 1 ? ", ..." : "",
        "); nothing was deleted: delete them once they are joined or expired (within ",
        record_.reward_wait_ms(), " ms)"));
  };
  int64_t retained;
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> waiting;
    for (const std::string& e : event_ids) {
      if (pending_.Find(e) != nullptr) waiting.push_back(e);
    }
    if (!waiting.empty()) return still_pending(waiting);
    retained = retained_from_;
  }
  std::vector<storage::Store::Redaction> redactions;
  absl::flat_hash_set<std::string> seen;
  int64_t newest = -1;
  for (const std::string& e : event_ids) {
    if (!seen.insert(e).second) continue;
    absl::StatusOr<storage::v1::EventRecord> event = env_.store->GetEvent(index_, e);
    if (absl::IsNotFound(event.status())) {
      response->add_not_found(e);
      continue;
    }
    if (!event.ok()) return event.status();
    if (event->state() == storage::v1::EVENT_STATE_PENDING) return still_pending({e});
    storage::Store::Redaction r;
    r.event_id = e;
    if (event->sequence() >= retained) {
      absl::StatusOr<storage::v1::SampleRecord> sample =
          env_.store->GetSample(index_, event->sequence());
      if (!sample.ok() && !absl::IsNotFound(sample.status())) return sample.status();
      if (sample.ok() && !sample->redacted()) {
        r.sequence = event->sequence();
        r.sample = *std::move(sample);
        r.sample.clear_features();
        r.sample.clear_event_id();
        r.sample.set_redacted(true);
      }
    }
    newest = std::max(newest, r.sequence);
    redactions.push_back(std::move(r));
  }
  if (newest >= 0) {
    // A reward joined since the first wait (its event was pending then, joined when read
    // above) may not be learned yet: its sample must be in the chunk stored below, or a
    // restart would re-score it without its features.
    DECISION_RETURN_IF_ERROR(WaitLearned());
    DECISION_RETURN_IF_ERROR(StoreLogChunksThrough(newest));
  }
  if (!redactions.empty()) {
    DECISION_RETURN_IF_ERROR(
        Timed([&] { return env_.store->DeleteEvents(index_, redactions); }));
  }
  response->set_deleted(static_cast<int64_t>(redactions.size()));
  return absl::OkStatus();
}

}  // namespace decision::server
