// A C++ client of the decision service (decision.v1). Depends only on the generated API.
//
// Every call has a deadline. Calls that are safe to repeat are retried, with exponential
// backoff, when the server is UNAVAILABLE or CANCELLED the call (a server shutting down; the
// client itself never cancels), and only then: Choose (the client sends an event id, so a
// retry returns the same decision), Reward (a repeated reward is not counted twice), and all
// reads. CreateProblem is retried too and reports success if a retry finds the problem its
// lost first attempt created. RegisterExpert and RetireExpert are not retried: a lost
// response leaves the caller to check ListExperts. The channel connects again to a server
// that went away after 100 ms, then at most every second (ClientOptions), so that the
// retries of a call meet a server that restarted.
//
// A token that cannot be sent as a header value (a trailing newline) makes every call
// INVALID_ARGUMENT (status()); a problem id that cannot is sent without the routing header,
// and the server refuses it as no problem id. gRPC itself would abort the process.
//
// Thread safety: a DecisionClient may be used from any number of threads.
#ifndef DECISION_CLIENT_DECISION_CLIENT_H_
#define DECISION_CLIENT_DECISION_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "decision/v1/decision.grpc.pb.h"

namespace decision::client {

// The call metadata naming the problem a call is about, set on every problem-scoped call
// (every call with a problem_id, and a ChooseBatch whose requests all name one problem). A
// proxy routes on it to the problem's owner (deploy/README.md, "Sharding problems across
// replicas"); clients in other languages set it themselves.
inline constexpr std::string_view kProblemHeader = "x-decision-problem";

// TLS to decisiond (its --tls_cert/--tls_key, and --tls_client_ca for mutual TLS).
struct TlsOptions {
  bool enabled = false;
  std::string ca_file;      // PEM roots that signed the server's certificate ("": system roots)
  std::string cert_file;    // PEM client certificate chain, for mutual TLS
  std::string key_file;     // its private key
  std::string server_name;  // expected name in the server's certificate ("": the host)
};

struct ClientOptions {
  std::string address = "127.0.0.1:50051";
  // Sent as "authorization: Bearer <token>" on every call when not empty (decisiond
  // --tokens_file). Never logged.
  std::string token;
  TlsOptions tls;
  int64_t deadline_ms = 5000;      // per attempt
  int max_attempts = 4;            // 1 = no retries
  int64_t initial_backoff_ms = 50;  // doubled after each UNAVAILABLE or CANCELLED
  int64_t max_message_bytes = 64 << 20;
  // How long the channel waits before it connects again to a server that went away: the
  // first wait, and the most it grows to (x1.6 each time). 0: gRPC's own (1 s, up to
  // 120 s), which outlasts the retries above, so a call fails for seconds after a restart
  // (bench/README.md, "The client across a server restart").
  int reconnect_backoff_ms = 100;
  int max_reconnect_backoff_ms = 1000;
};

class DecisionClient {
 public:
  // A TLS file that cannot be read makes every call fail with INVALID_ARGUMENT (see
  // status()).
  explicit DecisionClient(const ClientOptions& options);
  // OK, or why the client cannot call (an unreadable TLS file).
  const absl::Status& status() const { return status_; }

  absl::StatusOr<v1::Problem> CreateProblem(const std::string& problem_id,
                                            const v1::ProblemConfig& config);
  absl::StatusOr<v1::Problem> GetProblem(const std::string& problem_id);
  absl::StatusOr<v1::ListProblemsResponse> ListProblems();
  absl::StatusOr<v1::Expert> RegisterExpert(const std::string& problem_id,
                                            const std::string& name,
                                            const v1::ExpertModel& model, bool shadow = false);
  // Shadow experts (RegisterExpert with shadow): Promote makes one selectable, Demote
  // returns one to shadow mode. Not retried (admin changes).
  absl::StatusOr<v1::Expert> Promote(const std::string& problem_id, int expert_id);
  absl::StatusOr<v1::Expert> Demote(const std::string& problem_id, int expert_id);
  // Off-policy estimates of `model` over the problem's retained log (clip 0: 100).
  absl::StatusOr<v1::ModelEvaluation> EvaluateModel(const std::string& problem_id,
                                                    const v1::ExpertModel& model,
                                                    double clip = 0.0);
  absl::StatusOr<v1::ListExpertsResponse> ListExperts(const std::string& problem_id);
  absl::StatusOr<v1::Expert> RetireExpert(const std::string& problem_id, int expert_id);
  // Not retried (an admin change: the caller reads the problem back if unsure).
  absl::StatusOr<v1::Problem> SetRetention(const std::string& problem_id,
                                           const v1::RetentionConfig& retention);
  // Not retried: a retry would report the events deleted by the first attempt as not found.
  absl::StatusOr<v1::DeleteEventsResponse> DeleteEvents(const std::string& problem_id,
                                                        const std::vector<std::string>& ids);
  // An empty event_id is replaced by a random one, so that retries stay idempotent.
  absl::StatusOr<v1::ChooseResponse> Choose(const std::string& problem_id,
                                            absl::Span<const double> features,
                                            std::string event_id = "");
  // The same with every field of the request (eligible arms, ...); an empty event_id is
  // replaced by a random one.
  absl::StatusOr<v1::ChooseResponse> Choose(v1::ChooseRequest request);
  // A slate: one arm per slot, none twice (v1::ChooseSlateRequest). An empty event_id is
  // replaced by a random one; reward slot s as "<event_id>/<s>".
  absl::StatusOr<v1::ChooseSlateResponse> ChooseSlate(v1::ChooseSlateRequest request);
  // Independent decisions in one call; each request without an event id gets a random
  // one, so that a retry returns the same decisions.
  absl::StatusOr<v1::ChooseBatchResponse> ChooseBatch(v1::ChooseBatchRequest request);
  // Makes a decision chosen with ChooseRequest.deferred learnable (it was shown). Returns
  // true if this activated it (false: activated already, or not deferred).
  absl::StatusOr<bool> Activate(const std::string& problem_id, const std::string& event_id);
  // Returns true if this was the event's first reward.
  absl::StatusOr<bool> Reward(const std::string& problem_id, const std::string& event_id,
                              double value);
  absl::StatusOr<v1::Estimates> GetEstimates(const std::string& problem_id);
  // Why the decision of `event_id` was made (v1::Explanation).
  absl::StatusOr<v1::Explanation> Explain(const std::string& problem_id,
                                          const std::string& event_id);
  // Queues training of new experts from the log (0, 0: the defaults, 3 trees + 1 linear).
  // The response's job_id names the durable job (poll it with GetTrainingJob; a job that
  // was already queued is joined, joined_queued_job). Not retried: a lost response may
  // already have queued the job (job ids are dense per problem: GetTrainingJob of the ids
  // after the last one known finds it).
  absl::StatusOr<v1::TrainExpertsResponse> TrainExperts(const std::string& problem_id,
                                                        int tree_experts, int linear_experts);
  // The state of a training job: QUEUED, RUNNING, then SUCCEEDED (expert_ids) or FAILED
  // (error). NOT_FOUND for a job the problem never had.
  absl::StatusOr<v1::TrainingJob> GetTrainingJob(const std::string& problem_id, int64_t job_id);
  // Streams samples [start, start + limit) (limit 0: all) to fn; stops at fn's first error.
  // Not retried (a partial stream was already delivered). EXPORT_FORMAT_DSJSON: each sample
  // also carries its DSJSON line (LoggedSample.dsjson).
  absl::Status ExportLog(const std::string& problem_id, int64_t start, int64_t limit,
                         const std::function<absl::Status(const v1::LoggedSample&)>& fn,
                         v1::ExportFormat format = v1::EXPORT_FORMAT_UNSPECIFIED);
  // Audit log entries [start, start + limit) (limit 0: the server's page of 100).
  absl::StatusOr<v1::ListAuditLogResponse> ListAuditLog(int64_t start, int limit);

  // Moving a problem (decision.proto; decisionctl move-problem). Sent to the replica this
  // client is connected to, not through a proxy. BeginMove and ImportProblem are not
  // retried (a repeated BeginMove finds the problem moving, a repeated commit finds it
  // imported); ExportProblem (a read) and EndMove (which answers OK again once done) are.
  absl::StatusOr<v1::BeginMoveResponse> BeginMove(const std::string& problem_id,
                                                  const std::string& to_replica,
                                                  bool catch_up = false);
  absl::StatusOr<v1::ExportProblemResponse> ExportProblem(const v1::ExportProblemRequest& request);
  absl::StatusOr<v1::ImportProblemResponse> ImportProblem(const v1::ImportProblemRequest& request);
  absl::Status EndMove(const std::string& problem_id, bool abort,
                       const std::string& to_replica = "");

 private:
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(int attempts, const google::protobuf::Message& request,
                                 Call&& call);
  // The deadline, the token and the routing header of `request`.
  void Prepare(grpc::ClientContext* ctx, std::chrono::system_clock::duration deadline,
               const google::protobuf::Message& request) const;

  ClientOptions options_;
  absl::Status status_;
  std::unique_ptr<v1::DecisionService::Stub> stub_;
};

// grpc::Status -> absl::Status (the client's one conversion point).
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace decision::client

#endif  // DECISION_CLIENT_DECISION_CLIENT_H_
