// Conversions between the three vocabularies of the service: the wire API (decision.v1),
// the on-disk records (decision.storage.v1) and core's types. Every enum has one table in
// conversions.cc that lists each value in all three forms; nothing else converts them.
//
// Thread safety: pure functions.
#ifndef DECISION_SERVER_CONVERSIONS_H_
#define DECISION_SERVER_CONVERSIONS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/estimator.h"
#include "core/off_policy.h"
#include "core/expert.h"
#include "decision/v1/decision.pb.h"
#include "storage/records.pb.h"

namespace decision::server {

// The wire status of a stored expert state.
v1::ExpertStatus ExpertStatusToWire(storage::v1::ExpertState state);

// Core estimator options from a stored problem. An enum value the table does not know (a
// corrupt record) maps to the default.
EstimatorOptions EstimatorOptionsOf(const storage::v1::ProblemRecord& record);
// The stored form of core estimator options.
storage::v1::EstimatorRecord EstimatorRecordOf(const EstimatorOptions& options);
// Core estimator options from the wire, with the wire's defaults for unset fields.
// REQUIRES: every enum of `config` is a known value (validation.h checks this).
EstimatorOptions EstimatorOptionsFromWire(const v1::EstimatorConfig& config);
// The wire form of stored estimator options (every field set).
v1::EstimatorConfig EstimatorConfigToWire(const storage::v1::EstimatorRecord& record);

// The wire configuration of a stored problem, with every default filled in.
v1::ProblemConfig ConfigFromRecord(const storage::v1::ProblemRecord& record);

// The stored form of a wire model. INVALID_ARGUMENT if no kind is set.
absl::StatusOr<storage::v1::ExpertModelRecord> ModelRecordFromWire(const v1::ExpertModel& model);

// Builds the core expert of a stored model record. INVALID_ARGUMENT (from core) if the
// model does not fit the problem or does not load.
absl::StatusOr<std::unique_ptr<Expert>> BuildExpert(const storage::v1::ExpertModelRecord& model,
                                                    int num_arms, int num_features,
                                                    double smoothing);

// The wire form of a stored training job. A state or origin the table does not know (a
// corrupt record) maps to UNSPECIFIED.
v1::ModelEvaluation OffPolicyToWire(const OffPolicyEstimate& e);

v1::TrainingJob TrainingJobToWire(const storage::v1::TrainingJobRecord& record);

}  // namespace decision::server

#endif  // DECISION_SERVER_CONVERSIONS_H_
