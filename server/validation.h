// Request validation: every check of a client's input that does not need the problem's
// state, in one place. Each function returns OK or INVALID_ARGUMENT with a message that names
// the field, the value and what is allowed. Nothing here reads or writes the store.
//
// Every cost a request can cause is bounded here: sizes are checked alone and, where they
// multiply into one allocation, together (kMaxConfigDoubles).
//
// Thread safety: pure functions.
#ifndef DECISION_SERVER_VALIDATION_H_
#define DECISION_SERVER_VALIDATION_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/estimator.h"
#include "decision/v1/decision.pb.h"
#include "storage/records.pb.h"

namespace decision::server {

inline constexpr int kMinArms = 2;
inline constexpr int kMaxArmsPerProblem = 4096;
inline constexpr int kMaxFeaturesPerProblem = 65536;
inline constexpr int kMaxExpertsPerProblem = 256;
inline constexpr size_t kMaxEventIdBytes = 128;
inline constexpr size_t kMaxNameBytes = 128;
// The least smoothing eta: every arm keeps at least eta / K >= 2.4e-10 (K <= 4096), so a
// propensity is never 0 and importance ratios stay below 4.1e9.
inline constexpr double kMinSmoothing = 1e-6;
inline constexpr int kMaxExpertsPerTrainingJob = 16;
// The largest array of doubles one problem's configuration may imply: the divergence
// reservoir (reservoir x features) and one expert's predictions over it (reservoir x arms).
// 2^24 doubles = 128 MiB.
inline constexpr int64_t kMaxConfigDoubles = int64_t{1} << 24;
// The largest scoring budget: a minute of CPU per decision, far beyond any real one.
inline constexpr double kMaxScoringBudgetUs = 60e6;

// Validates a wire configuration and fills in the defaults. INVALID_ARGUMENT names the field.
absl::StatusOr<storage::v1::ProblemRecord> ProblemRecordFromConfig(
    const std::string& problem_id, const v1::ProblemConfig& config);

// A problem record read back from the store: OK if CreateProblem could have written it (its
// wire form, ConfigFromRecord, passes ProblemRecordFromConfig), else DATA_LOSS naming the
// field. A restart checks it before anything is sized from the record.
absl::Status CheckStoredProblem(const storage::v1::ProblemRecord& record);

// The most slots of a ChooseSlate, and of decisions in a ChooseBatch.
inline constexpr int kMaxSlateSlots = 64;
inline constexpr int kMaxChooseBatch = 256;
// Choose: features (count and finiteness), the caller's event id and the eligible arms.
absl::Status ValidateChooseRequest(const v1::ChooseRequest& request, int num_features,
                                   int num_arms);
// Whether a stored decision's eligible arms (EventRecord, SampleRecord) are sound: empty,
// or ascending arms in [0, num_arms) among which is the played `arm`.
bool StoredEligibleArmsValid(absl::Span<const int32_t> eligible, int arm, int num_arms);
// A valid request's eligible arms as stored: ascending; empty when every arm is eligible
// (unset, or every arm listed).
std::vector<int32_t> EligibleArmsOf(const v1::ChooseRequest& request, int num_arms);
// Reward: the value in [0, 1] and an event id of 1 to kMaxEventIdBytes bytes.
// 1 to 64 characters of [A-Za-z0-9_.-] (INVALID_ARGUMENT naming the problem).
absl::Status ValidateProblemId(const std::string& id);
// A replica's name in the placement map: the same rule (INVALID_ARGUMENT naming `field`).
absl::Status ValidateReplicaId(const std::string& id, const char* field);
absl::Status ValidateRewardRequest(const v1::RewardRequest& request);
// RegisterExpert: the name; returns the smoothing to use (the model's, or `default_smoothing`).
absl::StatusOr<double> ValidateRegisterExpertRequest(const v1::RegisterExpertRequest& request,
                                                     double default_smoothing);
absl::Status ValidateRetireExpertRequest(const v1::RetireExpertRequest& request);
// A retention setting (ProblemConfig.retention, SetRetention) for a problem whose
// estimator is `estimator`; `field` names it in the message.
absl::Status ValidateRetention(const v1::RetentionConfig& retention, EstimatorKind estimator,
                               absl::string_view field);
// DeleteEvents: 1 to kMaxDeleteEvents ids of 1 to kMaxEventIdBytes bytes.
absl::Status ValidateDeleteEventsRequest(const v1::DeleteEventsRequest& request);
inline constexpr int kMaxDeleteEvents = 1000;
inline constexpr int64_t kMinRetentionSamples = 8192;
inline constexpr int64_t kMinRetentionAgeMs = 1000;
inline constexpr int64_t kMaxRetentionAgeMs = 100LL * 365 * 24 * 3600 * 1000;
inline constexpr int64_t kMaxRetentionSamples = int64_t{1} << 53;
// TrainExperts: counts >= 0, at most kMaxExpertsPerTrainingJob in all (no overflow).
absl::Status ValidateTrainExpertsRequest(const v1::TrainExpertsRequest& request);
// ExportLog: start and limit >= 0.
// Activate: an event id of 1-128 bytes.
absl::Status ValidateActivateRequest(const v1::ActivateRequest& request);
// Explain: an event id of 1-128 bytes.
absl::Status ValidateExplainRequest(const v1::ExplainRequest& request);
absl::Status ValidateExportLogRequest(const v1::ExportLogRequest& request);
// start >= 0, 0 <= limit <= kMaxAuditPage.
inline constexpr int kMaxAuditPage = 1000;
absl::Status ValidateListAuditLogRequest(const v1::ListAuditLogRequest& request);
// GetTrainingJob: job_id >= 1 (job ids start at 1).
absl::Status ValidateGetTrainingJobRequest(const v1::GetTrainingJobRequest& request);

}  // namespace decision::server

#endif  // DECISION_SERVER_VALIDATION_H_
