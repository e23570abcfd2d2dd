#include "server/grpc_service.h"

#include <chrono>
#include <vector>
#include <string>

#include "absl/strings/str_cat.h"
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

template <typename Start>
grpc::ServerUnaryReactor* GrpcDecisionService::AsyncUnary(grpc::CallbackServerContext* ctx,
                                                          const char* method, Start&& start) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  start([this, reactor, method, begin = std::chrono::steady_clock::now()](absl::Status s) {
    const grpc::Status status = ToGrpcStatus(s);
    metrics_->RpcLatency(method).Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
    if (!status.ok()) metrics_->RpcErrors(method, CodeName(status.error_code())).Increment();
    reactor->Finish(status);
  });
  return reactor;
}

template <typename F>
grpc::ServerUnaryReactor* GrpcDecisionService::Unary(grpc::CallbackServerContext* ctx,
                                                     const char* method, F&& call) {
  return AsyncUnary(ctx, method, [&](Done done) { done(call()); });
}

grpc::ServerUnaryReactor* GrpcDecisionService::CreateProblem(
    grpc::CallbackServerContext* ctx, const v1::CreateProblemRequest* request,
    v1::Problem* response) {
  return AsyncUnary(ctx, "CreateProblem", [&](Done done) {
    service_->CreateProblem(*request, response, std::move(done));
  });
}
grpc::ServerUnaryReactor* GrpcDecisionService::GetProblem(grpc::CallbackServerContext* ctx,
                                                          const v1::GetProblemRequest* request,
                                                          v1::Problem* response) {
  return Unary(ctx, "GetProblem", [&] { return service_->GetProblem(*request, response); });
}
grpc::ServerUnaryReactor* GrpcDecisionService::ListProblems(
    grpc::CallbackServerContext* ctx, const v1::ListProblemsRequest* request,
    v1::ListProblemsResponse* response) {
  return Unary(ctx, "ListProblems", [&] { return service_->ListProblems(*request, response); });
}
grpc::ServerUnaryReactor* GrpcDecisionService::RegisterExpert(
    grpc::CallbackServerContext* ctx, const v1::RegisterExpertRequest* request,
    v1::Expert* response) {
  return AsyncUnary(ctx, "RegisterExpert", [&](Done done) {
    service_->RegisterExpert(*request, response, std::move(done));
  });
}
grpc::ServerUnaryReactor* GrpcDecisionService::ListExperts(
    grpc::CallbackServerContext* ctx, const v1::ListExpertsRequest* request,
    v1::ListExpertsResponse* response) {
  return Unary(ctx, "ListExperts", [&] { return service_->ListExperts(*request, response); });
}
grpc::ServerUnaryReactor* GrpcDecisionService::RetireExpert(
    grpc::CallbackServerContext* ctx, const v1::RetireExpertRequest* request,
    v1::Expert* response) {
  return AsyncUnary(ctx, "RetireExpert", [&](Done done) {
    service_->RetireExpert(*request, response, std::move(done));
  });
}
grpc::ServerUnaryReactor* GrpcDecisionService::Choose(grpc::CallbackServerContext* ctx,
                                                      const v1::ChooseRequest* request,
                                                      v1::ChooseResponse* response) {
  return AsyncUnary(ctx, "Choose",
                    [&](Done done) { service_->Choose(*request, response, std::move(done)); });
}
grpc::ServerUnaryReactor* GrpcDecisionService::Reward(grpc::CallbackServerContext* ctx,
                                                      const v1::RewardRequest* request,
                                                      v1::RewardResponse* response) {
  return AsyncUnary(ctx, "Reward",
                    [&](Done done) { service_->Reward(*request, response, std::move(done)); });
}
grpc::ServerUnaryReactor* GrpcDecisionService::GetEstimates(
    grpc::CallbackServerContext* ctx, const v1::GetEstimatesRequest* request,
    v1::Estimates* response) {
  return Unary(ctx, "GetEstimates", [&] { return service_->GetEstimates(*request, response); });
}

grpc::ServerUnaryReactor* GrpcDecisionService::TrainExperts(
    grpc::CallbackServerContext* ctx, const v1::TrainExpertsRequest* request,
    v1::TrainExpertsResponse* response) {
  return AsyncUnary(ctx, "TrainExperts", [&](Done done) {
    service_->TrainExperts(*request, response, std::move(done));
  });
}

namespace {

// Streams the log a page at a time: the service reads up to kPage samples on its blocking
// executor, the reactor writes them one by one (one write in flight, as gRPC requires),
// then asks for the next page. No reactor thread reads the store.
class ExportReactor final : public grpc::ServerWriteReactor<v1::LoggedSample> {
 public:
  static constexpr int64_t kPage = 512;

  ExportReactor(DecisionService* service, Metrics* metrics, const v1::ExportLogRequest& request)
      : service_(service), metrics_(metrics), request_(request),
        next_(request.start()),
        remaining_(request.limit() == 0 ? -1 : request.limit()) {
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
    grpc::CallbackServerContext*, const v1::ExportLogRequest* request) {
  return new ExportReactor(service_, metrics_, *request);
}

}  // namespace decision::server
