#include "server/problem.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/xgboost_expert.h"

namespace decision::server {
namespace {

using storage::v1::CheckpointRecord;
using storage::v1::EventRecord;
using storage::v1::ExpertModelRecord;
using storage::v1::ExpertRecord;
using storage::v1::ProblemRecord;
using storage::v1::SampleRecord;

constexpr int kStateStatusBackfilling = 1;
constexpr int kStateStatusActive = 2;
constexpr int kStateStatusRetired = 3;
constexpr int kEventPending = 0;
constexpr int kEventJoined = 1;
constexpr int kEventExpired = 2;

std::string RandomEventId() {
  static thread_local std::mt19937_64 gen(std::random_device{}() ^
                                          (static_cast<uint64_t>(std::random_device{}()) << 32));
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(gen()),
                static_cast<unsigned long long>(gen()));
  return buf;
}

// The first refresh happens after the warm-up of 3K samples, then every b sqrt(t).
int64_t NextRefresh(const ProblemRecord& r, int64_t t) {
  if (t < 3 * static_cast<int64_t>(r.num_arms())) return 3 * static_cast<int64_t>(r.num_arms());
  return t + std::max<int64_t>(
                 1, static_cast<int64_t>(r.batch_multiplier() * std::sqrt(static_cast<double>(t))));
}

v1::ExpertStatus StatusOf(int status) {
  switch (status) {
    case kStateStatusBackfilling:
      return v1::EXPERT_STATUS_BACKFILLING;
    case kStateStatusActive:
      return v1::EXPERT_STATUS_ACTIVE;
    case kStateStatusRetired:
      return v1::EXPERT_STATUS_RETIRED;
  }
  return v1::EXPERT_STATUS_UNSPECIFIED;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Expert>> BuildExpert(const ExpertModelRecord& model,
                                                    int num_arms, int num_features,
                                                    double smoothing) {
  switch (model.kind_case()) {
    case ExpertModelRecord::kUniform:
      return MakeUniformExpert(num_arms, num_features);
    case ExpertModelRecord::kTable: {
      std::vector<std::vector<double>> rows;
      for (const auto& row : model.table().rows()) {
        rows.emplace_back(row.probabilities().begin(), row.probabilities().end());
      }
      return MakeTableExpert(num_arms, num_features, std::move(rows),
                             model.table().key_feature(), smoothing);
    }
    case ExpertModelRecord::kLinearSoftmax: {
      const auto& l = model.linear_softmax();
      return MakeLinearSoftmaxExpert(
          num_arms, num_features, std::vector<double>(l.weights().begin(), l.weights().end()),
          std::vector<double>(l.bias().begin(), l.bias().end()),
          l.temperature() == 0.0 ? 1.0 : l.temperature(), smoothing);
    }
    case ExpertModelRecord::kXgboost:
      return MakeXgboostExpert(num_arms, num_features, model.xgboost(), smoothing);
    case ExpertModelRecord::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("model: no model kind is set");
}

EstimatorOptions EstimatorOptionsOf(const ProblemRecord& record) {
  const auto& e = record.estimator();
  EstimatorOptions o;
  o.kind = static_cast<EstimatorKind>(e.kind());
  o.constants = {e.big_c(), e.c1(), e.c2(), e.c3()};
  o.epsilon_rule = static_cast<EpsilonRule>(e.epsilon_rule());
  o.width_rule = static_cast<WidthRule>(e.width_rule());
  o.clip_test = static_cast<ClipTest>(e.clip_test());
  o.grouping = static_cast<MedianOfMeansGrouping>(e.grouping());
  return o;
}

Problem::Problem(uint32_t index, ProblemRecord record, const Env& env, DUcb ducb)
    : index_(index),
      record_(std::move(record)),
      env_(env),
      metrics_(env.metrics->ForProblem(record_.problem_id())),
      ducb_(std::move(ducb)),
      reservoir_(record_.num_features(), record_.divergence_reservoir()),
      gen_(env.seed ^ (static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ULL)) {}

template <typename F>
absl::Status Problem::Timed(F&& write) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = write();
  env_.metrics->storage_write_latency().Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return s;
}

absl::StatusOr<std::unique_ptr<Problem>> Problem::Create(uint32_t index, ProblemRecord record,
                                                         const Env& env) {
  DECISION_ASSIGN_OR_RETURN(DUcb ducb, DUcb::Create(EstimatorOptionsOf(record), 0));
  std::unique_ptr<Problem> p(new Problem(index, std::move(record), env, std::move(ducb)));
  DECISION_RETURN_IF_ERROR(env.store->PutProblem(index, p->record_));
  ExpertModelRecord uniform;
  uniform.set_uniform(true);
  absl::StatusOr<v1::Expert> expert = p->RegisterExpert("uniform", uniform, 0.0);
  if (!expert.ok()) return expert.status();
  absl::MutexLock lock(&p->mu_);
  p->next_refresh_at_ = NextRefresh(p->record_, 0);
  // The uniform expert has nothing to backfill: estimate it at once.
  DECISION_RETURN_IF_ERROR(p->ducb_.AddExperts({std::vector<double>()},
                                               DivergenceMatrix::Identity(1)));
  p->experts_[0].record.set_status(kStateStatusActive);
  p->experts_[0].metrics.backfill_progress->Set(1.0);
  DECISION_RETURN_IF_ERROR(env.store->PutCheckpoint(index, p->CheckpointLocked()));
  DECISION_RETURN_IF_ERROR(env.store->PutExpert(index, 0, p->experts_[0].record));
  return p;
}

absl::StatusOr<std::unique_ptr<Problem>> Problem::Load(uint32_t index, ProblemRecord record,
                                                       const Env& env) {
  const EstimatorOptions options = EstimatorOptionsOf(record);
  std::unique_ptr<Problem> p;
  {
    DECISION_ASSIGN_OR_RETURN(DUcb empty, DUcb::Create(options, 0));
    p.reset(new Problem(index, std::move(record), env, std::move(empty)));
  }
  absl::MutexLock lock(&p->mu_);
  const ProblemRecord& r = p->record_;
  // Experts.
  DECISION_RETURN_IF_ERROR(env.store->ForEachExpert(
      index, [&](uint32_t id, const ExpertRecord& er) -> absl::Status {
        if (id != p->experts_.size()) {
          return absl::DataLossError(absl::StrCat("problem ", r.problem_id(),
                                                  ": expert ids are not contiguous at ", id));
        }
        DECISION_ASSIGN_OR_RETURN(
            std::unique_ptr<Expert> model,
            BuildExpert(er.model(), r.num_arms(), r.num_features(), er.smoothing()));
        ExpertSlot slot;
        slot.record = er;
        slot.model = std::move(model);
        slot.metrics = env.metrics->ForExpert(r.problem_id(), static_cast<int>(id));
        p->experts_.push_back(std::move(slot));
        return absl::OkStatus();
      }));
  // The checkpoint says which experts D-UCB estimates and with which divergences.
  CheckpointRecord checkpoint;
  absl::StatusOr<CheckpointRecord> stored = env.store->GetCheckpoint(index);
  if (stored.ok()) {
    checkpoint = *std::move(stored);
  } else if (!absl::IsNotFound(stored.status())) {
    return stored.status();
  }
  const int n_est = std::min<int>(checkpoint.num_experts(), p->experts_.size());
  DivergenceMatrix d = DivergenceMatrix::Identity(n_est);
  if (checkpoint.m_size() == n_est * n_est && checkpoint.sigma_size() == n_est * n_est) {
    d.m.assign(checkpoint.m().begin(), checkpoint.m().end());
    d.sigma.assign(checkpoint.sigma().begin(), checkpoint.sigma().end());
  }
  // Backfilled columns of estimated experts (for samples joined before they registered),
  // and the progress of experts still backfilling.
  std::vector<std::vector<double>> columns(p->experts_.size());
  for (size_t id = 0; id < p->experts_.size(); ++id) {
    ExpertSlot& slot = p->experts_[id];
    if (static_cast<int>(id) >= n_est && slot.record.status() != kStateStatusRetired) {
      slot.record.set_status(kStateStatusBackfilling);
    } else if (static_cast<int>(id) < n_est && slot.record.status() == kStateStatusBackfilling) {
      slot.record.set_status(kStateStatusActive);
    }
    if (slot.record.backfill_total() == 0) continue;
    std::vector<double>& column = columns[id];
    DECISION_RETURN_IF_ERROR(env.store->ForEachBackfillChunk(
        index, static_cast<uint32_t>(id),
        [&](uint64_t chunk, const storage::v1::BackfillChunk& c) -> absl::Status {
          if (chunk * kBackfillChunk != column.size()) return absl::OkStatus();  // a gap
          column.insert(column.end(), c.values().begin(), c.values().end());
          return absl::OkStatus();
        }));
    if (static_cast<int64_t>(column.size()) > slot.record.backfill_total()) {
      column.resize(slot.record.backfill_total());
    }
  }
  for (int id = n_est; id < static_cast<int>(p->experts_.size()); ++id) {
    p->experts_[id].backfill = columns[id];
  }
  // The sample log: complete chunks from their LogChunk records, the samples after the last
  // chunk re-scored from their SampleRecord (the models are deterministic).
  const size_t num_experts = p->experts_.size();
  SampleLog log(n_est);
  std::vector<double> row(num_experts);
  // Appends sample `seq` with row[k] = pi_k for every expert k (NaN: look in its backfill).
  auto append = [&](int64_t seq, int chooser, double reward) -> absl::Status {
    for (size_t k = 0; k < num_experts; ++k) {
      const int64_t backfill_total = p->experts_[k].record.backfill_total();
      if (std::isnan(row[k]) && seq < static_cast<int64_t>(columns[k].size())) {
        row[k] = columns[k][seq];
      }
      if (static_cast<int>(k) >= n_est && seq >= backfill_total) {
        p->experts_[k].tail.push_back(row[k]);
      }
      if (static_cast<int>(k) < n_est && std::isnan(row[k])) {
        return absl::DataLossError(absl::StrCat("problem ", r.problem_id(), ": sample ", seq,
                                                " has no propensity for expert ", k));
      }
    }
    return log.Append(chooser, reward, absl::MakeConstSpan(row).subspan(0, n_est));
  };
  // A chunk is written by the maintenance round after its last sample: a crash in between
  // leaves a gap. The log then continues from the samples, and the chunks from the gap on
  // are written again (below).
  bool gap = false;
  DECISION_RETURN_IF_ERROR(env.store->ForEachLogChunk(
      index, [&](uint64_t chunk, const storage::v1::LogChunk& c) -> absl::Status {
        if (gap || static_cast<int64_t>(chunk) * kLogChunk != log.size()) {
          gap = true;
          return absl::OkStatus();
        }
        const int width = c.num_experts();
        for (int i = 0; i < c.chooser_size(); ++i) {
          for (size_t k = 0; k < num_experts; ++k) {
            row[k] = static_cast<int>(k) < width ? c.propensities(i * width + k) : NAN;
          }
          DECISION_RETURN_IF_ERROR(append(log.size(), c.chooser(i), c.reward(i)));
        }
        return absl::OkStatus();
      }));
  const int64_t chunks_read = log.size() / kLogChunk;
  {
    std::vector<SampleRecord> tail;
    DECISION_RETURN_IF_ERROR(env.store->ForEachSample(
        index, log.size(), 0, [&](int64_t seq, const SampleRecord& s) -> absl::Status {
          if (seq != log.size() + static_cast<int64_t>(tail.size())) {
            return absl::DataLossError(
                absl::StrCat("problem ", r.problem_id(), ": sample ", seq, " is out of order"));
          }
          tail.push_back(s);
          return absl::OkStatus();
        }));
    std::vector<double> probs(r.num_arms());
    for (const SampleRecord& s : tail) {
      const absl::Span<const double> x(s.features().data(), s.features_size());
      for (size_t k = 0; k < num_experts; ++k) {
        DECISION_RETURN_IF_ERROR(p->experts_[k].model->Predict(x, absl::MakeSpan(probs)));
        row[k] = probs[s.arm()];
      }
      DECISION_RETURN_IF_ERROR(append(log.size(), s.expert_id(), s.reward()));
    }
  }
  DECISION_ASSIGN_OR_RETURN(DUcb ducb, DUcb::FromLog(options, std::move(log), d));
  for (int k = 0; k < n_est; ++k) {
    ducb.SetSelectable(k, p->experts_[k].record.status() == kStateStatusActive);
  }
  p->ducb_ = std::move(ducb);
  for (int64_t chunk = chunks_read; (chunk + 1) * kLogChunk <= p->ducb_.log().size(); ++chunk) {
    p->unwritten_chunks_.push_back(p->PendingChunkLocked(chunk));
  }
  // Reservoir, schedule and counters.
  if (checkpoint.reservoir_size() > 0 && r.num_features() > 0) {
    p->reservoir_.Reset(std::vector<double>(checkpoint.reservoir().begin(),
                                            checkpoint.reservoir().end()),
                        checkpoint.reservoir_seen());
  }
  p->next_refresh_at_ = checkpoint.next_refresh_at() > 0
                            ? checkpoint.next_refresh_at()
                            : NextRefresh(r, p->ducb_.log().size());
  p->decisions_ = std::max(checkpoint.decisions(), p->ducb_.log().size());
  // Pending decisions.
  DECISION_RETURN_IF_ERROR(env.store->ForEachPending(
      index, [&](int64_t deadline, absl::string_view event_id) -> absl::Status {
        DECISION_ASSIGN_OR_RETURN(EventRecord event, env.store->GetEvent(index, event_id));
        if (event.state() != kEventPending) return absl::OkStatus();
        p->pending_[std::string(event_id)] = Pending{event, false, true};
        p->deadlines_.insert({deadline, std::string(event_id)});
        return absl::OkStatus();
      }));
  p->decisions_ = std::max<int64_t>(p->decisions_, p->ducb_.log().size() + p->pending_.size());
  // Every stored event id (pending, joined, expired), for Choose's idempotency check.
  DECISION_RETURN_IF_ERROR(env.store->ForEachEventId(
      index, [&](absl::string_view event_id) { p->event_ids_.Insert(event_id); }));
  for (size_t id = 0; id < p->experts_.size(); ++id) {
    p->experts_[id].metrics.backfill_progress->Set(
        static_cast<int>(id) < n_est ? 1.0
        : p->experts_[id].record.backfill_total() == 0
            ? 0.0
            : static_cast<double>(p->experts_[id].backfill.size()) /
                  p->experts_[id].record.backfill_total());
  }
  p->metrics_.pending->Set(static_cast<double>(p->pending_.size()));
  p->metrics_.samples->Set(static_cast<double>(p->ducb_.log().size()));
  return p;
}

void Problem::FillResponse(const std::string& event_id, const EventRecord& record,
                           v1::ChooseResponse* response) const {
  response->set_event_id(event_id);
  response->set_arm(record.arm());
  response->set_propensity(record.propensity());
  response->set_expert_id(record.expert_id());
}

bool Problem::AnswerPendingLocked(const std::string& event_id,
                                  v1::ChooseResponse* response) const {
  auto it = pending_.find(event_id);
  if (it == pending_.end()) return false;
  FillResponse(event_id, it->second.record, response);
  return true;
}

absl::Status Problem::Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response) {
  return AwaitDone([&](Done done) { Choose(request, response, std::move(done)); });
}

void Problem::Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response,
                     Done done) {
  bool flush = false;
  absl::StatusOr<std::optional<WriteOp>> op = PrepareDecision(request, response, &flush);
  if (!op.ok()) return done(op.status());
  if (op->has_value()) {  // --durable_choose: answered once written
    (*op)->done = std::move(done);
    return Submit(*std::move(*op));
  }
  done(absl::OkStatus());  // answered: an earlier decision, or a deferred one
  if (flush) FlushDecisions(/*wait=*/false);
}

absl::StatusOr<std::optional<Problem::WriteOp>> Problem::PrepareDecision(
    const v1::ChooseRequest& request, v1::ChooseResponse* response, bool* flush) {
  const int d = record_.num_features();
  if (request.features_size() != d) {
    return absl::InvalidArgumentError(absl::StrCat("features: problem ", id(), " expects ", d,
                                                   " features, got ",
                                                   request.features_size()));
  }
  for (int f = 0; f < d; ++f) {
    if (!std::isfinite(request.features(f))) {
      return absl::InvalidArgumentError(
          absl::StrCat("features[", f, "] is ", request.features(f), "; features must be finite"));
    }
  }
  if (request.event_id().size() > kMaxEventIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("event_id has ", request.event_id().size(),
                                                   " bytes; at most ", kMaxEventIdBytes));
  }
  const bool caller_id = !request.event_id().empty();
  std::string event_id = caller_id ? request.event_id() : RandomEventId();
  const absl::Span<const double> x(request.features().data(), d);
  std::shared_ptr<const Expert> model;
  int expert = -1;
  double u;
  auto select = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    expert = ducb_.SelectExpert(gen_);
    if (expert < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("problem ", id(), " has no selectable expert"));
    }
    model = experts_[expert].model;
    u = absl::Uniform<double>(gen_, 0.0, 1.0);
    reservoir_.Offer(x, gen_);
    return absl::OkStatus();
  };
  bool maybe_stored = false;
  {
    absl::MutexLock lock(&mu_);
    if (caller_id) {
      if (AnswerPendingLocked(event_id, response)) return std::nullopt;
      maybe_stored = event_ids_.MayContain(event_id);
    }
    // A new event id (the common case): choose in the same critical section.
    if (!maybe_stored) DECISION_RETURN_IF_ERROR(select());
  }
  if (maybe_stored) {
    absl::StatusOr<EventRecord> stored = env_.store->GetEvent(index_, event_id);
    if (stored.ok()) {
      FillResponse(event_id, *stored, response);
      return std::nullopt;
    }
    if (!absl::IsNotFound(stored.status())) return stored.status();
    absl::MutexLock lock(&mu_);
    DECISION_RETURN_IF_ERROR(select());
  }
  std::vector<double> probs(record_.num_arms());
  if (absl::Status s = model->Predict(x, absl::MakeSpan(probs)); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert ", expert, " cannot score this context: ", s.message()));
  }
  WriteOp op;
  op.kind = WriteOp::kDecision;
  op.choose_response = response;
  EventRecord& event = op.event;
  event.set_arm(SampleArm(probs, u));
  event.set_expert_id(expert);
  event.set_propensity(probs[event.arm()]);
  *event.mutable_features() = request.features();
  const int64_t now = env_.clock->NowMs();
  event.set_decided_at_ms(now);
  event.set_deadline_ms(now + record_.reward_wait_ms());
  event.set_state(kEventPending);
  event.set_sequence(-1);
  {
    absl::MutexLock lock(&mu_);
    // A concurrent Choose with the same event id may have won the race.
    if (caller_id && AnswerPendingLocked(event_id, response)) return std::nullopt;
    // Visible at once (a concurrent retry returns this decision), joinable once durable;
    // a deferred decision is both in this critical section.
    pending_[event_id] = Pending{event, /*joining=*/false, /*durable=*/false};
    event_ids_.Insert(event_id);
    op.event_id = std::move(event_id);
    if (env_.defer_decisions) {
      ApplyDecisionLocked(op, absl::OkStatus());  // answered and joinable from now on
      pending_[op.event_id].written = false;
      if (unwritten_.empty()) unwritten_since_ms_ = op.event.decided_at_ms();
      unwritten_.push_back(op.event_id);
      *flush = unwritten_.size() >= kMaxUnwrittenDecisions ||
               op.event.decided_at_ms() - unwritten_since_ms_ >= env_.decision_flush_ms;
      metrics_.pending->Set(static_cast<double>(pending_.size()));
      return std::nullopt;
    }
  }
  return op;
}

void Problem::Submit(WriteOp op) {
  {
    absl::MutexLock lock(&commit_mu_);
    commit_queue_.push_back(std::move(op));
  }
  CommitQueued();
}

void Problem::FlushDecisions(bool wait) {
  if (wait) {
    absl::MutexLock lock(&commit_mu_);
    commit_mu_.Await(absl::Condition(
        +[](bool* committing) { return !*committing; }, &committing_));
  }
  {
    absl::MutexLock lock(&mu_);
    if (unwritten_.empty()) return;
    // Queued under mu_: a join that finds its decision taken here is queued after it.
    absl::MutexLock queue(&commit_mu_);
    for (std::string& event_id : unwritten_) {
      auto it = pending_.find(event_id);
      if (it == pending_.end() || it->second.written) continue;  // joined, or taken
      it->second.written = true;
      WriteOp op;
      op.kind = WriteOp::kDeferredDecision;
      op.event_id = std::move(event_id);
      op.event = it->second.record;
      commit_queue_.push_back(std::move(op));
    }
    unwritten_.clear();
  }
  CommitQueued();
}

bool Problem::StartJoinLocked(Pending& pending) {
  pending.joining = true;
  const bool stored = pending.written;
  pending.written = true;  // by the join from now on: no flush takes it
  return stored;
}

void Problem::AbortJoinLocked(const std::string& event_id, bool decision_stored) {
  auto it = pending_.find(event_id);
  if (it == pending_.end()) return;
  it->second.joining = false;
  if (!decision_stored) ReturnUnwrittenLocked(it);
}

void Problem::ReturnUnwrittenLocked(PendingMap::iterator it) {
  it->second.written = false;
  if (unwritten_.empty()) unwritten_since_ms_ = env_.clock->NowMs();
  unwritten_.push_back(it->first);
}

void Problem::CommitQueued() {
  {
    absl::MutexLock lock(&commit_mu_);
    // The committing thread takes the queue with its next group.
    if (committing_ || commit_queue_.empty()) return;
    committing_ = true;
  }
  // This thread commits until the queue is empty: every op queued meanwhile rides along in
  // the next group, so concurrent decisions and joins share one log write.
  std::vector<WriteOp> group;
  while (true) {
    group.clear();
    {
      absl::MutexLock lock(&commit_mu_);
      if (commit_queue_.empty()) {
        committing_ = false;
        return;
      }
      group.swap(commit_queue_);
    }
    CommitGroup(group);
  }
}

void Problem::CommitGroup(std::vector<WriteOp>& group) {
  // Only the committing thread appends to the log, so the joins of this group take the
  // positions from `first` on in queue order, in the store and in memory alike. A group that
  // fails to write changes nothing: the positions are reused by the next group.
  int64_t first;
  {
    absl::MutexLock lock(&mu_);
    first = ducb_.log().size();
  }
  storage::Store::WriteGroup batch;
  absl::Status written = absl::OkStatus();
  int64_t seq = first;
  const int64_t now = env_.clock->NowMs();
  for (WriteOp& op : group) {
    if (op.kind == WriteOp::kDecision || op.kind == WriteOp::kDeferredDecision) {
      written = env_.store->AddDecision(&batch, index_, op.event_id, op.event);
    } else if (op.kind == WriteOp::kDrop) {
      written = env_.store->AddExpiry(&batch, index_, op.event_id, op.event, op.decision_stored);
    } else {
      SampleRecord sample;
      sample.set_event_id(op.event_id);
      *sample.mutable_features() = op.event.features();
      sample.set_arm(op.event.arm());
      sample.set_expert_id(op.event.expert_id());
      sample.set_propensity(op.event.propensity());
      sample.set_reward(op.reward);
      sample.set_default_reward(op.is_default);
      sample.set_decided_at_ms(op.event.decided_at_ms());
      sample.set_joined_at_ms(now);
      EventRecord joined = op.event;
      joined.set_state(op.is_default ? kEventExpired : kEventJoined);
      joined.set_reward(op.reward);
      joined.set_sequence(seq++);
      // The features now live in the sample; the event keeps what idempotent Choose and
      // duplicate detection need.
      joined.clear_features();
      // A deferred decision never written is written here, as its joined event.
      written = env_.store->AddJoin(&batch, index_, op.event_id, joined, joined.sequence(),
                                    sample, op.decision_stored);
    }
    if (!written.ok()) break;
  }
  if (written.ok()) written = Timed([&] { return env_.store->Commit(&batch); });
  {
    absl::MutexLock lock(&mu_);
    for (WriteOp& op : group) {
      if (op.kind == WriteOp::kDrop) {
        ApplyDropLocked(op, written);
      } else if (op.kind != WriteOp::kJoin) {
        ApplyDecisionLocked(op, written);
      } else {
        ApplyJoinLocked(op, written);
      }
    }
    metrics_.pending->Set(static_cast<double>(pending_.size()));
    metrics_.samples->Set(static_cast<double>(ducb_.log().size()));
  }
  for (WriteOp& op : group) {
    if (op.done) op.done(written);
  }
}

void Problem::ApplyDecisionLocked(WriteOp& op, const absl::Status& written) {
  if (op.kind == WriteOp::kDeferredDecision) {
    if (written.ok()) return;  // applied when it was answered
    // Answered already: it stays pending in memory, and the next flush (or its join)
    // writes it. Until then a crash would forget it.
    std::fprintf(stderr, "decisiond: problem %s: decision %s not written: %s\n", id().c_str(),
                 op.event_id.c_str(), written.ToString().c_str());
    auto it = pending_.find(op.event_id);
    if (it != pending_.end() && !it->second.joining) ReturnUnwrittenLocked(it);
    return;
  }
  if (!written.ok()) {
    pending_.erase(op.event_id);
    return;
  }
  pending_[op.event_id].durable = true;
  deadlines_.insert({op.event.deadline_ms(), op.event_id});
  FillResponse(op.event_id, op.event, op.choose_response);
  ++decisions_;
  metrics_.decisions->Increment();
  experts_[op.event.expert_id()].metrics.selected->Increment();
}

void Problem::ApplyDropLocked(WriteOp& op, const absl::Status& written) {
  if (!written.ok()) {
    AbortJoinLocked(op.event_id, op.decision_stored);
    return;
  }
  deadlines_.erase({op.event.deadline_ms(), op.event_id});
  pending_.erase(op.event_id);
  metrics_.expired_dropped->Increment();
}

Problem::Snapshot Problem::SnapshotLocked() const {
  Snapshot s;
  s.models.reserve(experts_.size());
  for (const ExpertSlot& slot : experts_) s.models.push_back(slot.model);
  return s;
}

absl::StatusOr<std::vector<double>> Problem::Propensities(const Snapshot& snapshot,
                                                          const EventRecord& event) const {
  std::vector<double> out(snapshot.models.size());
  std::vector<double> probs(record_.num_arms());
  const absl::Span<const double> x(event.features().data(), event.features_size());
  for (size_t k = 0; k < snapshot.models.size(); ++k) {
    DECISION_RETURN_IF_ERROR(snapshot.models[k]->Predict(x, absl::MakeSpan(probs)));
    out[k] = probs[event.arm()];
  }
  return out;
}

absl::Status Problem::Reward(const v1::RewardRequest& request, v1::RewardResponse* response) {
  return AwaitDone([&](Done done) { Reward(request, response, std::move(done)); });
}

void Problem::Reward(const v1::RewardRequest& request, v1::RewardResponse* response,
                     Done done) {
  absl::StatusOr<std::optional<WriteOp>> op = PrepareReward(request, response);
  if (!op.ok()) return done(op.status());
  if (!op->has_value()) return done(absl::OkStatus());  // a duplicate, answered
  response->set_first(true);
  (*op)->done = std::move(done);
  Submit(*std::move(*op));
}

absl::StatusOr<std::optional<Problem::WriteOp>> Problem::PrepareReward(
    const v1::RewardRequest& request, v1::RewardResponse* response) {
  const double value = request.value();
  if (!(value >= 0.0 && value <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("value is ", value, "; a reward must be in [0, 1]"));
  }
  const std::string& event_id = request.event_id();
  if (event_id.empty() || event_id.size() > kMaxEventIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("event_id must have 1 to ", kMaxEventIdBytes, " bytes, got ",
                     event_id.size()));
  }
  Snapshot snapshot;
  EventRecord event;
  bool expired_unprocessed = false;
  bool decision_stored = true;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(event_id);
    if (it != pending_.end()) {
      if (!it->second.durable) {
        return absl::UnavailableError(absl::StrCat(
            "the decision of event ", event_id, " is still being stored; retry the reward"));
      }
      if (it->second.joining) {
        response->set_first(false);
        metrics_.rewards_duplicate->Increment();
        return std::nullopt;
      }
      if (env_.clock->NowMs() > it->second.record.deadline_ms()) {
        expired_unprocessed = true;
      } else {
        decision_stored = StartJoinLocked(it->second);
        event = it->second.record;
        snapshot = SnapshotLocked();
      }
    }
  }
  if (expired_unprocessed) {
    // The wait time has passed but the expiry has not run yet: expire it now, then the
    // reward is late like any other.
    DECISION_RETURN_IF_ERROR(ExpireOne(event_id));
  }
  if (snapshot.models.empty()) {
    // Not pending: joined, expired or unknown.
    absl::StatusOr<EventRecord> stored = env_.store->GetEvent(index_, event_id);
    if (absl::IsNotFound(stored.status())) {
      return absl::NotFoundError(
          absl::StrCat("event ", event_id, " is unknown to problem ", id()));
    }
    if (!stored.ok()) return stored.status();
    if (stored->state() == kEventJoined || stored->state() == kEventPending) {
      response->set_first(false);
      metrics_.rewards_duplicate->Increment();
      return std::nullopt;
    }
    // Expired: count the first late reward, learn nothing.
    if (!stored->late_reward()) {
      stored->set_late_reward(true);
      absl::MutexLock lock(&mu_);
      DECISION_RETURN_IF_ERROR(
          Timed([&] { return env_.store->PutEvent(index_, event_id, *stored); }));
      metrics_.rewards_late->Increment();
    } else {
      metrics_.rewards_duplicate->Increment();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "event ", event_id, " expired at ", stored->deadline_ms(),
        " ms (reward wait time ", record_.reward_wait_ms(),
        " ms); the reward is counted as late and not learned"));
  }
  absl::StatusOr<std::vector<double>> propensities = Propensities(snapshot, event);
  if (!propensities.ok()) {
    absl::MutexLock lock(&mu_);
    AbortJoinLocked(event_id, decision_stored);
    return absl::InternalError(absl::StrCat("scoring the experts failed: ",
                                            propensities.status().message()));
  }
  WriteOp op;
  op.event_id = event_id;
  op.event = std::move(event);
  op.reward = value;
  op.is_default = false;
  op.decision_stored = decision_stored;
  op.propensities = *std::move(propensities);
  return op;
}

void Problem::ApplyJoinLocked(WriteOp& op, const absl::Status& written) {
  if (!written.ok()) {
    AbortJoinLocked(op.event_id, op.decision_stored);
    return;
  }
  const int64_t seq = ducb_.log().size();
  const EventRecord& event = op.event;
  std::vector<double>& propensities = op.propensities;
  // Experts registered since the propensities were computed.
  std::vector<double> probs(record_.num_arms());
  const absl::Span<const double> x(event.features().data(), event.features_size());
  for (size_t k = propensities.size(); k < experts_.size(); ++k) {
    absl::Status scored = experts_[k].model->Predict(x, absl::MakeSpan(probs));
    propensities.push_back(scored.ok() ? probs[event.arm()] : 1.0 / record_.num_arms());
  }
  const int n_est = ducb_.num_experts();
  absl::Status learned = ducb_.Learn(
      event.expert_id(), op.reward, absl::MakeConstSpan(propensities).subspan(0, n_est));
  if (!learned.ok()) {
    // The sample is stored; a restart will learn it. Should not happen: experts are
    // validated and smoothed.
    std::fprintf(stderr, "decisiond: problem %s: sample %lld not learned: %s\n", id().c_str(),
                 static_cast<long long>(seq), learned.ToString().c_str());
  }
  for (size_t k = n_est; k < experts_.size(); ++k) experts_[k].tail.push_back(propensities[k]);
  if (ducb_.log().size() % kLogChunk == 0) {
    // Written by WriteLogChunks, outside the lock (a chunk is about 1 MB).
    const int64_t chunk = ducb_.log().size() / kLogChunk - 1;
    unwritten_chunks_.push_back(PendingChunkLocked(chunk));
  }
  deadlines_.erase({event.deadline_ms(), op.event_id});
  pending_.erase(op.event_id);
  if (op.is_default) {
    metrics_.expired_default->Increment();
  } else {
    metrics_.rewards_learned->Increment();
    metrics_.reward_sum->Increment(op.reward);
  }
}

Problem::PendingChunk Problem::PendingChunkLocked(int64_t chunk) const {
  const int n_est = ducb_.num_experts();
  PendingChunk p;
  p.chunk = chunk;
  p.rows = ducb_.log().Chunk(chunk);
  p.width = static_cast<int>(experts_.size());
  const int others = p.width - n_est;
  if (others == 0) return p;
  p.others.resize(kLogChunk * others);
  for (int64_t i = 0; i < kLogChunk; ++i) {
    const int64_t s = chunk * kLogChunk + i;
    for (int k = n_est; k < p.width; ++k) {
      const int64_t from = experts_[k].record.backfill_total();
      p.others[i * others + (k - n_est)] = s >= from ? experts_[k].tail[s - from] : NAN;
    }
  }
  return p;
}

storage::v1::LogChunk Problem::BuildLogChunk(const PendingChunk& pending) {
  const int n_est = pending.rows.num_experts;
  const int width = pending.width;
  storage::v1::LogChunk c;
  c.set_num_experts(width);
  c.mutable_chooser()->Add(pending.rows.chooser.get(), pending.rows.chooser.get() + kLogChunk);
  c.mutable_reward()->Add(pending.rows.reward.get(), pending.rows.reward.get() + kLogChunk);
  c.mutable_propensities()->Resize(kLogChunk * width, 0.0);
  double* out = c.mutable_propensities()->mutable_data();
  for (int64_t i = 0; i < kLogChunk; ++i, out += width) {
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

absl::Status Problem::ExpireOne(const std::string& event_id) {
  EventRecord event;
  Snapshot snapshot;
  bool decision_stored;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(event_id);
    // Already joined, being joined by a reward or another expiry, or not yet stored.
    if (it == pending_.end() || it->second.joining || !it->second.durable) {
      return absl::OkStatus();
    }
    decision_stored = StartJoinLocked(it->second);
    event = it->second.record;
    if (!record_.drop_unrewarded()) snapshot = SnapshotLocked();
  }
  WriteOp op;
  op.event_id = event_id;
  op.decision_stored = decision_stored;
  if (record_.drop_unrewarded()) {
    op.kind = WriteOp::kDrop;
    event.set_state(kEventExpired);
  } else {
    absl::StatusOr<std::vector<double>> propensities = Propensities(snapshot, event);
    if (!propensities.ok()) {
      absl::MutexLock lock(&mu_);
      AbortJoinLocked(event_id, decision_stored);
      return propensities.status();
    }
    op.reward = record_.default_reward();
    op.is_default = true;
    op.propensities = *std::move(propensities);
  }
  op.event = std::move(event);
  return AwaitDone([&](Done done) {
    op.done = std::move(done);
    Submit(std::move(op));
  });
}

absl::Status Problem::ExpireDue() {
  const int64_t now = env_.clock->NowMs();
  std::vector<std::string> due;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first < now; ++it) {
      auto p = pending_.find(it->second);
      if (p != pending_.end() && !p->second.joining) due.push_back(it->second);
    }
  }
  for (const std::string& event_id : due) DECISION_RETURN_IF_ERROR(ExpireOne(event_id));
  return absl::OkStatus();
}

absl::StatusOr<v1::Expert> Problem::RegisterExpert(const std::string& name,
                                                   ExpertModelRecord model, double smoothing) {
  DECISION_ASSIGN_OR_RETURN(
      std::unique_ptr<Expert> built,
      BuildExpert(model, record_.num_arms(), record_.num_features(), smoothing));
  absl::MutexLock lock(&mu_);
  if (experts_.size() >= static_cast<size_t>(kMaxExpertsPerProblem)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "problem ", id(), " has ", experts_.size(), " experts, the maximum"));
  }
  const int expert_id = static_cast<int>(experts_.size());
  ExpertSlot slot;
  slot.record.set_name(name);
  *slot.record.mutable_model() = std::move(model);
  slot.record.set_smoothing(smoothing);
  slot.record.set_status(kStateStatusBackfilling);
  slot.record.set_backfill_total(ducb_.log().size());
  slot.record.set_registered_at_ms(env_.clock->NowMs());
  DECISION_RETURN_IF_ERROR(Timed([&] {
    return env_.store->PutExpert(index_, static_cast<uint32_t>(expert_id), slot.record);
  }));
  slot.model = std::move(built);
  slot.metrics = env_.metrics->ForExpert(id(), expert_id);
  slot.metrics.backfill_progress->Set(0.0);
  experts_.push_back(std::move(slot));
  return ExpertProtoLocked(expert_id);
}

absl::StatusOr<v1::Expert> Problem::RetireExpert(int expert_id) {
  absl::MutexLock lock(&mu_);
  if (expert_id < 0 || expert_id >= static_cast<int>(experts_.size())) {
    return absl::NotFoundError(
        absl::StrCat("expert ", expert_id, " is unknown to problem ", id()));
  }
  ExpertSlot& slot = experts_[expert_id];
  if (slot.record.status() == kStateStatusRetired) return ExpertProtoLocked(expert_id);
  if (slot.record.status() == kStateStatusActive) {
    int selectable = 0;
    for (int k = 0; k < ducb_.num_experts(); ++k) selectable += ducb_.selectable(k);
    if (selectable <= 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "expert ", expert_id, " is the last selectable expert of problem ", id()));
    }
  }
  storage::v1::ExpertRecord updated = slot.record;
  updated.set_status(kStateStatusRetired);
  DECISION_RETURN_IF_ERROR(Timed([&] {
    return env_.store->PutExpert(index_, static_cast<uint32_t>(expert_id), updated);
  }));
  slot.record = std::move(updated);
  if (expert_id < ducb_.num_experts()) ducb_.SetSelectable(expert_id, false);
  return ExpertProtoLocked(expert_id);
}

v1::Expert Problem::ExpertProtoLocked(int expert_id) const {
  const ExpertSlot& slot = experts_[expert_id];
  v1::Expert e;
  e.set_problem_id(id());
  e.set_expert_id(expert_id);
  e.set_name(slot.record.name());
  e.set_kind(slot.model->kind());
  e.set_status(StatusOf(slot.record.status()));
  e.set_smoothing(slot.model->smoothing());
  e.set_backfill_total(slot.record.backfill_total());
  e.set_backfilled(expert_id < ducb_.num_experts()
                       ? slot.record.backfill_total()
                       : static_cast<int64_t>(slot.backfill.size()));
  return e;
}

std::vector<v1::Expert> Problem::ListExperts() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Expert> out;
  for (size_t k = 0; k < experts_.size(); ++k) out.push_back(ExpertProtoLocked(k));
  return out;
}

absl::Status Problem::StepBackfill(bool* worked) {
  *worked = false;
  int expert_id;
  std::shared_ptr<const Expert> model;
  int64_t from, total;
  {
    absl::MutexLock lock(&mu_);
    expert_id = ducb_.num_experts();
    if (expert_id >= static_cast<int>(experts_.size())) return absl::OkStatus();
    const ExpertSlot& slot = experts_[expert_id];
    if (slot.record.status() == kStateStatusBackfilling ||
        slot.record.status() == kStateStatusRetired) {
      model = slot.model;
      from = static_cast<int64_t>(slot.backfill.size());
      total = slot.record.backfill_total();
    } else {
      return absl::OkStatus();
    }
  }
  *worked = true;
  if (from < total) {
    // One chunk of probabilities from the stored samples.
    const int64_t count = std::min<int64_t>(kBackfillChunk, total - from);
    std::vector<double> rows;
    std::vector<int> arms;
    DECISION_RETURN_IF_ERROR(env_.store->ForEachSample(
        index_, from, count, [&](int64_t, const SampleRecord& s) {
          rows.insert(rows.end(), s.features().begin(), s.features().end());
          arms.push_back(s.arm());
          return absl::OkStatus();
        }));
    if (static_cast<int64_t>(arms.size()) != count) {
      return absl::DataLossError(absl::StrCat("problem ", id(), ": backfill found ",
                                              arms.size(), " samples, expected ", count));
    }
    const int k = record_.num_arms();
    std::vector<double> probs(static_cast<size_t>(count) * k);
    DECISION_RETURN_IF_ERROR(model->PredictBatch(rows, count, absl::MakeSpan(probs)));
    storage::v1::BackfillChunk chunk;
    for (int64_t i = 0; i < count; ++i) chunk.add_values(probs[i * k + arms[i]]);
    DECISION_RETURN_IF_ERROR(Timed([&] {
      return env_.store->PutBackfillChunk(index_, expert_id, from / kBackfillChunk, chunk);
    }));
    absl::MutexLock lock(&mu_);
    ExpertSlot& slot = experts_[expert_id];
    slot.backfill.insert(slot.backfill.end(), chunk.values().begin(), chunk.values().end());
    slot.metrics.backfill_progress->Set(static_cast<double>(slot.backfill.size()) / total);
    if (static_cast<int64_t>(slot.backfill.size()) < total) return absl::OkStatus();
  }
  // Complete: divergences of the new expert against the estimated ones (outside the lock),
  // then add it to D-UCB with its whole column.
  std::vector<std::shared_ptr<const Expert>> models;
  std::vector<double> contexts;
  DivergenceMatrix previous;
  {
    absl::MutexLock lock(&mu_);
    for (int k = 0; k <= expert_id; ++k) models.push_back(experts_[k].model);
    contexts.assign(reservoir_.contexts().begin(), reservoir_.contexts().end());
    previous = ducb_.estimator().divergences();
  }
  DECISION_ASSIGN_OR_RETURN(DivergenceMatrix d,
                            ComputeDivergencesFor(models, contexts, previous, expert_id));
  absl::MutexLock lock(&mu_);
  ExpertSlot& slot = experts_[expert_id];
  std::vector<double> column = slot.backfill;
  column.insert(column.end(), slot.tail.begin(), slot.tail.end());
  if (static_cast<int64_t>(column.size()) != ducb_.log().size()) {
    return absl::InternalError(absl::StrCat("problem ", id(), ": expert ", expert_id,
                                            " backfill covers ", column.size(),
                                            " samples, the log has ", ducb_.log().size()));
  }
  const bool retired = slot.record.status() == kStateStatusRetired;
  DECISION_RETURN_IF_ERROR(ducb_.AddExperts({column}, d));
  ducb_.SetSelectable(expert_id, !retired);
  slot.backfill = {};
  slot.tail = {};
  slot.metrics.backfill_progress->Set(1.0);
  // The checkpoint (which experts are estimated) first, then the expert's status.
  DECISION_RETURN_IF_ERROR(Timed([&] { return env_.store->PutCheckpoint(index_, CheckpointLocked()); }));
  if (!retired) {
    slot.record.set_status(kStateStatusActive);
    DECISION_RETURN_IF_ERROR(Timed([&] {
      return env_.store->PutExpert(index_, static_cast<uint32_t>(expert_id), slot.record);
    }));
  }
  return absl::OkStatus();
}

absl::StatusOr<DivergenceMatrix> Problem::ComputeDivergencesFor(
    const std::vector<std::shared_ptr<const Expert>>& models, const std::vector<double>& contexts,
    const DivergenceMatrix& previous, int keep) const {
  const int n = static_cast<int>(models.size());
  const int d = record_.num_features();
  const size_t rows = d == 0 ? (contexts.empty() ? 0 : 1) : contexts.size() / d;
  if (rows == 0) {
    // No context seen yet: new experts get identity rows until the first refresh.
    DivergenceMatrix out = DivergenceMatrix::Identity(n);
    for (int i = 0; i < keep; ++i) {
      for (int j = 0; j < keep; ++j) {
        out.m[i * n + j] = previous.M(i, j);
        out.sigma[i * n + j] = previous.Sigma(i, j);
      }
    }
    return out;
  }
  const int k = record_.num_arms();
  std::vector<std::vector<double>> predictions(n);
  for (int e = 0; e < n; ++e) {
    predictions[e].resize(rows * k);
    DECISION_RETURN_IF_ERROR(
        models[e]->PredictBatch(contexts, rows, absl::MakeSpan(predictions[e])));
  }
  DivergenceMatrix out;
  DECISION_RETURN_IF_ERROR(ComputeDivergences(predictions, k, record_.divergence_groups(),
                                              &previous, keep, &out));
  return out;
}

absl::StatusOr<TrainingSet> Problem::TrainingSetFromLog() {
  TrainingSet set;
  set.num_features = record_.num_features();
  DECISION_RETURN_IF_ERROR(env_.store->ForEachSample(
      index_, 0, 0, [&](int64_t, const SampleRecord& s) {
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

absl::Status Problem::RetireDominated(int max_active) {
  absl::MutexLock lock(&mu_);
  if (ducb_.log().size() == 0) return absl::OkStatus();
  std::vector<std::pair<double, int>> active;  // (ucb, expert)
  double best_lower = -std::numeric_limits<double>::infinity();
  for (int k = 0; k < ducb_.num_experts(); ++k) {
    if (!ducb_.selectable(k)) continue;
    const ExpertEstimate e = ducb_.Estimate(k);
    active.push_back({e.mean + e.width, k});
    best_lower = std::max(best_lower, e.mean - e.width);
  }
  std::sort(active.begin(), active.end());
  size_t keep_from = 0;
  while (keep_from + 1 < active.size() &&
         (active[keep_from].first < best_lower ||
          active.size() - keep_from > static_cast<size_t>(std::max(1, max_active)))) {
    ++keep_from;
  }
  for (size_t i = 0; i < keep_from; ++i) {
    const int k = active[i].second;
    storage::v1::ExpertRecord updated = experts_[k].record;
    updated.set_status(kStateStatusRetired);
    DECISION_RETURN_IF_ERROR(Timed([&] {
      return env_.store->PutExpert(index_, static_cast<uint32_t>(k), updated);
    }));
    experts_[k].record = std::move(updated);
    ducb_.SetSelectable(k, false);
  }
  return absl::OkStatus();
}

absl::Status Problem::MaybeRefreshDivergences(bool* refreshed, int64_t min_interval_ms) {
  if (refreshed != nullptr) *refreshed = false;
  std::vector<std::shared_ptr<const Expert>> models;
  std::vector<double> contexts;
  DivergenceMatrix previous;
  SampleLog prefix;  // a read-only view of the log, taken once the divergences are known
  {
    absl::MutexLock lock(&mu_);
    if (ducb_.log().size() < next_refresh_at_ || reservoir_.size() == 0) return absl::OkStatus();
    if (min_interval_ms > 0 && env_.clock->NowMs() - last_refresh_ms_ < min_interval_ms) {
      return absl::OkStatus();
    }
    for (int k = 0; k < ducb_.num_experts(); ++k) models.push_back(experts_[k].model);
    contexts.assign(reservoir_.contexts().begin(), reservoir_.contexts().end());
    previous = ducb_.estimator().divergences();
  }
  // The O(N^2 R K) divergences and the O(N t) rebuild of the estimator both run without the
  // lock: Choose and Reward go on meanwhile. The lock is held only to catch the rebuilt
  // estimator up with the samples joined during the rebuild.
  DECISION_ASSIGN_OR_RETURN(DivergenceMatrix d,
                            ComputeDivergencesFor(models, contexts, previous, /*keep=*/0));
  {
    absl::MutexLock lock(&mu_);
    // Experts added meanwhile: the next round computes the divergences again.
    if (ducb_.num_experts() != static_cast<int>(models.size())) return absl::OkStatus();
    prefix = ducb_.log().SharedPrefix();
  }
  DECISION_ASSIGN_OR_RETURN(std::unique_ptr<Estimator> rebuilt,
                            DUcb::RebuildEstimator(EstimatorOptionsOf(record_), prefix, d));
  absl::MutexLock lock(&mu_);
  if (absl::Status s = ducb_.SwapInEstimator(std::move(rebuilt)); !s.ok()) {
    if (absl::IsFailedPrecondition(s)) return absl::OkStatus();  // experts added: as above
    return s;
  }
  next_refresh_at_ = NextRefresh(record_, ducb_.log().size());
  last_refresh_ms_ = env_.clock->NowMs();
  if (refreshed != nullptr) *refreshed = true;
  return Timed([&] { return env_.store->PutCheckpoint(index_, CheckpointLocked()); });
}

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
  absl::MutexLock lock(&mu_);
  return Timed([&] { return env_.store->PutCheckpoint(index_, CheckpointLocked()); });
}

v1::Estimates Problem::GetEstimates() const {
  absl::MutexLock lock(&mu_);
  v1::Estimates out;
  out.set_problem_id(id());
  const int64_t t = ducb_.log().size();
  out.set_samples(t);
  const int n_est = ducb_.num_experts();
  double best = -std::numeric_limits<double>::infinity(), collected = 0.0;
  for (size_t k = 0; k < experts_.size(); ++k) {
    v1::ExpertEstimate* e = out.add_experts();
    e->set_expert_id(static_cast<int>(k));
    e->set_status(StatusOf(experts_[k].record.status()));
    if (static_cast<int>(k) < n_est) {
      const ExpertEstimate est = ducb_.Estimate(k);
      e->set_estimate(est.mean);
      e->set_width(est.width);
      e->set_ucb(est.mean + est.width);
      e->set_times_selected(ducb_.log().count(k));
      e->set_effective_sample_size(ducb_.estimator().EffectiveSampleSize(k));
      best = std::max(best, est.mean);
      collected += ducb_.log().count(k) * est.mean;
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
  p.set_samples(ducb_.log().size());
  p.set_pending(static_cast<int64_t>(pending_.size()));
  p.set_experts(static_cast<int>(experts_.size()));
  return p;
}

absl::Status Problem::ExportLog(int64_t start, int64_t limit,
                                const std::function<absl::Status(const v1::LoggedSample&)>& fn) {
  v1::LoggedSample out;
  return env_.store->ForEachSample(
      index_, start, limit, [&](int64_t seq, const SampleRecord& s) -> absl::Status {
        out.Clear();
        out.set_sequence(seq);
        out.set_event_id(s.event_id());
        *out.mutable_features() = s.features();
        out.set_arm(s.arm());
        out.set_expert_id(s.expert_id());
        out.set_propensity(s.propensity());
        out.set_reward(s.reward());
        out.set_default_reward(s.default_reward());
        out.set_decided_at_ms(s.decided_at_ms());
        out.set_joined_at_ms(s.joined_at_ms());
        {
          absl::MutexLock lock(&mu_);
          if (seq < ducb_.log().size()) {
            const double* row = ducb_.log().propensities(seq);
            out.mutable_expert_propensities()->Add(row, row + ducb_.num_experts());
          }
        }
        return fn(out);
      });
}

void Problem::ExportMetrics() {
  const v1::Estimates estimates = GetEstimates();
  std::vector<Metrics::Pair> pairs;
  std::vector<int> active;
  {
    absl::MutexLock lock(&mu_);
    for (const v1::ExpertEstimate& e : estimates.experts()) {
      const ExpertSlot& slot = experts_[e.expert_id()];
      if (e.expert_id() >= ducb_.num_experts()) continue;
      slot.metrics.estimate->Set(e.estimate());
      slot.metrics.ucb->Set(e.ucb());
      slot.metrics.effective_sample_size->Set(e.effective_sample_size());
      if (slot.record.status() == kStateStatusActive) active.push_back(e.expert_id());
    }
  }
  metrics_.estimated_regret->Set(estimates.estimated_regret());
  const int n = estimates.n();
  for (int i : active) {
    for (int j : active) {
      if (i == j) continue;
      pairs.push_back({i, j, estimates.m(i * n + j), estimates.sigma(i * n + j)});
    }
  }
  env_.metrics->SetPairs(id(), pairs);
}

}  // namespace decision::server
