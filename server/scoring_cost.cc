#include "server/scoring_cost.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_format.h"

namespace decision::server {
namespace {

// The payload that marks a ScoringBudgetError.
constexpr char kOverBudgetPayload[] = "decision.server/over_scoring_budget";

double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

double MeasureScoringCostUs(const Expert& expert, absl::Span<const double> contexts) {
  if (std::strcmp(expert.kind(), "uniform") == 0) return 0.0;
  constexpr size_t kRows = kScoringCostRows;
  const size_t d = static_cast<size_t>(expert.num_features());
  const size_t available = d == 0 ? 0 : contexts.size() / d;
  std::vector<double> batch;
  if (available < kRows) {
    // Always a full batch, so that the per-call overhead is shared alike: the contexts
    // there are, repeated, or synthetic rows.
    batch.resize(kRows * d);
    std::mt19937_64 gen(15);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i] = available > 0 ? contexts[(i / d) % available * d + i % d]
                 : i < d       ? 0.0
                               : uniform(gen);
    }
    contexts = batch;
  }
  contexts = contexts.subspan(0, kRows * d);
  std::vector<double> probs(kRows * expert.num_arms());
  // The first call warms up what a model builds on first use (XGBoost's caches).
  expert.PredictBatch(contexts, kRows, absl::MakeSpan(probs)).IgnoreError();
  std::vector<double> seconds;
  for (int r = 0; r < kScoringCostRepetitions; ++r) {
    const double start = ThreadCpuSeconds();
    expert.PredictBatch(contexts, kRows, absl::MakeSpan(probs)).IgnoreError();
    seconds.push_back(ThreadCpuSeconds() - start);
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return std::max(0.0, seconds[seconds.size() / 2]) * 1e6 / static_cast<double>(kRows);
}

absl::Status ScoringBudgetError(const std::string& expert_name, double cost_us,
                                double total_us, double budget_us) {
  absl::Status s = absl::ResourceExhaustedError(absl::StrFormat(
      "expert '%s' costs %.3f us per row; the problem's experts cost %.3f us of its scoring "
      "budget of %g us per decision; retire an expert or register a cheaper model",
      expert_name, cost_us, total_us, budget_us));
  s.SetPayload(kOverBudgetPayload, absl::Cord());
  return s;
}

bool IsOverScoringBudget(const absl::Status& status) {
  return absl::IsResourceExhausted(status) && status.GetPayload(kOverBudgetPayload).has_value();
}

}  // namespace decision::server
