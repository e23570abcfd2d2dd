// The model sandbox: a client's XGBoost model is loaded and scored for the first time in a
// separate, resource-limited process (decision_model_probe, model_probe_main.cc), never in
// decisiond. A model that crashes, hangs or exhausts memory there is refused with
// INVALID_ARGUMENT naming what happened; decisiond never notices.
//
// What the probe does, in order (model_probe_main.cc):
//   1. limits itself: address space (memory_mb), CPU time, no files written, no core dump,
//      few file descriptors; the parent kills it at the wall-time limit;
//   2. converts a legacy binary model to UBJSON (the only step where libxgboost reads bytes
//      that core/xgboost_model_check.h has not checked);
//   3. checks the structure (CheckXgboostModel), loads the model and predicts every probe row;
//   4. answers with the canonical model bytes (the input, or its UBJSON conversion), which
//      are what decisiond checks again, loads and stores.
//
// Wire format between the two processes (both sides are this repository's code; the format
// is private and versionless): see model_probe_main.cc.
//
// Thread safety: Check may be called concurrently; each call spawns its own process.
#ifndef DECISION_SERVER_MODEL_SANDBOX_H_
#define DECISION_SERVER_MODEL_SANDBOX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace decision::server {

struct ModelSandboxOptions {
  // The decision_model_probe executable. Empty: no sandbox (in-process structural checks
  // only); decisiond always sets it.
  std::string probe_path;
  int64_t memory_mb = 2048;   // RLIMIT_AS of the probe
  int64_t cpu_seconds = 20;   // RLIMIT_CPU of the probe
  int64_t timeout_ms = 30'000;  // wall time before the probe is killed
};

// The request of one probe: a model of `num_arms` classes over `num_features` features and
// the contexts (row-major, num_features values each) to predict.
struct ModelProbeRequest {
  int num_arms = 0;
  int num_features = 0;
  absl::string_view model;
  std::vector<double> rows;
};

class ModelSandbox {
 public:
  explicit ModelSandbox(ModelSandboxOptions options) : options_(std::move(options)) {}

  bool enabled() const { return !options_.probe_path.empty(); }

  // Runs the probe on `request`. Returns the canonical model bytes, or INVALID_ARGUMENT
  // saying why the model was refused (the probe's own message, or how it died: signal,
  // time limit, memory limit). INTERNAL if the probe cannot be started (missing executable,
  // no processes left): that is the server's fault, not the model's.
  // REQUIRES: enabled().
  absl::StatusOr<std::string> Check(const ModelProbeRequest& request) const;

 private:
  const ModelSandboxOptions options_;
};

// The probe rows of a problem: `real` contexts (the problem's recent ones, at most
// `max_real` of them) followed by synthetic ones that reach a model's extremes (zeros, a
// fixed pseudo-random spread, and large positive and negative values).
std::vector<double> ProbeRows(absl::Span<const double> real, int num_features, int max_real);

}  // namespace decision::server

#endif  // DECISION_SERVER_MODEL_SANDBOX_H_
