#include "server/expert_pool.h"

#include "absl/strings/str_cat.h"
#include "server/conversions.h"

namespace decision::server {
namespace {

// The kind of a stored model, as Expert::kind() names it (a FAILED expert's model is the
// stand-in: its own kind is in the record).
const char* KindOf(const storage::v1::ExpertModelRecord& model) {
  switch (model.kind_case()) {
    case storage::v1::ExpertModelRecord::kUniform: return "uniform";
    case storage::v1::ExpertModelRecord::kTable: return "table";
    case storage::v1::ExpertModelRecord::kLinearSoftmax: return "linear_softmax";
    case storage::v1::ExpertModelRecord::kXgboost: return "xgboost";
    default: return "unknown";
  }
}

}  // namespace


std::vector<std::shared_ptr<const Expert>> ExpertPool::Models(int n) const {
  std::vector<std::shared_ptr<const Expert>> models;
  models.reserve(n);
  for (int k = 0; k < n; ++k) models.push_back(slots_[k].model);
  return models;
}

std::vector<std::shared_ptr<const Expert>> ExpertPool::JoinModels(
    const std::shared_ptr<const Expert>& stand_in) const {
  std::vector<std::shared_ptr<const Expert>> models = Models();
  for (int k = 0; k < size(); ++k) {
    if (Frozen(k)) models[k] = stand_in;
  }
  return models;
}

absl::StatusOr<storage::v1::ExpertRecord> ExpertPool::RetiredRecord(
    const std::string& problem_id, int id, int selectable) const {
  if (id < 0 || id >= size()) {
    return absl::NotFoundError(
        absl::StrCat("expert ", id, " is unknown to problem ", problem_id));
  }
  const storage::v1::ExpertRecord& current = slots_[id].record;
  if (current.status() == storage::v1::EXPERT_STATE_ACTIVE && slots_[id].failure.empty() &&
      !current.shadow() && selectable <= 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "expert ", id, " is the last selectable expert of problem ", problem_id));
  }
  storage::v1::ExpertRecord retired = current;
  retired.set_status(storage::v1::EXPERT_STATE_RETIRED);
  return retired;
}

bool ExpertPool::CountsAgainstBudget(int id) const {
  const ExpertSlot& slot = slots_[id];
  const storage::v1::ExpertState state = slot.record.status();
  return slot.failure.empty() && (state == storage::v1::EXPERT_STATE_ACTIVE ||
                                  state == storage::v1::EXPERT_STATE_BACKFILLING);
}

double ExpertPool::ScoringCostUs() const {
  double total = 0.0;
  for (int id = 0; id < size(); ++id) {
    if (CountsAgainstBudget(id)) total += slots_[id].record.score_cost_us();
  }
  return total;
}

v1::ExpertStatus ExpertPool::WireStatus(int id) const {
  const ExpertSlot& slot = slots_[id];
  if (!slot.failure.empty()) return v1::EXPERT_STATUS_FAILED;
  if (slot.record.shadow() && slot.record.status() == storage::v1::EXPERT_STATE_ACTIVE) {
    return v1::EXPERT_STATUS_SHADOW;
  }
  return ExpertStatusToWire(slot.record.status());
}

v1::Expert ExpertPool::ToWire(const std::string& problem_id, int id, bool estimated) const {
  const ExpertSlot& slot = slots_[id];
  v1::Expert e;
  e.set_problem_id(problem_id);
  e.set_expert_id(id);
  e.set_name(slot.record.name());
  const bool own_model = slot.failure.empty() && !Unloaded(id);
  e.set_kind(own_model ? slot.model->kind() : KindOf(slot.record.model()));
  e.set_status(WireStatus(id));
  e.set_shadow(slot.record.shadow());
  e.set_error(slot.failure);
  e.set_smoothing(own_model ? slot.model->smoothing() : slot.record.smoothing());
  // Counted from its window's start (retention): the samples it has and will have.
  const int64_t first = slot.record.backfill_first();
  e.set_window_start(first);
  e.set_backfill_total(slot.record.backfill_total() - first);
  e.set_backfilled((estimated ? slot.record.backfill_total() : slot.backfilled) - first);
  e.set_score_cost_us(slot.record.score_cost_us());
  return e;
}

}  // namespace decision::server
