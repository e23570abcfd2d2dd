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
#include "server/placement.h"

namespace decision::server {

// Routes libprotobuf's log lines (one per request whose string field is not UTF-8: anyone
// can send those) through a limiter: at most one line every 10 s, with the count of the
// lines left out. Call once, before serving.
void LimitProtobufLogs();

// `message` whole if it has at most `max_bytes`, else its first max_bytes (less a partial
// UTF-8 character) and "... (N bytes in all)".
std::string BoundedMessage(absl::string_view message, size_t max_bytes);

// absl::Status -> grpc::Status, the one conversion point. The message is bounded to
// kMaxStatusMessageBytes (BoundedMessage).
inline constexpr size_t kMaxStatusMessageBytes = 2048;
grpc::Status ToGrpcStatus(const absl::Status& status);

// What an audit record keeps of the caller's problem id, the call's detail and its status
// message.
inline constexpr size_t kMaxAuditFieldBytes = 256;

// Every RPC of decision.v1 as a raw-bytes callback method: the request is parsed here, not
// by gRPC. gRPC 1.51's typed callback handler (CallbackUnaryHandler) answers a body that
// fails to parse (truncated, or a string field that is not UTF-8) with UNIMPLEMENTED and an
// empty message, which misleads every client; parsing here answers INVALID_ARGUMENT naming
// the message type. A new RPC must be added to this chain, or it is served by the
// synchronous base, which answers UNIMPLEMENTED (tests/bad_input_test.cc sends garbage to
// every method of the service descriptor and expects INVALID_ARGUMENT).
using RawDecisionService = v1::DecisionService::WithRawCallbackMethod_CreateProblem<
    v1::DecisionService::WithRawCallbackMethod_GetProblem<
    v1::DecisionService::WithRawCallbackMethod_ListProblems<
    v1::DecisionService::WithRawCallbackMethod_RegisterExpert<
    v1::DecisionService::WithRawCallbackMethod_ListExperts<
    v1::DecisionService::WithRawCallbackMethod_RetireExpert<
    v1::DecisionService::WithRawCallbackMethod_Choose<
    v1::DecisionService::WithRawCallbackMethod_Reward<
    v1::DecisionService::WithRawCallbackMethod_GetEstimates<
    v1::DecisionService::WithRawCallbackMethod_ExportLog<
    v1::DecisionService::WithRawCallbackMethod_TrainExperts<
    v1::DecisionService::WithRawCallbackMethod_ListAuditLog<
    v1::DecisionService::WithRawCallbackMethod_GetTrainingJob<
    v1::DecisionService::WithRawCallbackMethod_SetRetention<
    v1::DecisionService::WithRawCallbackMethod_DeleteEvents<
    v1::DecisionService::WithRawCallbackMethod_Explain<
    v1::DecisionService::WithRawCallbackMethod_Activate<
    v1::DecisionService::WithRawCallbackMethod_Promote<
    v1::DecisionService::WithRawCallbackMethod_Demote<
    v1::DecisionService::WithRawCallbackMethod_EvaluateModel<
    v1::DecisionService::WithRawCallbackMethod_ChooseSlate<
    v1::DecisionService::WithRawCallbackMethod_ChooseBatch<
    v1::DecisionService::WithRawCallbackMethod_BeginMove<
    v1::DecisionService::WithRawCallbackMethod_ExportProblem<
    v1::DecisionService::WithRawCallbackMethod_ImportProblem<
    v1::DecisionService::WithRawCallbackMethod_EndMove<
    v1::DecisionService::Service>>>>>>>>>>>>>>>>>>>>>>>>>>;

template <typename Request, typename Response>
class UnaryCall;

class GrpcDecisionService final : public RawDecisionService {
 public:
  // `auth` decides who may call what (open mode: everyone); `placement`, if given, which
  // problems this replica serves (server/placement.h). All must outlive this.
  GrpcDecisionService(DecisionService* service, Metrics* metrics, const Authorizer* auth,
                      Placement* placement = nullptr)
      : service_(service), metrics_(metrics), auth_(auth), placement_(placement) {}

  using Bytes = grpc::ByteBuffer;
  grpc::ServerUnaryReactor* CreateProblem(grpc::CallbackServerContext* ctx, const Bytes* in,
                                          Bytes* out) override;
  grpc::ServerUnaryReactor* GetProblem(grpc::CallbackServerContext* ctx, const Bytes* in,
                                       Bytes* out) override;
  grpc::ServerUnaryReactor* ListProblems(grpc::CallbackServerContext* ctx, const Bytes* in,
                                         Bytes* out) override;
  grpc::ServerUnaryReactor* RegisterExpert(grpc::CallbackServerContext* ctx, const Bytes* in,
                                           Bytes* out) override;
  grpc::ServerUnaryReactor* ListExperts(grpc::CallbackServerContext* ctx, const Bytes* in,
                                        Bytes* out) override;
  grpc::ServerUnaryReactor* RetireExpert(grpc::CallbackServerContext* ctx, const Bytes* in,
                                         Bytes* out) override;
  grpc::ServerUnaryReactor* SetRetention(grpc::CallbackServerContext* ctx, const Bytes* in,
                                         Bytes* out) override;
  grpc::ServerUnaryReactor* DeleteEvents(grpc::CallbackServerContext* ctx, const Bytes* in,
                                         Bytes* out) override;
  // A Choose whose deadline passed (or that was cancelled) before it decides gets
  // DEADLINE_EXCEEDED (CANCELLED) and makes no decision. One whose answer could not be sent
  // (cancelled, or past its deadline, before the status went out) is undelivered
  // (Problem::Undeliver): never learned. The same for ChooseSlate and ChooseBatch, whose
  // every decision is undelivered with their answer.
  grpc::ServerUnaryReactor* Choose(grpc::CallbackServerContext* ctx, const Bytes* in,
                                   Bytes* out) override;
  grpc::ServerUnaryReactor* Reward(grpc::CallbackServerContext* ctx, const Bytes* in,
                                   Bytes* out) override;
  grpc::ServerUnaryReactor* GetEstimates(grpc::CallbackServerContext* ctx, const Bytes* in,
                                         Bytes* out) override;
  grpc::ServerUnaryReactor* TrainExperts(grpc::CallbackServerContext* ctx, const Bytes* in,
                                         Bytes* out) override;
  grpc::ServerUnaryReactor* GetTrainingJob(grpc::CallbackServerContext* ctx, const Bytes* in,
                                           Bytes* out) override;
  grpc::ServerWriteReactor<Bytes>* ExportLog(grpc::CallbackServerContext* ctx,
                                             const Bytes* in) override;
  grpc::ServerUnaryReactor* ListAuditLog(grpc::CallbackServerContext* ctx, const Bytes* in,
                                         Bytes* out) override;
  grpc::ServerUnaryReactor* Explain(grpc::CallbackServerContext* ctx, const Bytes* in,
                                    Bytes* out) override;
  grpc::ServerUnaryReactor* Activate(grpc::CallbackServerContext* ctx, const Bytes* in,
                                     Bytes* out) override;
  grpc::ServerUnaryReactor* ChooseSlate(grpc::CallbackServerContext* ctx, const Bytes* in,
                                        Bytes* out) override;
  grpc::ServerUnaryReactor* ChooseBatch(grpc::CallbackServerContext* ctx, const Bytes* in,
                                        Bytes* out) override;
  grpc::ServerUnaryReactor* Promote(grpc::CallbackServerContext* ctx, const Bytes* in,
                                    Bytes* out) override;
  grpc::ServerUnaryReactor* Demote(grpc::CallbackServerContext* ctx, const Bytes* in,
                                   Bytes* out) override;
  grpc::ServerUnaryReactor* EvaluateModel(grpc::CallbackServerContext* ctx, const Bytes* in,
                                          Bytes* out) override;
  // Moving a problem: sent to a replica directly, so the placement map is not checked.
  grpc::ServerUnaryReactor* BeginMove(grpc::CallbackServerContext* ctx, const Bytes* in,
                                      Bytes* out) override;
  grpc::ServerUnaryReactor* ExportProblem(grpc::CallbackServerContext* ctx, const Bytes* in,
                                          Bytes* out) override;
  grpc::ServerUnaryReactor* ImportProblem(grpc::CallbackServerContext* ctx, const Bytes* in,
                                          Bytes* out) override;
  grpc::ServerUnaryReactor* EndMove(grpc::CallbackServerContext* ctx, const Bytes* in,
                                    Bytes* out) override;

  // The role each RPC needs (the table of auth.h).
  static Role RoleOf(absl::string_view method);

  // Testing seam: called in Choose after its deadline and cancellation checks, just before
  // the decision (a test cancels the call there). Set before serving; null in production.
  void set_before_decide_for_testing(std::function<void(grpc::CallbackServerContext*)> hook) {
    before_decide_for_testing_ = std::move(hook);
  }

 private:
  // What a call is, for authorization and the audit log.
  struct Call {
    const char* method;
    absl::string_view problem_id;  // "" for calls without one
    // Administrative calls only: what the audit log records besides the problem, evaluated
    // once the call finished (it may read the response).
    std::function<std::string()> audit_detail;
    // Whether the placement map must place the problem here (CheckRouting): not for the
    // calls of a move, which address a replica, not the problem's owner.
    bool routed = true;
  };
  absl::StatusOr<Grant> Authorize(grpc::CallbackServerContext* ctx, const Call& call) const;
  // INVALID_ARGUMENT if the call's x-decision-problem metadata names another problem than
  // its request (a proxy would have routed it by the wrong one); FAILED_PRECONDITION if the
  // placement map puts its problem on another replica.
  absl::Status CheckRouting(grpc::CallbackServerContext* ctx, const Call& call) const;
  // CANCELLED or DEADLINE_EXCEEDED if the caller of a Choose, ChooseSlate or ChooseBatch is
  // gone before it decides: nothing is decided for it.
  static absl::Status CallerGone(grpc::CallbackServerContext* ctx);

  // Parses the request into a UnaryCall (INVALID_ARGUMENT if it does not parse), describes
  // it (describe(request, response) -> Call; the audit detail may read the response once
  // the call finished), authorizes it, then start(grant, call, done) queues the
  // work; the reactor finishes in done, possibly on another thread, so the handler returns
  // at once. Calls that never block (in-memory reads under short locks) call done at once;
  // everything that blocks runs on the service's executors. A call that is not authorized
  // finishes at once without starting.
  template <typename Request, typename Response, typename Describe, typename Start>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* ctx, const char* method,
                                  const Bytes* in, Bytes* out, Describe&& describe,
                                  Start&& start);
  void CountError(const char* method, const grpc::Status& status);

  DecisionService* service_;
  Metrics* metrics_;
  const Authorizer* auth_;
  Placement* placement_;  // ImportProblem claims what it imports
  std::function<void(grpc::CallbackServerContext*)> before_decide_for_testing_;
};

}  // namespace decision::server

#endif  // DECISION_SERVER_GRPC_SERVICE_H_
