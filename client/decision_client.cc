#include "client/decision_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <random>
#include <thread>

namespace decision::client {
namespace {

std::string RandomEventId() {
  static thread_local std::mt19937_64 gen(std::random_device{}() ^
                                          (static_cast<uint64_t>(std::random_device{}()) << 32));
  char buf[34];
  std::snprintf(buf, sizeof(buf), "c%016llx%016llx", static_cast<unsigned long long>(gen()),
                static_cast<unsigned long long>(gen()));
  return buf;
}

// Whether gRPC may send `value` as an ASCII header value (printable, no newline): it aborts
// the process on one it may not.
bool IsHeaderValue(const std::string& value) {
  for (const char c : value) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

DecisionClient::DecisionClient(const ClientOptions& options) : options_(options) {
  grpc::ChannelArguments args;
  const int max_message = static_cast<int>(
      std::clamp<int64_t>(options.max_message_bytes, 0, std::numeric_limits<int>::max()));
  args.SetMaxReceiveMessageSize(max_message);
  args.SetMaxSendMessageSize(max_message);
  // gRPC waits 1 s, then 1.6 times longer each time, before it connects again to a server
  // that went away: longer than the retries' whole backoff (50 + 100 + 200 ms), so a client
  // whose server restarted in a second kept failing for seconds after it was back.
  if (options.reconnect_backoff_ms > 0) {
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, options.reconnect_backoff_ms);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, options.reconnect_backoff_ms);
  }
  if (options.max_reconnect_backoff_ms > 0) {
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, options.max_reconnect_backoff_ms);
  }
  if (!IsHeaderValue(options.token)) {
    status_ = absl::InvalidArgumentError(
        "the token has a byte that cannot be sent in a header (a newline, or one outside "
        "printable ASCII): strip it");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls.enabled) {
    grpc::SslCredentialsOptions ssl;
    const std::pair<const std::string*, std::string*> files[] = {
        {&options.tls.ca_file, &ssl.pem_root_certs},
        {&options.tls.cert_file, &ssl.pem_cert_chain},
        {&options.tls.key_file, &ssl.pem_private_key}};
    for (const auto& [path, pem] : files) {
      if (path->empty()) continue;
      std::ifstream in(*path, std::ios::binary);
      std::stringstream text;
      text << in.rdbuf();
      if (!in || text.str().empty()) {
        status_ = absl::InvalidArgumentError("cannot read TLS file " + *path);
      }
      *pem = text.str();
    }
    if (options.tls.cert_file.empty() != options.tls.key_file.empty()) {
      status_ = absl::InvalidArgumentError("a TLS client certificate needs its key, and back");
    }
    if (!options.tls.server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls.server_name);
    }
    credentials = grpc::SslCredentials(ssl);
  }
  stub_ = v1::DecisionService::NewStub(
      grpc::CreateCustomChannel(options.address, credentials, args));
}

// The problem a request is about: its problem_id field, or the one problem every request
// of a ChooseBatch names; empty otherwise (ListProblems, ListAuditLog, a batch of several
// problems).
static std::string RoutingProblem(const google::protobuf::Message& request) {
  const google::protobuf::Descriptor* d = request.GetDescriptor();
  const google::protobuf::Reflection* r = request.GetReflection();
  if (const google::protobuf::FieldDescriptor* f = d->FindFieldByName("problem_id");
      f != nullptr && f->type() == google::protobuf::FieldDescriptor::TYPE_STRING &&
      !f->is_repeated()) {
    return r->GetString(request, f);
  }
  if (const auto* batch = dynamic_cast<const v1::ChooseBatchRequest*>(&request)) {
    std::string problem;
    for (const v1::ChooseRequest& c : batch->requests()) {
      if (!problem.empty() && c.problem_id() != problem) return "";
      problem = c.problem_id();
    }
    return problem;
  }
  return "";
}

void DecisionClient::Prepare(grpc::ClientContext* ctx,
                             std::chrono::system_clock::duration deadline,
                             const google::protobuf::Message& request) const {
  ctx->set_deadline(std::chrono::system_clock::now() + deadline);
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  // What a proxy routes on (deploy/haproxy): the problem's owner serves the call. An id
  // that cannot be a header value is no problem id either: sent without the header, the
  // server says what is wrong with it (INVALID_ARGUMENT).
  if (std::string problem = RoutingProblem(request);
      !problem.empty() && IsHeaderValue(problem)) {
    ctx->AddMetadata(std::string(kProblemHeader), problem);
  }
}

template <typename Response, typename Call>
absl::StatusOr<Response> DecisionClient::Unary(int attempts,
                                               const google::protobuf::Message& request,
                                               Call&& call) {
  int64_t backoff_ms = options_.initial_backoff_ms;
  grpc::Status status;
  if (!status_.ok()) return status_;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext ctx;
    Prepare(&ctx, std::chrono::milliseconds(options_.deadline_ms), request);
    Response response;
    status = call(&ctx, &response);
    if (status.ok()) return response;
    // CANCELLED too: this client never cancels a call, so the server did (a call it had
    // not started when it began to shut down).
    if ((status.error_code() != grpc::StatusCode::UNAVAILABLE &&
         status.error_code() != grpc::StatusCode::CANCELLED) ||
        attempt >= attempts) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms *= 2;
  }
  return FromGrpc(status);
}

absl::StatusOr<v1::Problem> DecisionClient::CreateProblem(const std::string& problem_id,
                                                          const v1::ProblemConfig& config) {
  v1::CreateProblemRequest request;
  request.set_problem_id(problem_id);
  *request.mutable_config() = config;
  int calls = 0;
  absl::StatusOr<v1::Problem> result =
      Unary<v1::Problem>(options_.max_attempts, request,
                         [&](grpc::ClientContext* ctx, v1::Problem* r) {
        ++calls;
        return stub_->CreateProblem(ctx, request, r);
      });
  if (calls > 1 && absl::IsAlreadyExists(result.status())) return GetProblem(problem_id);
  return result;
}

absl::StatusOr<v1::Problem> DecisionClient::GetProblem(const std::string& problem_id) {
  v1::GetProblemRequest request;
  request.set_problem_id(problem_id);
  return Unary<v1::Problem>(options_.max_attempts, request,
                            [&](grpc::ClientContext* ctx, v1::Problem* r) {
    return stub_->GetProblem(ctx, request, r);
  });
}

absl::StatusOr<v1::ListProblemsResponse> DecisionClient::ListProblems() {
  const v1::ListProblemsRequest request;
  return Unary<v1::ListProblemsResponse>(
      options_.max_attempts, request, [&](grpc::ClientContext* ctx, v1::ListProblemsResponse* r) {
        return stub_->ListProblems(ctx, request, r);
      });
}

absl::StatusOr<v1::Expert> DecisionClient::RegisterExpert(const std::string& problem_id,
                                                          const std::string& name,
                                                          const v1::ExpertModel& model,
                                                          bool shadow) {
  v1::RegisterExpertRequest request;
  request.set_problem_id(problem_id);
  request.set_name(name);
  *request.mutable_model() = model;
  request.set_shadow(shadow);
  return Unary<v1::Expert>(1, request, [&](grpc::ClientContext* ctx, v1::Expert* r) {
    return stub_->RegisterExpert(ctx, request, r);
  });
}

absl::StatusOr<v1::Expert> DecisionClient::Promote(const std::string& problem_id,
                                                   int expert_id) {
  v1::PromoteRequest request;
  request.set_problem_id(problem_id);
  request.set_expert_id(expert_id);
  return Unary<v1::Expert>(1, request, [&](grpc::ClientContext* ctx, v1::Expert* r) {
    return stub_->Promote(ctx, request, r);
  });
}

absl::StatusOr<v1::Expert> DecisionClient::Demote(const std::string& problem_id,
                                                  int expert_id) {
  v1::PromoteRequest request;
  request.set_problem_id(problem_id);
  request.set_expert_id(expert_id);
  return Unary<v1::Expert>(1, request, [&](grpc::ClientContext* ctx, v1::Expert* r) {
    return stub_->Demote(ctx, request, r);
  });
}

absl::StatusOr<v1::ModelEvaluation> DecisionClient::EvaluateModel(
    const std::string& problem_id, const v1::ExpertModel& model, double clip) {
  v1::EvaluateModelRequest request;
  request.set_problem_id(problem_id);
  *request.mutable_model() = model;
  request.set_clip(clip);
  // A read: retried on UNAVAILABLE like the other reads.
  return Unary<v1::ModelEvaluation>(
      options_.max_attempts, request, [&](grpc::ClientContext* ctx, v1::ModelEvaluation* r) {
        return stub_->EvaluateModel(ctx, request, r);
      });
}

absl::StatusOr<v1::ListExpertsResponse> DecisionClient::ListExperts(
    const std::string& problem_id) {
  v1::ListExpertsRequest request;
  request.set_problem_id(problem_id);
  return Unary<v1::ListExpertsResponse>(
      options_.max_attempts, request, [&](grpc::ClientContext* ctx, v1::ListExpertsResponse* r) {
        return stub_->ListExperts(ctx, request, r);
      });
}

absl::StatusOr<v1::Expert> DecisionClient::RetireExpert(const std::string& problem_id,
                                                        int expert_id) {
  v1::RetireExpertRequest request;
  request.set_problem_id(problem_id);
  request.set_expert_id(expert_id);
  return Unary<v1::Expert>(1, request, [&](grpc::ClientContext* ctx, v1::Expert* r) {
    return stub_->RetireExpert(ctx, request, r);
  });
}

absl::StatusOr<v1::Problem> DecisionClient::SetRetention(const std::string& problem_id,
                                                         const v1::RetentionConfig& retention) {
  v1::SetRetentionRequest request;
  request.set_problem_id(problem_id);
  *request.mutable_retention() = retention;
  return Unary<v1::Problem>(1, request, [&](grpc::ClientContext* ctx, v1::Problem* r) {
    return stub_->SetRetention(ctx, request, r);
  });
}

absl::StatusOr<v1::DeleteEventsResponse> DecisionClient::DeleteEvents(
    const std::string& problem_id, const std::vector<std::string>& ids) {
  v1::DeleteEventsRequest request;
  request.set_problem_id(problem_id);
  for (const std::string& id : ids) request.add_event_ids(id);
  return Unary<v1::DeleteEventsResponse>(
      1, request, [&](grpc::ClientContext* ctx, v1::DeleteEventsResponse* r) {
        return stub_->DeleteEvents(ctx, request, r);
      });
}

absl::StatusOr<v1::ChooseResponse> DecisionClient::Choose(const std::string& problem_id,
                                                          absl::Span<const double> features,
                                                          std::string event_id) {
  v1::ChooseRequest request;
  request.set_problem_id(problem_id);
  request.mutable_features()->Add(features.begin(), features.end());
  request.set_event_id(std::move(event_id));
  return Choose(std::move(request));
}

absl::StatusOr<v1::ChooseResponse> DecisionClient::Choose(v1::ChooseRequest request) {
  if (request.event_id().empty()) request.set_event_id(RandomEventId());
  return Unary<v1::ChooseResponse>(
      options_.max_attempts, request, [&](grpc::ClientContext* ctx, v1::ChooseResponse* r) {
        return stub_->Choose(ctx, request, r);
      });
}

absl::StatusOr<v1::ChooseSlateResponse> DecisionClient::ChooseSlate(
    v1::ChooseSlateRequest request) {
  if (request.event_id().empty()) request.set_event_id(RandomEventId());
  return Unary<v1::ChooseSlateResponse>(
      options_.max_attempts, request, [&](grpc::ClientContext* ctx, v1::ChooseSlateResponse* r) {
        return stub_->ChooseSlate(ctx, request, r);
      });
}

absl::StatusOr<v1::ChooseBatchResponse> DecisionClient::ChooseBatch(
    v1::ChooseBatchRequest request) {
  for (v1::ChooseRequest& r : *request.mutable_requests()) {
    if (r.event_id().empty()) r.set_event_id(RandomEventId());
  }
  return Unary<v1::ChooseBatchResponse>(
      options_.max_attempts, request, [&](grpc::ClientContext* ctx, v1::ChooseBatchResponse* r) {
        return stub_->ChooseBatch(ctx, request, r);
      });
}

absl::StatusOr<bool> DecisionClient::Activate(const std::string& problem_id,
                                              const std::string& event_id) {
  v1::ActivateRequest request;
  request.set_problem_id(problem_id);
  request.set_event_id(event_id);
  absl::StatusOr<v1::ActivateResponse> r = Unary<v1::ActivateResponse>(
      options_.max_attempts, request, [&](grpc::ClientContext* ctx, v1::ActivateResponse* resp) {
        return stub_->Activate(ctx, request, resp);
      });
  if (!r.ok()) return r.status();
  return r->first();
}

absl::StatusOr<bool> DecisionClient::Reward(const std::string& problem_id,
                                            const std::string& event_id, double value) {
  v1::RewardRequest request;
  request.set_problem_id(problem_id);
  request.set_event_id(event_id);
  request.set_value(value);
  absl::StatusOr<v1::RewardResponse> r = Unary<v1::RewardResponse>(
      options_.max_attempts, request, [&](grpc::ClientContext* ctx, v1::RewardResponse* resp) {
        return stub_->Reward(ctx, request, resp);
      });
  if (!r.ok()) return r.status();
  return r->first();
}

absl::StatusOr<v1::Explanation> DecisionClient::Explain(const std::string& problem_id,
                                                        const std::string& event_id) {
  v1::ExplainRequest request;
  request.set_problem_id(problem_id);
  request.set_event_id(event_id);
  return Unary<v1::Explanation>(options_.max_attempts, request,
                                [&](grpc::ClientContext* ctx, v1::Explanation* r) {
                                  return stub_->Explain(ctx, request, r);
                                });
}

absl::StatusOr<v1::Estimates> DecisionClient::GetEstimates(const std::string& problem_id) {
  v1::GetEstimatesRequest request;
  request.set_problem_id(problem_id);
  return Unary<v1::Estimates>(options_.max_attempts, request,
                              [&](grpc::ClientContext* ctx, v1::Estimates* r) {
                                return stub_->GetEstimates(ctx, request, r);
                              });
}

absl::StatusOr<v1::TrainExpertsResponse> DecisionClient::TrainExperts(
    const std::string& problem_id, int tree_experts, int linear_experts) {
  v1::TrainExpertsRequest request;
  request.set_problem_id(problem_id);
  request.set_tree_experts(tree_experts);
  request.set_linear_experts(linear_experts);
  return Unary<v1::TrainExpertsResponse>(
      1, request, [&](grpc::ClientContext* ctx, v1::TrainExpertsResponse* r) {
        return stub_->TrainExperts(ctx, request, r);
      });
}

absl::StatusOr<v1::TrainingJob> DecisionClient::GetTrainingJob(const std::string& problem_id,
                                                               int64_t job_id) {
  v1::GetTrainingJobRequest request;
  request.set_problem_id(problem_id);
  request.set_job_id(job_id);
  return Unary<v1::TrainingJob>(options_.max_attempts, request,
                                [&](grpc::ClientContext* ctx, v1::TrainingJob* r) {
                                  return stub_->GetTrainingJob(ctx, request, r);
                                });
}

absl::StatusOr<v1::BeginMoveResponse> DecisionClient::BeginMove(const std::string& problem_id,
                                                                const std::string& to_replica,
                                                                bool catch_up) {
  v1::BeginMoveRequest request;
  request.set_problem_id(problem_id);
  request.set_to_replica(to_replica);
  request.set_catch_up(catch_up);
  return Unary<v1::BeginMoveResponse>(1, request,
                                      [&](grpc::ClientContext* ctx, v1::BeginMoveResponse* r) {
                                        return stub_->BeginMove(ctx, request, r);
                                      });
}

absl::StatusOr<v1::ExportProblemResponse> DecisionClient::ExportProblem(
    const v1::ExportProblemRequest& request) {
  return Unary<v1::ExportProblemResponse>(
      options_.max_attempts, request, [&](grpc::ClientContext* ctx, v1::ExportProblemResponse* r) {
        return stub_->ExportProblem(ctx, request, r);
      });
}

absl::StatusOr<v1::ImportProblemResponse> DecisionClient::ImportProblem(
    const v1::ImportProblemRequest& request) {
  return Unary<v1::ImportProblemResponse>(
      1, request, [&](grpc::ClientContext* ctx, v1::ImportProblemResponse* r) {
        return stub_->ImportProblem(ctx, request, r);
      });
}

absl::Status DecisionClient::EndMove(const std::string& problem_id, bool abort,
                                     const std::string& to_replica) {
  v1::EndMoveRequest request;
  request.set_problem_id(problem_id);
  request.set_abort(abort);
  request.set_to_replica(to_replica);
  return Unary<v1::EndMoveResponse>(options_.max_attempts, request,
                                    [&](grpc::ClientContext* ctx, v1::EndMoveResponse* r) {
                                      return stub_->EndMove(ctx, request, r);
                                    })
      .status();
}

absl::Status DecisionClient::ExportLog(
    const std::string& problem_id, int64_t start, int64_t limit,
    const std::function<absl::Status(const v1::LoggedSample&)>& fn, v1::ExportFormat format) {
  v1::ExportLogRequest request;
  request.set_problem_id(problem_id);
  request.set_start(start);
  request.set_limit(limit);
  request.set_format(format);
  if (!status_.ok()) return status_;
  grpc::ClientContext ctx;
  // A whole-log export can be long: the deadline scales with nothing we know, so give it an
  // hour; cancel by returning an error from fn.
  Prepare(&ctx, std::chrono::hours(1), request);
  std::unique_ptr<grpc::ClientReader<v1::LoggedSample>> reader =
      stub_->ExportLog(&ctx, request);
  v1::LoggedSample sample;
  while (reader->Read(&sample)) {
    if (absl::Status s = fn(sample); !s.ok()) {
      ctx.TryCancel();
      reader->Finish().ok();
      return s;
    }
  }
  return FromGrpc(reader->Finish());
}

absl::StatusOr<v1::ListAuditLogResponse> DecisionClient::ListAuditLog(int64_t start, int limit) {
  v1::ListAuditLogRequest request;
  request.set_start(start);
  request.set_limit(limit);
  return Unary<v1::ListAuditLogResponse>(
      options_.max_attempts, request, [&](grpc::ClientContext* ctx, v1::ListAuditLogResponse* r) {
        return stub_->ListAuditLog(ctx, request, r);
      });
}

}  // namespace decision::client
