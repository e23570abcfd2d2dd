#include "core/sample_log.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace decision {
namespace {

absl::Status CheckPropensity(double p, int expert, int64_t sample) {
  if (!(p > 0.0 && p <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("propensity of expert ", expert,
                                                   " for sample ", sample, " is ", p,
                                                   "; it must be in (0, 1]"));
  }
  return absl::OkStatus();
}

absl::Status ReadOnly() {
  return absl::FailedPreconditionError("a shared prefix of a sample log is read-only");
}

}  // namespace

SampleLog SampleLog::SharedPrefix() const {
  SampleLog prefix(num_experts_);
  prefix.chooser_ = chooser_.SharedPrefix(chooser_.rows());
  prefix.reward_ = reward_.SharedPrefix(reward_.rows());
  prefix.propensity_ = propensity_.SharedPrefix(propensity_.rows());
  prefix.count_ = count_;
  prefix.read_only_ = true;
  return prefix;
}

absl::Status SampleLog::Append(int chooser, double reward,
                               absl::Span<const double> propensities) {
  if (read_only_) return ReadOnly();
  if (chooser < 0 || chooser >= num_experts()) {
    return absl::InvalidArgumentError(absl::StrCat("chooser ", chooser,
                                                   " is not an expert index in [0, ",
                                                   num_experts(), ")"));
  }
  if (!(reward >= 0.0 && reward <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reward ", reward, " is outside [0, 1]"));
  }
  if (propensities.size() != static_cast<size_t>(num_experts_)) {
    return absl::InvalidArgumentError(absl::StrCat("sample has ", propensities.size(),
                                                   " propensities, expected one per expert (",
                                                   num_experts(), ")"));
  }
  for (int k = 0; k < num_experts(); ++k) {
    if (absl::Status s = CheckPropensity(propensities[k], k, size()); !s.ok()) return s;
  }
  *chooser_.AppendRow() = chooser;
  *reward_.AppendRow() = reward;
  std::copy(propensities.begin(), propensities.end(), propensity_.AppendRow());
  ++count_[chooser];
  return absl::OkStatus();
}

absl::Status SampleLog::AddExpert(absl::Span<const double> propensities) {
  if (read_only_) return ReadOnly();
  if (static_cast<int64_t>(propensities.size()) != size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "new expert has ", propensities.size(), " propensities, the log has ", size(),
        " samples"));
  }
  for (int64_t s = 0; s < size(); ++s) {
    if (absl::Status st = CheckPropensity(propensities[s], num_experts(), s); !st.ok()) {
      return st;
    }
  }
  ChunkedRows<double> wider(num_experts_ + 1);
  for (int64_t s = 0; s < size(); ++s) {
    double* row = wider.AppendRow();
    std::copy_n(propensity_.row(s), num_experts_, row);
    row[num_experts_] = propensities[s];
  }
  propensity_ = std::move(wider);
  ++num_experts_;
  count_.push_back(0);
  return absl::OkStatus();
}

}  // namespace decision
