// The gRPC face of DecisionService: a final adapter that authorizes each call (auth.h),
// converts requests and statuses, records per-RPC latency and error metrics, and appends
// the administrative calls to the audit log. It holds no logic, and no handler blocks its
// reactor thread: blocking work runs on the service's executors, which finish the reactor
// (STYLE.md, rule 12).
#ifndef DECISION_SERVER_GRPC_SERVICE_H_
#define DECISION_SERVER_GRPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>

#include "decision/v1/decision.grpc.pb.h"
#include "server/auth.h"
#include "server/decision_service.h"
#include "server/metrics.h"

namespace decision::server {

// absl::Status -> grpc::Status, the one conversion point.
grpc::Status ToGrpcStatus(const absl::Status& status);

class GrpcDecisionService final : public v1::DecisionService::CallbackService {
 public:
  // `auth` decides who may call what (open mode: everyone). All three must outlive this.
  GrpcDecisionService(DecisionService* service, Metrics* metrics, const Authorizer* auth)
      : service_(service), metrics_(metrics), auth_(auth) {}

  grpc::ServerUnaryReactor* CreateProblem(grpc::CallbackServerContext* ctx,
                                          const v1::CreateProblemRequest* request,
                                          v1::Problem* response) override;
  grpc::ServerUnaryReactor* GetProblem(grpc::CallbackServerContext* ctx,
                                       const v1::GetProblemRequest* request,
                                       v1::Problem* response) override;
  grpc::ServerUnaryReactor* ListProblems(grpc::CallbackServerContext* ctx,
                                         const v1::ListProblemsRequest* request,
                                         v1::ListProblemsResponse* response) override;
  grpc::ServerUnaryReactor* RegisterExpert(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterExpertRequest* request,
                                           v1::Expert* response) override;
  grpc::ServerUnaryReactor* ListExperts(grpc::CallbackServerContext* ctx,
                                        const v1::ListExpertsRequest* request,
                                        v1::ListExpertsResponse* response) override;
  grpc::ServerUnaryReactor* RetireExpert(grpc::CallbackServerContext* ctx,
                                         const v1::RetireExpertRequest* request,
                                         v1::Expert* response) override;
  grpc::ServerUnaryReactor* Choose(grpc::CallbackServerContext* ctx,
                                   const v1::ChooseRequest* request,
                                   v1::ChooseResponse* response) override;
  grpc::ServerUnaryReactor* Reward(grpc::CallbackServerContext* ctx,
                                   const v1::RewardRequest* request,
                                   v1::RewardResponse* response) override;
  grpc::ServerUnaryReactor* GetEstimates(grpc::CallbackServerContext* ctx,
                                         const v1::GetEstimatesRequest* request,
                                         v1::Estimates* response) override;
  grpc::ServerUnaryReactor* TrainExperts(grpc::CallbackServerContext* ctx,
                                         const v1::TrainExpertsRequest* request,
                                         v1::TrainExpertsResponse* response) override;
  grpc::ServerUnaryReactor* GetTrainingJob(grpc::CallbackServerContext* ctx,
                                           const v1::GetTrainingJobRequest* request,
                                           v1::TrainingJob* response) override;
  grpc::ServerWriteReactor<v1::LoggedSample>* ExportLog(
      grpc::CallbackServerContext* ctx, const v1::ExportLogRequest* request) override;
  grpc::ServerUnaryReactor* ListAuditLog(grpc::CallbackServerContext* ctx,
                                         const v1::ListAuditLogRequest* request,
                                         v1::ListAuditLogResponse* response) override;

  // The role each RPC needs (the table of auth.h).
  static Role RoleOf(absl::string_view method);

 private:
  // What a call is, for authorization and the audit log.
  struct Call {
    const char* method;
    absl::string_view problem_id;  // "" for calls without one
    // Administrative calls only: what the audit log records besides the problem, evaluated
    // once the call finished (it may read the response).
    std::function<std::string()> audit_detail;
  };
  absl::StatusOr<Grant> Authorize(grpc::CallbackServerContext* ctx, const Call& call) const;

  // For the calls that never block (in-memory reads under short locks): call(grant) runs on
  // the reactor thread; AsyncUnary with an immediate done. Everything that blocks goes
  // through AsyncUnary, and the service runs it on an executor.
  template <typename F>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Call call, F&& call_fn);
  // For the asynchronous calls: start(done) queues the work; the reactor finishes in done,
  // possibly on another thread, so the handler returns at once. A call that is not
  // authorized finishes at once without starting.
  template <typename Start>
  grpc::ServerUnaryReactor* AsyncUnary(grpc::CallbackServerContext* ctx, Call call,
                                       Start&& start);

  DecisionService* service_;
  Metrics* metrics_;
  const Authorizer* auth_;
};

}  // namespace decision::server

#endif  // DECISION_SERVER_GRPC_SERVICE_H_
