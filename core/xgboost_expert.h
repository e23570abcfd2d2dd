// An expert backed by an XGBoost `multi:softprob` booster (tree or linear), loaded from
// model bytes (JSON, UBJSON or XGBoost's legacy binary format) through libxgboost's C API.
//
// A context for which the booster returns no finite positive probability (a diverged model)
// gets the uniform distribution instead of an error.
//
// Thread safety: Predict may be called from any thread; calls into the booster are
// serialised by a mutex (libxgboost keeps per-handle prediction buffers).
#ifndef DECISION_CORE_XGBOOST_EXPERT_H_
#define DECISION_CORE_XGBOOST_EXPERT_H_

#include <memory>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "core/expert.h"

namespace decision {

// Loads a booster from `model_bytes`. Returns INVALID_ARGUMENT, naming the problem, if the
// bytes are not a model libxgboost can load, if its objective is not multi:softprob, or if
// its number of classes or features differs from num_arms / num_features. Never crashes on
// malformed bytes.
absl::StatusOr<std::unique_ptr<Expert>> MakeXgboostExpert(int num_arms, int num_features,
                                                          absl::string_view model_bytes,
                                                          double smoothing = kDefaultSmoothing);

}  // namespace decision

#endif  // DECISION_CORE_XGBOOST_EXPERT_H_
