// request_fuzz: every check a client's request meets before it reaches a problem's state,
// and the operator's tokens file.
//
// Input: byte 0 % 13 picks what the rest is:
//   0..11  a request message of proto/decision/v1/decision.proto (kRequests below), parsed
//          with ParseFromArray, then put through what the service does with it before it
//          needs a problem: the validation functions of server/validation.h and the
//          conversions of server/conversions.h (ProblemRecordFromConfig, ConfigFromRecord,
//          ModelRecordFromWire, BuildExpert, ...), and what DecisionService and Problem
//          derive from the results (the estimator, NextRefresh, a Choose's predictions);
//   12     the text of a tokens file, for ParseTokens (server/auth.h).
// Properties: every check returns OK or INVALID_ARGUMENT, never crashes; a configuration
// that is accepted gives a record within the documented bounds whose wire form
// (ConfigFromRecord, what GetProblem returns) is accepted again and gives the same record;
// accepted tokens have a valid name and at least one role.
// Seeds: corpus/request/, written by write_fuzz_seeds.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/policy.h"
#include "server/auth.h"
#include "server/conversions.h"
#include "server/problem.h"
#include "server/validation.h"
#include "tests/fuzz/fuzz_support.h"

namespace decision::server {
namespace {

// OK or INVALID_ARGUMENT.
void ExpectValidation(const absl::Status& s, const char* what) {
  FUZZ_CHECK(s.ok() || s.code() == absl::StatusCode::kInvalidArgument, "%s: %s", what,
             s.ToString().c_str());
}

template <typename Message>
bool Parse(absl::string_view bytes, Message* m) {
  return m->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

void CreateProblem(const v1::CreateProblemRequest& request) {
  absl::StatusOr<storage::v1::ProblemRecord> record =
      ProblemRecordFromConfig(request.problem_id(), request.config());
  ExpectValidation(record.status(), "ProblemRecordFromConfig");
  if (!record.ok()) return;
  const storage::v1::ProblemRecord& r = *record;
  FUZZ_CHECK(r.num_arms() >= kMinArms && r.num_arms() <= kMaxArmsPerProblem &&
                 r.num_features() >= 0 && r.num_features() <= kMaxFeaturesPerProblem &&
                 r.divergence_reservoir() > 0 && r.divergence_groups() > 0 &&
                 r.divergence_groups() <= r.divergence_reservoir() &&
                 int64_t{r.divergence_reservoir()} * r.num_features() <= kMaxConfigDoubles &&
                 int64_t{r.divergence_reservoir()} * r.num_arms() <= kMaxConfigDoubles &&
                 r.reward_wait_ms() > 0 && r.smoothing() > 0 && r.smoothing() <= 1 &&
                 std::isfinite(r.batch_multiplier()) && r.batch_multiplier() > 0 &&
                 r.max_active_experts() > 0 && r.max_active_experts() <= kMaxExpertsPerProblem,
             "accepted record out of bounds: %s", r.ShortDebugString().c_str());
  // GetProblem's answer describes the same problem: created again, it gives the same record.
  const v1::ProblemConfig wire = ConfigFromRecord(r);
  absl::StatusOr<storage::v1::ProblemRecord> again =
      ProblemRecordFromConfig(request.problem_id(), wire);
  FUZZ_CHECK(again.ok(), "the stored config is refused: %s (%s)",
             again.status().ToString().c_str(), wire.ShortDebugString().c_str());
  FUZZ_CHECK(again->SerializeAsString() == r.SerializeAsString(),
             "the stored config does not round-trip: %s became %s", r.ShortDebugString().c_str(),
             again->ShortDebugString().c_str());
  // What Problem::Create derives from the record.
  absl::StatusOr<DUcb> ducb = DUcb::Create(EstimatorOptionsOf(r), 0);
  FUZZ_CHECK(ducb.ok(), "DUcb::Create: %s", ducb.status().ToString().c_str());
  absl::StatusOr<std::unique_ptr<Expert>> uniform = MakeUniformExpert(r.num_arms(), r.num_features());
  FUZZ_CHECK(uniform.ok(), "the first expert: %s", uniform.status().ToString().c_str());
  // The batch schedule, at the start and far into the log.
  int64_t previous = 0;
  std::vector<int64_t> ts = {0, 1, int64_t{3} * r.num_arms(), 1000, int64_t{1} << 30,
                             int64_t{1} << 40};
  std::sort(ts.begin(), ts.end());
  for (int64_t t : ts) {
    const int64_t next = NextRefresh(r, t);
    FUZZ_CHECK(next > t && next >= previous, "NextRefresh(%lld) = %lld",
               static_cast<long long>(t), static_cast<long long>(next));
    previous = next;
  }
}

void RegisterExpert(const v1::RegisterExpertRequest& request) {
  constexpr double kProblemSmoothing = 0.05;
  absl::StatusOr<double> smoothing = ValidateRegisterExpertRequest(request, kProblemSmoothing);
  ExpectValidation(smoothing.status(), "ValidateRegisterExpertRequest");
  if (!smoothing.ok()) return;
  FUZZ_CHECK(*smoothing > 0 && *smoothing <= 1, "smoothing %g", *smoothing);
  absl::StatusOr<storage::v1::ExpertModelRecord> model = ModelRecordFromWire(request.model());
  ExpectValidation(model.status(), "ModelRecordFromWire");
  if (!model.ok()) return;
  // The shape of the XGBoost seeds (3 arms, 4 features).
  absl::StatusOr<std::unique_ptr<Expert>> expert = BuildExpert(*model, 3, 4, *smoothing);
  ExpectValidation(expert.status(), "BuildExpert");
  if (expert.ok()) fuzz::CheckPredictions(**expert, "registered model");
}

void Choose(const v1::ChooseRequest& request) {
  ExpectValidation(ValidateChooseRequest(request, 4, 3), "ValidateChooseRequest");
  const int d = request.features_size();
  const absl::Status s = ValidateChooseRequest(request, d, 3);
  ExpectValidation(s, "ValidateChooseRequest");
  if (!s.ok() || d > kMaxFeaturesPerProblem) return;
  // The features of an accepted Choose go to the experts: each must answer with a
  // distribution or INVALID_ARGUMENT.
  const std::vector<double> x(request.features().begin(), request.features().end());
  std::vector<double> weights(3 * static_cast<size_t>(d));
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = (i % 5) - 2.0;
  absl::StatusOr<std::unique_ptr<Expert>> linear =
      MakeLinearSoftmaxExpert(3, d, std::move(weights), {0.5, -0.5, 0.0});
  FUZZ_CHECK(linear.ok(), "%s", linear.status().ToString().c_str());
  // As the server scores it: restricted to the request's eligible arms.
  const std::vector<int32_t> eligible = EligibleArmsOf(request, 3);
  std::vector<double> probs(3);
  const absl::Status predicted = (*linear)->PredictEligible(x, eligible, absl::MakeSpan(probs));
  ExpectValidation(predicted, "Predict");
  if (predicted.ok()) {
    double total = 0;
    for (int a = 0; a < 3; ++a) {
      const double p = probs[a];
      const bool allowed =
          eligible.empty() || std::find(eligible.begin(), eligible.end(), a) != eligible.end();
      FUZZ_CHECK(std::isfinite(p) && (allowed ? p > 0 : p == 0), "arm %d probability %g", a,
                 p);
      total += p;
    }
    FUZZ_CHECK(std::abs(total - 1) < 1e-9, "sum %.17g", total);
  }
}

void Tokens(absl::string_view text) {
  absl::StatusOr<absl::flat_hash_map<std::string, TokenEntry>> tokens = ParseTokens(text);
  ExpectValidation(tokens.status(), "ParseTokens");
  if (!tokens.ok()) return;
  for (const auto& [hash, entry] : *tokens) {
    FUZZ_CHECK(hash.size() == 64, "hash '%s'", hash.c_str());
    FUZZ_CHECK(!entry.name.empty() && entry.name.size() <= 64, "name '%s'",
               entry.name.c_str());
    FUZZ_CHECK(entry.roles != 0 && entry.roles < 16, "roles %u", entry.roles);
  }
}

void Run(uint8_t selector, absl::string_view bytes) {
  switch (selector % 13) {
    case 0: {
      v1::CreateProblemRequest r;
      if (Parse(bytes, &r)) CreateProblem(r);
      break;
    }
    case 1: {
      v1::GetProblemRequest r;
      Parse(bytes, &r);
      break;
    }
    case 2: {
      v1::ListProblemsRequest r;
      Parse(bytes, &r);
      break;
    }
    case 3: {
      v1::RegisterExpertRequest r;
      if (Parse(bytes, &r)) RegisterExpert(r);
      break;
    }
    case 4: {
      v1::ListExpertsRequest r;
      Parse(bytes, &r);
      break;
    }
    case 5: {
      v1::RetireExpertRequest r;
      if (Parse(bytes, &r)) {
        const absl::Status s = ValidateRetireExpertRequest(r);
        ExpectValidation(s, "ValidateRetireExpertRequest");
        // Every id is well formed: one the problem does not have, negative ones included,
        // is NOT_FOUND when the call looks it up (d429e25).
        FUZZ_CHECK(s.ok(), "expert_id %d: %s", r.expert_id(), s.ToString().c_str());
      }
      break;
    }
    case 6: {
      v1::ChooseRequest r;
      if (Parse(bytes, &r)) Choose(r);
      break;
    }
    case 7: {
      v1::RewardRequest r;
      if (Parse(bytes, &r)) {
        const absl::Status s = ValidateRewardRequest(r);
        ExpectValidation(s, "ValidateRewardRequest");
        if (s.ok()) FUZZ_CHECK(r.value() >= 0 && r.value() <= 1, "reward %g", r.value());
      }
      break;
    }
    case 8: {
      v1::GetEstimatesRequest r;
      Parse(bytes, &r);
      break;
    }
    case 9: {
      v1::TrainExpertsRequest r;
      if (Parse(bytes, &r)) {
        const absl::Status s = ValidateTrainExpertsRequest(r);
        ExpectValidation(s, "ValidateTrainExpertsRequest");
        if (s.ok()) {
          FUZZ_CHECK(r.tree_experts() >= 0 && r.linear_experts() >= 0 &&
                         r.tree_experts() + r.linear_experts() <= kMaxExpertsPerTrainingJob,
                     "%d trees and %d linear", r.tree_experts(), r.linear_experts());
        }
      }
      break;
    }
    case 10: {
      v1::ExportLogRequest r;
      if (Parse(bytes, &r)) ExpectValidation(ValidateExportLogRequest(r), "ExportLog");
      break;
    }
    case 11: {
      // The same bytes as both requests: a new case would renumber the corpus' selectors.
      v1::ListAuditLogRequest r;
      if (Parse(bytes, &r)) ExpectValidation(ValidateListAuditLogRequest(r), "ListAuditLog");
      v1::GetTrainingJobRequest job;
      if (Parse(bytes, &job)) {
        const absl::Status s = ValidateGetTrainingJobRequest(job);
        ExpectValidation(s, "ValidateGetTrainingJobRequest");
        if (s.ok()) FUZZ_CHECK(job.job_id() >= 1, "job id %lld", (long long)job.job_id());
      }
      break;
    }
    case 12:
      Tokens(bytes);
      break;
  }
}

}  // namespace
}  // namespace decision::server

extern "C" int DECISION_FUZZ_ENTRY(const uint8_t* data, size_t size) {
  decision::fuzz::Input in(data, size);
  const uint8_t selector = in.Byte();
  decision::server::Run(selector, in.Rest());
  return 0;
}
