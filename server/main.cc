// decisiond: the decision service. Flags are defined here and nowhere else.
//
//   decisiond --listen=0.0.0.0:50051 --metrics_listen=0.0.0.0:9464 --data_dir=./data
//
// On start it prints one line "decisiond listening on HOST:PORT metrics on HOST:PORT" (the
// ports actually bound, so port 0 works), then serves until SIGTERM or SIGINT: it stops
// accepting, drains the RPCs in flight, checkpoints every problem and exits 0.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/exposer.h"
#include "server/clock.h"
#include "server/decision_service.h"
#include "server/grpc_service.h"
#include "server/metrics.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address (host:port; port 0 picks one)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus metrics address (host:port; port 0 picks one; empty disables)");
ABSL_FLAG(std::string, data_dir, "./data", "directory of the RocksDB store");
ABSL_FLAG(bool, sync_writes, false,
          "fsync every write: survives power loss, not just a process crash (slower)");
ABSL_FLAG(bool, durable_choose, false,
          "answer Choose only once its decision is written; off: answer at once and write it "
          "with its Reward or within --maintenance_interval_ms (a crash forgets about that "
          "long of unrewarded decisions; acknowledged rewards are durable either way)");
ABSL_FLAG(int, max_message_bytes, 4 << 20, "largest request accepted, in bytes");
ABSL_FLAG(uint64_t, seed, 0, "random seed of the decisions (0: from the OS)");
ABSL_FLAG(int, maintenance_interval_ms, 20,
          "period of the background work: expiry, backfill, divergence refresh, metrics");
ABSL_FLAG(int, shutdown_grace_ms, 5000, "how long SIGTERM waits for RPCs in flight");
ABSL_FLAG(bool, inline_maintenance, false,
          "run expiry, backfill, divergence refresh and training synchronously after each "
          "Reward: slower, but decisions are a deterministic function of --seed and the "
          "request sequence (for tests and reproducible replays)");
ABSL_FLAG(int, training_threads, 1, "threads of each XGBoost training job");
ABSL_FLAG(int64_t, min_refresh_interval_ms, 10000,
          "batch boundaries (divergence refresh, auto-training) closer than this in wall time "
          "are merged");

namespace {

decision::server::ServiceOptions OptionsFromFlags() {
  decision::server::ServiceOptions options;
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.sync_writes = absl::GetFlag(FLAGS_sync_writes);
  options.durable_choose = absl::GetFlag(FLAGS_durable_choose);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.maintenance_interval_ms = absl::GetFlag(FLAGS_maintenance_interval_ms);
  options.inline_maintenance = absl::GetFlag(FLAGS_inline_maintenance);
  options.start_maintenance_thread = !options.inline_maintenance;
  options.training_threads = absl::GetFlag(FLAGS_training_threads);
  options.min_refresh_interval_ms = absl::GetFlag(FLAGS_min_refresh_interval_ms);
  return options;
}

// Serves `metrics` on --metrics_listen (unless empty); false, with a message, on failure.
bool StartMetrics(decision::server::Metrics* metrics,
                  std::unique_ptr<prometheus::Exposer>* exposer, std::string* address) {
  const std::string m = absl::GetFlag(FLAGS_metrics_listen);
  if (m.empty()) return true;
  try {
    *exposer = std::make_unique<prometheus::Exposer>(m);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decisiond: cannot serve metrics on %s: %s\n", m.c_str(), e.what());
    return false;
  }
  (*exposer)->RegisterCollectable(metrics->registry());
  const auto ports = (*exposer)->GetListeningPorts();
  *address = absl::StrCat(m.substr(0, m.rfind(':')), ":", ports.empty() ? 0 : ports[0]);
  return true;
}

int Run() {
  using namespace decision::server;
  // Block the termination signals in every thread; main waits for them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  SystemClock clock;
  Metrics metrics;
  const ServiceOptions options = OptionsFromFlags();
  if (options.maintenance_interval_ms < 1 || absl::GetFlag(FLAGS_max_message_bytes) < 1024) {
    std::fprintf(stderr, "decisiond: --maintenance_interval_ms must be >= 1 and "
                         "--max_message_bytes >= 1024\n");
    return 2;
  }
  auto service = DecisionService::Open(options, &clock, &metrics);
  if (!service.ok()) {
    std::fprintf(stderr, "decisiond: cannot start: %s\n", service.status().ToString().c_str());
    return 1;
  }

  std::unique_ptr<prometheus::Exposer> exposer;
  std::string metrics_address = "disabled";
  if (!StartMetrics(&metrics, &exposer, &metrics_address)) return 1;

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  GrpcDecisionService grpc_service(service->get(), &metrics);
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  builder.RegisterService(&grpc_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "decisiond: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  std::printf("decisiond listening on %s:%d metrics on %s\n",
              listen.substr(0, listen.rfind(':')).c_str(), port, metrics_address.c_str());
  std::fflush(stdout);

  int signal = 0;
  sigwait(&signals, &signal);
  std::fprintf(stderr, "decisiond: signal %d: draining\n", signal);
  server->GetHealthCheckService()->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  server->Wait();
  absl::Status closed = (*service)->Shutdown();
  if (!closed.ok()) {
    std::fprintf(stderr, "decisiond: shutdown: %s\n", closed.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "decisiond: stopped cleanly\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil is built with deadlock detection on: it costs a graph update per lock.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage("decisiond: contextual-bandit decisions with stochastic experts");
  absl::ParseCommandLine(argc, argv);
  return Run();
}
