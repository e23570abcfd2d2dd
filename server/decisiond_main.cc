// decisiond: the decision service. Flags are defined here and nowhere else.
//
//   decisiond --listen=0.0.0.0:50051 --metrics_listen=0.0.0.0:9464 --data_dir=./data
//             --tls_cert=server.pem --tls_key=server.key --tokens_file=tokens.txt
//
// On a non-loopback address it refuses to start without TLS and a tokens file unless
// --insecure_plaintext and --allow_unauthenticated say otherwise (README, "Security").
// SIGHUP re-reads the tokens file and the placement map.
//
// On start it prints one line "decisiond listening on HOST:PORT metrics on HOST:PORT" (the
// ports actually bound, so port 0 works), then serves until SIGTERM or SIGINT: it stops
// accepting, drains the RPCs in flight, checkpoints every problem and exits 0.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <malloc.h>  // mallopt (glibc)
#ifdef DECISION_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/auth.h"
#include "server/clock.h"
#include "server/decision_service.h"
#include "server/executor.h"
#include "server/grpc_service.h"
#include "server/listen_address.h"
#include "server/metrics.h"
#include "server/metrics_endpoint.h"
#include "server/placement.h"
#include "server/validation.h"

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
ABSL_FLAG(int, training_threads, 0,
          "experts of a training job trained at once, one thread each (the models are the "
          "same at any value); 0: as many as the CPUs decisiond may run on");
ABSL_FLAG(int, scoring_threads, 0,
          "threads that score joined samples and backfills and compute divergences at once "
          "(what is learned is the same at any value); 0: as many as the CPUs decisiond may "
          "run on, at most 16");
ABSL_FLAG(int64_t, malloc_trim_interval_ms, 30000,
          "how often the memory the allocator holds free goes back to the operating system "
          "(jemalloc's purge of every arena, or glibc's malloc_trim in a build without "
          "jemalloc; 0: never)");
ABSL_FLAG(int64_t, malloc_mmap_threshold_kb, 256,
          "a build without jemalloc (-DDECISION_JEMALLOC=OFF, the sanitizer builds) only: "
          "allocations of at least this many KiB get their own mapping, returned to the "
          "operating system when freed (glibc's M_MMAP_THRESHOLD; 0: glibc's default, which "
          "raises the threshold up to 32 MiB after large frees, so that large transient "
          "buffers fragment the arenas; GLIBC_TUNABLES then applies)");
ABSL_FLAG(std::string, background_priority, "low",
          "CPU priority of the background threads, so that under CPU saturation the threads "
          "answering requests run first: low (learner, scorers, maintenance, expert pool and "
          "trainer at nice 10), idle (learner, scorers, expert pool and trainer at SCHED_IDLE, "
          "maintenance and "
          "RocksDB's compactions at nice 19; only in a cgroup "
          "of its own, such as a container: SCHED_IDLE yields to every busy process of the "
          "cgroup) or normal");
ABSL_FLAG(std::string, background_cpus, "",
          "CPUs for the background threads (learner, scorers, trainer and XGBoost's threads, "
          "maintenance, expert pool, RocksDB's flushes and compactions, jemalloc's purge "
          "thread), e.g. 2-3 or 1,3; "
          "the threads that answer requests then run on the other CPUs decisiond may use. "
          "Empty: every thread may run on every CPU");
ABSL_FLAG(int64_t, reservoir_predictions_mb, 128,
          "memory per problem for the experts' predictions on the divergence reservoir, kept "
          "so that a refresh predicts only the rows that changed (0: predict all rows at "
          "every refresh)");
ABSL_FLAG(int64_t, max_pending_decisions, 1'000'000,
          "cap per problem on the decisions waiting for their reward; a Choose past it gets "
          "RESOURCE_EXHAUSTED until rewards or the reward wait bring it down");
ABSL_FLAG(int64_t, max_pending_decisions_mb, 1024,
          "cap per problem on the estimated memory of the decisions waiting for their reward "
          "(8 bytes per feature + 512 each); a Choose past it gets RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_problems, 10'000,
          "cap on the problems of this server; CreateProblem past it gets RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_experts_per_problem, 256,
          "cap per problem on the experts registered, retired and failed ones included (the "
          "log keeps their columns, the estimator their counts and divergences); "
          "RegisterExpert and training jobs past it get RESOURCE_EXHAUSTED; at most 256");
ABSL_FLAG(int64_t, max_problem_memory_mb, 1024,
          "cap per problem on the memory that grows with its experts (the estimator's state "
          "and the samples kept in memory: decision_problem_memory_bytes); RegisterExpert and "
          "training jobs that would pass it get RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_divergence_terms, int64_t{1} << 33,
          "cap per problem on the per-context terms (ordered pair of experts x context x arm) "
          "one divergence computation evaluates, 3 to 5 ns each here: the default, 2^33, is "
          "27 to 45 s of CPU, shared by the expert-pool and scorer threads; RegisterExpert "
          "and training jobs that would pass it get RESOURCE_EXHAUSTED");
ABSL_FLAG(int, metrics_pair_experts, 16,
          "the divergence pair series (decision_divergence_mij, _sigmaij) cover at most this many "
          "active experts per problem, those of highest UCB: 2 n (n - 1) series; "
          "GetEstimates has the full matrix");
ABSL_FLAG(int64_t, min_refresh_interval_ms, 0,
          "opt-in CPU throttle: batch boundaries (divergence refresh, auto-training) closer "
          "than this in wall time merge into one (fewer batches than the paper's schedule). "
          "0: every boundary at its round");

ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of the gRPC port (enables TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: clients must present a certificate it signed (mutual TLS)");
ABSL_FLAG(int, tls_reload_interval_s, 60,
          "how often the TLS files are re-read; a changed certificate takes effect without a "
          "restart");
ABSL_FLAG(bool, insecure_plaintext, false,
          "allow plaintext gRPC on a non-loopback address (a warning is printed)");
ABSL_FLAG(std::string, tokens_file, "",
          "per-role bearer tokens (hashes only; see server/auth.h); re-read on SIGHUP. Without "
          "it every call is allowed, which decisiond accepts only on loopback unless "
          "--allow_unauthenticated");
ABSL_FLAG(std::string, replica_id, "",
          "this replica's name in the placement map (the proxy's backend name for it; "
          "deploy/haproxy)");
ABSL_FLAG(std::string, placement_map, "",
          "the proxy's placement map (\"PROBLEM_ID REPLICA_ID\" lines; server/placement.h): "
          "calls for a problem it places on another replica are refused, naming the owner; "
          "re-read on SIGHUP. Needs --replica_id");
ABSL_FLAG(bool, allow_unauthenticated, false,
          "serve a non-loopback address without a tokens file (a warning is printed)");
ABSL_FLAG(std::string, model_probe, "",
          "the decision_model_probe executable that loads clients' XGBoost models in a "
          "sandbox (default: next to decisiond)");
ABSL_FLAG(int64_t, model_probe_memory_mb, 2048, "address-space limit of the model probe, MB");
ABSL_FLAG(int64_t, model_probe_timeout_ms, 30000,
          "wall-time limit of the model probe (its CPU limit is the same, rounded up to s)");

#ifdef DECISION_JEMALLOC
// decisiond allocates through jemalloc (linked in its place of glibc's malloc; see
// server/CMakeLists.txt). Its settings, read when it starts: a background thread returns
// freed pages to the operating system as they age (dirty pages after 5 s, without waiting
// for the next allocation in that arena), so that memory comes back between the periodic
// purges (--malloc_trim_interval_ms); one such thread does for every arena. MALLOC_CONF in
// the environment overrides them.
extern "C" {
// NOLINTNEXTLINE: the name jemalloc reads.
const char* malloc_conf =
    "background_thread:true,max_background_threads:1,dirty_decay_ms:5000,muzzy_decay_ms:0";
}
#endif

namespace {

// The model probe next to this executable (/proc/self/exe), or "" if it cannot be found.
std::string DefaultModelProbe() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "";
  return (self.parent_path() / "decision_model_probe").string();
}

// --background_priority's names; nullopt for any other.
std::optional<decision::server::ThreadPriority> ParseThreadPriority(const std::string& name) {
  using decision::server::ThreadPriority;
  if (name == "low") return ThreadPriority::kLow;
  if (name == "idle") return ThreadPriority::kIdle;
  if (name == "normal") return ThreadPriority::kNormal;
  return std::nullopt;
}

#ifdef DECISION_JEMALLOC
decision::server::ServiceOptions::Allocator JemallocHooks() {
  decision::server::ServiceOptions::Allocator hooks;
  hooks.release = [] {
    const std::string purge = "arena." + std::to_string(MALLCTL_ARENAS_ALL) + ".purge";
    mallctl(purge.c_str(), nullptr, nullptr, nullptr, 0);
  };
  hooks.bytes = [] {
    uint64_t epoch = 1;  // jemalloc's statistics are a snapshot taken at an epoch
    size_t size = sizeof(epoch);
    mallctl("epoch", &epoch, &size, &epoch, size);
    const auto read = [](const char* name) {
      size_t value = 0;
      size_t value_size = sizeof(value);
      return mallctl(name, &value, &value_size, nullptr, 0) == 0 ? static_cast<double>(value)
                                                                 : 0.0;
    };
    decision::server::ServiceOptions::AllocatorBytes bytes;
    bytes.in_use = read("stats.allocated");
    bytes.free = std::max(0.0, read("stats.resident") - bytes.in_use);
    bytes.mapped = read("stats.mapped");
    return bytes;
  };
  return hooks;
}

// jemalloc starts its background purge thread at the first allocation, before main could pin
// anything; restarted from a thread on `cpus`, it runs there (a thread inherits its creator's
// CPUs). Nothing if it is off (MALLOC_CONF).
void MoveAllocatorThread(const std::vector<int>& cpus) {
  bool enabled = false;
  size_t size = sizeof(enabled);
  if (mallctl("background_thread", &enabled, &size, nullptr, 0) != 0 || !enabled) return;
  std::thread([&cpus] {
    decision::server::PinCurrentThread(cpus);
    bool off = false, on = true;
    if (mallctl("background_thread", nullptr, nullptr, &off, sizeof(off)) != 0 ||
        mallctl("background_thread", nullptr, nullptr, &on, sizeof(on)) != 0) {
      std::fprintf(stderr, "decisiond: could not restart jemalloc's background thread on "
                           "--background_cpus\n");
    }
  }).join();
}
#endif

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
  options.scoring_threads = absl::GetFlag(FLAGS_scoring_threads);
  options.malloc_trim_interval_ms = absl::GetFlag(FLAGS_malloc_trim_interval_ms);
#ifdef DECISION_JEMALLOC
  options.allocator = JemallocHooks();
#endif
  options.reservoir_predictions_mb = absl::GetFlag(FLAGS_reservoir_predictions_mb);
  options.max_pending_decisions = absl::GetFlag(FLAGS_max_pending_decisions);
  options.max_pending_decisions_mb = absl::GetFlag(FLAGS_max_pending_decisions_mb);
  options.max_problems = absl::GetFlag(FLAGS_max_problems);
  options.metrics_pair_experts = absl::GetFlag(FLAGS_metrics_pair_experts);
  options.max_experts_per_problem = absl::GetFlag(FLAGS_max_experts_per_problem);
  options.max_problem_memory_mb = absl::GetFlag(FLAGS_max_problem_memory_mb);
  options.max_divergence_terms = absl::GetFlag(FLAGS_max_divergence_terms);
  // An unknown name is refused in main, before anything starts.
  options.background_priority =
      ParseThreadPriority(absl::GetFlag(FLAGS_background_priority))
          .value_or(decision::server::ThreadPriority::kLow);
  options.min_refresh_interval_ms = absl::GetFlag(FLAGS_min_refresh_interval_ms);
  options.model_sandbox.probe_path = absl::GetFlag(FLAGS_model_probe);
  if (options.model_sandbox.probe_path.empty()) {
    options.model_sandbox.probe_path = DefaultModelProbe();
  }
  options.model_sandbox.memory_mb = absl::GetFlag(FLAGS_model_probe_memory_mb);
  options.model_sandbox.timeout_ms = absl::GetFlag(FLAGS_model_probe_timeout_ms);
  options.model_sandbox.cpu_seconds = (options.model_sandbox.timeout_ms + 999) / 1000;
  return options;
}

// Whether `address` (host:port) binds only the loopback interface.
bool IsLoopback(const std::string& address) {
  const std::string host = decision::server::ListenHost(address);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The gRPC port's credentials from the --tls_* flags, or plaintext; nullptr (with a message)
// if the flags are inconsistent or refuse plaintext here.
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFromFlags(const std::string& listen) {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert), key = absl::GetFlag(FLAGS_tls_key),
                    client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (cert.empty() != key.empty() || (cert.empty() && !client_ca.empty())) {
    std::fprintf(stderr, "decisiond: --tls_cert and --tls_key go together, and "
                         "--tls_client_ca needs them\n");
    return nullptr;
  }
  if (cert.empty()) {
    if (!IsLoopback(listen)) {
      if (!absl::GetFlag(FLAGS_insecure_plaintext)) {
        std::fprintf(stderr,
                     "decisiond: refusing plaintext gRPC on non-loopback %s: give --tls_cert "
                     "and --tls_key, or --insecure_plaintext on a trusted network\n",
                     listen.c_str());
        return nullptr;
      }
      std::fprintf(stderr, "decisiond: WARNING: plaintext gRPC on %s (--insecure_plaintext): "
                           "anyone on the network can read the traffic and its tokens\n",
                   listen.c_str());
    }
    return grpc::InsecureServerCredentials();
  }
  for (const std::string& file : {cert, key, client_ca}) {
    if (!file.empty() && access(file.c_str(), R_OK) != 0) {
      std::fprintf(stderr, "decisiond: cannot read TLS file %s\n", file.c_str());
      return nullptr;
    }
  }
  const int interval = absl::GetFlag(FLAGS_tls_reload_interval_s);
  if (interval < 1) {
    std::fprintf(stderr, "decisiond: --tls_reload_interval_s must be >= 1\n");
    return nullptr;
  }
  // gRPC's file-watching provider re-reads the files every `interval` seconds: a rotated
  // certificate (or client CA) is used by new connections without a restart.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      key, cert, client_ca, static_cast<unsigned>(interval));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (client_ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

int Run() {
  using namespace decision::server;
  // Block the termination signals in every thread; main waits for them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  SystemClock clock;
  Metrics metrics;
  ServiceOptions options = OptionsFromFlags();
  if (options.maintenance_interval_ms < 1 || absl::GetFlag(FLAGS_max_message_bytes) < 1024) {
    std::fprintf(stderr, "decisiond: --maintenance_interval_ms must be >= 1 and "
                         "--max_message_bytes >= 1024\n");
    return 2;
  }
  if (const std::string p = absl::GetFlag(FLAGS_background_priority);
      !ParseThreadPriority(p).has_value()) {
    std::fprintf(stderr, "decisiond: --background_priority must be idle, low or normal, not %s\n",
                 p.c_str());
    return 2;
  }
  if (options.training_threads < 0 || options.training_threads > 64 ||
      options.scoring_threads < 0 || options.scoring_threads > 64) {
    std::fprintf(stderr, "decisiond: --training_threads and --scoring_threads must be in "
                         "[0, 64] (0: one per CPU decisiond may run on)\n");
    return 2;
  }
  if (options.reservoir_predictions_mb < 0 || options.reservoir_predictions_mb > (1 << 20)) {
    std::fprintf(stderr, "decisiond: --reservoir_predictions_mb must be in [0, 1048576]\n");
    return 2;
  }
  if (options.max_pending_decisions < 1 || options.max_pending_decisions_mb < 1 ||
      options.max_pending_decisions_mb > (int64_t{1} << 30) || options.max_problems < 1 ||
      options.metrics_pair_experts < 0 || options.metrics_pair_experts > 256 ||
      options.max_experts_per_problem < 1 ||
      options.max_experts_per_problem > kMaxExpertsPerProblem ||
      options.max_problem_memory_mb < 1 || options.max_problem_memory_mb > (int64_t{1} << 30) ||
      options.max_divergence_terms < 1) {
    std::fprintf(stderr,
                 "decisiond: --max_pending_decisions, --max_problems and "
                 "--max_divergence_terms must be >= 1, "
                 "--max_pending_decisions_mb and --max_problem_memory_mb in [1, 1073741824], "
                 "--metrics_pair_experts in [0, 256] and --max_experts_per_problem in [1, %d]\n",
                 kMaxExpertsPerProblem);
    return 2;
  }
  if (access(options.model_sandbox.probe_path.c_str(), X_OK) != 0 ||
      options.model_sandbox.memory_mb < 64 || options.model_sandbox.timeout_ms < 100) {
    std::fprintf(stderr,
                 "decisiond: the model probe '%s' is not an executable (--model_probe), or "
                 "--model_probe_memory_mb < 64 or --model_probe_timeout_ms < 100\n",
                 options.model_sandbox.probe_path.c_str());
    return 2;
  }
  if (const std::string list = absl::GetFlag(FLAGS_background_cpus); !list.empty()) {
    absl::StatusOr<std::vector<int>> background = ParseCpuList(list);
    if (!background.ok()) {
      std::fprintf(stderr, "decisiond: --background_cpus: %s\n",
                   std::string(background.status().message()).c_str());
      return 2;
    }
    const std::vector<int> allowed = CurrentThreadCpus();
    std::vector<int> request_cpus;
    std::set_difference(allowed.begin(), allowed.end(), background->begin(), background->end(),
                        std::back_inserter(request_cpus));
    if (!std::includes(allowed.begin(), allowed.end(), background->begin(),
                       background->end())) {
      std::fprintf(stderr, "decisiond: --background_cpus=%s names CPUs decisiond may not run "
                           "on: it may run on %s\n",
                   list.c_str(), FormatCpuList(allowed).c_str());
      return 2;
    }
    if (request_cpus.empty()) {
      std::fprintf(stderr, "decisiond: --background_cpus=%s leaves no CPU for the threads "
                           "that answer requests: decisiond may run on %s\n",
                   list.c_str(), FormatCpuList(allowed).c_str());
      return 2;
    }
    options.background_cpus = *std::move(background);
    // This thread, and every thread it starts from here on (gRPC's, the writer, the
    // blocking executor, the metrics server): the request CPUs. The background threads
    // move to theirs as they start (ServiceOptions::background_cpus).
    PinCurrentThread(request_cpus);
#ifdef DECISION_JEMALLOC
    MoveAllocatorThread(options.background_cpus);
#endif
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  const std::shared_ptr<grpc::ServerCredentials> credentials = ServerCredentialsFromFlags(listen);
  if (credentials == nullptr) return 2;
  absl::StatusOr<std::unique_ptr<Authorizer>> auth =
      Authorizer::Open(absl::GetFlag(FLAGS_tokens_file));
  if (!auth.ok()) {
    std::fprintf(stderr, "decisiond: %s\n", auth.status().ToString().c_str());
    return 2;
  }
  if ((*auth)->open() && !IsLoopback(listen)) {
    if (!absl::GetFlag(FLAGS_allow_unauthenticated)) {
      std::fprintf(stderr,
                   "decisiond: refusing to serve non-loopback %s without a --tokens_file: "
                   "anyone who can reach it could create, retire and export everything. Give "
                   "--tokens_file, or --allow_unauthenticated on a trusted network\n",
                   listen.c_str());
      return 2;
    }
    std::fprintf(stderr, "decisiond: WARNING: no --tokens_file: every caller on %s may do "
                         "everything (--allow_unauthenticated)\n", listen.c_str());
  }
  if (!absl::GetFlag(FLAGS_placement_map).empty() && absl::GetFlag(FLAGS_replica_id).empty()) {
    std::fprintf(stderr, "decisiond: --placement_map needs --replica_id (this replica's "
                         "name in the map)\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Placement>> placement =
      Placement::Open(absl::GetFlag(FLAGS_replica_id), absl::GetFlag(FLAGS_placement_map));
  if (!placement.ok()) {
    std::fprintf(stderr, "decisiond: %s\n", placement.status().ToString().c_str());
    return 2;
  }
  auto service = DecisionService::Open(options, &clock, &metrics);
  if (!service.ok()) {
    // A store that cannot be opened names itself and the reason, in one line: "decisiond:
    // cannot open the store at PATH: REASON".
    const absl::Status& failed = service.status();
    if (absl::StartsWith(failed.message(), "cannot open the store")) {
      std::fprintf(stderr, "decisiond: %s\n", std::string(failed.message()).c_str());
    } else {
      std::fprintf(stderr, "decisiond: cannot start: %s\n", failed.ToString().c_str());
    }
    return 1;
  }

  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  std::string metrics_address = "disabled";
  if (const std::string m = absl::GetFlag(FLAGS_metrics_listen); !m.empty()) {
    auto started = MetricsEndpoint::Start(m, metrics.registry());
    if (!started.ok()) {
      std::fprintf(stderr, "decisiond: %s\n", std::string(started.status().message()).c_str());
      return 1;
    }
    metrics_endpoint = *std::move(started);
    metrics_address = metrics_endpoint->address();
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  LimitProtobufLogs();
  GrpcDecisionService grpc_service(service->get(), &metrics, auth->get(), placement->get());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, credentials, &port);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  builder.RegisterService(&grpc_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "decisiond: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  std::printf("decisiond listening on %s:%d metrics on %s\n",
              ListenHostPart(listen).c_str(), port, metrics_address.c_str());
  std::fflush(stdout);

  int signal = 0;
  while (true) {
    sigwait(&signals, &signal);
    if (signal != SIGHUP) break;
    // SIGHUP: re-read the tokens file. A bad file keeps the tokens in force.
    if (absl::Status s = (*auth)->Reload(); !s.ok()) {
      std::fprintf(stderr, "decisiond: SIGHUP: tokens not reloaded, the old ones stay: %s\n",
                   s.ToString().c_str());
    } else {
      std::fprintf(stderr, "decisiond: SIGHUP: %zu tokens loaded\n", (*auth)->size());
    }
    if (absl::Status s = (*placement)->Reload(); !s.ok()) {
      std::fprintf(stderr, "decisiond: SIGHUP: placement map not reloaded, the old one "
                           "stays: %s\n", s.ToString().c_str());
    } else if (!absl::GetFlag(FLAGS_placement_map).empty()) {
      std::fprintf(stderr, "decisiond: SIGHUP: %zu problems placed\n", (*placement)->size());
    }
  }
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
  absl::SetProgramUsageMessage(
      "decisiond [--flag=value ...]: contextual-bandit decisions with stochastic experts");
  absl::ParseCommandLine(argc, argv);
#ifdef __GLIBC__
  // Before any thread starts. A fixed threshold also stops glibc's dynamic one: large
  // buffers (reservoir predictions, scoring and training scratch, checkpoints) are mapped
  // and unmapped instead of fragmenting the arenas (bench/README.md, "Soak").
  const int64_t mmap_threshold_kb = absl::GetFlag(FLAGS_malloc_mmap_threshold_kb);
  if (mmap_threshold_kb < 0 || mmap_threshold_kb > (int64_t{32} << 10)) {
    std::fprintf(stderr, "decisiond: --malloc_mmap_threshold_kb=%lld: must be in [0, 32768]\n",
                 static_cast<long long>(mmap_threshold_kb));
    return 2;
  }
#ifndef DECISION_JEMALLOC
  if (mmap_threshold_kb > 0) mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold_kb << 10));
#endif
#endif
  return Run();
}
