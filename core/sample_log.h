// The joined samples the estimators learn from (DESIGN.md section 2): for every sample s,
// in arrival order of its reward, the expert j(s) that chose it, the reward Y_s in [0, 1],
// and for every expert k the propensity pi_k(V_s | X_s) of the arm that was played.
//
// Propensities are stored one column per expert, so registering an expert mid-stream
// appends one column (its backfilled propensities over the whole log).
//
// Thread safety: not thread-safe; callers serialise access.
#ifndef DECISION_CORE_SAMPLE_LOG_H_
#define DECISION_CORE_SAMPLE_LOG_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace decision {

class SampleLog {
 public:
  explicit SampleLog(int num_experts = 0) : propensity_(num_experts), count_(num_experts, 0) {}

  int num_experts() const { return static_cast<int>(propensity_.size()); }
  int64_t size() const { return static_cast<int64_t>(reward_.size()); }

  // Appends a sample. propensities[k] = pi_k(V|X) for every expert k.
  // Returns INVALID_ARGUMENT (and appends nothing) unless 0 <= chooser < num_experts(),
  // reward is in [0, 1], propensities.size() == num_experts() and each is in (0, 1].
  absl::Status Append(int chooser, double reward, absl::Span<const double> propensities);

  // Adds an expert whose propensity for each stored sample, in order, is given.
  // Returns INVALID_ARGUMENT (and changes nothing) unless propensities.size() == size() and
  // each is in (0, 1].
  absl::Status AddExpert(absl::Span<const double> propensities);

  // REQUIRES: 0 <= s < size(), 0 <= k < num_experts().
  int chooser(int64_t s) const { return chooser_[s]; }
  double reward(int64_t s) const { return reward_[s]; }
  double propensity(int k, int64_t s) const { return propensity_[k][s]; }
  absl::Span<const double> propensities_of(int k) const { return propensity_[k]; }
  // n_j: the number of samples chosen by expert j.
  int64_t count(int j) const { return count_[j]; }

 private:
  std::vector<int32_t> chooser_;
  std::vector<double> reward_;
  std::vector<std::vector<double>> propensity_;  // [expert][sample]
  std::vector<int64_t> count_;
};

}  // namespace decision

#endif  // DECISION_CORE_SAMPLE_LOG_H_
