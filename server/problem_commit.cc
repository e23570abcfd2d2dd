// Problem: the join writer. Every write of a decision, a join, an expiry or a late-reward
// mark goes through GroupCommitQueue (executor.h) and lands here, on the writer executor:
// one group at a time per problem, so the joins of a group take log positions from the
// log's size on, in queue order, in the store and in memory alike. A group that fails to
// write changes nothing in memory: its positions are taken by the next group.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/problem.h"

namespace decision::server {

using storage::v1::EventRecord;
using storage::v1::SampleRecord;

void Problem::QueueFlushLocked(Done done) {
  WriteOp op;
  op.kind = WriteOp::kFlush;
  op.flushed = pending_.TakeUnwritten();
  op.done = std::move(done);
  // Queued under mu_: a join that finds its decision kFlushing is queued after this.
  Submit(std::move(op));
}

absl::Status Problem::FlushDecisions() {
  // A flush that fails puts its decisions back (ApplyLocked): one more try writes them, or
  // reports why not.
  absl::Status s;
  for (int attempt = 0; attempt < 2 && (attempt == 0 || !s.ok()); ++attempt) {
    s = AwaitDone([&](Done done) {
      absl::MutexLock lock(&mu_);
      QueueFlushLocked(std::move(done));
    });
  }
  return s;
}

void Problem::CompletePropensities(WriteOp& op,
                                   const std::vector<std::shared_ptr<const Expert>>& models,
                                   std::vector<ScoringFailure>* failures) const {
  std::vector<double> probs(record_.num_arms());
  const absl::Span<const double> x(op.event.features().data(), op.event.features_size());
  for (size_t k = op.propensities.size(); k < models.size(); ++k) {
    // An expert that cannot score this context is quarantined with the stand-in's 1/K: it
    // was not part of the decision, and the sample must be learned by the others.
    const absl::Status s = models[k]->Predict(x, absl::MakeSpan(probs));
    const double p = s.ok() ? probs[op.event.arm()] : 0.0;
    if (p > 0.0 && p <= 1.0) {
      op.propensities.push_back(p);
      continue;
    }
    failures->push_back(
        {static_cast<int>(k),
         absl::StrCat("join: ", s.ok() ? absl::StrCat("the played arm gets probability ", p)
                                       : std::string(s.message()))});
    op.propensities.push_back(1.0 / record_.num_arms());
  }
}

void Problem::MarkLateAfterExpiryLocked(const WriteOp& op) {
  const PendingDecision* d = pending_.Find(op.event_id);
  if (d == nullptr || !d->late_reward || op.event.late_reward()) return;
  WriteOp mark;
  mark.kind = WriteOp::kMarkLate;
  mark.event_id = op.event_id;
  Submit(std::move(mark));
}

absl::Status Problem::AddToBatch(WriteOp& op, storage::Store::WriteGroup* batch, int64_t* seq,
                                 int64_t now_ms, absl::flat_hash_set<std::string>* marked_late) {
  storage::Store& store = *env_.store;
  switch (op.kind) {
    case WriteOp::kDecision:
      return store.AddDecision(batch, index_, op.event_id, op.event);
    case WriteOp::kFlush:
      for (const auto& [event_id, event] : op.flushed) {
        DECISION_RETURN_IF_ERROR(store.AddDecision(batch, index_, event_id, event));
      }
      return absl::OkStatus();
    case WriteOp::kDrop: {
      op.event.set_state(storage::v1::EVENT_STATE_EXPIRED);
      return store.AddExpiry(batch, index_, op.event_id, op.event, op.decision_stored);
    }
    case WriteOp::kJoin: {
      SampleRecord sample;
      sample.set_event_id(op.event_id);
      *sample.mutable_features() = op.event.features();
      sample.set_arm(op.event.arm());
      sample.set_expert_id(op.event.expert_id());
      sample.set_propensity(op.event.propensity());
      sample.set_reward(op.reward);
      sample.set_default_reward(op.is_default);
      sample.set_decided_at_ms(op.event.decided_at_ms());
      sample.set_joined_at_ms(now_ms);
      EventRecord joined = op.event;
      joined.set_state(op.is_default ? storage::v1::EVENT_STATE_EXPIRED
                                     : storage::v1::EVENT_STATE_JOINED);
      joined.set_reward(op.reward);
      joined.set_sequence((*seq)++);
      // The features now live in the sample; the event keeps what idempotent Choose and
      // duplicate detection need.
      joined.clear_features();
      return store.AddJoin(batch, index_, op.event_id, joined, joined.sequence(), sample,
                           op.decision_stored);
    }
    case WriteOp::kLateReward:
    case WriteOp::kMarkLate:
      return AddLateMarkToBatch(op, batch, marked_late);
  }
  return absl::OkStatus();
}

absl::Status Problem::AddLateMarkToBatch(WriteOp& op, storage::Store::WriteGroup* batch,
                                         absl::flat_hash_set<std::string>* marked_late) {
  // The event left the pending table after its join or expiry was written, so the store has
  // it; this thread writes every change to it, so the read is current.
  absl::StatusOr<EventRecord> stored = env_.store->GetEvent(index_, op.event_id);
  op.writes = false;
  if (absl::IsNotFound(stored.status())) {
    op.result = absl::NotFoundError(
        absl::StrCat("event ", op.event_id, " is unknown to problem ", id()));
    return absl::OkStatus();
  }
  if (!stored.ok()) {
    op.result = stored.status();
    return absl::OkStatus();
  }
  const bool reward = op.kind == WriteOp::kLateReward;  // else a kMarkLate
  if (stored->state() != storage::v1::EVENT_STATE_EXPIRED) {
    if (op.reward_response != nullptr) op.reward_response->set_first(false);
    op.counts_duplicate = reward;
    return absl::OkStatus();
  }
  if (reward) op.result = LateError(op.event_id, stored->deadline_ms());
  if (stored->late_reward() || marked_late->contains(op.event_id)) {
    op.counts_duplicate = reward;
    return absl::OkStatus();
  }
  marked_late->insert(op.event_id);
  op.counts_late = reward;
  op.writes = true;
  stored->set_late_reward(true);
  return env_.store->AddEventUpdate(batch, index_, op.event_id, *stored);
}

void Problem::CommitGroup(std::vector<WriteOp>& group) {
  int64_t first;
  absl::Status stopped;
  // Set when a join of the group was scored before an expert registered: that expert
  // scores it below, outside mu_ (ApplyJoinLocked then rarely has to).
  std::vector<std::shared_ptr<const Expert>> models;
  {
    absl::MutexLock lock(&mu_);
    first = ducb_.log().size();
    stopped = learning_stopped_;
    for (WriteOp& op : group) {
      if (op.kind == WriteOp::kJoin &&
          op.propensities.size() < static_cast<size_t>(experts_.size()) && models.empty()) {
        models = experts_.Models();
      }
      // A reward that came while the expiry was queued is written with it.
      if (!(op.kind == WriteOp::kDrop || (op.kind == WriteOp::kJoin && op.is_default))) continue;
      const PendingDecision* d = pending_.Find(op.event_id);
      if (d != nullptr && d->late_reward) op.event.set_late_reward(true);
    }
  }
  if (!models.empty()) {
    std::vector<ScoringFailure> failures;
    for (WriteOp& op : group) {
      if (op.kind == WriteOp::kJoin) CompletePropensities(op, models, &failures);
    }
    QuarantineFailures(failures);
  }
  storage::Store::WriteGroup batch;
  absl::Status written = absl::OkStatus();
  int64_t seq = first;
  const int64_t now = env_.clock->NowMs();
  absl::flat_hash_set<std::string> marked_late;
  for (WriteOp& op : group) {
    if (op.kind == WriteOp::kJoin && !stopped.ok()) {
      op.writes = false;
      op.result = stopped;
      continue;
    }
    written = AddToBatch(op, &batch, &seq, now, &marked_late);
    if (!written.ok()) break;
  }
  if (written.ok() && batch.size() > 0) {
    written = Timed([&] { return env_.store->Commit(&batch); });
  }
  {
    absl::MutexLock lock(&mu_);
    for (WriteOp& op : group) ApplyLocked(op, written);
    metrics_.pending->Set(static_cast<double>(pending_.answered()));
    metrics_.samples->Set(static_cast<double>(ducb_.log().size()));
  }
  for (WriteOp& op : group) {
    const absl::Status answer = op.writes && !written.ok() ? written : op.result;
    if (op.kind == WriteOp::kDecision) {
      for (ChooseWaiter& w : op.waiters) {
        if (answer.ok()) Answer(op.event_id, op.event, w.response);
        w.done(answer);
      }
    }
    if (op.done) op.done(answer);
  }
}

void Problem::ApplyLocked(WriteOp& op, const absl::Status& written) {
  const bool ok = written.ok() || !op.writes;
  switch (op.kind) {
    case WriteOp::kDecision: {
      PendingDecision* d = pending_.Find(op.event_id);
      if (!ok) {
        if (d != nullptr) op.waiters = std::move(d->waiters);
        pending_.Erase(op.event_id);
        return;
      }
      op.waiters = pending_.MarkStored(op.event_id);
      if (d != nullptr) d->deliveries = 1 + static_cast<int>(op.waiters.size());
      Answer(op.event_id, op.event, op.choose_response);
      ++decisions_;
      metrics_.decisions->Increment();
      experts_.at(op.event.expert_id()).metrics.selected->Increment();
      return;
    }
    case WriteOp::kFlush:
      if (ok) {
        for (const auto& [event_id, event] : op.flushed) pending_.MarkStored(event_id);
        return;
      }
      // Answered already: they stay pending in memory, and the next flush (or their join)
      // writes them. Until then a crash would forget them.
      write_error_log_.Report(env_.clock->NowMs(),
                              absl::StrCat("problem ", id(), ": ", op.flushed.size(),
                                           " decisions not written: ", written.ToString()));
      for (const auto& [event_id, event] : op.flushed) {
        pending_.ReturnUnwritten(event_id, env_.clock->NowMs());
      }
      return;
    case WriteOp::kDrop: {
      if (!ok) return pending_.AbortJoin(op.event_id, env_.clock->NowMs());
      MarkLateAfterExpiryLocked(op);
      pending_.Erase(op.event_id);
      metrics_.expired_dropped->Increment();
      return;
    }
    case WriteOp::kJoin:
      return ApplyJoinLocked(op, written);
    case WriteOp::kLateReward:
      if (op.counts_duplicate) metrics_.rewards_duplicate->Increment();
      if (op.counts_late && written.ok()) metrics_.rewards_late->Increment();
      return;
    case WriteOp::kMarkLate:
      if (op.writes && !written.ok()) {
        std::fprintf(stderr, "decisiond: problem %s: late mark of %s not written: %s\n",
                     id().c_str(), op.event_id.c_str(), written.ToString().c_str());
      }
      return;
  }
}

absl::Status Problem::LearnLocked(WriteOp& op, int64_t seq) {
  if (env_.hooks != nullptr && env_.hooks->before_learn) {
    DECISION_RETURN_IF_ERROR(env_.hooks->before_learn(seq));
  }
  return ducb_.Learn(op.event.expert_id(), op.reward,
                     absl::MakeConstSpan(op.propensities).subspan(0, ducb_.num_experts()));
}

void Problem::ApplyJoinLocked(WriteOp& op, const absl::Status& written) {
  if (!op.writes || !written.ok()) {
    pending_.AbortJoin(op.event_id, env_.clock->NowMs());
    return;
  }
  if (!learning_stopped_.ok()) {
    // An earlier join of this group could not be learned: this one's sample is stored one
    // position past the log's end. A restart learns both from the store.
    op.result = learning_stopped_;
    pending_.Erase(op.event_id);
    return;
  }
  const int64_t seq = ducb_.log().size();
  // WART: an expert registered after the group began is scored here, under mu_ (a model
  // evaluation under the lock). It needs a registration to race this group: rare.
  if (op.propensities.size() < static_cast<size_t>(experts_.size())) {
    std::vector<ScoringFailure> failures;
    CompletePropensities(op, experts_.Models(), &failures);
    for (const ScoringFailure& f : failures) QuarantineLocked(f.expert, f.reason);
  }
  if (absl::Status learned = LearnLocked(op, seq); !learned.ok()) {
    // The sample is stored at `seq` but the log did not take it: a later group would write
    // its own sample at the same position. Stop joining until a restart, which learns the
    // stored sample from the store. Should not happen: propensities are checked before the
    // write.
    learning_stopped_ = absl::InternalError(absl::StrCat(
        "problem ", id(), ": sample ", seq, " was stored but could not be learned (",
        learned.message(), "); rewards are refused until decisiond restarts and reloads it"));
    std::fprintf(stderr, "decisiond: %s\n", learning_stopped_.ToString().c_str());
    op.result = learning_stopped_;
    pending_.Erase(op.event_id);
    return;
  }
  for (int k = ducb_.num_experts(); k < experts_.size(); ++k) {
    experts_.at(k).tail.push_back(op.propensities[k]);
  }
  if (ducb_.log().size() % storage::kLogChunkSamples == 0) {
    // Written by WriteLogChunks, outside the lock (a chunk is about 1 MB).
    unwritten_chunks_.push_back(
        PendingChunkLocked(ducb_.log().size() / storage::kLogChunkSamples - 1));
  }
  if (op.is_default) MarkLateAfterExpiryLocked(op);
  pending_.Erase(op.event_id);
  if (op.reward_response != nullptr) op.reward_response->set_first(true);
  if (op.reward > 0.0) ++positive_rewards_;
  if (op.is_default) {
    metrics_.expired_default->Increment();
  } else {
    metrics_.rewards_learned->Increment();
    metrics_.reward_sum->Increment(op.reward);
  }
}

}  // namespace decision::server
