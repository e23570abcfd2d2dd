// decisiond's gRPC layer (server/grpc_service.h) over a test's in-process DecisionService, on
// a loopback port in open mode (no tokens), with a stub that calls it: for what only that
// layer does, such as paging ExportLog's stream or noticing a cancelled call.
#ifndef DECISION_TESTS_GRPC_HARNESS_H_
#define DECISION_TESTS_GRPC_HARNESS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "decision/v1/decision.grpc.pb.h"
#include "server/auth.h"
#include "server/decision_service.h"
#include "server/grpc_service.h"
#include "server/metrics.h"

namespace decision::server {

class GrpcHarness {
 public:
  // `before_serving` may install testing hooks on the gRPC service before it serves. Null if
  // the server did not start.
  static std::unique_ptr<GrpcHarness> Start(
      DecisionService* service, Metrics* metrics,
      const std::function<void(GrpcDecisionService&)>& before_serving = {}) {
    auto h = std::unique_ptr<GrpcHarness>(new GrpcHarness());
    h->auth_ = *Authorizer::Open("");  // open mode
    h->grpc_ = std::make_unique<GrpcDecisionService>(service, metrics, h->auth_.get());
    if (before_serving) before_serving(*h->grpc_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(h->grpc_.get());
    h->server_ = builder.BuildAndStart();
    if (h->server_ == nullptr) return nullptr;
    h->stub_ = v1::DecisionService::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    return h;
  }
  ~GrpcHarness() {
    if (server_ != nullptr) server_->Shutdown();
  }
  v1::DecisionService::Stub& stub() { return *stub_; }

 private:
  GrpcHarness() = default;
  std::unique_ptr<Authorizer> auth_;
  std::unique_ptr<GrpcDecisionService> grpc_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::DecisionService::Stub> stub_;
};

}  // namespace decision::server

#endif  // DECISION_TESTS_GRPC_HARNESS_H_
