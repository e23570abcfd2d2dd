// Problem: reads of the stored log: ExportLog (with its DSJSON form), Explain and
// EvaluateModel. Each scans or looks up the store outside mu_ and scores models there; see
// problem.h.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/conversions.h"
#include "server/dsjson.h"
#include "server/problem.h"
#include "server/validation.h"

namespace decision::server {

using storage::v1::EventRecord;

absl::StatusOr<v1::ModelEvaluation> Problem::EvaluateModel(const Expert& model, double clip) {
  const int d = record_.num_features();
  const int k = record_.num_arms();
  // Scored in batches, each with its samples' eligible arms.
  constexpr size_t kBatch = 512;
  std::vector<double> rows, probs, logged, rewards;
  std::vector<int> arms;
  std::vector<std::vector<int32_t>> eligible;
  bool restricted = false;
  OffPolicySums sums(clip);
  const auto score = [&]() -> absl::Status {
    const size_t m = arms.size();
    if (m == 0) return absl::OkStatus();
    probs.resize(m * k);
    std::vector<absl::Span<const int32_t>> spans;
    if (restricted) spans.assign(eligible.begin(), eligible.end());
    if (absl::Status s = model.PredictBatchEligible(rows, m, spans, absl::MakeSpan(probs));
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model cannot score this problem's log: ", s.message()));
    }
    for (size_t i = 0; i < m; ++i) sums.Add(probs[i * k + arms[i]], logged[i], rewards[i]);
    rows.clear();
    arms.clear();
    logged.clear();
    rewards.clear();
    eligible.clear();
    restricted = false;
    return absl::OkStatus();
  };
  DECISION_RETURN_IF_ERROR(env_.store->ForEachSample(
      index_, 0, 0, [&](int64_t seq, const storage::v1::SampleRecord& s) -> absl::Status {
        if (s.redacted()) return absl::OkStatus();  // its context was deleted
        const absl::Span<const int32_t> allowed =
            absl::MakeConstSpan(s.eligible_arms().data(), s.eligible_arms_size());
        if (s.features_size() != d || s.arm() < 0 || s.arm() >= k ||
            !(s.propensity() > 0.0 && s.propensity() <= 1.0) ||
            !StoredEligibleArmsValid(allowed, s.arm(), k)) {
          return absl::DataLossError(
              absl::StrCat("problem ", id(), ": sample ", seq, " is damaged"));
        }
        rows.insert(rows.end(), s.features().begin(), s.features().end());
        arms.push_back(s.arm());
        logged.push_back(s.propensity());
        rewards.push_back(s.reward());
        eligible.emplace_back(allowed.begin(), allowed.end());
        restricted = restricted || !allowed.empty();
        if (arms.size() == kBatch) return score();
        return absl::OkStatus();
      }));
  DECISION_RETURN_IF_ERROR(score());
  return OffPolicyToWire(sums.Estimate());
}

absl::StatusOr<v1::Explanation> Problem::Explain(const std::string& event_id) {
  EventRecord event;
  bool pending = false;
  std::shared_ptr<const Expert> model;
  {
    absl::MutexLock lock(&mu_);
    if (const PendingDecision* d = pending_.Find(event_id)) {
      if (d->state == DecisionState::kDeciding) {
        return absl::NotFoundError(absl::StrCat("event ", event_id, " of problem ", id(),
                                                " is still being decided"));
      }
      event = d->record;
      pending = true;
    }
  }
  if (!pending) {
    absl::StatusOr<EventRecord> stored = env_.store->GetEvent(index_, event_id);
    if (absl::IsNotFound(stored.status())) {
      return absl::NotFoundError(
          absl::StrCat("problem ", id(), " has no event ", event_id,
                       " (never decided, deleted, or older than its retention)"));
    }
    if (!stored.ok()) return stored.status();
    event = *std::move(stored);
  }
  v1::Explanation out;
  out.set_problem_id(id());
  out.set_event_id(event_id);
  out.set_decided_at_ms(event.decided_at_ms());
  out.set_expert_id(event.expert_id());
  out.set_estimate(event.estimate());
  out.set_width(event.width());
  out.set_ucb(event.estimate() + event.width());
  out.set_runner_up_expert_id(event.has_runner_up() ? event.runner_up() : -1);
  out.set_runner_up_ucb(event.runner_up_ucb());
  out.set_arm(event.arm());
  out.set_propensity(event.propensity());
  out.set_draw(event.draw());
  out.set_sequence(event.sequence());
  out.set_awaiting_activation(event.awaiting_activation());
  if (event.has_slate_slot()) out.set_slate_slot(event.slate_slot());
  out.set_unlearned_slot(UnlearnedSlot(event));
  *out.mutable_features() = event.features();
  *out.mutable_eligible_arms() = event.eligible_arms();
  switch (event.state()) {
    case storage::v1::EVENT_STATE_JOINED:
      out.set_outcome(v1::DECISION_OUTCOME_JOINED);
      out.set_reward(event.reward());
      break;
    case storage::v1::EVENT_STATE_EXPIRED:
      out.set_outcome(event.sequence() >= 0 ? v1::DECISION_OUTCOME_DEFAULT_REWARD
                                            : v1::DECISION_OUTCOME_DROPPED);
      if (event.sequence() >= 0) out.set_reward(event.reward());
      break;
    default:
      out.set_outcome(v1::DECISION_OUTCOME_PENDING);
  }
  if (event.sequence() >= 0) {
    // Joined: the context and the eligible arms live in the sample.
    DECISION_ASSIGN_OR_RETURN(storage::v1::SampleRecord sample,
                              env_.store->GetSample(index_, event.sequence()));
    *out.mutable_features() = sample.features();
    *out.mutable_eligible_arms() = sample.eligible_arms();
  }
  const int k = record_.num_arms();
  {
    absl::MutexLock lock(&mu_);
    const int e = event.expert_id();
    if (e >= 0 && e < experts_.size() && experts_.at(e).failure.empty() &&
        !experts_.Unloaded(e)) {
      model = experts_.at(e).model;
    }
  }
  if (model != nullptr && out.features_size() == record_.num_features() &&
      event.arm() >= 0 && event.arm() < k &&
      StoredEligibleArmsValid(
          absl::MakeConstSpan(out.eligible_arms().data(), out.eligible_arms_size()),
          event.arm(), k)) {
    std::vector<double> distribution(k);
    if (model
            ->PredictEligible(absl::MakeConstSpan(out.features().data(), out.features_size()),
                              absl::MakeConstSpan(out.eligible_arms().data(),
                                                  out.eligible_arms_size()),
                              absl::MakeSpan(distribution))
            .ok()) {
      out.mutable_distribution()->Assign(distribution.begin(), distribution.end());
      out.set_reproduced(SampleArm(distribution, event.draw()) == event.arm() &&
                         distribution[event.arm()] == event.propensity());
    }
  }
  return out;
}

absl::Status Problem::ExportLog(int64_t start, int64_t limit, bool dsjson,
                                const std::function<absl::Status(const v1::LoggedSample&)>& fn) {
  int width;
  int64_t learned;
  std::vector<std::shared_ptr<const Expert>> models;  // dsjson: the choosers' models
  {
    absl::MutexLock lock(&mu_);
    width = ducb_.num_experts();
    learned = ducb_.num_samples();
    if (dsjson) models = experts_.Models();
  }
  const int k = record_.num_arms();
  std::vector<double> distribution(k);
  v1::LoggedSample out;
  // The experts' propensities come from the sample's log chunk (in memory or stored), read
  // once per chunk.
  ChunkRows rows;
  int64_t rows_chunk = -1;  // the chunk `rows` was looked up for (it may have none)
  bool have_rows = false;
  return env_.store->ForEachSample(
      index_, start, limit,
      [&](int64_t seq, const storage::v1::SampleRecord& s) -> absl::Status {
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
        out.set_redacted(s.redacted());
        *out.mutable_eligible_arms() = s.eligible_arms();
        if (seq < learned) {
          const int64_t chunk = seq / storage::kLogChunkSamples;
          if (chunk != rows_chunk) {
            rows_chunk = chunk;
            absl::StatusOr<ChunkRows> read = ReadChunkRows(chunk, width);
            if (!read.ok() && !absl::IsNotFound(read.status())) return read.status();
            have_rows = read.ok();
            if (have_rows) rows = *std::move(read);
          }
          if (have_rows && seq - rows.first() < rows.size()) {
            const double* row = rows.row(seq);
            int n = 0;
            while (n < std::min(width, rows.width) && !std::isnan(row[n])) ++n;
            out.mutable_expert_propensities()->Add(row, row + n);
          }
        }
        if (dsjson) {
          // The chooser's distribution, re-scored: kept only if it gives the logged
          // propensity (its model may be a failed or unloaded expert's stand-in now).
          bool known = !s.redacted() && s.expert_id() >= 0 &&
                       s.expert_id() < static_cast<int>(models.size()) &&
                       s.arm() >= 0 && s.arm() < k;
          if (known) {
            known = models[s.expert_id()]
                        ->PredictEligible(
                            absl::MakeConstSpan(s.features().data(), s.features_size()),
                            absl::MakeConstSpan(s.eligible_arms().data(),
                                                s.eligible_arms_size()),
                            absl::MakeSpan(distribution))
                        .ok() &&
                    std::abs(distribution[s.arm()] - s.propensity()) <= 1e-12;
          }
          out.set_dsjson(ToDsjson(out, known ? absl::MakeConstSpan(distribution)
                                             : absl::Span<const double>()));
        }
        return fn(out);
      });
}

}  // namespace decision::server
