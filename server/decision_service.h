// The decision service without its transport: the registry of problems (as TF Serving's
// ServerCore is a registry of servables) and the owner of the service's threads. Every RPC
// of decision.v1 is a method that validates its input (validation.h), calls the problem and
// returns an absl::Status (see the error table in proto/decision/v1/decision.proto). The
// gRPC layer (grpc_service.h) only converts; tests call this class directly.
//
// Around it: grpc_service.h (the gRPC adapter: authorization by auth.h, the audit log),
// model_sandbox.h (clients' XGBoost models are loaded first in decision_model_probe).
//
// Threads:
//   - the writer executor (one thread): every problem's group commits (problem_commit.cc);
//   - the blocking executor (two threads): the RPC work that blocks (store scans and
//     lookups, model parsing, the inline maintenance), so that no reactor thread blocks;
//   - the maintenance thread (decision and log writes, expiry) and the expert-pool thread
//     (backfill, divergences, retirement) (service_maintenance.cc), unless
//     start_maintenance_thread is off;
//   - the trainer's thread (trainer.h), unless inline_maintenance is on.
// Each asynchronous method calls `done` exactly once, possibly on another thread, with no
// lock held. The synchronous forms wait for it: they are for tests and tools, never for a
// reactor thread.
//
// Thread safety: every method may be called concurrently.
#ifndef DECISION_SERVER_DECISION_SERVICE_H_
#define DECISION_SERVER_DECISION_SERVICE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "decision/v1/decision.pb.h"
#include "server/clock.h"
#include "server/executor.h"
#include "server/log_limiter.h"
#include "server/metrics.h"
#include "server/model_sandbox.h"
#include "server/problem.h"
#include "server/trainer.h"
#include "server/training_jobs.h"
#include "storage/store.h"

namespace decision::server {

// The most scoring threads ServiceOptions::scoring_threads = 0 starts: one batch rarely
// has work for more (it is split by expert, or in parts of a few hundred rows).
inline constexpr int kMaxDefaultScoringThreads = 16;

struct ServiceOptions {
  std::string data_dir = "data";
  bool sync_writes = false;  // fsync every write (see storage/store.h)
  // Choose answers only once its decision is written. Off (the default), a decision is
  // answered at once and written with its Reward or within maintenance_interval_ms; a crash
  // forgets the decisions not yet written (see "Deferred decisions" in server/problem.h).
  // Acknowledged rewards are durable either way.
  bool durable_choose = false;
  uint64_t seed = 0;         // 0: seeded from the OS
  // How often the maintenance thread writes and expires decisions, and the expert-pool
  // thread backfills and refreshes.
  int maintenance_interval_ms = 20;
  bool start_maintenance_thread = true;
  // Run a problem's maintenance (expiry, the whole backfill, divergence refresh, training)
  // after every Reward, once it is learned, before the Reward is answered, instead of on the background
  // threads. Slower, but the decisions become a deterministic function of the seed and the
  // request sequence: for tests and reproducible replays.
  bool inline_maintenance = false;
  // 0 (the default): every batch boundary happens at its round, as in the paper, and late
  // work queues and catches up (Problem::MaybeRefreshDivergences). > 0: an opt-in CPU
  // throttle: boundaries closer than this in wall time merge into one, so fewer batches are
  // trained than the paper's schedule has. Ignored with inline_maintenance.
  int64_t min_refresh_interval_ms = 0;
  // How long the expert-pool round computes one problem's divergence refresh per visit (at
  // least one step: a few pairs over a block of contexts, or one expert's predictions taken
  // into the cache) before it goes on to the other problems; the refresh
  // resumes at the next visit, and the boundary passes once it is done. One refresh at
  // thousands of arms is tens of seconds of CPU, and would otherwise hold up every other
  // problem's backfills and refreshes that long. 0: one step a visit; < 0: a visit
  // finishes the refresh it starts (as inline_maintenance does).
  int64_t refresh_slice_ms = 100;
  // Experts of a training job trained at once, one XGBoost thread each; the models do not
  // depend on it (Trainer). 0: as many as the CPUs decisiond may run on (CpusAvailable), or
  // as background_cpus has.
  int training_threads = 0;
  // Threads that score joined samples and backfills and compute divergences at once: the
  // learner or the expert pool plus scoring_threads - 1 helpers, at the background priority. What is learned does not
  // depend on it. 0: as many as the CPUs decisiond may run on (or background_cpus has), at
  // most kMaxDefaultScoringThreads.
  int scoring_threads = 0;
  // How often the expert-pool thread gives the memory the allocator holds free back to
  // the operating system (allocator.release; unset: glibc's malloc_trim). Memory that
  // RocksDB's compactions, scans and protobuf parsing free stays in the allocator's
  // per-thread arenas otherwise: bench/scale with 10M of 60M samples kept had 361 MB of
  // arenas for 160 MB in use. 0: never.
  int64_t malloc_trim_interval_ms = 30'000;
  // The allocator the process runs on, for malloc_trim_interval_ms and
  // decision_allocator_bytes (every 5 s). Unset (tests, and decisiond built with glibc's
  // malloc): glibc's malloc_trim and mallinfo2. decisiond's main sets them for jemalloc.
  struct AllocatorBytes {
    double in_use = 0;  // allocated and not freed
    double free = 0;    // held by the allocator, not in use
    double mapped = 0;  // mapped from the operating system
  };
  struct Allocator {
    std::function<void()> release;
    std::function<AllocatorBytes()> bytes;
  };
  Allocator allocator;
  // The most memory each problem keeps its experts' predictions on the divergence
  // reservoir in, so that a refresh predicts only the rows that changed since the last one
  // (server/reservoir_predictions.h). 0 turns the cache off.
  int64_t reservoir_predictions_mb = 128;
  // Caps (RESOURCE_EXHAUSTED past them, naming the flag; nothing stored changes): the
  // decisions a problem holds waiting for their reward, by count and by estimated memory
  // (Problem::Env), and the problems of this server.
  int64_t max_pending_decisions = 1'000'000;
  int64_t max_pending_decisions_mb = 1024;
  int64_t max_problems = 10'000;
  // Experts a problem may have registered, retired and failed ones included (Problem::Env);
  // at most kMaxExpertsPerProblem.
  int max_experts_per_problem = 256;
  // What a problem's estimator state and samples in memory may reach (Problem::Env), MB.
  int64_t max_problem_memory_mb = 1024;
  // What one divergence computation of a problem may evaluate (Problem::Env), in terms.
  int64_t max_divergence_terms = int64_t{1} << 33;
  // The divergence pair series cover at most this many active experts per problem, those
  // of highest UCB (Problem::Env).
  int metrics_pair_experts = 16;
  // The maintenance round exports the problems' and the store's gauges at most this often
  // (tests that read them set 0: every round exports).
  int64_t metrics_export_interval_ms = 500;
  // CPU priority of the background threads (executor.h, ThreadPriority), so that when the
  // CPU is saturated the threads answering requests run first: kLow (the default) runs the
  // learner, the maintenance and expert-pool threads and the trainer (with XGBoost's
  // threads) at nice 10; kIdle runs the learner, the expert pool (backfill, divergences)
  // and the trainer at SCHED_IDLE, and the maintenance thread and RocksDB's compactions
  // (StoreOptions::low_priority_compactions) at nice 19; kNormal lowers none. Nice 19 for
  // all with kLow was tried and measured (executor.h). The maintenance thread is never idle: it
  // writes deferred decisions and expires them, which must go on under overload. A learner
  // that gets no CPU holds its lag at the bound, which slows Reward acknowledgements (the
  // writer waits), not Choose.
  // WARNING: SCHED_IDLE threads yield to every other thread of their cgroup, other
  // processes' included. kIdle is for a decisiond in a cgroup of its own (a container, a
  // Kubernetes pod, a systemd service); on a shared one, any busy process stops learning
  // and training for as long as it runs.
  ThreadPriority background_priority = ThreadPriority::kLow;
  // The CPUs of the background threads: the learner and scorers, the trainer (and
  // XGBoost's threads, which it starts), the maintenance and expert-pool threads, and
  // RocksDB's flushes and compactions (their threads start in Open). Empty: they may run on
  // every CPU the process may. The threads that answer requests (gRPC's, the writer, the
  // blocking executor) are the caller's to place: decisiond's main restricts itself to the
  // other CPUs before it starts them, and restarts jemalloc's purge thread on these. With a
  // list, the default training and scoring thread counts follow its length. On a saturated
  // core, priorities alone leave a Choose waiting for the CPU (bench/README.md, "Issue 15 at
  // a glance"); CPUs of their own do not.
  std::vector<int> background_cpus;
  // Where a client's XGBoost model is first loaded and scored (model_sandbox.h). Without a
  // probe_path, models are only checked in-process (core/xgboost_model_check.h).
  ModelSandboxOptions model_sandbox;
  // While the store cannot write (a full disk, a failing one), how often the maintenance
  // round asks it to resume (storage::Store::Recover), in milliseconds of the Clock.
  int64_t store_recovery_interval_ms = 1000;
  // An error that repeats (every maintenance round, every audit record) is printed at most
  // this often, with the count of those held back (log_limiter.h).
  int64_t error_log_interval_ms = 10'000;
  // Testing seams (see storage::StoreOptions::fault_injection and env, ProblemHooks and
  // TrainerHooks).
  std::function<absl::Status(absl::string_view what)> store_fault_injection;
  std::shared_ptr<rocksdb::Env> store_env;
  const ProblemHooks* problem_hooks = nullptr;
  const TrainerHooks* trainer_hooks = nullptr;
};

// A problem entered by a call that may change it (Problem::EnterCall), so that a move's
// fence waits for the call: leaves it when destroyed, or, with LeaveAfter, once the call is
// answered.
class EnteredProblem {
 public:
  explicit EnteredProblem(Problem* p) : p_(p) {}
  EnteredProblem(EnteredProblem&& other) : p_(std::exchange(other.p_, nullptr)) {}
  EnteredProblem& operator=(EnteredProblem&&) = delete;
  ~EnteredProblem() {
    if (p_ != nullptr) p_->LeaveCall();
  }
  Problem* get() const { return p_; }
  Problem* operator->() const { return p_; }
  Problem& operator*() const { return *p_; }
  // `done`, then leaving the problem.
  Done LeaveAfter(Done done) && {
    return [p = std::exchange(p_, nullptr), done = std::move(done)](absl::Status s) {
      done(std::move(s));
      p->LeaveCall();
    };
  }

 private:
  Problem* p_;
};

// A record of a problem being imported (ImportProblem) that arrives in parts
// (v1::ProblemEntry.value_size): its value so far.
struct ImportPart {
  int family = 0;
  std::string key;
  std::string value;
  int64_t size = 0;  // of the whole value
};

// Store faults. While the store cannot write (storage::Store::Health), every call that
// would write is refused with UNAVAILABLE before it does anything: Choose ("the store cannot
// write: ...; decisions are refused until it recovers": with deferred decisions a Choose
// answered now could not be kept), Reward, CreateProblem, RegisterExpert, RetireExpert and
// TrainExperts. Calls that only read keep working. The maintenance round asks the store to
// resume every store_recovery_interval_ms and skips its own writes until it does; then the
// deferred decisions are written and calls are accepted again, without a restart.
class DecisionService {
 public:
  // Opens the store under options.data_dir (created if missing) and restores every problem.
  // `clock` and `metrics` must outlive the service. A store that cannot be opened is
  // INTERNAL "cannot open the store at PATH: REASON" (storage::Store::Open).
  static absl::StatusOr<std::unique_ptr<DecisionService>> Open(const ServiceOptions& options,
                                                               const Clock* clock,
                                                               Metrics* metrics);
  ~DecisionService();

  // Refuses new calls (UNAVAILABLE), finishes the blocking work in flight, stops the
  // maintenance and training threads, writes every deferred decision and log chunk,
  // checkpoints every problem and closes the store. Returns the first failure of these
  // writes: OK only if everything answered is on disk.
  absl::Status Shutdown();

  // Asynchronous forms: `done` is called once (see the header comment).
  void CreateProblem(const v1::CreateProblemRequest& request, v1::Problem* response, Done done);
  // Checks the model as RegisterExpert does, then Problem::EvaluateModel, on the blocking
  // executor.
  void EvaluateModel(const v1::EvaluateModelRequest& request, v1::ModelEvaluation* response,
                     Done done);
  absl::Status EvaluateModel(const v1::EvaluateModelRequest& request,
                             v1::ModelEvaluation* response);
  // Promote and Demote (Problem::SetShadow), on the blocking executor.
  void Promote(const v1::PromoteRequest& request, v1::Expert* response, Done done);
  void Demote(const v1::PromoteRequest& request, v1::Expert* response, Done done);
  absl::Status SetShadow(const v1::PromoteRequest& request, bool shadow, v1::Expert* response);
  void RegisterExpert(const v1::RegisterExpertRequest& request, v1::Expert* response,
                      Done done);
  void RetireExpert(const v1::RetireExpertRequest& request, v1::Expert* response, Done done);
  void SetRetention(const v1::SetRetentionRequest& request, v1::Problem* response, Done done);
  void DeleteEvents(const v1::DeleteEventsRequest& request, v1::DeleteEventsResponse* response,
                    Done done);
  void Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response, Done done);
  void Reward(const v1::RewardRequest& request, v1::RewardResponse* response, Done done);
  void Activate(const v1::ActivateRequest& request, v1::ActivateResponse* response, Done done);
  // A slate: one Choose per slot over the eligible arms left (the proto's ChooseSlate), and
  // a batch of independent Chooses; both on the blocking executor.
  void ChooseSlate(const v1::ChooseSlateRequest& request, v1::ChooseSlateResponse* response,
                   Done done);
  void ChooseBatch(const v1::ChooseBatchRequest& request, v1::ChooseBatchResponse* response,
                   Done done);
  absl::Status ChooseSlate(const v1::ChooseSlateRequest& request,
                           v1::ChooseSlateResponse* response);
  absl::Status ChooseBatch(const v1::ChooseBatchRequest& request,
                           v1::ChooseBatchResponse* response);
  // The answer of a Choose that decided `event_id` never reached its caller (Problem::
  // Undeliver). Unknown problems and events are ignored.
  void Undeliver(const std::string& problem_id, const std::string& event_id);
  void TrainExperts(const v1::TrainExpertsRequest& request, v1::TrainExpertsResponse* response,
                    Done done);
  // One page of ExportLog: request.limit() samples from request.start() (limit 0: all),
  // read on the blocking executor, then `done` with the status.
  void ExportLogPage(const v1::ExportLogRequest& request, std::vector<v1::LoggedSample>* page,
                     Done done);
  void ListAuditLog(const v1::ListAuditLogRequest& request, v1::ListAuditLogResponse* response,
                    Done done);
  // Why a decision was made (Problem::Explain), on the blocking executor.
  void Explain(const v1::ExplainRequest& request, v1::Explanation* response, Done done);
  // Appends one administrative call to the audit log, on the blocking executor. A record
  // that cannot be written is reported on stderr and in the metrics; the call it describes
  // has already happened.
  void RecordAudit(storage::v1::AuditRecord record);

  // Moving a problem between replicas (service_move.cc; the RPCs' contracts are in
  // decision.proto, the steps in docs/SCALING.md). Each runs on the blocking executor.
  void BeginMove(const v1::BeginMoveRequest& request, v1::BeginMoveResponse* response,
                 Done done);
  void ExportProblem(const v1::ExportProblemRequest& request,
                     v1::ExportProblemResponse* response, Done done);
  void ImportProblem(const v1::ImportProblemRequest& request,
                     v1::ImportProblemResponse* response, Done done);
  // `placed_on_target`: whether this replica's placement map places the problem on
  // request.to_replica (Placement::PlacedOn). A problem that is not moving is ended with
  // to_replica, its records deleted, only if it is OK: a copy left behind by a move.
  void EndMove(const v1::EndMoveRequest& request, v1::EndMoveResponse* response,
               absl::Status placed_on_target, Done done);
  absl::Status BeginMove(const v1::BeginMoveRequest& request, v1::BeginMoveResponse* response)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ExportProblem(const v1::ExportProblemRequest& request,
                             v1::ExportProblemResponse* response) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ImportProblem(const v1::ImportProblemRequest& request,
                             v1::ImportProblemResponse* response)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status EndMove(const v1::EndMoveRequest& request, v1::EndMoveResponse* response,
                       const absl::Status& placed_on_target) ABSL_LOCKS_EXCLUDED(mu_);

  // Synchronous forms (tests and tools).
  absl::Status CreateProblem(const v1::CreateProblemRequest& request, v1::Problem* response);
  absl::Status RegisterExpert(const v1::RegisterExpertRequest& request, v1::Expert* response);
  absl::Status RetireExpert(const v1::RetireExpertRequest& request, v1::Expert* response);
  absl::Status SetRetention(const v1::SetRetentionRequest& request, v1::Problem* response);
  absl::Status DeleteEvents(const v1::DeleteEventsRequest& request,
                            v1::DeleteEventsResponse* response);
  absl::Status Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response);
  absl::Status Reward(const v1::RewardRequest& request, v1::RewardResponse* response);
  absl::Status Activate(const v1::ActivateRequest& request, v1::ActivateResponse* response);
  absl::Status TrainExperts(const v1::TrainExpertsRequest& request,
                            v1::TrainExpertsResponse* response);
  absl::Status ExportLog(const v1::ExportLogRequest& request,
                         const std::function<absl::Status(const v1::LoggedSample&)>& fn);
  absl::Status ListAuditLog(const v1::ListAuditLogRequest& request,
                            v1::ListAuditLogResponse* response);
  absl::Status Explain(const v1::ExplainRequest& request, v1::Explanation* response);

  // In memory, short locks only: these never block and may run on a reactor thread.
  // What Problem::Load returned for a problem at Open: OK for one that serves (or was
  // created since), its error for one that failed to load, NOT_FOUND for an unknown id.
  absl::Status ProblemLoadStatus(const std::string& problem_id) ABSL_LOCKS_EXCLUDED(mu_);
  // GetProblem, ListExperts and GetEstimates report what is learned: they answer once
  // every reward acknowledged before them is learned (Problem::WhenLearned), without
  // blocking. The synchronous forms wait for that (tests, tools).
  void GetProblem(const v1::GetProblemRequest& request, v1::Problem* response, Done done);
  void ListExperts(const v1::ListExpertsRequest& request, v1::ListExpertsResponse* response,
                   Done done);
  void GetEstimates(const v1::GetEstimatesRequest& request, v1::Estimates* response, Done done);
  absl::Status GetProblem(const v1::GetProblemRequest& request, v1::Problem* response);
  absl::Status ListProblems(const v1::ListProblemsRequest& request,
                            v1::ListProblemsResponse* response);
  absl::Status ListExperts(const v1::ListExpertsRequest& request,
                           v1::ListExpertsResponse* response);
  absl::Status GetEstimates(const v1::GetEstimatesRequest& request, v1::Estimates* response);
  // The latest state of a training job (service_training.cc). INVALID_ARGUMENT for a
  // job_id <= 0, NOT_FOUND for an unknown problem or job.
  absl::Status GetTrainingJob(const v1::GetTrainingJobRequest& request,
                              v1::TrainingJob* response);

  // One round of maintenance for every problem (service_maintenance.cc): the maintenance
  // thread's round, then the expert-pool thread's. Tests with start_maintenance_thread =
  // false call it themselves. Each task of each problem runs even if an earlier one failed;
  // returns the first error. While the store cannot write, the round only tries to resume
  // it (at most every store_recovery_interval_ms) and returns UNAVAILABLE if it still cannot.
  absl::Status RunMaintenance() ABSL_LOCKS_EXCLUDED(maintenance_mu_, pool_mu_);

  // OK if the store can write; else UNAVAILABLE, saying what is refused: "the store cannot
  // write: ERROR (for N s); `refused` are refused until it recovers".
  absl::Status CheckStoreWritable(absl::string_view refused) const;

  // Testing seam: the store, to flush or compact it at a chosen point.
  storage::Store& store_for_testing() { return *store_; }

 private:
  // An XGBoost model from a client, loaded and scored in the sandbox (when enabled) on the
  // problem's shape and recent contexts; `model` becomes the probe's canonical form.
  absl::Status ProbeInSandbox(Problem& p, storage::v1::ExpertModelRecord* model);

  DecisionService(const ServiceOptions& options, const Clock* clock, Metrics* metrics);
  absl::StatusOr<Problem*> Find(const std::string& problem_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Find for a call that may change the problem: UNAVAILABLE while it is fenced for a move.
  absl::StatusOr<EnteredProblem> Enter(const std::string& problem_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Problem::Fence for a move, then waits out a background round that took the problem
  // before the fence (service_move.cc).
  absl::Status FenceForMove(Problem* p, absl::Status why)
      ABSL_LOCKS_EXCLUDED(maintenance_mu_, pool_mu_);
  // Why a call for a problem that moved away is refused (FAILED_PRECONDITION naming the
  // owner).
  static absl::Status MovedError(const std::string& problem_id, const std::string& to);
  // INVALID_ARGUMENT (ValidateProblemId) for what is not a problem id, NOT_FOUND otherwise.
  static absl::Status UnknownProblem(const std::string& problem_id);
  static absl::Status FailedLoadError(const std::string& problem_id, const absl::Status& why);
  Problem::Env ProblemEnv() const;
  // Runs `work` on the blocking executor and passes its status to `done`.
  void OffReactor(std::function<absl::Status()> work, Done done);
  // Runs `read` on problem `problem_id` once what was acknowledged before is learned.
  void AfterLearning(const std::string& problem_id,
                     std::function<absl::Status(const Problem&)> read, Done done);
  absl::Status CreateProblemNow(const v1::CreateProblemRequest& request, v1::Problem* response)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status TrainExpertsNow(const v1::TrainExpertsRequest& request,
                               v1::TrainExpertsResponse* response);
  // At start, once every problem is loaded (service_training.cc): the training jobs a
  // crash or a shutdown left QUEUED or RUNNING are queued again for the experts they have
  // not trained, or ended (SUCCEEDED if nothing was left, FAILED with the reason if they
  // cannot go on); see PrepareResume in training_jobs.h.
  absl::Status ResumeTrainingJobs() ABSL_LOCKS_EXCLUDED(mu_);
  // Inline maintenance: the problem's maintenance (and training) after a reward.
  absl::Status MaintainInline(Problem* p) ABSL_LOCKS_EXCLUDED(maintenance_mu_, pool_mu_);

  // service_maintenance.cc
  std::vector<Problem*> AllProblems() ABSL_LOCKS_EXCLUDED(mu_);
  // The maintenance thread's round: the store, then each problem's writes and expiry.
  absl::Status RunWriteRound() ABSL_LOCKS_EXCLUDED(maintenance_mu_);
  // The expert-pool thread's round (nothing while the store cannot write).
  absl::Status RunPoolRound() ABSL_LOCKS_EXCLUDED(pool_mu_);
  void MaintenanceLoop() ABSL_LOCKS_EXCLUDED(maintenance_mu_);
  void ExpertPoolLoop() ABSL_LOCKS_EXCLUDED(pool_mu_);
  // The store's part of a round: its metrics, and an attempt to resume it if it cannot
  // write. OK if it can write now.
  absl::Status MaintainStore() ABSL_EXCLUSIVE_LOCKS_REQUIRED(maintenance_mu_);
  void ExportProblemMetrics(Problem* p);
  // One problem's deferred decisions, log chunks and expiry.
  absl::Status MaintainWrites(Problem* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(maintenance_mu_);
  // One problem's expert pool; `backfill_budget` bounds the time spent reading a restart's
  // event ids and backfilling.
  // `refresh_slice` bounds the time spent on a divergence refresh (negative: no bound;
  // ServiceOptions::refresh_slice_ms).
  absl::Status MaintainPool(Problem* p, std::chrono::milliseconds backfill_budget,
                            std::chrono::milliseconds refresh_slice)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu_);

  const ServiceOptions options_;
  const Clock* clock_;
  Metrics* metrics_;
  uint64_t seed_ = 0;
  std::unique_ptr<storage::Store> store_;
  // Declared after the store and before the problems: destroyed before the problems they
  // run work for, and after nothing that uses them.
  std::unique_ptr<Executor> writer_;
  std::unique_ptr<Executor> learner_;  // scores and learns joined samples (problem_learn.cc)
  // Help the learner and the backfill score (Problem::Env::scorers); null with one
  // scoring thread.
  std::unique_ptr<Executor> scorers_;
  std::unique_ptr<Executor> blocking_;
  std::unique_ptr<TrainingJobBook> training_jobs_;  // before the trainer, which uses it
  std::unique_ptr<Trainer> trainer_;
  const ModelSandbox sandbox_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Problem>> problems_ ABSL_GUARDED_BY(mu_);
  // Problems that failed to load at Open, and why: every call to one is refused.
  absl::flat_hash_map<std::string, absl::Status> failed_problems_ ABSL_GUARDED_BY(mu_);
  uint32_t next_index_ ABSL_GUARDED_BY(mu_) = 0;
  // Moving problems (service_move.cc). Problems that moved to another replica: its name and
  // the index of their stub record here.
  struct MovedAway {
    std::string to;
    uint32_t index = 0;
  };
  absl::flat_hash_map<std::string, MovedAway> moved_away_ ABSL_GUARDED_BY(mu_);
  // Problems moving away from here (BeginMove): the replica they are moving to, whether
  // they are fenced, and whether the copy began at a snapshot (catch_up).
  struct Moving {
    std::string to;
    bool fenced = false;
    bool watched = false;
    bool fencing = false;  // a BeginMove is fencing it now
    bool ending = false;   // an EndMove is ending it now (others are refused meanwhile)
  };
  absl::flat_hash_map<std::string, Moving> moving_ ABSL_GUARDED_BY(mu_);
  // Imports in progress on this replica (the target).
  struct Import {
    uint32_t index = 0;
    int64_t entries = 0;
    int64_t bytes = 0;
    std::optional<storage::v1::ProblemRecord> record;  // its problems-family entry
    std::optional<ImportPart> part;  // a record arriving in parts
  };
  absl::flat_hash_map<std::string, Import> imports_ ABSL_GUARDED_BY(mu_);
  // The Problem objects of problems that moved away: calls that found one before it moved
  // may still hold it (they are refused by its fence), so it lives until the service does.
  std::vector<std::unique_ptr<Problem>> moved_out_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex create_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one CreateProblem at a time

  absl::Notification stop_;
  std::thread maintenance_;
  std::thread expert_pool_;
  absl::Mutex maintenance_mu_ ABSL_ACQUIRED_BEFORE(pool_mu_);  // one write round at a time
  absl::Mutex pool_mu_;                                         // one pool round at a time
  std::chrono::steady_clock::time_point last_metrics_export_ ABSL_GUARDED_BY(maintenance_mu_);
  std::chrono::steady_clock::time_point last_malloc_trim_ ABSL_GUARDED_BY(pool_mu_);
  std::chrono::steady_clock::time_point last_allocator_export_ ABSL_GUARDED_BY(pool_mu_);
  // Set by a pool round whose backfill or divergence refresh ran out of its time budget
  // with work left: the expert-pool thread then starts the next round at once instead of
  // waiting an interval.
  bool pool_behind_ ABSL_GUARDED_BY(pool_mu_) = false;
  // Store faults (MaintainStore): the last attempt to resume (Clock ms), and the write
  // errors already counted in the metrics.
  int64_t last_store_recovery_ms_ ABSL_GUARDED_BY(maintenance_mu_) =
      std::numeric_limits<int64_t>::min();
  int64_t store_write_errors_counted_ ABSL_GUARDED_BY(maintenance_mu_) = 0;
  bool store_was_writable_ ABSL_GUARDED_BY(maintenance_mu_) = true;
  // Repeated errors, printed at a bounded rate (see ServiceOptions::error_log_interval_ms).
  LogLimiter maintenance_log_{options_.error_log_interval_ms};
  LogLimiter audit_log_{options_.error_log_interval_ms};
};

}  // namespace decision::server

#endif  // DECISION_SERVER_DECISION_SERVICE_H_
