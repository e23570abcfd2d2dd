// null_server: the decision.v1 service with trivial handlers (Choose returns arm 0, Reward
// returns first = true, nothing is stored or computed), on the same gRPC callback server
// setup as decisiond. The load generator measures it next to decisiond in the same run: the
// ratio of the two is what the service costs on top of gRPC itself.
//
// With --work_us=W every Choose and Reward handler first burns W us of its thread's CPU:
// load --calibrate_work_us uses it to show what W us of work per RPC costs in throughput.
//
//   null_server --listen=127.0.0.1:0   (prints "null_server listening on HOST:PORT")
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <time.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "decision/v1/decision.grpc.pb.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC listen address");
ABSL_FLAG(int, work_us, 0,
          "CPU each handler burns before it answers (calibration: what a server with this much "
          "work per RPC gets from gRPC on this machine)");

namespace {

namespace v1 = decision::v1;

// Spins for the --work_us flag's microseconds of the calling thread's CPU time.
void Work() {
  static const int work_us = absl::GetFlag(FLAGS_work_us);
  if (work_us <= 0) return;
  timespec start;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
  for (;;) {
    timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    const long elapsed_ns =
        (now.tv_sec - start.tv_sec) * 1'000'000'000L + (now.tv_nsec - start.tv_nsec);
    if (elapsed_ns >= work_us * 1000L) return;
  }
}

class NullService final : public v1::DecisionService::CallbackService {
  grpc::ServerUnaryReactor* Choose(grpc::CallbackServerContext* ctx, const v1::ChooseRequest* req,
                                   v1::ChooseResponse* resp) override {
    Work();
    resp->set_event_id(req->event_id());
    resp->set_arm(0);
    resp->set_propensity(1.0);
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Reward(grpc::CallbackServerContext* ctx, const v1::RewardRequest*,
                                   v1::RewardResponse* resp) override {
    Work();
    resp->set_first(true);
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  NullService service;
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "null_server: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  std::printf("null_server listening on %s:%d\n", listen.substr(0, listen.rfind(':')).c_str(),
              port);
  std::fflush(stdout);
  int signal = 0;
  sigwait(&signals, &signal);
  server->Shutdown();
  return 0;
}
