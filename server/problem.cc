// Problem: creation, Choose, Reward (and Activate) and the in-memory queries. See problem.h.
#include "server/problem.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/conversions.h"
#include "server/validation.h"

namespace decision::server {

std::string RandomEventId() {
  static thread_local std::mt19937_64 gen(std::random_device{}() ^
                                          (static_cast<uint64_t>(std::random_device{}()) << 32));
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(gen()),
                static_cast<unsigned long long>(gen()));
  return buf;
}

namespace {

using storage::v1::EventRecord;

}  // namespace

int64_t NextRefresh(const storage::v1::ProblemRecord& r, int64_t t) {
  const int64_t warmup = 3 * static_cast<int64_t>(r.num_arms());
  if (t < warmup) return warmup;
  // CreateProblem only checks that batch_multiplier is finite and > 0: b sqrt(t) can exceed
  // int64 (b = 1e300), where the conversion is undefined (x86 gives INT64_MIN: a refresh at
  // every sample), and a corrupt record's b can be NaN. The step is at least 1 and saturates
  // at 2^53 samples, further than any log.
  constexpr double kMaxStep = 9007199254740992.0;  // 2^53
  const double step = r.batch_multiplier() * std::sqrt(static_cast<double>(t));
  return t + (step >= kMaxStep ? static_cast<int64_t>(kMaxStep)
              : step >= 1.0    ? static_cast<int64_t>(step)
                               : 1);
}

Problem::Problem(uint32_t index, storage::v1::ProblemRecord record, const Env& env, DUcb ducb)
    : index_(index),
      record_(std::move(record)),
      env_(env),
      metrics_(env.metrics->ForProblem(record_.problem_id())),
      writer_(env.writer, [this](std::vector<WriteOp>& group) { CommitGroup(group); }),
      ducb_(std::move(ducb)),
      reservoir_(record_.num_features(), record_.divergence_reservoir()),
      reservoir_predictions_(env.reservoir_predictions_bytes),
      retention_max_samples_(record_.retention_max_samples()),
      retention_max_age_ms_(record_.retention_max_age_ms()),
      gen_(env.seed ^ (static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ULL)),
      // The record is valid (Create's caller and Load check it), so this cannot fail.
      stand_in_(MakeUniformExpert(record_.num_arms(), record_.num_features()).value()) {}

Problem::~Problem() = default;

absl::StatusOr<std::unique_ptr<Problem>> Problem::Create(uint32_t index,
                                                         storage::v1::ProblemRecord record,
                                                         const Env& env) {
  // The uniform expert has nothing to backfill: estimated at once.
  DECISION_ASSIGN_OR_RETURN(
      DUcb ducb, DUcb::Create(EstimatorOptionsOf(record), 1, DUcb::LogMode::kNone));
  std::unique_ptr<Problem> p(new Problem(index, std::move(record), env, std::move(ducb)));
  ExpertSlot uniform;
  uniform.record.set_name("uniform");
  uniform.record.mutable_model()->set_uniform(true);
  uniform.record.set_status(storage::v1::EXPERT_STATE_ACTIVE);
  uniform.record.set_registered_at_ms(env.clock->NowMs());
  DECISION_ASSIGN_OR_RETURN(uniform.model,
                            BuildExpert(uniform.record.model(), p->record_.num_arms(),
                                        p->record_.num_features(), 0.0));
  uniform.metrics = env.metrics->ForExpert(p->id(), 0);
  uniform.metrics.backfill_progress->Set(1.0);
  uniform.may_have_chosen = false;
  CheckpointWrite checkpoint;
  const storage::v1::ExpertRecord first = uniform.record;
  {
    absl::MutexLock lock(&p->mu_);
    p->next_refresh_at_ = NextRefresh(p->record_, 0);
    checkpoint = p->CheckpointLocked(/*with_state=*/true);
    p->experts_.Add(std::move(uniform));
    p->state_written_ = true;  // if the write below fails, there is no problem
  }
  // The store's lock is never taken under mu_ (ExportLog takes mu_ inside a store scan).
  storage::Store::WriteGroup batch;
  DECISION_RETURN_IF_ERROR(env.store->AddProblem(&batch, index, p->record_, first,
                                                 checkpoint.checkpoint, *checkpoint.state));
  // One write: after a crash the problem exists with its first expert, or not at all.
  DECISION_RETURN_IF_ERROR(p->Timed([&] { return env.store->Commit(&batch); }));
  return p;
}

// ------------------------------------------------------------------------------- Choose

absl::Status Problem::Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response) {
  return ChooseSlot(request, /*slot=*/-1, response);
}

absl::Status Problem::ChooseSlot(const v1::ChooseRequest& request, int slot,
                                v1::ChooseResponse* response) {
  return AwaitDone([&](Done done) {
    ChooseAs(request, response, std::move(done), Committer::kCaller, slot);
  });
}

void Problem::Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response,
                     Done done) {
  ChooseAs(request, response, std::move(done), Committer::kWriter);
}

void Problem::Answer(const std::string& event_id, const EventRecord& record,
                     v1::ChooseResponse* response) {
  response->set_event_id(event_id);
  response->set_arm(record.arm());
  response->set_propensity(record.propensity());
  response->set_expert_id(record.expert_id());
}

void Problem::AnswerWaiters(std::vector<ChooseWaiter> waiters, const std::string& event_id,
                            const EventRecord& record) {
  for (ChooseWaiter& w : waiters) {
    Answer(event_id, record, w.response);
    w.done(absl::OkStatus());
  }
}

absl::Status Problem::CheckPendingCapLocked() const {
  const int64_t pending = pending_.answered();
  const int64_t each = PendingDecisionBytes(record_.num_features());
  // The eligible arms decisions carry (ChooseRequest.eligible) count as they are.
  const int64_t bytes = pending * each + 4 * pending_.eligible_arms();
  const char* flag = nullptr;
  int64_t cap = 0;
  if (pending >= env_.max_pending_decisions) {
    flag = "--max_pending_decisions";
    cap = env_.max_pending_decisions;
  } else if (bytes >= env_.max_pending_decision_bytes) {
    flag = "--max_pending_decisions_mb";
    cap = env_.max_pending_decision_bytes >> 20;
  } else {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "problem ", id(), " holds ", pending, " decisions waiting for their reward (about ",
      bytes >> 20, " MB), the most ", flag, " (", cap,
      ") allows; a decision leaves when it is rewarded or its reward wait (",
      record_.reward_wait_ms(), " ms) passes"));
}

absl::StatusOr<Problem::Selection> Problem::SelectLocked(absl::Span<const double> x,
                                                         std::vector<int32_t> eligible,
                                                         bool offer) {
  if (offer) DECISION_RETURN_IF_ERROR(CheckPendingCapLocked());
  Selection s;
  s.expert = ducb_.SelectExpert(gen_);
  if (s.expert < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("problem ", id(), " has no selectable expert"));
  }
  s.model = experts_.at(s.expert).model;
  ++experts_.at(s.expert).selections_in_flight;  // until its decision is pending (Decide)
  // What Explain reports: the estimate it was followed for, and the runner-up (O(N),
  // Estimate is O(1)).
  const int n = ducb_.num_experts();
  if (s.expert < n) s.estimate = ducb_.Estimate(s.expert);
  for (int k = 0; k < n; ++k) {
    if (k == s.expert || !ducb_.selectable(k)) continue;
    const ExpertEstimate e = ducb_.Estimate(k);
    const double ucb = e.mean + e.width;
    if (s.runner_up < 0 || ucb > s.runner_up_ucb) {
      s.runner_up = k;
      s.runner_up_ucb = ucb;
    }
  }
  s.u = absl::Uniform<double>(gen_, 0.0, 1.0);
  if (offer) reservoir_.Offer(x, eligible, gen_);
  s.eligible = std::move(eligible);
  return s;
}

void Problem::ChooseAs(const v1::ChooseRequest& request, v1::ChooseResponse* response,
                       Done done, Committer committer, int slate_slot) {
  if (absl::Status s =
          ValidateChooseRequest(request, record_.num_features(), record_.num_arms());
      !s.ok()) {
    return done(s);
  }
  const bool caller_id = !request.event_id().empty();
  std::string event_id = caller_id ? request.event_id() : RandomEventId();
  const absl::Span<const double> x(request.features().data(), request.features_size());
  absl::StatusOr<Selection> selection;
  bool lookup = false;
  bool answered = false;
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (caller_id) {
      if (PendingDecision* d = pending_.Find(event_id)) {
        if (d->state == DecisionState::kDeciding || d->state == DecisionState::kWriting) {
          // The same event id is being decided or written: answered with that decision.
          d->waiters.push_back({response, std::move(done)});
          return;
        }
        refused = RetryOfSlot(event_id, d->record, slate_slot);
        if (refused.ok()) {
          Answer(event_id, d->record, response);
          ++d->deliveries;
        }
        answered = true;
      }
    }
    if (caller_id && !answered) {
      // The claim keeps every other Choose of this id from deciding it until this one has
      // (they wait for it), and keeps a reward from joining what is not yet answered.
      pending_.Claim(event_id);
      lookup = event_ids_loading_ || event_ids_.MayContain(event_id);
    }
    // A new event id (the common case): select in the same critical section.
    if (!answered && !lookup) {
      selection = SelectLocked(x, EligibleArmsOf(request, record_.num_arms()));
    }
  }
  if (answered) return done(std::move(refused));
  if (lookup && committer == Committer::kCaller) {
    // A caller that may block looks the id up itself.
    return DecideAfterLookup(request, std::move(event_id), response, std::move(done),
                             slate_slot);
  }
  if (lookup) {
    // The id may be stored (joined or expired): the store says, on the blocking executor.
    env_.blocking->Schedule([this, request = request, event_id = std::move(event_id), response,
                             done = std::move(done), slate_slot]() mutable {
      DecideAfterLookup(std::move(request), std::move(event_id), response, std::move(done),
                        slate_slot);
    });
    return;
  }
  if (!selection.ok()) {
    if (caller_id) return FailClaim(event_id, selection.status(), std::move(done));
    return done(selection.status());
  }
  Decide(request, std::move(event_id), caller_id, *std::move(selection), response,
         std::move(done), committer, slate_slot);
}

void Problem::DecideAfterLookup(v1::ChooseRequest request, std::string event_id,
                                v1::ChooseResponse* response, Done done, int slate_slot) {
  if (env_.hooks != nullptr && env_.hooks->before_event_lookup) {
    env_.hooks->before_event_lookup(event_id);
  }
  absl::StatusOr<EventRecord> stored = env_.store->GetEvent(index_, event_id);
  if (stored.ok()) {
    std::vector<ChooseWaiter> waiters;
    {
      absl::MutexLock lock(&mu_);
      waiters = pending_.Unclaim(event_id);
    }
    AnswerWaiters(std::move(waiters), event_id, *stored);
    if (absl::Status same = RetryOfSlot(event_id, *stored, slate_slot); !same.ok()) {
      return done(same);
    }
    Answer(event_id, *stored, response);
    return done(absl::OkStatus());
  }
  if (!absl::IsNotFound(stored.status())) return FailClaim(event_id, stored.status(), done);
  absl::StatusOr<Selection> selection;
  {
    absl::MutexLock lock(&mu_);
    selection = SelectLocked(
        absl::MakeConstSpan(request.features().data(), request.features_size()),
        EligibleArmsOf(request, record_.num_arms()));
  }
  if (!selection.ok()) return FailClaim(event_id, selection.status(), std::move(done));
  // On the blocking executor: this thread may commit.
  Decide(request, std::move(event_id), /*claimed=*/true, *std::move(selection), response,
         std::move(done), Committer::kCaller, slate_slot);
}

absl::Status Problem::RetryOfSlot(const std::string& event_id, const EventRecord& decided,
                                  int slate_slot) const {
  if (slate_slot < 0 || (decided.has_slate_slot() && decided.slate_slot() == slate_slot)) {
    return absl::OkStatus();
  }
  // A plain Choose (or another slot) took the id "<base>/<s>": answering with its decision
  // would put an arm the slate did not allow, or one twice, on the page.
  return absl::AlreadyExistsError(absl::StrCat(
      "event ", event_id, " is already a decision of problem ", id(), " that is not slot ",
      slate_slot, " of a slate; give the slate another event id"));
}

void Problem::FailClaim(const std::string& event_id, absl::Status status, Done done) {
  std::vector<ChooseWaiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    waiters = pending_.Unclaim(event_id);
  }
  for (ChooseWaiter& w : waiters) w.done(status);
  done(std::move(status));
}

void Problem::Decide(const v1::ChooseRequest& request, std::string event_id, bool claimed,
                     Selection selection, v1::ChooseResponse* response, Done done,
                     Committer committer, int slate_slot) {
  if (env_.hooks != nullptr && env_.hooks->after_select) env_.hooks->after_select(event_id);
  // WART: the chosen expert is evaluated on the caller's thread (a reactor thread under
  // gRPC). It is CPU work, not a wait, and one model per Choose; but a model whose cost is
  // not bounded would hold the reactor. Registration does not bound it yet.
  const absl::Span<const double> x(request.features().data(), request.features_size());
  std::vector<double> probs(record_.num_arms());
  // An expert that cannot score the context is quarantined and another one selected: each
  // pass quarantines one more expert, so this ends (the uniform expert never fails).
  while (true) {
    absl::Status s =
        selection.model->PredictEligible(x, selection.eligible, absl::MakeSpan(probs));
    for (size_t a = 0; s.ok() && a < probs.size(); ++a) {
      if (!(probs[a] >= 0.0 && probs[a] <= 1.0)) {
        s = absl::InvalidArgumentError(absl::StrCat("arm ", a, " gets probability ", probs[a]));
      }
    }
    if (s.ok()) break;
    absl::StatusOr<Selection> next;
    {
      absl::MutexLock lock(&mu_);
      --experts_.at(selection.expert).selections_in_flight;
      QuarantineLocked(selection.expert, absl::StrCat("choose: ", s.message()));
      next = SelectLocked(x, selection.eligible, /*offer=*/false);
    }
    if (!next.ok()) {
      if (claimed) return FailClaim(event_id, next.status(), std::move(done));
      return done(next.status());
    }
    selection = *std::move(next);
  }
  if (request.return_distribution()) {
    response->mutable_distribution()->Assign(probs.begin(), probs.end());
  }
  EventRecord event;
  event.set_arm(SampleArm(probs, selection.u));
  event.set_draw(selection.u);
  event.set_estimate(selection.estimate.mean);
  event.set_width(selection.estimate.width);
  if (selection.runner_up >= 0) {
    event.set_runner_up(selection.runner_up);
    event.set_runner_up_ucb(selection.runner_up_ucb);
  }
  event.set_expert_id(selection.expert);
  event.set_propensity(probs[event.arm()]);
  *event.mutable_features() = request.features();
  event.mutable_eligible_arms()->Add(selection.eligible.begin(), selection.eligible.end());
  const int64_t now = env_.clock->NowMs();
  event.set_awaiting_activation(request.deferred());
  if (slate_slot >= 0) event.set_slate_slot(slate_slot);
  event.set_decided_at_ms(now);
  event.set_deadline_ms(now + record_.reward_wait_ms());
  event.set_state(storage::v1::EVENT_STATE_PENDING);
  event.set_sequence(-1);
  if (!env_.defer_decisions) {
    // Answered once written (ApplyLocked), with the Choose calls that wait for it.
    {
      absl::MutexLock lock(&mu_);
      event_ids_.Insert(event_id, now);
      pending_.Decide(event_id, event, DecisionState::kWriting, now);
      --experts_.at(selection.expert).selections_in_flight;
    }
    WriteOp op;
    op.kind = WriteOp::kDecision;
    op.event_id = std::move(event_id);
    op.event = std::move(event);
    op.choose_response = response;
    op.done = std::move(done);
    return Submit(std::move(op), committer);
  }
  // Deferred: answered and joinable at once; written by a flush or by its join.
  std::vector<ChooseWaiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    event_ids_.Insert(event_id, now);
    waiters = pending_.Decide(event_id, event, DecisionState::kUnwritten, now);
    --experts_.at(selection.expert).selections_in_flight;
    pending_.Find(event_id)->deliveries = 1 + static_cast<int>(waiters.size());
    ++decisions_;
    metrics_.decisions->Increment();
    experts_.at(selection.expert).metrics.selected->Increment();
    metrics_.pending->Set(static_cast<double>(pending_.answered()));
    if (pending_.FlushDue(now, kMaxUnwrittenDecisions, env_.decision_flush_ms)) {
      QueueFlushLocked(nullptr);
    }
  }
  Answer(event_id, event, response);
  AnswerWaiters(std::move(waiters), event_id, event);
  done(absl::OkStatus());
}

// ------------------------------------------------------------------------------- Reward

absl::Status Problem::Reward(const v1::RewardRequest& request, v1::RewardResponse* response) {
  DECISION_RETURN_IF_ERROR(AwaitDone(
      [&](Done done) { RewardAs(request, response, std::move(done), Committer::kCaller); }));
  return WaitLearned();
}

void Problem::Reward(const v1::RewardRequest& request, v1::RewardResponse* response,
                     Done done) {
  RewardAs(request, response, std::move(done), Committer::kWriter);
}

void Problem::Activate(const v1::ActivateRequest& request, v1::ActivateResponse* response,
                       Done done) {
  if (absl::Status s = ValidateActivateRequest(request); !s.ok()) return done(s);
  const std::string& event_id = request.event_id();
  // By value: it also runs on the blocking executor below.
  const auto expired = [event_id](int64_t deadline_ms) {
    return absl::FailedPreconditionError(absl::StrCat(
        "event ", event_id, " was not activated within its reward wait (it expired at ",
        deadline_ms, " ms): it is dropped, not learned"));
  };
  WriteOp op;
  {
    absl::MutexLock lock(&mu_);
    PendingDecision* d = pending_.Find(event_id);
    if (d != nullptr) {
      switch (d->state) {
        case DecisionState::kDeciding:
        case DecisionState::kWriting:
          return done(absl::UnavailableError(absl::StrCat(
              "the decision of event ", event_id, " is still being stored; retry")));
        case DecisionState::kJoining:
        case DecisionState::kExpiring:
          if (d->record.awaiting_activation()) return done(expired(d->record.deadline_ms()));
          response->set_first(false);
          return done(absl::OkStatus());
        case DecisionState::kUnwritten:
        case DecisionState::kFlushing:
        case DecisionState::kStored:
          break;
      }
      if (!d->record.awaiting_activation()) {
        response->set_first(false);
        return done(absl::OkStatus());
      }
      if (env_.clock->NowMs() > d->record.deadline_ms()) {
        return done(expired(d->record.deadline_ms()));
      }
      // Learnable from now on: a reward planned after this is joined after the write below
      // (writes keep their order), and an expiry learns it with the default reward.
      d->record.set_awaiting_activation(false);
      response->set_first(true);
      if (d->state == DecisionState::kUnwritten) {
        return done(absl::OkStatus());  // its flush or its join writes it as it is now
      }
      op.kind = WriteOp::kActivate;
      op.event_id = event_id;
      op.event = d->record;
      op.activate_response = response;
      op.done = std::move(done);
    }
  }
  if (op.kind == WriteOp::kActivate) return Submit(std::move(op), Committer::kWriter);
  // Not pending: joined, expired or unknown; the store says which.
  env_.blocking->Schedule([this, event_id, response, expired, done = std::move(done)] {
    absl::StatusOr<EventRecord> stored = env_.store->GetEvent(index_, event_id);
    if (absl::IsNotFound(stored.status())) {
      return done(absl::NotFoundError(
          absl::StrCat("problem ", id(), " has no event ", event_id)));
    }
    if (!stored.ok()) return done(stored.status());
    if (stored->awaiting_activation()) return done(expired(stored->deadline_ms()));
    response->set_first(false);
    done(absl::OkStatus());
  });
}

absl::Status Problem::UnlearnedSlotError(const std::string& event_id,
                                        const EventRecord& event) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "event ", event_id, " is slot ", event.slate_slot(), " of a slate, and problem ", id(),
      " learns only the first slot (slate_learning SLATE_LEARNING_FIRST_SLOT): its reward is "
      "not learned"));
}

absl::Status Problem::LateError(const std::string& event_id, int64_t deadline_ms) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "event ", event_id, " expired at ", deadline_ms, " ms (reward wait time ",
      record_.reward_wait_ms(), " ms); the reward is counted as late and not learned"));
}

Problem::RewardPlan Problem::PlanRewardLocked(const std::string& event_id, int64_t now_ms,
                                              v1::RewardResponse* response) {
  RewardPlan plan;
  PendingDecision* d = pending_.Find(event_id);
  if (d == nullptr) {
    // Not pending: joined, expired or unknown. The writer resolves it against the store, in
    // order with the joins and expiries it writes.
    plan.action = RewardPlan::kLate;
    return plan;
  }
  switch (d->state) {
    case DecisionState::kDeciding:
    case DecisionState::kWriting:
      plan.answer = absl::UnavailableError(absl::StrCat(
          "the decision of event ", event_id, " is still being stored; retry the reward"));
      return plan;
    case DecisionState::kJoining:
      response->set_first(false);
      metrics_.rewards_duplicate->Increment();
      return plan;
    case DecisionState::kExpiring:
      // Racing its expiry: late, like a reward after it. The expiry writes the mark.
      (d->late_reward ? metrics_.rewards_duplicate : metrics_.rewards_late)->Increment();
      d->late_reward = true;
      plan.answer = LateError(event_id, d->record.deadline_ms());
      return plan;
    case DecisionState::kUnwritten:
    case DecisionState::kFlushing:
    case DecisionState::kStored:
      break;
  }
  if (UnlearnedSlot(d->record)) {
    plan.answer = UnlearnedSlotError(event_id, d->record);
    return plan;
  }
  if (d->deliveries == 0) {
    plan.answer = absl::FailedPreconditionError(absl::StrCat(
        "the decision of event ", event_id, " was never delivered (its Choose was cancelled "
        "or passed its deadline before the answer was sent): it is not learned"));
    return plan;
  }
  if (d->record.awaiting_activation() && now_ms <= d->record.deadline_ms()) {
    plan.answer = absl::FailedPreconditionError(absl::StrCat(
        "the decision of event ", event_id,
        " was chosen deferred and is not activated: call Activate when it is shown, then "
        "Reward"));
    return plan;
  }
  if (now_ms > d->record.deadline_ms()) {
    // The wait time passed but the expiry has not run yet: expire it now, with the late
    // mark, and answer as for any late reward once the expiry is written.
    d->late_reward = true;
    metrics_.rewards_late->Increment();
    plan.answer = LateError(event_id, d->record.deadline_ms());
    plan.action = RewardPlan::kExpire;
    PrepareExpiryLocked(event_id, *d, &plan.op);
    return plan;
  }
  plan.action = RewardPlan::kJoin;
  plan.op.kind = WriteOp::kJoin;
  plan.op.event_id = event_id;
  plan.op.decision_stored = pending_.StartJoin(*d, /*expiry=*/false);
  plan.op.event = d->record;
  return plan;
}

void Problem::RewardAs(const v1::RewardRequest& request, v1::RewardResponse* response,
                       Done done, Committer committer) {
  if (absl::Status s = ValidateRewardRequest(request); !s.ok()) return done(s);
  RewardPlan plan;
  {
    absl::MutexLock lock(&mu_);
    plan = PlanRewardLocked(request.event_id(), env_.clock->NowMs(), response);
  }
  WriteOp& op = plan.op;
  switch (plan.action) {
    case RewardPlan::kAnswer:
      return done(plan.answer);
    case RewardPlan::kExpire:
      op.done = [answer = plan.answer, done = std::move(done)](absl::Status written) {
        done(written.ok() ? answer : written);
      };
      return Submit(std::move(op), committer);
    case RewardPlan::kLate:
      op.kind = WriteOp::kLateReward;
      op.event_id = request.event_id();
      op.reward_response = response;
      op.done = std::move(done);
      return Submit(std::move(op), committer);
    case RewardPlan::kJoin:
      break;
  }
  // No expert scores the context here: the learner scores the written samples in batches.
  op.reward = request.value();
  op.reward_response = response;
  op.done = std::move(done);
  Submit(std::move(op), committer);
}

void Problem::Undeliver(const std::string& event_id) {
  absl::MutexLock lock(&mu_);
  PendingDecision* d = pending_.Find(event_id);
  if (d == nullptr || d->deliveries == 0) return;
  switch (d->state) {
    case DecisionState::kUnwritten:
    case DecisionState::kFlushing:
    case DecisionState::kStored:
      if (--d->deliveries == 0) metrics_.undelivered->Increment();
      return;
    default:
      // Being decided (another call will answer it), or already joined by a reward: some
      // caller has it.
      return;
  }
}

// ------------------------------------------------------------------------------ Queries

std::vector<double> Problem::RecentContexts(int max_rows) const {
  absl::MutexLock lock(&mu_);
  const absl::Span<const double> rows = reservoir_.contexts();
  const size_t d = record_.num_features();
  const size_t n = d == 0 ? 0 : std::min<size_t>(rows.size() / d, std::max(0, max_rows));
  return std::vector<double>(rows.begin(), rows.begin() + n * d);
}

bool Problem::HasPositiveReward() const {
  absl::MutexLock lock(&mu_);
  return positive_rewards_ > 0;
}

std::vector<v1::Expert> Problem::ListExperts() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Expert> out;
  for (int k = 0; k < experts_.size(); ++k) {
    out.push_back(experts_.ToWire(id(), k, k < ducb_.num_experts()));
  }
  return out;
}

v1::Estimates Problem::GetEstimates() const {
  absl::MutexLock lock(&mu_);
  v1::Estimates out;
  out.set_problem_id(id());
  const int64_t t = ducb_.num_samples();
  out.set_samples(t);
  const int n_est = ducb_.num_experts();
  double best = -std::numeric_limits<double>::infinity(), collected = 0.0;
  for (int k = 0; k < experts_.size(); ++k) {
    v1::ExpertEstimate* e = out.add_experts();
    e->set_expert_id(k);
    const bool failed = !experts_.at(k).failure.empty();
    e->set_status(experts_.WireStatus(k));
    if (failed) {
      // Excluded: its column holds the stand-in's 1/K since it failed, so no estimate of it
      // is meaningful; the regret is against the best healthy expert.
      e->set_times_selected(k < n_est ? ducb_.count(k) : 0);
      e->set_width(std::numeric_limits<double>::infinity());
      if (k < n_est) collected += ducb_.count(k) * ducb_.Estimate(k).mean;
    } else if (k < n_est) {
      const ExpertEstimate est = ReportedEstimateLocked(k);
      e->set_estimate(est.mean);
      e->set_width(est.width);
      e->set_ucb(est.mean + est.width);
      e->set_times_selected(ducb_.count(k));
      if (!experts_.Frozen(k)) {
        e->set_effective_sample_size(ducb_.estimator().EffectiveSampleSize(k));
        *e->mutable_off_policy() = OffPolicyToWire(ducb_.OffPolicy(k).Estimate());
      }
      best = std::max(best, est.mean);
      collected += ducb_.count(k) * est.mean;
    } else {
      e->set_width(std::numeric_limits<double>::infinity());
      e->set_ucb(std::numeric_limits<double>::infinity());
    }
  }
  const DivergenceMatrix& d = ducb_.estimator().divergences();
  out.set_n(d.num_experts);
  *out.mutable_m() = {d.m.begin(), d.m.end()};
  *out.mutable_sigma() = {d.sigma.begin(), d.sigma.end()};
  out.set_estimated_regret(t > 0 ? t * best - collected : 0.0);
  return out;
}

v1::Problem Problem::Summary() const {
  absl::MutexLock lock(&mu_);
  v1::Problem p;
  p.set_problem_id(id());
  p.set_decisions(decisions_);
  p.set_samples(ducb_.num_samples());
  p.set_pending(pending_.answered());
  p.set_experts(experts_.size());
  p.set_next_batch_at(next_refresh_at_);
  p.set_retained_from(retained_from_);
  *p.mutable_config() = ConfigFromRecord(record_);
  // Changed at runtime (SetRetention) since the record was loaded.
  p.mutable_config()->mutable_retention()->set_max_samples(retention_max_samples_);
  p.mutable_config()->mutable_retention()->set_max_age_ms(retention_max_age_ms_);
  return p;
}

}  // namespace decision::server
