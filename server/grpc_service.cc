#include "server/grpc_service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/stubs/logging.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/log_limiter.h"
#include "server/validation.h"

namespace decision::server {
namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "OTHER";
  }
}


void LimitedProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                        const std::string& message) {
  static LogLimiter* const limiter = new LogLimiter(10'000);
  const std::string text = absl::StrCat("libprotobuf ", filename, ":", line, ": ", message);
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    std::fprintf(stderr, "decisiond: %s\n", text.c_str());
    return;
  }
  limiter->Report(absl::ToUnixMillis(absl::Now()), text);
}

}  // namespace

void LimitProtobufLogs() { google::protobuf::SetLogHandler(&LimitedProtobufLog); }

std::string BoundedMessage(absl::string_view message, size_t max_bytes) {
  if (message.size() <= max_bytes) return std::string(message);
  // Cut before a UTF-8 continuation byte, not inside a character.
  size_t keep = max_bytes;
  while (keep > 0 && (static_cast<unsigned char>(message[keep]) & 0xC0) == 0x80) --keep;
  return absl::StrCat(message.substr(0, keep), "... (", message.size(), " bytes in all)");
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering. A message can echo what the caller
  // sent: bounded, so that its trailer never passes a client's metadata limit (8 KiB by
  // default), which would turn the status into RESOURCE_EXHAUSTED.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      BoundedMessage(status.message(), kMaxStatusMessageBytes));
}

namespace {

struct MethodRole {
  const char* method;
  Role role;
};
// Every RPC of decision.v1 and the role it needs (auth.h). An RPC missing here needs admin,
// the strictest role.
constexpr MethodRole kMethodRoles[] = {
    {"Choose", Role::kDecide},           {"Reward", Role::kDecide},
    {"GetProblem", Role::kObserve},      {"ListProblems", Role::kObserve},
    {"ListExperts", Role::kObserve},     {"GetEstimates", Role::kObserve},
    {"ExportLog", Role::kExport},        {"CreateProblem", Role::kAdmin},
    {"RegisterExpert", Role::kAdmin},    {"RetireExpert", Role::kAdmin},
    {"TrainExperts", Role::kAdmin},      {"ListAuditLog", Role::kAdmin},
    {"GetTrainingJob", Role::kObserve},  {"SetRetention", Role::kAdmin},
    {"DeleteEvents", Role::kAdmin},      {"Explain", Role::kExport},
    {"Activate", Role::kDecide},         {"Promote", Role::kAdmin},
    {"Demote", Role::kAdmin},            {"EvaluateModel", Role::kAdmin},
    {"ChooseSlate", Role::kDecide},      {"ChooseBatch", Role::kDecide},
    {"BeginMove", Role::kAdmin},         {"ExportProblem", Role::kAdmin},
    {"ImportProblem", Role::kAdmin},     {"EndMove", Role::kAdmin},
};

// A model's kind for the audit log (its size for XGBoost bytes).
std::string AuditKind(const v1::ExpertModel& model) {
  switch (model.kind_case()) {
    case v1::ExpertModel::kUniform: return "uniform";
    case v1::ExpertModel::kTable: return "table";
    case v1::ExpertModel::kLinearSoftmax: return "linear_softmax";
    case v1::ExpertModel::kXgboost:
      return absl::StrCat("xgboost (", model.xgboost().model().size(), " bytes)");
    default: return "none";
  }
}

// Administrative calls are audited; reading the audit log is not an action.
bool Audited(absl::string_view method) {
  return GrpcDecisionService::RoleOf(method) == Role::kAdmin && method != "ListAuditLog";
}

}  // namespace

Role GrpcDecisionService::RoleOf(absl::string_view method) {
  for (const MethodRole& m : kMethodRoles) {
    if (method == m.method) return m.role;
  }
  return Role::kAdmin;  // unreachable for the RPCs above; the strictest role otherwise
}

absl::StatusOr<Grant> GrpcDecisionService::Authorize(grpc::CallbackServerContext* ctx,
                                                     const Call& call) const {
  const auto& metadata = ctx->client_metadata();
  const auto it = metadata.find("authorization");
  std::string value;
  if (it != metadata.end()) value.assign(it->second.data(), it->second.size());
  return auth_->Authorize(it == metadata.end() ? nullptr : &value, RoleOf(call.method),
                          call.problem_id, absl::Now());
}

absl::Status GrpcDecisionService::CheckRouting(grpc::CallbackServerContext* ctx,
                                               const Call& call) const {
  if (call.problem_id.empty()) return absl::OkStatus();
  const auto& metadata = ctx->client_metadata();
  // (A string_ref key: no allocation per call.)
  const grpc::string_ref key(kProblemMetadata.data(), kProblemMetadata.size());
  if (const auto it = metadata.find(key); it != metadata.end()) {
    const absl::string_view routed(it->second.data(), it->second.size());
    if (routed != call.problem_id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", kProblemMetadata, " metadata names problem ", routed.substr(0, 64),
          ", the request problem ", call.problem_id.substr(0, 64),
          ": a proxy routes by the metadata, so they must agree"));
    }
  }
  if (placement_ == nullptr || !call.routed) return absl::OkStatus();
  return placement_->Check(call.problem_id);
}

absl::Status GrpcDecisionService::CallerGone(grpc::CallbackServerContext* ctx) {
  // No decision for a caller that is gone: it could never be shown.
  if (ctx->IsCancelled()) {
    return absl::CancelledError("the call was cancelled before the decision");
  }
  if (ctx->deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError(
        "the call's deadline passed before the decision; no decision was made");
  }
  return absl::OkStatus();
}

void GrpcDecisionService::CountError(const char* method, const grpc::Status& status) {
  if (!status.ok()) metrics_->RpcErrors(method, CodeName(status.error_code())).Increment();
}

namespace {

// `bytes` parsed as a Message, or INVALID_ARGUMENT naming the message type.
template <typename Message>
grpc::Status ParseRequest(const grpc::ByteBuffer& bytes, Message* message) {
  grpc::ByteBuffer copy(bytes);  // Deserialize consumes its buffer; this copies references
  if (grpc::SerializationTraits<Message>::Deserialize(&copy, message).ok()) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("the request body is not a valid ",
                                   Message::descriptor()->full_name(),
                                   ": truncated or malformed, or a string field that is not "
                                   "valid UTF-8"));
}

}  // namespace

// One unary call: its request and response messages and its reactor. It answers once
// (Reply), serializing the response, and deletes itself when gRPC is done with it.
template <typename Request, typename Response>
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out) : ctx_(ctx), out_(out) {}

  Request request;
  Response response;
  // Run when gRPC is done with the call if an OK answer was produced but the call was
  // cancelled (by the client, its deadline or the connection) before its status was sent:
  // the client never had the answer.
  std::function<void()> on_lost;

  void Reply(grpc::Status status) {
    if (status.ok()) {
      bool own_buffer = false;
      status = grpc::SerializationTraits<Response>::Serialize(response, out_, &own_buffer);
      answered_ok_ = status.ok();
    }
    Finish(status);
  }
  void OnDone() override {
    if (answered_ok_ && on_lost && ctx_->IsCancelled()) on_lost();
    delete this;
  }
  // OnDone is trivial (a short lock at most, never a wait), so gRPC may run it on the thread
  // that completed the call rather than hand it to its executor, as it does for its own
  // DefaultReactor. The hand-off through gRPC's executor also hides the happens-before edge
  // from ThreadSanitizer (tests/sanitizer/grpc_tsan.cc covers the completion queues only).
  bool InternalInlineable() override { return true; }

 private:
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const out_;
  bool answered_ok_ = false;
};

template <typename Request, typename Response, typename Describe, typename Start>
grpc::ServerUnaryReactor* GrpcDecisionService::Serve(grpc::CallbackServerContext* ctx,
                                                     const char* method, const Bytes* in,
                                                     Bytes* out, Describe&& describe,
                                                     Start&& start) {
  auto* call = new UnaryCall<Request, Response>(ctx, out);
  const auto begin = std::chrono::steady_clock::now();
  if (grpc::Status parsed = ParseRequest(*in, &call->request); !parsed.ok()) {
    CountError(method, parsed);
    call->Reply(parsed);
    return call;
  }
  Call described = describe(call->request, call->response);
  absl::StatusOr<Grant> grant = Authorize(ctx, described);
  if (!grant.ok()) {
    const grpc::Status status = ToGrpcStatus(grant.status());
    CountError(method, status);
    call->Reply(status);
    return call;
  }
  if (absl::Status routed = CheckRouting(ctx, described); !routed.ok()) {
    const grpc::Status status = ToGrpcStatus(routed);
    CountError(method, status);
    call->Reply(status);
    return call;
  }
  std::function<void(const absl::Status&)> audit;
  if (Audited(method)) {
    // The problem id is the caller's, not yet validated, and the message and the detail
    // may echo what it sent: the record keeps at most 256 bytes of each.
    audit = [this, method, caller = grant->name,
             problem = std::string(described.problem_id.substr(0, kMaxAuditFieldBytes)),
             detail = std::move(described.audit_detail)](const absl::Status& s) {
      storage::v1::AuditRecord record;
      record.set_at_ms(absl::ToUnixMillis(absl::Now()));
      record.set_caller(caller);
      record.set_method(method);
      record.set_problem_id(problem);
      if (detail) record.set_detail(BoundedMessage(detail(), kMaxAuditFieldBytes));
      record.set_code(static_cast<int>(s.code()));
      record.set_message(BoundedMessage(s.message(), kMaxAuditFieldBytes));
      service_->RecordAudit(std::move(record));
    };
  }
  start(*grant, call, [this, call, method, begin, audit = std::move(audit)](absl::Status s) {
    if (audit) audit(s);
    const grpc::Status status = ToGrpcStatus(s);
    metrics_->RpcLatency(method).Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
    CountError(method, status);
    call->Reply(status);
  });
  return call;
}

// The handlers. `describe` names what the authorization and the audit log need; `start`
// queues (or does) the work.
#define DECISION_CALL(Req, Resp) UnaryCall<v1::Req, v1::Resp>* call

grpc::ServerUnaryReactor* GrpcDecisionService::CreateProblem(grpc::CallbackServerContext* ctx,
                                                             const Bytes* in, Bytes* out) {
  return Serve<v1::CreateProblemRequest, v1::Problem>(
      ctx, "CreateProblem", in, out,
      [](const v1::CreateProblemRequest& r, const auto&) {
        return Call{"CreateProblem", r.problem_id(), [] { return std::string(); }};
      },
      [this](const Grant&, DECISION_CALL(CreateProblemRequest, Problem), Done done) {
        service_->CreateProblem(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::GetProblem(grpc::CallbackServerContext* ctx,
                                                          const Bytes* in, Bytes* out) {
  return Serve<v1::GetProblemRequest, v1::Problem>(
      ctx, "GetProblem", in, out,
      [](const v1::GetProblemRequest& r, const auto&) { return Call{"GetProblem", r.problem_id(), nullptr}; },
      [this](const Grant&, DECISION_CALL(GetProblemRequest, Problem), Done done) {
        service_->GetProblem(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::ListProblems(grpc::CallbackServerContext* ctx,
                                                            const Bytes* in, Bytes* out) {
  return Serve<v1::ListProblemsRequest, v1::ListProblemsResponse>(
      ctx, "ListProblems", in, out,
      [](const v1::ListProblemsRequest&, const auto&) { return Call{"ListProblems", "", nullptr}; },
      [this](const Grant& grant, DECISION_CALL(ListProblemsRequest, ListProblemsResponse),
             Done done) {
        absl::Status s = service_->ListProblems(call->request, &call->response);
        if (s.ok() && !grant.problems.empty()) {
          // A scoped token sees only its own problems.
          auto* problems = call->response.mutable_problems();
          problems->erase(std::remove_if(problems->begin(), problems->end(),
                                         [&](const v1::Problem& p) {
                                           return !grant.Covers(p.problem_id());
                                         }),
                          problems->end());
        }
        done(s);
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::RegisterExpert(grpc::CallbackServerContext* ctx,
                                                              const Bytes* in, Bytes* out) {
  return Serve<v1::RegisterExpertRequest, v1::Expert>(
      ctx, "RegisterExpert", in, out,
      [](const v1::RegisterExpertRequest& r, const v1::Expert& registered) {
        auto detail = [&r, &registered] {
          return absl::StrCat("name=", r.name().substr(0, 128), " kind=", AuditKind(r.model()),
                              registered.expert_id() > 0
                                  ? absl::StrCat(" -> expert ", registered.expert_id())
                                  : "");
        };
        return Call{"RegisterExpert", r.problem_id(), std::move(detail)};
      },
      [this](const Grant&, DECISION_CALL(RegisterExpertRequest, Expert), Done done) {
        service_->RegisterExpert(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::ListExperts(grpc::CallbackServerContext* ctx,
                                                           const Bytes* in, Bytes* out) {
  return Serve<v1::ListExpertsRequest, v1::ListExpertsResponse>(
      ctx, "ListExperts", in, out,
      [](const v1::ListExpertsRequest& r, const auto&) { return Call{"ListExperts", r.problem_id(), nullptr}; },
      [this](const Grant&, DECISION_CALL(ListExpertsRequest, ListExpertsResponse), Done done) {
        service_->ListExperts(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::RetireExpert(grpc::CallbackServerContext* ctx,
                                                            const Bytes* in, Bytes* out) {
  return Serve<v1::RetireExpertRequest, v1::Expert>(
      ctx, "RetireExpert", in, out,
      [](const v1::RetireExpertRequest& r, const auto&) {
        return Call{"RetireExpert", r.problem_id(),
                    [&r] { return absl::StrCat("expert ", r.expert_id()); }};
      },
      [this](const Grant&, DECISION_CALL(RetireExpertRequest, Expert), Done done) {
        service_->RetireExpert(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::SetRetention(grpc::CallbackServerContext* ctx,
                                                            const Bytes* in, Bytes* out) {
  return Serve<v1::SetRetentionRequest, v1::Problem>(
      ctx, "SetRetention", in, out,
      [](const v1::SetRetentionRequest& r, const auto&) {
        return Call{"SetRetention", r.problem_id(), [&r] {
                      return absl::StrCat("max_samples ", r.retention().max_samples(),
                                          ", max_age_ms ", r.retention().max_age_ms());
                    }};
      },
      [this](const Grant&, DECISION_CALL(SetRetentionRequest, Problem), Done done) {
        service_->SetRetention(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::DeleteEvents(grpc::CallbackServerContext* ctx,
                                                            const Bytes* in, Bytes* out) {
  return Serve<v1::DeleteEventsRequest, v1::DeleteEventsResponse>(
      ctx, "DeleteEvents", in, out,
      [](const v1::DeleteEventsRequest& r, const auto&) {
        // The audit names how many, not which (the ids may identify the user).
        return Call{"DeleteEvents", r.problem_id(),
                    [&r] { return absl::StrCat(r.event_ids_size(), " event ids"); }};
      },
      [this](const Grant&, DECISION_CALL(DeleteEventsRequest, DeleteEventsResponse), Done done) {
        service_->DeleteEvents(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::Choose(grpc::CallbackServerContext* ctx,
                                                      const Bytes* in, Bytes* out) {
  return Serve<v1::ChooseRequest, v1::ChooseResponse>(
      ctx, "Choose", in, out,
      [](const v1::ChooseRequest& r, const auto&) { return Call{"Choose", r.problem_id(), nullptr}; },
      [this, ctx](const Grant&, DECISION_CALL(ChooseRequest, ChooseResponse), Done done) {
        if (absl::Status gone = CallerGone(ctx); !gone.ok()) return done(gone);
        if (before_decide_for_testing_) before_decide_for_testing_(ctx);
        service_->Choose(call->request, &call->response,
                         [this, call, done = std::move(done)](absl::Status s) {
                           if (s.ok()) {
                             call->on_lost = [this, call] {
                               service_->Undeliver(call->request.problem_id(),
                                                   call->response.event_id());
                             };
                           }
                           done(std::move(s));
                         });
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::Reward(grpc::CallbackServerContext* ctx,
                                                      const Bytes* in, Bytes* out) {
  return Serve<v1::RewardRequest, v1::RewardResponse>(
      ctx, "Reward", in, out,
      [](const v1::RewardRequest& r, const auto&) { return Call{"Reward", r.problem_id(), nullptr}; },
      [this](const Grant&, DECISION_CALL(RewardRequest, RewardResponse), Done done) {
        service_->Reward(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::GetEstimates(grpc::CallbackServerContext* ctx,
                                                            const Bytes* in, Bytes* out) {
  return Serve<v1::GetEstimatesRequest, v1::Estimates>(
      ctx, "GetEstimates", in, out,
      [](const v1::GetEstimatesRequest& r, const auto&) {
        return Call{"GetEstimates", r.problem_id(), nullptr};
      },
      [this](const Grant&, DECISION_CALL(GetEstimatesRequest, Estimates), Done done) {
        service_->GetEstimates(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::TrainExperts(grpc::CallbackServerContext* ctx,
                                                            const Bytes* in, Bytes* out) {
  return Serve<v1::TrainExpertsRequest, v1::TrainExpertsResponse>(
      ctx, "TrainExperts", in, out,
      [](const v1::TrainExpertsRequest& r, const auto&) {
        return Call{"TrainExperts", r.problem_id(), [&r] {
                      return absl::StrCat("tree_experts=", r.tree_experts(),
                                          " linear_experts=", r.linear_experts());
                    }};
      },
      [this](const Grant&, DECISION_CALL(TrainExpertsRequest, TrainExpertsResponse),
             Done done) {
        service_->TrainExperts(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::GetTrainingJob(grpc::CallbackServerContext* ctx,
                                                              const Bytes* in, Bytes* out) {
  return Serve<v1::GetTrainingJobRequest, v1::TrainingJob>(
      ctx, "GetTrainingJob", in, out,
      [](const v1::GetTrainingJobRequest& r, const auto&) {
        return Call{"GetTrainingJob", r.problem_id(), nullptr};
      },
      [this](const Grant&, DECISION_CALL(GetTrainingJobRequest, TrainingJob), Done done) {
        done(service_->GetTrainingJob(call->request, &call->response));
      });
}


grpc::ServerUnaryReactor* GrpcDecisionService::EvaluateModel(grpc::CallbackServerContext* ctx,
                                                             const Bytes* in, Bytes* out) {
  return Serve<v1::EvaluateModelRequest, v1::ModelEvaluation>(
      ctx, "EvaluateModel", in, out,
      [](const v1::EvaluateModelRequest& r, const auto&) {
        return Call{"EvaluateModel", r.problem_id(), [&r] {
                      return absl::StrCat("kind=", AuditKind(r.model()));
                    }};
      },
      [this](const Grant&, DECISION_CALL(EvaluateModelRequest, ModelEvaluation), Done done) {
        service_->EvaluateModel(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::Promote(grpc::CallbackServerContext* ctx,
                                                       const Bytes* in, Bytes* out) {
  return Serve<v1::PromoteRequest, v1::Expert>(
      ctx, "Promote", in, out,
      [](const v1::PromoteRequest& r, const auto&) {
        return Call{"Promote", r.problem_id(),
                    [&r] { return absl::StrCat("expert ", r.expert_id()); }};
      },
      [this](const Grant&, DECISION_CALL(PromoteRequest, Expert), Done done) {
        service_->Promote(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::Demote(grpc::CallbackServerContext* ctx,
                                                      const Bytes* in, Bytes* out) {
  return Serve<v1::PromoteRequest, v1::Expert>(
      ctx, "Demote", in, out,
      [](const v1::PromoteRequest& r, const auto&) {
        return Call{"Demote", r.problem_id(),
                    [&r] { return absl::StrCat("expert ", r.expert_id()); }};
      },
      [this](const Grant&, DECISION_CALL(PromoteRequest, Expert), Done done) {
        service_->Demote(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::ChooseSlate(grpc::CallbackServerContext* ctx,
                                                           const Bytes* in, Bytes* out) {
  return Serve<v1::ChooseSlateRequest, v1::ChooseSlateResponse>(
      ctx, "ChooseSlate", in, out,
      [](const v1::ChooseSlateRequest& r, const auto&) {
        return Call{"ChooseSlate", r.problem_id(), nullptr};
      },
      [this, ctx](const Grant&, DECISION_CALL(ChooseSlateRequest, ChooseSlateResponse),
                  Done done) {
        if (absl::Status gone = CallerGone(ctx); !gone.ok()) return done(gone);
        if (before_decide_for_testing_) before_decide_for_testing_(ctx);
        service_->ChooseSlate(
            call->request, &call->response, [this, call, done = std::move(done)](absl::Status s) {
              if (s.ok()) {
                call->on_lost = [this, call] {
                  for (const v1::ChooseResponse& slot : call->response.slots()) {
                    service_->Undeliver(call->request.problem_id(), slot.event_id());
                  }
                };
              }
              done(std::move(s));
            });
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::ChooseBatch(grpc::CallbackServerContext* ctx,
                                                           const Bytes* in, Bytes* out) {
  return Serve<v1::ChooseBatchRequest, v1::ChooseBatchResponse>(
      ctx, "ChooseBatch", in, out,
      // A batch may name several problems: authorized for each (a scoped token must cover
      // all of them).
      [](const v1::ChooseBatchRequest& r, const auto&) {
        return Call{"ChooseBatch",
                    r.requests_size() > 0 ? absl::string_view(r.requests(0).problem_id())
                                          : absl::string_view(),
                    nullptr};
      },
      [this, ctx](const Grant& grant, DECISION_CALL(ChooseBatchRequest, ChooseBatchResponse),
                  Done done) {
        for (int i = 0; i < call->request.requests_size(); ++i) {
          if (!grant.Covers(call->request.requests(i).problem_id())) {
            return done(absl::PermissionDeniedError(absl::StrCat(
                "requests[", i, "]: the token is not scoped to problem ",
                call->request.requests(i).problem_id())));
          }
          if (placement_ == nullptr) continue;
          if (absl::Status s = placement_->Check(call->request.requests(i).problem_id());
              !s.ok()) {
            return done(absl::FailedPreconditionError(
                absl::StrCat("requests[", i, "]: ", s.message())));
          }
        }
        if (absl::Status gone = CallerGone(ctx); !gone.ok()) return done(gone);
        if (before_decide_for_testing_) before_decide_for_testing_(ctx);
        service_->ChooseBatch(
            call->request, &call->response, [this, call, done = std::move(done)](absl::Status s) {
              if (s.ok()) {
                call->on_lost = [this, call] {
                  for (int i = 0; i < call->response.responses_size(); ++i) {
                    service_->Undeliver(call->request.requests(i).problem_id(),
                                        call->response.responses(i).event_id());
                  }
                };
              }
              done(std::move(s));
            });
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::Activate(grpc::CallbackServerContext* ctx,
                                                        const Bytes* in, Bytes* out) {
  return Serve<v1::ActivateRequest, v1::ActivateResponse>(
      ctx, "Activate", in, out,
      [](const v1::ActivateRequest& r, const auto&) {
        return Call{"Activate", r.problem_id(), nullptr};
      },
      [this](const Grant&, DECISION_CALL(ActivateRequest, ActivateResponse), Done done) {
        service_->Activate(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::Explain(grpc::CallbackServerContext* ctx,
                                                       const Bytes* in, Bytes* out) {
  return Serve<v1::ExplainRequest, v1::Explanation>(
      ctx, "Explain", in, out,
      [](const v1::ExplainRequest& r, const auto&) {
        return Call{"Explain", r.problem_id(), nullptr};
      },
      [this](const Grant&, DECISION_CALL(ExplainRequest, Explanation), Done done) {
        service_->Explain(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::ListAuditLog(grpc::CallbackServerContext* ctx,
                                                            const Bytes* in, Bytes* out) {
  return Serve<v1::ListAuditLogRequest, v1::ListAuditLogResponse>(
      ctx, "ListAuditLog", in, out,
      [](const v1::ListAuditLogRequest&, const auto&) { return Call{"ListAuditLog", "", nullptr}; },
      [this](const Grant& grant, DECISION_CALL(ListAuditLogRequest, ListAuditLogResponse),
             Done done) {
        if (!grant.problems.empty()) {
          // The audit log spans every problem: only an unscoped admin token reads it.
          return done(absl::PermissionDeniedError(absl::StrCat(
              "token '", grant.name, "' is scoped to problems; the audit log needs an "
              "unscoped admin token")));
        }
        service_->ListAuditLog(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::BeginMove(grpc::CallbackServerContext* ctx,
                                                         const Bytes* in, Bytes* out) {
  return Serve<v1::BeginMoveRequest, v1::BeginMoveResponse>(
      ctx, "BeginMove", in, out,
      [](const v1::BeginMoveRequest& r, const auto&) {
        return Call{"BeginMove", r.problem_id(),
                    [&r] { return absl::StrCat("to ", r.to_replica().substr(0, 64)); },
                    /*routed=*/false};
      },
      [this](const Grant&, DECISION_CALL(BeginMoveRequest, BeginMoveResponse), Done done) {
        service_->BeginMove(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::ExportProblem(grpc::CallbackServerContext* ctx,
                                                             const Bytes* in, Bytes* out) {
  return Serve<v1::ExportProblemRequest, v1::ExportProblemResponse>(
      ctx, "ExportProblem", in, out,
      [](const v1::ExportProblemRequest& r, const auto& response) {
        return Call{"ExportProblem", r.problem_id(),
                    [&response] {
                      return absl::StrCat(response.entries_size(), " records");
                    },
                    /*routed=*/false};
      },
      [this](const Grant&, DECISION_CALL(ExportProblemRequest, ExportProblemResponse),
             Done done) {
        service_->ExportProblem(call->request, &call->response, std::move(done));
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::ImportProblem(grpc::CallbackServerContext* ctx,
                                                             const Bytes* in, Bytes* out) {
  return Serve<v1::ImportProblemRequest, v1::ImportProblemResponse>(
      ctx, "ImportProblem", in, out,
      [](const v1::ImportProblemRequest& r, const auto&) {
        return Call{"ImportProblem", r.problem_id(),
                    [&r] {
                      return absl::StrCat(r.entries_size(), " records",
                                          r.first() ? ", first" : "",
                                          r.commit() ? ", commit" : "");
                    },
                    /*routed=*/false};
      },
      [this](const Grant&, DECISION_CALL(ImportProblemRequest, ImportProblemResponse),
             Done done) {
        const bool commit = call->request.commit();
        service_->ImportProblem(
            call->request, &call->response,
            [this, call, commit, done = std::move(done)](absl::Status s) {
              if (s.ok() && commit && placement_ != nullptr) {
                placement_->Claim(call->request.problem_id());
              }
              done(std::move(s));
            });
      });
}

grpc::ServerUnaryReactor* GrpcDecisionService::EndMove(grpc::CallbackServerContext* ctx,
                                                       const Bytes* in, Bytes* out) {
  return Serve<v1::EndMoveRequest, v1::EndMoveResponse>(
      ctx, "EndMove", in, out,
      [](const v1::EndMoveRequest& r, const auto&) {
        return Call{"EndMove", r.problem_id(),
                    [&r] { return std::string(r.abort() ? "abort" : "finish"); },
                    /*routed=*/false};
      },
      [this](const Grant&, DECISION_CALL(EndMoveRequest, EndMoveResponse), Done done) {
        const v1::EndMoveRequest& r = call->request;
        absl::Status placed_on_target =
            placement_ != nullptr
                ? placement_->PlacedOn(r.problem_id(), r.to_replica())
                : NoPlacementMap(r.problem_id(), r.to_replica());
        service_->EndMove(r, &call->response, std::move(placed_on_target), std::move(done));
      });
}

#undef DECISION_CALL

namespace {

// Streams the log a page at a time: the service reads up to kPage samples on its blocking
// executor, the reactor writes them one by one (one write in flight, as gRPC requires),
// then asks for the next page. No reactor thread reads the store.
class ExportReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  static constexpr int64_t kPage = 512;

  // `allowed`: the caller's authorization (or the request's parse); a refusal finishes the
  // stream at once.
  ExportReactor(DecisionService* service, Metrics* metrics, const v1::ExportLogRequest& request,
                const absl::Status& allowed)
      : service_(service), metrics_(metrics), request_(request),
        next_(request.start()),
        remaining_(request.limit() == 0 ? -1 : request.limit()) {
    if (!allowed.ok()) {
      Done(ToGrpcStatus(allowed));
      return;
    }
    // The pages below are always valid requests: validate the caller's once, here.
    if (absl::Status s = ValidateExportLogRequest(request); !s.ok()) {
      Done(ToGrpcStatus(s));
      return;
    }
    NextPage();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    ++written_;
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void NextPage() {
    if (remaining_ == 0) return Done(grpc::Status::OK);
    v1::ExportLogRequest page_request = request_;
    page_request.set_start(next_);
    page_request.set_limit(remaining_ < 0 ? kPage : std::min(kPage, remaining_));
    page_.clear();
    written_ = 0;
    service_->ExportLogPage(page_request, &page_, [this](absl::Status s) {
      if (!s.ok()) return Done(ToGrpcStatus(s));
      if (page_.empty()) return Done(grpc::Status::OK);
      // After the last sample streamed: a page may start past the requested start (samples
      // before the first one retention keeps are not there).
      next_ = page_.back().sequence() + 1;
      if (remaining_ > 0) remaining_ -= static_cast<int64_t>(page_.size());
      WriteNext();
    });
  }
  void WriteNext() {
    if (written_ == page_.size()) return NextPage();
    bool own_buffer = false;
    bytes_.Clear();  // the previous write is done with it
    const grpc::Status s =
        grpc::SerializationTraits<v1::LoggedSample>::Serialize(page_[written_], &bytes_,
                                                               &own_buffer);
    if (!s.ok()) return Done(s);
    StartWrite(&bytes_);
  }
  void Done(const grpc::Status& status) {
    if (!status.ok()) {
      metrics_->RpcErrors("ExportLog", CodeName(status.error_code())).Increment();
    }
    Finish(status);
  }

  DecisionService* service_;
  Metrics* metrics_;
  const v1::ExportLogRequest request_;
  int64_t next_;
  int64_t remaining_;  // -1: unlimited
  std::vector<v1::LoggedSample> page_;
  size_t written_ = 0;    // samples of page_ written
  grpc::ByteBuffer bytes_;  // the sample being written
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* GrpcDecisionService::ExportLog(
    grpc::CallbackServerContext* ctx, const Bytes* in) {
  v1::ExportLogRequest request;
  if (grpc::Status parsed = ParseRequest(*in, &request); !parsed.ok()) {
    return new ExportReactor(service_, metrics_, request,
                             absl::InvalidArgumentError(parsed.error_message()));
  }
  const Call call{"ExportLog", request.problem_id(), nullptr};
  const absl::StatusOr<Grant> grant = Authorize(ctx, call);
  // Routed as the unary calls are: a misrouted export, or one reaching a copy the map
  // places elsewhere, must not stream stale samples.
  return new ExportReactor(service_, metrics_, request,
                           grant.ok() ? CheckRouting(ctx, call) : grant.status());
}

}  // namespace decision::server
