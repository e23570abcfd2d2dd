// The cost model of experts (issue 15): what scoring an expert costs, and the per-problem
// budget of that cost.
//
// An expert's cost is the microseconds of CPU per row that Expert::PredictBatch takes over
// a batch of the problem's contexts: what every join pays for it, since joins are scored in
// batches. It is measured once, in-process, when the expert is registered, and stored with
// it (ExpertRecord.score_cost_us); experts stored before costs were are measured again at
// each load. A problem's scoring cost is the sum over the experts scored per join
// (ExpertPool::ScoringCostUs); its budget (ProblemRecord.scoring_budget_us, 0: none) bounds
// that sum, and RegisterExpert refuses an expert that would exceed it (ScoringBudgetError).
//
// Thread safety: pure functions (MeasureScoringCostUs reads the calling thread's CPU clock).
#ifndef DECISION_SERVER_SCORING_COST_H_
#define DECISION_SERVER_SCORING_COST_H_

#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/expert.h"

namespace decision::server {

// The rows of one measured batch, and how many times the batch is timed (after one call
// that warms the model's caches up); the median is kept.
inline constexpr int kScoringCostRows = 64;
inline constexpr int kScoringCostRepetitions = 5;

// Microseconds of CPU per row that `expert` takes to score a batch of kScoringCostRows
// contexts: the median of kScoringCostRepetitions timings, divided by the rows. The batch
// is the first rows of `contexts` (row-major, expert.num_features() values each), repeated
// if there are fewer; with none (a problem that has seen no context yet), fixed synthetic
// rows: one of zeros, then seeded uniform values in [0, 1). Timed with the calling thread's
// CPU clock, not the wall clock, so that a busy machine does not inflate it (an XGBoost
// expert predicts on the calling thread: core/xgboost_expert.cc). A uniform expert costs 0
// without being timed: it is the stand-in that scores quarantined experts, and its
// distribution is a constant. The figure is never negative; a batch that fails to score is
// timed all the same.
double MeasureScoringCostUs(const Expert& expert, absl::Span<const double> contexts);

// RESOURCE_EXHAUSTED naming the figures: "expert 'NAME' costs C us per row; the problem's
// experts cost T us of its scoring budget of B us per decision; retire an expert or
// register a cheaper model". IsOverScoringBudget tells it from the other RESOURCE_EXHAUSTED
// errors (a full problem).
absl::Status ScoringBudgetError(const std::string& expert_name, double cost_us,
                                double total_us, double budget_us);
bool IsOverScoringBudget(const absl::Status& status);

}  // namespace decision::server

#endif  // DECISION_SERVER_SCORING_COST_H_
