// The decision service without its transport: every RPC of decision.v1 as a plain method
// that validates its input, calls the problem's engine and the store, and returns an
// absl::Status (see the error table in proto/decision/v1/decision.proto). The gRPC layer
// (grpc_service.h) only converts; tests call this class directly.
//
// Thread safety: every method may be called concurrently.
#ifndef DECISION_SERVER_DECISION_SERVICE_H_
#define DECISION_SERVER_DECISION_SERVICE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "decision/v1/decision.pb.h"
#include "server/clock.h"
#include "server/metrics.h"
#include "server/problem.h"
#include "server/trainer.h"
#include "storage/store.h"

namespace decision::server {

struct ServiceOptions {
  std::string data_dir = "data";
  bool sync_writes = false;  // fsync every write (see storage/store.h)
  // Choose answers only once its decision is written. Off (the default), a decision is
  // answered at once and written with its Reward or within maintenance_interval_ms; a crash
  // forgets the decisions not yet written (see "Deferred decisions" in server/problem.h).
  // Acknowledged rewards are durable either way.
  bool durable_choose = false;
  uint64_t seed = 0;         // 0: seeded from the OS
  // How often the maintenance thread expires decisions, backfills and refreshes.
  int maintenance_interval_ms = 20;
  bool start_maintenance_thread = true;
  // Run a problem's maintenance (expiry, the whole backfill, divergence refresh, training)
  // synchronously after every Reward instead of on the background threads. Slower, but the
  // decisions become a deterministic function of the seed and the request sequence: for
  // tests and reproducible replays.
  bool inline_maintenance = false;
  // Batch boundaries (divergence refresh, auto-training) closer than this in wall time are
  // merged: the boundary waits. The refresh costs O(N^2 R K) and, at thousands of rewards
  // per second, the paper's b sqrt(t) schedule would refresh several times a second.
  // Ignored with inline_maintenance (the schedule then follows the samples only).
  int64_t min_refresh_interval_ms = 10'000;
  // Threads each XGBoost training job uses.
  int training_threads = 1;
};

class DecisionService {
 public:
  // Opens the store under options.data_dir (created if missing) and restores every problem.
  // `clock` and `metrics` must outlive the service.
  static absl::StatusOr<std::unique_ptr<DecisionService>> Open(const ServiceOptions& options,
                                                               const Clock* clock,
                                                               Metrics* metrics);
  ~DecisionService();

  // Stops the maintenance thread, checkpoints every problem and closes the store. Further
  // calls return UNAVAILABLE.
  absl::Status Shutdown();

  absl::Status CreateProblem(const v1::CreateProblemRequest& request, v1::Problem* response);
  absl::Status GetProblem(const v1::GetProblemRequest& request, v1::Problem* response);
  absl::Status ListProblems(const v1::ListProblemsRequest& request,
                            v1::ListProblemsResponse* response);
  absl::Status RegisterExpert(const v1::RegisterExpertRequest& request, v1::Expert* response);
  absl::Status ListExperts(const v1::ListExpertsRequest& request,
                           v1::ListExpertsResponse* response);
  absl::Status RetireExpert(const v1::RetireExpertRequest& request, v1::Expert* response);
  absl::Status Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response);
  absl::Status Reward(const v1::RewardRequest& request, v1::RewardResponse* response);
  // The same, asynchronous: `done` is called once, when the joined sample is durable, or
  // when the decision is answered (deferred) or durable (durable_choose); see Problem. The
  // gRPC layer uses these, so that a handler never blocks.
  void Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response, Done done);
  void Reward(const v1::RewardRequest& request, v1::RewardResponse* response, Done done);
  absl::Status GetEstimates(const v1::GetEstimatesRequest& request, v1::Estimates* response);
  absl::Status ExportLog(const v1::ExportLogRequest& request,
                         const std::function<absl::Status(const v1::LoggedSample&)>& fn);
  absl::Status TrainExperts(const v1::TrainExpertsRequest& request,
                            v1::TrainExpertsResponse* response);

  // One round of maintenance for every problem: expiry, one backfill chunk, divergence
  // refresh, metrics. The maintenance thread calls it; tests with start_maintenance_thread
  // = false call it themselves.
  absl::Status RunMaintenance();

 private:
  DecisionService(const ServiceOptions& options, const Clock* clock, Metrics* metrics)
      : options_(options), clock_(clock), metrics_(metrics) {}
  absl::StatusOr<Problem*> Find(const std::string& problem_id);
  void MaintenanceLoop();
  // One problem's maintenance; `backfill_budget` bounds the time spent backfilling.
  absl::Status MaintainProblem(Problem* p, std::chrono::milliseconds backfill_budget)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(maintenance_mu_);

  const ServiceOptions options_;
  const Clock* clock_;
  Metrics* metrics_;
  std::unique_ptr<storage::Store> store_;
  std::unique_ptr<Trainer> trainer_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Problem>> problems_ ABSL_GUARDED_BY(mu_);
  uint32_t next_index_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;

  absl::Notification stop_;
  std::thread maintenance_;
  absl::Mutex maintenance_mu_;  // one maintenance round at a time
  std::chrono::steady_clock::time_point last_metrics_export_ ABSL_GUARDED_BY(maintenance_mu_);
  // Set by a round whose backfill ran out of its time budget with work left: the
  // maintenance thread then starts the next round at once instead of waiting an interval.
  bool backfill_behind_ ABSL_GUARDED_BY(maintenance_mu_) = false;
};

// Validates a wire configuration and fills in defaults. INVALID_ARGUMENT names the field.
absl::StatusOr<storage::v1::ProblemRecord> ProblemRecordFromConfig(
    const std::string& problem_id, const v1::ProblemConfig& config);
v1::ProblemConfig ConfigFromRecord(const storage::v1::ProblemRecord& record);
// INVALID_ARGUMENT for a negative start or limit.
absl::Status ValidateExportLogRequest(const v1::ExportLogRequest& request);

}  // namespace decision::server

#endif  // DECISION_SERVER_DECISION_SERVICE_H_
