// Problem: the expert pool's changes. Registration, retirement and quarantine (the backfill
// of a new expert is problem_backfill.cc, the divergences problem_divergences.cc); expert
// records are written under expert_writes_mu_ only.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/conversions.h"
#include "server/problem.h"
#include "server/scoring_cost.h"
#include "server/validation.h"

namespace decision::server {
namespace {
// How many of the problem's recent contexts a new expert is scored on at registration.
constexpr int kRegistrationScoredContexts = 512;
}  // namespace

using storage::v1::ExpertRecord;

int Problem::SelectableLocked() const {
  int selectable = 0;
  for (int k = 0; k < ducb_.num_experts(); ++k) selectable += ducb_.selectable(k);
  return selectable;
}

std::vector<std::pair<double, int>> Problem::SelectableByUcbLocked(double* best_lower,
                                                                   double width_scale) const {
  std::vector<std::pair<double, int>> selectable;  // (ucb, expert)
  if (best_lower != nullptr) *best_lower = -std::numeric_limits<double>::infinity();
  for (int k = 0; k < ducb_.num_experts(); ++k) {
    if (!ducb_.selectable(k)) continue;
    const ExpertEstimate e = ducb_.Estimate(k);
    const double width = e.width * width_scale;
    selectable.push_back({e.mean + width, k});
    if (best_lower != nullptr) *best_lower = std::max(*best_lower, e.mean - width);
  }
  std::sort(selectable.begin(), selectable.end());
  return selectable;
}

double Problem::ScoringCostUs(const std::string& name, const Expert& model,
                              absl::Span<const double> contexts) const {
  const double measured = MeasureScoringCostUs(model, contexts);
  if (env_.hooks != nullptr && env_.hooks->score_cost_us) {
    return env_.hooks->score_cost_us(name, measured);
  }
  return measured;
}

void Problem::ExportScoringCostLocked() {
  metrics_.scoring_cost->Set(experts_.ScoringCostUs() * 1e-6);
}

bool Problem::QuarantineLocked(int expert_id, absl::string_view reason) {
  ExpertSlot& slot = experts_.at(expert_id);
  if (!slot.failure.empty()) return false;
  slot.failure = absl::StrCat("quarantined: ", reason);
  slot.failure_unwritten = true;
  slot.model = stand_in_;
  ++estimates_generation_;
  MarkPoolWork();  // its FAILED record
  slot.metrics.failed->Set(1.0);
  if (expert_id < ducb_.num_experts()) ducb_.SetSelectable(expert_id, false);
  ExportScoringCostLocked();
  // Once per expert: a quarantine is not repeated, so this cannot flood the log.
  std::fprintf(stderr, "decisiond: problem %s: expert %d FAILED and is quarantined: %s\n",
               id().c_str(), expert_id, std::string(reason).c_str());
  return true;
}

void Problem::QuarantineFailures(const std::vector<ScoringFailure>& failures) {
  if (failures.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const ScoringFailure& f : failures) QuarantineLocked(f.expert, f.reason);
}

absl::Status Problem::PersistFailures() {
  absl::MutexLock writes(&expert_writes_mu_);
  std::vector<std::pair<int, ExpertRecord>> unwritten;
  {
    absl::MutexLock lock(&mu_);
    for (int k = 0; k < experts_.durable_size(); ++k) {
      const ExpertSlot& slot = experts_.at(k);
      if (!slot.failure_unwritten) continue;
      ExpertRecord failed = slot.record;
      failed.set_failure(slot.failure);
      failed.set_failed_at_ms(env_.clock->NowMs());
      unwritten.emplace_back(k, std::move(failed));
    }
  }
  for (const auto& [k, failed] : unwritten) {
    DECISION_RETURN_IF_ERROR(WriteExpertRecord(k, failed));
    absl::MutexLock lock(&mu_);
    experts_.at(k).failure_unwritten = false;
  }
  return absl::OkStatus();
}

bool Problem::FoldRetiredLocked() {
  bool folded = false;
  for (int k = 0; k < ducb_.num_experts(); ++k) {
    if (!experts_.Frozen(k) || ducb_.estimator().Retired(k)) continue;
    // UNIMPLEMENTED (the clipped estimator keeps every row): it stays as it was.
    if (!ducb_.Retire(k).ok()) return folded;
    folded = true;
  }
  if (folded) ++estimator_generation_;
  return folded;
}

int64_t Problem::DivergenceTermsBound(const storage::v1::ProblemRecord& record, int live,
                                      int loaded) {
  const int64_t pairs = std::max(int64_t{live} * (live - 1), 2 * int64_t{loaded - 1});
  return std::max<int64_t>(pairs, 0) * record.num_arms() * record.divergence_reservoir();
}

int Problem::RetiredInEstimatorLocked() const {
  int retired = 0;
  for (int k = 0; k < ducb_.num_experts(); ++k) retired += ducb_.estimator().Retired(k);
  return retired;
}

absl::Status Problem::WriteExpertRecord(int expert_id, const ExpertRecord& record) {
  return WriteExpertRecords({{expert_id, record}});
}

absl::Status Problem::WriteExpertRecords(absl::Span<const std::pair<int, ExpertRecord>> records) {
  absl::Status status;
  for (const auto& [k, record] : records) {
    status = PutExpertRecord(k, record);
    if (!status.ok()) break;  // the ones written are applied; the caller's next round retries
  }
  // A frozen expert's row is freed now, and the state written with it: a restart then
  // starts from the folded state, not from one that folds it later (a restart between a
  // record and this checkpoint folds it at its load). One checkpoint for the records
  // together: it carries the estimators' whole state (megabytes), so a pass that retires
  // several experts writes it once.
  std::optional<CheckpointWrite> folded;
  {
    absl::MutexLock lock(&mu_);
    if (FoldRetiredLocked()) folded = CheckpointLocked();
  }
  if (folded.has_value()) {
    const absl::Status written = WriteCheckpoint(*folded);
    if (status.ok()) status = written;
  }
  return status;
}

absl::Status Problem::PutExpertRecord(int expert_id, const ExpertRecord& record) {
  ExpertRecord updated = record;
  if (updated.status() == storage::v1::EXPERT_STATE_RETIRED && !updated.has_retired_mean()) {
    // Retired once estimated: its estimate now is the one kept (ExpertPool::Frozen).
    absl::MutexLock lock(&mu_);
    if (expert_id < ducb_.num_experts() && experts_.at(expert_id).failure.empty()) {
      const ExpertEstimate e = ducb_.Estimate(expert_id);
      updated.set_retired_mean(e.mean);
      updated.set_retired_width(e.width);
    }
  }
  // The model's payload is not kept in memory, nor written again: the store keeps it apart
  // from the record (a model never changes once registered). An unloaded expert's is
  // dropped from the store (Store::PutExpert): nothing loads it again (a restart skips it,
  // a retired expert stays retired), and every sample it chose is gone under the retention
  // (or it chose none), so the store keeps the models of the experts that matter, not of
  // every expert ever registered.
  storage::DropModelPayload(updated.mutable_model());
  DECISION_RETURN_IF_ERROR(Timed([&] {
    return env_.store->PutExpert(index_, static_cast<uint32_t>(expert_id), updated);
  }));
  absl::MutexLock lock(&mu_);
  experts_.at(expert_id).record = updated;
  ++estimates_generation_;
  if (expert_id < ducb_.num_experts()) {
    ducb_.SetSelectable(expert_id, updated.status() == storage::v1::EXPERT_STATE_ACTIVE &&
                                       !updated.shadow() &&
                                       experts_.at(expert_id).failure.empty());
  }
  ExportScoringCostLocked();
  return absl::OkStatus();
}

absl::Status Problem::ExpertCapLocked() const {
  if (experts_.size() < env_.max_experts) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "problem ", id(), " has ", experts_.size(),
      " experts (retired and failed ones count), the cap (--max_experts_per_problem=",
      env_.max_experts, ")"));
}

absl::Status Problem::ExpertCap() const {
  absl::MutexLock lock(&mu_);
  return ExpertCapLocked();
}

absl::Status Problem::RetireToFitBudget(double cost_us) {
  const double budget = record_.scoring_budget_us();
  std::vector<std::pair<int, ExpertRecord>> retire;
  {
    absl::MutexLock lock(&mu_);
    double total = experts_.ScoringCostUs() + cost_us;
    if (budget <= 0.0 || total <= budget || experts_.size() >= env_.max_experts) {
      return absl::OkStatus();
    }
    int retirable = SelectableLocked() - 1;  // the last selectable one stays
    for (const auto& [ucb, k] : SelectableByUcbLocked()) {
      if (total <= budget || retirable == 0) break;
      const ExpertRecord& record = experts_.at(k).record;
      if (k == 0 || record.score_cost_us() <= 0.0) continue;  // retiring it frees nothing
      total -= record.score_cost_us();
      --retirable;
      ExpertRecord updated = record;
      updated.set_status(storage::v1::EXPERT_STATE_RETIRED);
      retire.emplace_back(k, std::move(updated));
    }
    // Retiring cannot make room: retire nothing, and the registration is refused.
    if (total > budget) return absl::OkStatus();
  }
  return WriteExpertRecords(retire);
}

absl::StatusOr<v1::Expert> Problem::SetShadow(int expert_id, bool shadow) {
  absl::MutexLock writes(&expert_writes_mu_);
  ExpertRecord updated;
  {
    absl::MutexLock lock(&mu_);
    if (expert_id < 0 || expert_id >= experts_.size()) {
      return absl::NotFoundError(
          absl::StrCat("expert ", expert_id, " is unknown to problem ", id()));
    }
    const ExpertSlot& slot = experts_.at(expert_id);
    const char* verb = shadow ? "demoted" : "promoted";
    if (slot.record.status() == storage::v1::EXPERT_STATE_RETIRED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "expert ", expert_id, " of problem ", id(), " is retired and cannot be ", verb,
          "; register its model again"));
    }
    if (!slot.failure.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("expert ", expert_id, " of problem ",
                                                        id(), " failed (", slot.failure,
                                                        ") and cannot be ", verb));
    }
    if (slot.record.shadow() == shadow) {
      return experts_.ToWire(id(), expert_id, expert_id < ducb_.num_experts());
    }
    if (shadow && expert_id < ducb_.num_experts() && ducb_.selectable(expert_id) &&
        SelectableLocked() <= 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "expert ", expert_id, " is the last selectable expert of problem ", id()));
    }
    updated = slot.record;
    updated.set_shadow(shadow);
  }
  DECISION_RETURN_IF_ERROR(WriteExpertRecord(expert_id, updated));
  absl::MutexLock lock(&mu_);
  return experts_.ToWire(id(), expert_id, expert_id < ducb_.num_experts());
}

absl::StatusOr<v1::Expert> Problem::RegisterExpert(const std::string& name,
                                                   storage::v1::ExpertModelRecord model,
                                                   double smoothing,
                                                   const RegisterOptions& options) {
  DECISION_ASSIGN_OR_RETURN(
      std::unique_ptr<Expert> built,
      BuildExpert(model, record_.num_arms(), record_.num_features(), smoothing));
  const std::vector<double> recent = RecentContexts(kRegistrationScoredContexts);
  // The common way a valid model fails on this problem's data (a table whose keys miss the
  // contexts, a linear model whose logits overflow on them): scored on a uniform sample of
  // the contexts seen, it is refused here rather than failing later in the backfill.
  if (const int d = record_.num_features(); d > 0) {
    const size_t n = recent.size() / d;
    std::vector<double> probs(n * record_.num_arms());
    for (size_t i = 0; i < n; ++i) {
      const absl::Status s = built->Predict(absl::MakeConstSpan(recent).subspan(i * d, d),
                                            absl::MakeSpan(probs).subspan(i * record_.num_arms(),
                                                                          record_.num_arms()));
      if (!s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the expert cannot score a context this problem has seen (", s.message(),
            "); it would fail on the stored log"));
      }
    }
  }
  // What every join will pay for it, measured before any lock is taken.
  const double cost_us = ScoringCostUs(name, *built, recent);
  absl::MutexLock writes(&expert_writes_mu_);
  if (fenced()) {
    absl::MutexLock lock(&call_mu_);
    if (!fence_.ok()) return fence_;  // a training job's registration (calls are counted)
  }
  if (options.retire_to_fit) DECISION_RETURN_IF_ERROR(RetireToFitBudget(cost_us));
  int expert_id;
  ExpertRecord record;
  {
    // The slot joins the pool before its record is written, so that every sample joined
    // from now on is in its tail; it is not durable (not backfilled, not in a log chunk)
    // until the write succeeds.
    absl::MutexLock lock(&mu_);
    DECISION_RETURN_IF_ERROR(ExpertCapLocked());
    if (const int64_t bytes =
            MemoryBound(record_, experts_.size() + 1, RetiredInEstimatorLocked());
        bytes > env_.max_memory_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "problem ", id(), ": a new expert would take the memory of its ", experts_.size() + 1,
          " experts' estimator state and samples in memory to ", bytes / 1048576.0,
          " MB, over the cap (--max_problem_memory_mb=", env_.max_memory_bytes >> 20, ")"));
    }
    {
      int live = 1, loaded = 1;  // with the new one
      for (int e = 0; e < experts_.size(); ++e) {
        if (experts_.Unloaded(e)) continue;
        ++loaded;
        if (experts_.at(e).failure.empty() && !experts_.Frozen(e)) ++live;
      }
      if (const int64_t terms = DivergenceTermsBound(record_, live, loaded);
          terms > env_.max_divergence_terms) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "problem ", id(), ": with a new expert a divergence computation would evaluate ",
            terms, " terms (", live, " live experts' ordered pairs x ", record_.num_arms(),
            " arms x ", record_.divergence_reservoir(),
            " reservoir contexts), over the cap (--max_divergence_terms=",
            env_.max_divergence_terms,
            "); retire experts, or create the problem with a smaller divergence_reservoir"));
      }
    }
    // Under expert_writes_mu_: no other registration can pass this check meanwhile.
    const double budget = record_.scoring_budget_us();
    if (const double total = experts_.ScoringCostUs(); budget > 0.0 && total + cost_us > budget) {
      return ScoringBudgetError(name, cost_us, total, budget);
    }
    expert_id = experts_.size();
    record.set_name(name);
    *record.mutable_model() = std::move(model);
    record.set_smoothing(smoothing);
    record.set_status(storage::v1::EXPERT_STATE_BACKFILLING);
    record.set_backfill_total(ducb_.num_samples());
    // Its window: the samples retention kept (ApplyRetention moves retained_from_ under
    // expert_writes_mu_ too, so it cannot delete them before the backfill pins them).
    record.set_backfill_first(std::min(retained_from_, record.backfill_total()));
    record.set_registered_at_ms(env_.clock->NowMs());
    record.set_score_cost_us(cost_us);
    record.set_shadow(options.shadow);
    ExpertSlot slot;
    slot.record = record;
    storage::DropModelPayload(slot.record.mutable_model());
    slot.backfilled = record.backfill_first();
    slot.model = std::move(built);
    slot.metrics = env_.metrics->ForExpert(id(), expert_id);
    slot.metrics.backfill_progress->Set(0.0);
    slot.metrics.score_cost->Set(cost_us * 1e-6);
    slot.durable = false;
    slot.may_have_chosen = false;
    experts_.Add(std::move(slot));
    ExportScoringCostLocked();
  }
  absl::Status written = Timed([&] {
    return env_.store->PutExpert(index_, static_cast<uint32_t>(expert_id), record);
  });
  absl::MutexLock lock(&mu_);
  if (!written.ok()) {
    experts_.DropLast();
    // Its id may be reused: the chunk being filled must not give its values to the next.
    current_chunk_.Narrow(experts_.size());
    ExportScoringCostLocked();
    return written;
  }
  experts_.at(expert_id).durable = true;
  MarkPoolWork();  // its backfill
  return experts_.ToWire(id(), expert_id, /*estimated=*/false);
}

absl::StatusOr<v1::Expert> Problem::RetireExpert(int expert_id) {
  absl::MutexLock writes(&expert_writes_mu_);
  absl::StatusOr<ExpertRecord> retired;
  {
    absl::MutexLock lock(&mu_);
    retired = experts_.RetiredRecord(id(), expert_id, SelectableLocked());
    if (!retired.ok()) return retired.status();
    if (experts_.at(expert_id).record.status() == storage::v1::EXPERT_STATE_RETIRED) {
      return experts_.ToWire(id(), expert_id, expert_id < ducb_.num_experts());
    }
  }
  DECISION_RETURN_IF_ERROR(WriteExpertRecord(expert_id, *retired));
  absl::MutexLock lock(&mu_);
  return experts_.ToWire(id(), expert_id, expert_id < ducb_.num_experts());
}

absl::Status Problem::PromoteProvenShadows() {
  std::vector<int> promote;
  {
    absl::MutexLock lock(&mu_);
    if (ducb_.num_samples() == 0) return absl::OkStatus();
    double best = -std::numeric_limits<double>::infinity();
    for (int k = 0; k < ducb_.num_experts(); ++k) {
      if (ducb_.selectable(k)) best = std::max(best, ducb_.Estimate(k).mean);
    }
    const double width_scale = GateWidthScale();
    for (int k = 0; k < ducb_.num_experts(); ++k) {
      const ExpertSlot& slot = experts_.at(k);
      if (!slot.record.shadow() || slot.record.status() != storage::v1::EXPERT_STATE_ACTIVE ||
          !slot.failure.empty()) {
        continue;
      }
      const ExpertEstimate e = ducb_.Estimate(k);
      if (e.mean - e.width * width_scale > best) promote.push_back(k);
    }
  }
  for (int k : promote) DECISION_RETURN_IF_ERROR(SetShadow(k, false).status());
  return absl::OkStatus();
}

double Problem::GateWidthScale() const {
  const storage::v1::EstimatorRecord& e = record_.estimator();
  const double paper = EstimatorConstants::Practical().c3;
  if (e.kind() != storage::v1::ESTIMATOR_KIND_RECORD_MEDIAN_OF_MEANS || !(e.c3() < paper)) {
    return 1.0;
  }
  return std::sqrt(paper / e.c3());
}

absl::Status Problem::RetireDominated(int max_active) {
  absl::MutexLock writes(&expert_writes_mu_);
  std::vector<std::pair<int, ExpertRecord>> retire;
  {
    absl::MutexLock lock(&mu_);
    if (ducb_.num_samples() == 0) return absl::OkStatus();
    double best_lower;
    const std::vector<std::pair<double, int>> active =
        SelectableByUcbLocked(&best_lower, GateWidthScale());
    size_t keep_from = 0;
    while (keep_from + 1 < active.size() &&
           (active[keep_from].first < best_lower ||
            active.size() - keep_from > static_cast<size_t>(std::max(1, max_active)))) {
      ++keep_from;
    }
    for (size_t i = 0; i < keep_from; ++i) {
      ExpertRecord updated = experts_.at(active[i].second).record;
      updated.set_status(storage::v1::EXPERT_STATE_RETIRED);
      retire.emplace_back(active[i].second, std::move(updated));
    }
  }
  // Each write is applied as it succeeds; a failure leaves the rest for the next round.
  return WriteExpertRecords(retire);
}

absl::Status Problem::UnloadQuietExperts() {
  absl::MutexLock writes(&expert_writes_mu_);
  std::vector<std::pair<int, ExpertRecord>> unload;
  {
    absl::MutexLock lock(&mu_);
    const int64_t written = WrittenSamplesLocked();
    for (int k = 0; k < experts_.durable_size(); ++k) {
      ExpertSlot& slot = experts_.at(k);
      if (!experts_.Frozen(k) || experts_.Unloaded(k) || !slot.failure.empty()) continue;
      if (slot.quiet_below < 0) {
        // Frozen: never selected again. Once no selection of it is in flight and none of
        // its decisions is pending, every sample it chose is written (a join leaves the
        // pending table in the lock hold that gives its sample a sequence).
        if (slot.selections_in_flight > 0 || pending_.ChosenBy(k) > 0) continue;
        slot.quiet_below = slot.may_have_chosen ? written : 0;
      }
      if (slot.quiet_below > retained_from_) continue;
      ExpertRecord updated = slot.record;
      updated.set_unloaded_at_sample(retained_from_);
      unload.emplace_back(k, std::move(updated));
    }
  }
  for (const auto& [k, updated] : unload) {
    DECISION_RETURN_IF_ERROR(WriteExpertRecord(k, updated));
    {
      absl::MutexLock lock(&mu_);
      experts_.at(k).model = stand_in_;
      metrics_.experts_unloaded->Increment();
    }
    reservoir_predictions_.Drop(k);
  }
  return absl::OkStatus();
}

bool Problem::PoolWorkRemains() const {
  absl::MutexLock lock(&mu_);
  if (event_ids_loading_) return true;
  if (experts_.durable_size() > ducb_.num_experts()) return true;  // backfill
  if (ducb_.num_samples() >= next_refresh_at_ && reservoir_.size() > 0) return true;
  for (int k = 0; k < experts_.durable_size(); ++k) {
    if (experts_.at(k).failure_unwritten) return true;
  }
  return false;
}

}  // namespace decision::server
