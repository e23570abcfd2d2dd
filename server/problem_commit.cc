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

Problem::WriteWork Problem::WriteWorkDue(int64_t now_ms) const {
  absl::MutexLock lock(&mu_);
  WriteWork work;
  work.decisions = pending_.unwritten() > 0 || pending_.flushing() > 0;
  work.chunks = !unwritten_chunks_.empty();
  work.expiry = pending_.AnyDeadlineBefore(now_ms);
  return work;
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
    case WriteOp::kActivate:  // the same record, no longer awaiting its activation
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
      *sample.mutable_eligible_arms() = op.event.eligible_arms();
      EventRecord joined = op.event;
      joined.set_state(op.is_default ? storage::v1::EVENT_STATE_EXPIRED
                                     : storage::v1::EVENT_STATE_JOINED);
      joined.set_reward(op.reward);
      joined.set_sequence((*seq)++);
      // The features now live in the sample; the event keeps what idempotent Choose and
      // duplicate detection need.
      joined.clear_features();
      joined.clear_eligible_arms();
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
  if (reward && UnlearnedSlot(*stored)) {
    op.result = UnlearnedSlotError(op.event_id, *stored);
    return absl::OkStatus();
  }
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
  {
    absl::MutexLock lock(&mu_);
    // Bounded learning lag: past kMaxUnlearnedSamples the writer waits for the learner
    // (the rewards then wait for their acknowledgement; nothing is dropped).
    const auto can_write = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return unlearned_.size() < kMaxUnlearnedSamples || !learning_stopped_.ok();
    };
    mu_.Await(absl::Condition(&can_write));
    first = WrittenSamplesLocked();
    stopped = learning_stopped_;
    for (WriteOp& op : group) {
      // A reward that came while the expiry was queued is written with it.
      if (!(op.kind == WriteOp::kDrop || (op.kind == WriteOp::kJoin && op.is_default))) continue;
      const PendingDecision* d = pending_.Find(op.event_id);
      if (d != nullptr && d->late_reward) op.event.set_late_reward(true);
    }
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
  bool start_learner = false;
  {
    absl::MutexLock lock(&mu_);
    for (WriteOp& op : group) ApplyLocked(op, written);
    metrics_.pending->Set(static_cast<double>(pending_.answered()));
    metrics_.learning_lag->Set(static_cast<double>(unlearned_.size()));
    if (env_.learner != nullptr && !unlearned_.empty() && !learn_scheduled_) {
      start_learner = learn_scheduled_ = true;
    }
  }
  // Scheduled without mu_: a stopped executor runs the task at once, in this thread.
  if (start_learner) env_.learner->Schedule([this] { LearnQueued(); });
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
  // Without a learner executor, the writer learns the group it just answered.
  if (env_.learner == nullptr) LearnQueued();
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
      (op.unlearned_slot    ? metrics_.expired_unlearned_slot
       : op.never_activated ? metrics_.expired_never_activated
                            : metrics_.expired_dropped)
          ->Increment();
      return;
    }
    case WriteOp::kActivate:
      if (!ok) {
        // Not durable: not activated (unless a join has taken the decision meanwhile; it
        // writes the decision as learned).
        PendingDecision* d = pending_.Find(op.event_id);
        if (d != nullptr && (d->state == DecisionState::kStored ||
                             d->state == DecisionState::kFlushing ||
                             d->state == DecisionState::kUnwritten)) {
          d->record.set_awaiting_activation(true);
        }
        if (op.activate_response != nullptr) op.activate_response->set_first(false);
      }
      return;
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

void Problem::ApplyJoinLocked(WriteOp& op, const absl::Status& written) {
  if (!op.writes || !written.ok()) {
    pending_.AbortJoin(op.event_id, env_.clock->NowMs());
    return;
  }
  experts_.at(op.event.expert_id()).may_have_chosen = true;  // a sample it chose is stored
  if (!learning_stopped_.ok()) {
    // The learner failed on an earlier sample while this group was written: this one is
    // stored past it, and a restart learns both from the store.
    op.result = learning_stopped_;
    pending_.Erase(op.event_id);
    return;
  }
  QueueLearnLocked(op, WrittenSamplesLocked());
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
