// The gRPC face of DecisionService: a final adapter that converts requests and statuses
// and records per-RPC latency and error metrics. It holds no logic, and no handler blocks
// its reactor thread: blocking work runs on the service's executors, which finish the
// reactor (STYLE.md, rule 12).
#ifndef DECISION_SERVER_GRPC_SERVICE_H_
#define DECISION_SERVER_GRPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "decision/v1/decision.grpc.pb.h"
#include "server/decision_service.h"
#include "server/metrics.h"

namespace decision::server {

// absl::Status -> grpc::Status, the one conversion point.
grpc::Status ToGrpcStatus(const absl::Status& status);

class GrpcDecisionService final : public v1::DecisionService::CallbackService {
 public:
  GrpcDecisionService(DecisionService* service, Metrics* metrics)
      : service_(service), metrics_(metrics) {}

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
  grpc::ServerWriteReactor<v1::LoggedSample>* ExportLog(
      grpc::CallbackServerContext* ctx, const v1::ExportLogRequest* request) override;

 private:
  // For the calls that never block (in-memory reads under short locks): call() runs on the
  // reactor thread; AsyncUnary with an immediate done. Everything that blocks goes through
  // AsyncUnary, and the service runs it on an executor.
  template <typename F>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const char* method, F&& call);
  // For the asynchronous calls: start(done) queues the work; the reactor finishes in done,
  // possibly on another thread, so the handler returns at once.
  template <typename Start>
  grpc::ServerUnaryReactor* AsyncUnary(grpc::CallbackServerContext* ctx, const char* method,
                                       Start&& start);

  DecisionService* service_;
  Metrics* metrics_;
};

}  // namespace decision::server

#endif  // DECISION_SERVER_GRPC_SERVICE_H_
