#include "server/grpc_service.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
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
    {"GetTrainingJob", Role::kObserve},
};

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

template <typename Start>
grpc::ServerUnaryReactor* GrpcDecisionService::AsyncUnary(grpc::CallbackServerContext* ctx,
                                                          Call call, Start&& start) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const auto begin = std::chrono::steady_clock::now();
  const char* method = call.method;
  absl::StatusOr<Grant> grant = Authorize(ctx, call);
  if (!grant.ok()) {
    const grpc::Status status = ToGrpcStatus(grant.status());
    metrics_->RpcErrors(method, CodeName(status.error_code())).Increment();
    reactor->Finish(status);
    return reactor;
  }
  std::function<void(const absl::Status&)> audit;
  if (Audited(method)) {
    // The problem id is the caller's, not yet validated: the record keeps at most 256 bytes.
    audit = [this, method, caller = grant->name,
             problem = std::string(call.problem_id.substr(0, 256)),
             detail = std::move(call.audit_detail)](const absl::Status& s) {
      storage::v1::AuditRecord record;
      record.set_at_ms(absl::ToUnixMillis(absl::Now()));
      record.set_caller(caller);
      record.set_method(method);
      record.set_problem_id(problem);
      if (detail) record.set_detail(detail());
      record.set_code(static_cast<int>(s.code()));
      record.set_message(std::string(s.message()));
      service_->RecordAudit(std::move(record));
    };
  }
  start(*grant, [this, reactor, method, begin, audit = std::move(audit)](absl::Status s) {
    if (audit) audit(s);
    const grpc::Status status = ToGrpcStatus(s);
    metrics_->RpcLatency(method).Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
    if (!status.ok()) metrics_->RpcErrors(method, CodeName(status.error_code())).Increment();
    reactor->Finish(status);
  });
  return reactor;
}

template <typename F>
grpc::ServerUnaryReactor* GrpcDecisionService::Unary(grpc::CallbackServerContext* ctx, Call call,
                                                     F&& call_fn) {
  return AsyncUnary(ctx, std::move(call),
                    [&](const Grant& grant, Done done) { done(call_fn(grant)); });
}

grpc::ServerUnaryReactor* GrpcDecisionService::CreateProblem(
    grpc::CallbackServerContext* ctx, const v1::CreateProblemRequest* request,
    v1::Problem* response) {
  return AsyncUnary(ctx, {"CreateProblem", request->problem_id(), [] { return std::string(); }},
                    [&](const Grant&, Done done) {
                      service_->CreateProblem(*request, response, std::move(done));
                    });
}
grpc::ServerUnaryReactor* GrpcDecisionService::GetProblem(grpc::CallbackServerContext* ctx,
                                                          const v1::GetProblemRequest* request,
                                                          v1::Problem* response) {
  return Unary(ctx, {"GetProblem", request->problem_id(), nullptr},
               [&](const Grant&) { return service_->GetProblem(*request, response); });
}
grpc::ServerUnaryReactor* GrpcDecisionService::ListProblems(
    grpc::CallbackServerContext* ctx, const v1::ListProblemsRequest* request,
    v1::ListProblemsResponse* response) {
  return Unary(ctx, {"ListProblems", "", nullptr}, [&](const Grant& grant) {
    absl::Status s = service_->ListProblems(*request, response);
    if (s.ok() && !grant.problems.empty()) {
      // A scoped token sees only its own problems.
      auto* problems = response->mutable_problems();
      problems->erase(std::remove_if(problems->begin(), problems->end(),
                                     [&](const v1::Problem& p) {
                                       return !grant.Covers(p.problem_id());
                                     }),
                      problems->end());
    }
    return s;
  });
}
grpc::ServerUnaryReactor* GrpcDecisionService::RegisterExpert(
    grpc::CallbackServerContext* ctx, const v1::RegisterExpertRequest* request,
    v1::Expert* response) {
  auto detail = [request, response] {
    std::string kind;
    switch (request->model().kind_case()) {
      case v1::ExpertModel::kUniform: kind = "uniform"; break;
      case v1::ExpertModel::kTable: kind = "table"; break;
      case v1::ExpertModel::kLinearSoftmax: kind = "linear_softmax"; break;
      case v1::ExpertModel::kXgboost:
        kind = absl::StrCat("xgboost (", request->model().xgboost().model().size(), " bytes)");
        break;
      default: kind = "none"; break;
    }
    return absl::StrCat("name=", request->name().substr(0, 128), " kind=", kind,
                        response->expert_id() > 0 ? absl::StrCat(" -> expert ",
                                                                 response->expert_id())
                                                  : "");
  };
  return AsyncUnary(ctx, {"RegisterExpert", request->problem_id(), std::move(detail)},
                    [&](const Grant&, Done done) {
                      service_->RegisterExpert(*request, response, std::move(done));
                    });
}
grpc::ServerUnaryReactor* GrpcDecisionService::ListExperts(
    grpc::CallbackServerContext* ctx, const v1::ListExpertsRequest* request,
    v1::ListExpertsResponse* response) {
  return Unary(ctx, {"ListExperts", request->problem_id(), nullptr},
               [&](const Grant&) { return service_->ListExperts(*request, response); });
}
grpc::ServerUnaryReactor* GrpcDecisionService::RetireExpert(
    grpc::CallbackServerContext* ctx, const v1::RetireExpertRequest* request,
    v1::Expert* response) {
  auto detail = [request] { return absl::StrCat("expert ", request->expert_id()); };
  return AsyncUnary(ctx, {"RetireExpert", request->problem_id(), std::move(detail)},
                    [&](const Grant&, Done done) {
                      service_->RetireExpert(*request, response, std::move(done));
                    });
}
grpc::ServerUnaryReactor* GrpcDecisionService::Choose(grpc::CallbackServerContext* ctx,
                                                      const v1::ChooseRequest* request,
                                                      v1::ChooseResponse* response) {
  return AsyncUnary(ctx, {"Choose", request->problem_id(), nullptr},
                    [&](const Grant&, Done done) {
                      service_->Choose(*request, response, std::move(done));
                    });
}
grpc::ServerUnaryReactor* GrpcDecisionService::Reward(grpc::CallbackServerContext* ctx,
                                                      const v1::RewardRequest* request,
                                                      v1::RewardResponse* response) {
  return AsyncUnary(ctx, {"Reward", request->problem_id(), nullptr},
                    [&](const Grant&, Done done) {
                      service_->Reward(*request, response, std::move(done));
                    });
}
grpc::ServerUnaryReactor* GrpcDecisionService::GetEstimates(
    grpc::CallbackServerContext* ctx, const v1::GetEstimatesRequest* request,
    v1::Estimates* response) {
  return Unary(ctx, {"GetEstimates", request->problem_id(), nullptr},
               [&](const Grant&) { return service_->GetEstimates(*request, response); });
}

grpc::ServerUnaryReactor* GrpcDecisionService::TrainExperts(
    grpc::CallbackServerContext* ctx, const v1::TrainExpertsRequest* request,
    v1::TrainExpertsResponse* response) {
  auto detail = [request] {
    return absl::StrCat("tree_experts=", request->tree_experts(),
                        " linear_experts=", request->linear_experts());
  };
  return AsyncUnary(ctx, {"TrainExperts", request->problem_id(), std::move(detail)},
                    [&](const Grant&, Done done) {
                      service_->TrainExperts(*request, response, std::move(done));
                    });
}

grpc::ServerUnaryReactor* GrpcDecisionService::GetTrainingJob(
    grpc::CallbackServerContext* ctx, const v1::GetTrainingJobRequest* request,
    v1::TrainingJob* response) {
  return Unary(ctx, {"GetTrainingJob", request->problem_id(), nullptr},
               [&](const Grant&) { return service_->GetTrainingJob(*request, response); });
}

grpc::ServerUnaryReactor* GrpcDecisionService::ListAuditLog(
    grpc::CallbackServerContext* ctx, const v1::ListAuditLogRequest* request,
    v1::ListAuditLogResponse* response) {
  return AsyncUnary(ctx, {"ListAuditLog", "", nullptr}, [&](const Grant& grant, Done done) {
    if (!grant.problems.empty()) {
      // The audit log spans every problem: only an unscoped admin token reads it.
      return done(absl::PermissionDeniedError(absl::StrCat(
          "token '", grant.name, "' is scoped to problems; the audit log needs an unscoped "
          "admin token")));
    }
    service_->ListAuditLog(*request, response, std::move(done));
  });
}

namespace {

// Streams the log a page at a time: the service reads up to kPage samples on its blocking
// executor, the reactor writes them one by one (one write in flight, as gRPC requires),
// then asks for the next page. No reactor thread reads the store.
class ExportReactor final : public grpc::ServerWriteReactor<v1::LoggedSample> {
 public:
  static constexpr int64_t kPage = 512;

  // `allowed`: the caller's authorization; a refusal finishes the stream at once.
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
      next_ += static_cast<int64_t>(page_.size());
      if (remaining_ > 0) remaining_ -= static_cast<int64_t>(page_.size());
      WriteNext();
    });
  }
  void WriteNext() {
    if (written_ == page_.size()) return NextPage();
    StartWrite(&page_[written_]);
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
  size_t written_ = 0;  // samples of page_ written
};

}  // namespace

grpc::ServerWriteReactor<v1::LoggedSample>* GrpcDecisionService::ExportLog(
    grpc::CallbackServerContext* ctx, const v1::ExportLogRequest* request) {
  const absl::StatusOr<Grant> grant = Authorize(ctx, {"ExportLog", request->problem_id(), nullptr});
  return new ExportReactor(service_, metrics_, *request, grant.status());
}

}  // namespace decision::server
