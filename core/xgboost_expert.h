// An expert backed by an XGBoost `multi:softprob` booster (tree or linear), loaded from
// JSON or UBJSON model bytes through libxgboost's C API, after CheckXgboostModel
// (core/xgboost_model_check.h) has accepted them: libxgboost trusts its model files, and a
// crafted one crashes or hangs the process that loads it. XGBoost's legacy binary format
// is accepted only after ConvertXgboostModelToUbjson, which runs in the model sandbox.
//
// A context for which the booster returns no finite positive probability (a diverged model)
// gets the uniform distribution instead of an error.
//
// Thread safety: Predict and PredictBatch may be called from any number of threads at
// once, and run in parallel: libxgboost 1.7.4 keeps its prediction buffers per thread and
// per booster, and the booster is configured once at load (core/xgboost_expert.cc gives the
// source references). Each call in flight takes its own scratch (float rows, a proxy
// DMatrix) from a small pool, under a lock held only to take and return it.
//
// Cost: a model is predicted by its compiled form (core/xgboost_forest.h), which opens and
// reads no file. With XgboostPredictor::kLibxgboost, no call opens or reads a file once the
// expert has served as many calls at once as it ever will (a new scratch's proxy DMatrix
// reads two cgroup files, in libxgboost), except for gblinear: libxgboost 1.7 predicts it
// only through a DMatrix built per call, which reads the two cgroup files every time.
#ifndef DECISION_CORE_XGBOOST_EXPERT_H_
#define DECISION_CORE_XGBOOST_EXPERT_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "core/expert.h"

namespace decision {

// The float libxgboost is given for feature value `x` (finite): x rounded to float, and a
// value beyond float's range saturated to +-FLT_MAX rather than made infinite, which
// libxgboost refuses ("Input data contains `inf` or `nan`"): a finite context, which
// ValidateContext accepts, always predicts, and every split on a finite threshold sends it
// where the double would go. Used for prediction and training alike.
float XgboostFeature(double x);

// Loads a booster from `model_bytes` (JSON or UBJSON). libxgboost sees the bytes only after
// CheckXgboostModel(model_bytes, num_arms, num_features) has accepted them. Returns
// INVALID_ARGUMENT, naming the problem, if the check refuses the bytes (among others: the
// legacy binary format, an objective other than multi:softprob, a number of classes or
// features other than num_arms / num_features), or if libxgboost then fails to load them.
// Never crashes on malformed bytes.
//
// A model, trees or gblinear, is predicted by its compiled form (core/xgboost_forest.h: the
// same floats as libxgboost's predictor, without its per-call cost) unless `predictor`
// says otherwise.
enum class XgboostPredictor { kCompiled, kLibxgboost };
absl::StatusOr<std::unique_ptr<Expert>> MakeXgboostExpert(
    int num_arms, int num_features, absl::string_view model_bytes,
    double smoothing = kDefaultSmoothing, XgboostPredictor predictor = XgboostPredictor::kCompiled);

// Loads `model_bytes` in any format libxgboost 1.7.4 reads (JSON, UBJSON or the legacy
// binary format) and returns the same model saved as UBJSON, ready for CheckXgboostModel.
// Returns INVALID_ARGUMENT if libxgboost refuses the bytes or cannot save the model.
//
// THIS FUNCTION TRUSTS ITS INPUT. IT HANDS THE BYTES TO LIBXGBOOST UNCHECKED, AND A CRAFTED
// MODEL CAN CRASH, HANG OR EXHAUST THE MEMORY OF THE PROCESS THAT CALLS IT. CALL IT ONLY
// INSIDE THE MODEL SANDBOX PROCESS (A SEPARATE, RESOURCE-LIMITED PROCESS), NEVER IN THE
// SERVING PROCESS, AND CHECK ITS OUTPUT WITH CheckXgboostModel BEFORE USING IT.
//
// Thread safety: reentrant; each call owns its booster.
absl::StatusOr<std::string> ConvertXgboostModelToUbjson(absl::string_view model_bytes);

}  // namespace decision

#endif  // DECISION_CORE_XGBOOST_EXPERT_H_
