// One problem (decision point) of the service, without its transport: the facade that owns
// the problem's lock and orchestrates its parts. The DecisionService owns one per problem.
//
// Parts (each plain state or a pure function, with no lock of its own):
//   PendingTable   the decisions waiting for their reward, one DecisionState each
//   ExpertPool     the experts, their records and models, their backfill progress
//   DUcb (core)    the incremental estimator, with no log: its state does not grow with
//                  the samples (the log is in the store; docs/ENGINE.md)
//   validation.h   request checks; conversions.h the enum tables
// and the pieces of work, one file each:
//   problem.cc              creation, Choose, Reward (and Activate), in-memory queries
//   problem_commit.cc       the join writer: group commits on the writer executor
//   problem_learn.cc        the learner: joined samples scored in batches and learned
//   problem_log.cc          reads of the stored log: ExportLog (and DSJSON), Explain,
//                           EvaluateModel
//   problem_experts.cc      registration, retirement, quarantine
//   problem_divergences.cc  the divergences: a new expert's pairs, the sliced refresh
//   problem_backfill.cc     the backfill of a new expert, and its estimator rows
//   problem_maintenance.cc  expiry, checkpoints, log chunks, training sets, metrics
//   problem_retention.cc    retention: what the store keeps of the history
//   recovery.cc             Load: the problem rebuilt from the store, in named steps
//
// Locking. mu_ guards the in-memory state. The rule: no store I/O and no model evaluation
// with mu_ held; the exceptions are marked WART where they are. Methods named ...Locked
// REQUIRE mu_. expert_writes_mu_ serialises the writes of expert records (registration,
// retirement, activation) so that each is read, written and applied without a lost update;
// it is taken before mu_, never after. A group commit runs on the writer executor (one
// thread for all problems) and takes mu_ only to read the next log position (waiting there
// while kMaxUnlearnedSamples wait for the learner) and to apply the written group.
//
// Learning trails the acknowledgement. A Reward is answered once its joined sample is
// durable; the sample is then queued for the learner (problem_learn.cc), which scores the
// queued samples with every expert in batches (one PredictBatch per expert, outside mu_)
// and teaches them to D-UCB in log order. Samples written but not learned yet are bounded
// (kMaxUnlearnedSamples: past it the writer waits for the learner) and measured
// (decision_learning_lag_samples, decision_learning_delay_seconds). Reads that report what
// is learned (GetEstimates, Summary, ListExperts through the service; the synchronous
// Reward) first wait, without blocking a thread (WhenLearned), until every sample
// acknowledged before them is learned. A crash between the write and the learning loses
// nothing: a restart learns the stored samples.
//
// Threads. Choose and Reward never block their caller: they do their in-memory work and
// hand the rest to the writer (or, for a Choose whose caller event id may be stored, a
// lookup to the blocking executor), and `done` is called from there. RegisterExpert,
// RetireExpert, ExportLog and the maintenance methods block (store I/O, model parsing):
// call them from an executor, the maintenance thread or the trainer, never from a reactor.
// Each maintenance method must be called from one thread at a time. The write tasks
// (FlushDecisions, WriteLogChunks, ExpireDue) and the expert-pool tasks (PersistFailures,
// StepBackfill, RetireDominated, MaybeRefreshDivergences) share only what mu_ and
// expert_writes_mu_ guard, so the two groups may run on two threads at once.
//
// Deferred decisions (Env::defer_decisions, the default of decisiond): Choose answers as
// soon as its decision is in memory. A decision rewarded (or expired) before it is written
// is written by its join, in the same write as the sample, so an acknowledged reward is
// durable with its decision. The others are written by FlushDecisions, which the
// maintenance round calls, and which a Choose triggers when the oldest unwritten decision
// is Env::decision_flush_ms old or kMaxUnwrittenDecisions wait. A crash forgets the
// decisions not yet written: their rewards get NOT_FOUND. Without deferral a decision is
// answered once it is durable, and a reward that arrives before that gets UNAVAILABLE.
#ifndef DECISION_SERVER_PROBLEM_H_
#define DECISION_SERVER_PROBLEM_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/divergence.h"
#include "core/expert.h"
#include "core/policy.h"
#include "core/xgboost_trainer.h"
#include "decision/v1/decision.pb.h"
#include "server/clock.h"
#include "server/event_id_filter.h"
#include "server/executor.h"
#include "server/expert_pool.h"
#include "server/log_limiter.h"
#include "server/metrics.h"
#include "server/pending_table.h"
#include "server/reservoir_predictions.h"
#include "storage/format.h"
#include "storage/records.pb.h"
#include "storage/store.h"

namespace decision::server {

// A random event id (32 hex digits), for a Choose without one.
std::string RandomEventId();

inline constexpr size_t kMaxTrainingSamples = 200'000;
// Training holds, per sample, a gradient, a curvature and a prediction per arm (about 24
// bytes; 490 MB for 20,000 samples at 1,024 arms, measured) and its features in XGBoost's
// matrix and binned copy (about 20 bytes each), so a training set's samples x (arms +
// features) is bounded too: 2^23, about 200 MB per expert in training. Where arms +
// features <= 41, kMaxTrainingSamples binds first (letter: 199,728 samples).
inline constexpr size_t kMaxTrainingSampleColumns = size_t{1} << 23;
// The most samples a training set of a problem with `num_arms` arms and `num_features`
// features holds (the newest), at least 1.
inline size_t MaxTrainingSamples(int num_arms, int num_features) {
  const size_t columns = static_cast<size_t>(std::max(num_arms, 1)) +
                         static_cast<size_t>(std::max(num_features, 0));
  return std::clamp<size_t>(kMaxTrainingSampleColumns / columns, 1, kMaxTrainingSamples);
}

// How a problem's experts are fitted (AutoTrainConfig.training_objective).
inline TrainingObjective TrainingObjectiveOf(const storage::v1::ProblemRecord& r) {
  return r.train_by_likelihood() ? TrainingObjective::kLikelihood
                                 : TrainingObjective::kImportanceWeighted;
}
// A checkpoint writes the estimators' state when this many samples were learned since it
// was last written, whatever else changed: what a restart learns again at most.
inline constexpr int64_t kMaxReplaySamples = int64_t{1} << 20;
inline constexpr size_t kMaxUnwrittenDecisions = 4096;  // deferred ones before a flush
// Samples written and not yet learned before the writer waits for the learner: the bound
// of the learning lag, in samples (a full learner batch, and one more filling).
inline constexpr size_t kMaxLearnBatch = 512;  // scored in one PredictBatch per expert
inline constexpr size_t kMaxUnlearnedSamples = 2 * kMaxLearnBatch;
// The longest the learner holds mu_ at a time (it learns a batch in slices of about this).
inline constexpr int64_t kMaxLearnSliceUs = 200;
// Stored event ids a load step reads into Choose's filter (StepEventIdLoad), and how many
// it inserts per hold of mu_.
inline constexpr int64_t kEventIdLoadStep = 16384;
inline constexpr int64_t kEventIdInsertsPerLock = 1024;
// Retention asks the store to compact a problem's events (Store::CompactEventsSoon) once it
// has cut half the samples it keeps since the last time, and at least this many.
inline constexpr int64_t kEventCompactionMinSamples = 4 * storage::kLogChunkSamples;
// Log chunk c and backfill chunk c cover the same samples.
static_assert(storage::kLogChunkSamples == storage::kBackfillChunkSamples);

// An expert that could not score a context: its id and why.
struct ScoringFailure {
  int expert;
  std::string reason;
};

// Completion of an asynchronous call: called once, with no lock of the problem held.
using Done = std::function<void(absl::Status)>;

// Runs `start(done)` and waits until done is called; returns its status. Blocks: never call
// it on a reactor thread or on the writer executor.
template <typename Start>
absl::Status AwaitDone(Start&& start) {
  absl::Notification finished;
  absl::Status result;
  start([&](absl::Status s) {
    result = std::move(s);
    finished.Notify();
  });
  finished.WaitForNotification();
  return result;
}

// Testing seams (as RocksDB's SyncPoint, reduced to what the tests need): each is called,
// when set, with no lock held unless it says so. Null in production.
struct ProblemHooks {
  // In Choose, after the expert is selected and before the decision is recorded.
  std::function<void(const std::string& event_id)> after_select;
  // In the learner, before a sample is learned (called with the problem's lock held); a
  // non-OK status makes the learning fail.
  std::function<absl::Status(int64_t sequence)> before_learn;
  // In the learner, before it scores a batch of samples from `first_sequence` on.
  std::function<void(int64_t first_sequence)> before_score;
  // The scoring cost (us per row) an expert gets, from its name and its measured cost, where
  // it is measured: at registration, and at a load for an expert stored without one
  // (scoring_cost.h). Tests pin costs with it instead of asserting measured times.
  std::function<double(const std::string& expert_name, double measured_us)> score_cost_us;
  // In a backfill step (the expert-pool thread), once a chunk is scored and before it is
  // written.
  std::function<void(int expert_id)> after_backfill_scoring;
  // In Choose, before a caller's event id is looked up in the store (the filter could not
  // rule it out).
  std::function<void(const std::string& event_id)> before_event_lookup;
};

class Problem {
 public:
  struct Env {
    storage::Store* store;
    const Clock* clock;
    Metrics* metrics;
    Executor* writer;    // group commits (see problem_commit.cc)
    Executor* blocking;  // blocking work a Choose or Reward needs (store lookups)
    uint64_t seed;
    // Scores and learns joined samples (problem_learn.cc). Null: the writer learns each
    // group itself once it is answered (tests that want learning in the writer's order).
    Executor* learner = nullptr;
    // Threads that help the learner and the backfill score (ParallelFor): the learner's
    // batch is split by expert, a backfill chunk by rows, a divergence computation's blocks
    // by expert and by pair. What is computed does not depend on how many there are. Null:
    // each works on its own thread alone.
    Executor* scorers = nullptr;
    bool defer_decisions = false;  // see "Deferred decisions" above
    int64_t decision_flush_ms = 20;  // the longest a deferred decision waits for a Choose
    const ProblemHooks* hooks = nullptr;
    // The most memory each problem keeps its experts' predictions on the divergence
    // reservoir in (reservoir_predictions.h); experts past it are predicted again at every
    // divergence computation, a block of contexts at a time.
    int64_t reservoir_predictions_bytes = int64_t{128} << 20;
    // Bounds on one divergence computation (core/divergence.h): the experts the cache
    // above does not keep are predicted a block of contexts at a time, within these.
    DivergenceLimits divergence_limits = {};
    // Caps on the decisions waiting for their reward (answered, not yet joined or
    // expired): a Choose that would make a new one past either gets RESOURCE_EXHAUSTED.
    // Chooses in flight at once may pass the cap by their number. The memory of one is
    // estimated as PendingDecisionBytes(num_features), plus 4 bytes per eligible arm it
    // carries (PendingTable::eligible_arms).
    int64_t max_pending_decisions = 1'000'000;
    int64_t max_pending_decision_bytes = int64_t{1} << 30;
    // The divergence pair series (decision_divergence_mij, _sigmaij) cover the active experts
    // of highest UCB, at most this many: 2 n (n - 1) series per problem.
    int metrics_pair_experts = 16;
    // RegisterExpert past this many experts (retired and failed ones count: the log keeps
    // their columns, the estimator their counts and divergences) gets RESOURCE_EXHAUSTED;
    // a problem that already
    // has more, from a higher setting, still loads and serves.
    int max_experts = 256;
    // RegisterExpert that would take MemoryBound past this gets RESOURCE_EXHAUSTED.
    int64_t max_memory_bytes = int64_t{1} << 30;
    // RegisterExpert that would make one divergence computation evaluate more per-context
    // terms than this (DivergenceTermsBound) gets RESOURCE_EXHAUSTED.
    int64_t max_divergence_terms = int64_t{1} << 33;
  };
  // The memory that grows with a problem's experts, at `num_experts` experts: the
  // estimator's state at its bound (EstimatorStateBound) and a log chunk of samples in
  // memory, and the buffer the state is checkpointed from; `num_retired` of them retired
  // with their rows freed (Estimator::Retire). What decision_problem_memory_bytes reports,
  // at most.
  static int64_t MemoryBound(const storage::v1::ProblemRecord& record, int num_experts,
                             int num_retired = 0);
  // The per-context terms (ordered pair x context x arm) one divergence computation of a
  // problem can evaluate with `live` experts estimated and not retired or failed, of
  // `loaded` with a model loaded: a refresh computes the live experts' pairs, a new
  // expert's estimate its pairs with every loaded one, over the reservoir's R contexts.
  // 3.1 ns a term on the reference machine at 26 arms, 5.3 ns at 4096 (bench/core_bench
  // BM_DivergenceRefreshThreads).
  static int64_t DivergenceTermsBound(const storage::v1::ProblemRecord& record, int live,
                                      int loaded);
  // The estimated memory of one pending decision: its features, plus its record, event id
  // and index entries.
  static constexpr int64_t PendingDecisionBytes(int num_features) {
    return 8 * int64_t{num_features} + 512;
  }

  // A new problem: its record, expert 0 (uniform) and its first checkpoint, in one write.
  // REQUIRES: `record` is valid (validation.h).
  static absl::StatusOr<std::unique_ptr<Problem>> Create(uint32_t index,
                                                         storage::v1::ProblemRecord record,
                                                         const Env& env);
  // A problem restored from the store (recovery.cc). DATA_LOSS if a record is inconsistent.
  static absl::StatusOr<std::unique_ptr<Problem>> Load(uint32_t index,
                                                       storage::v1::ProblemRecord record,
                                                       const Env& env);
  ~Problem();

  const std::string& id() const { return record_.problem_id(); }
  uint32_t index() const { return index_; }  // its key in the store
  const storage::v1::ProblemRecord& record() const { return record_; }

  // `done` is called once: when the decision is answered (deferred) or durable, or with the
  // error. `request` may be destroyed when the call returns; `response` must live until
  // `done`. Never blocks.
  void Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `done` is called once the joined sample is durable, or with the error. Never blocks.
  void Reward(const v1::RewardRequest& request, v1::RewardResponse* response, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Makes a deferred decision learnable (ChooseRequest.deferred). `done` once the
  // activation is durable. A decision no longer pending is looked up in the store on the
  // blocking executor; otherwise never blocks.
  void Activate(const v1::ActivateRequest& request, v1::ActivateResponse* response, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The answer of a Choose with decision `event_id` did not reach its caller (the call was
  // cancelled or passed its deadline). When no answer of it is left delivered, the decision
  // is never learned: its expiry drops it, and a reward for it is FAILED_PRECONDITION.
  // Counted in decision_undelivered_total. In memory only: a restart before the expiry
  // learns it with the default reward.
  void Undeliver(const std::string& event_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The same, waiting for `done` (tests, tools). The synchronous Reward also waits until
  // its sample is learned.
  absl::Status Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response);
  // Choose for slot `slot` (>= 0) of a slate (-1: a plain Choose): the decision records
  // its slot, and is never learned if the problem learns first slots only and slot > 0
  // (UnlearnedSlot).
  absl::Status ChooseSlot(const v1::ChooseRequest& request, int slot,
                          v1::ChooseResponse* response);
  absl::Status Reward(const v1::RewardRequest& request, v1::RewardResponse* response);

  // Calls `done` (OK) once every sample written before the call is learned, or has been
  // given up on (learning stopped: the status says why). At once if none waits. Never
  // blocks; `done` runs on the learner's thread or the caller's.
  void WhenLearned(Done done) ABSL_LOCKS_EXCLUDED(mu_);
  // The same, waiting. Blocks.
  absl::Status WaitLearned() ABSL_LOCKS_EXCLUDED(mu_);

  // Experts (problem_experts.cc). Block: model parsing, scoring and store writes.
  struct RegisterOptions {
    // When the new expert would exceed the scoring budget: first retire the lowest-UCB
    // selectable experts (never expert 0, never the last selectable one) until it fits, if
    // retiring them can make it fit; else retire nothing. Training jobs of auto-training
    // problems ask for it (trainer.h).
    bool retire_to_fit = false;
    // Shadow mode (RegisterExpertRequest.shadow): estimated, never selected.
    bool shadow = false;
  };
  // RESOURCE_EXHAUSTED naming --max_experts_per_problem if the problem is full (its experts,
  // retired and failed ones included, at the cap): what RegisterExpert would refuse.
  absl::Status ExpertCap() const ABSL_LOCKS_EXCLUDED(mu_);
  // Builds the model, tries it on recent contexts, measures its scoring cost
  // (scoring_cost.h) and adds it BACKFILLING. RESOURCE_EXHAUSTED if the problem is full, or
  // if the experts that count against the budget (ExpertPool::CountsAgainstBudget) and the
  // new one would cost more than record().scoring_budget_us() (> 0): ScoringBudgetError,
  // and nothing is stored. Checked under expert_writes_mu_, so that two registrations
  // cannot both pass with room for one.
  absl::StatusOr<v1::Expert> RegisterExpert(const std::string& name,
                                            storage::v1::ExpertModelRecord model,
                                            double smoothing, const RegisterOptions& options)
      ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_);
  absl::StatusOr<v1::Expert> RegisterExpert(const std::string& name,
                                            storage::v1::ExpertModelRecord model,
                                            double smoothing)
      ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_) {
    return RegisterExpert(name, std::move(model), smoothing, RegisterOptions());
  }
  absl::StatusOr<v1::Expert> RetireExpert(int expert_id)
      ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_);
  // The promotion gate (ProblemConfig.auto_promote): promotes every shadow expert whose
  // lower bound (estimate - width) exceeds the best estimate of the selectable experts.
  absl::Status PromoteProvenShadows() ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_);
  // Promote (shadow = false) and Demote (true): see the RPCs. Writes the expert's record.
  absl::StatusOr<v1::Expert> SetShadow(int expert_id, bool shadow)
      ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_);
  // Retires active experts whose UCB is below the best lower confidence bound
  // (mean - width), then the lowest-UCB ones until at most max_active are selectable.
  // Never retires the last selectable expert.
  absl::Status RetireDominated(int max_active) ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_);
  // Unloads the model of every frozen retired expert none of whose samples is kept: it can
  // never choose again (no selection in flight, no decision pending), and every sample it
  // chose is below the retention cut (or it chose none). No expert registered later has one
  // of its samples in its window, so its divergence pairs with those weigh nothing and are
  // 1; the record says so (unloaded_at_sample), and a restart does not load the model.
  absl::Status UnloadQuietExperts() ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_);

  // Read-only queries (in memory, short lock).
  std::vector<v1::Expert> ListExperts() const ABSL_LOCKS_EXCLUDED(mu_);
  // A copy of at most `max_rows` recent contexts (the divergence reservoir), row-major: the
  // real contexts a new model is probed on (model_sandbox.h).
  std::vector<double> RecentContexts(int max_rows) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether some sample of the log has a positive reward (what training learns from).
  bool HasPositiveReward() const ABSL_LOCKS_EXCLUDED(mu_);
  v1::Estimates GetEstimates() const ABSL_LOCKS_EXCLUDED(mu_);
  // Its counters and its configuration (with the retention it has now).
  v1::Problem Summary() const ABSL_LOCKS_EXCLUDED(mu_);
  // Off-policy estimates of `model` over the retained log (v1::ModelEvaluation), weights
  // clipped at `clip` for clipped_ips. Blocks (a store scan, one prediction per sample).
  absl::StatusOr<v1::ModelEvaluation> EvaluateModel(const Expert& model, double clip)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Why the decision of `event_id` was made (v1::Explanation). NOT_FOUND for an event the
  // problem does not have. Blocks (store reads).
  absl::StatusOr<v1::Explanation> Explain(const std::string& event_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Samples [start, start + limit) in join order (limit 0: all), until fn fails. Blocks
  // (a store scan). `dsjson`: each also carries its DSJSON line (server/dsjson.h), with the
  // chooser's distribution re-scored from its model (one prediction per sample).
  absl::Status ExportLog(int64_t start, int64_t limit, bool dsjson,
                         const std::function<absl::Status(const v1::LoggedSample&)>& fn)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Training support (the trainer's thread): the joined samples to train the problem's
  // experts on (TrainingObjectiveOf: every one, or those with a positive reward); at most
  // the newest kMaxTrainingSamples, of the first `samples` joined ones (0: all).
  // FAILED_PRECONDITION if there is none.
  absl::StatusOr<TrainingSet> TrainingSetFromLog(int64_t samples = 0) ABSL_LOCKS_EXCLUDED(mu_);

  // Maintenance (one thread at a time; problem_maintenance.cc, problem_experts.cc and
  // problem_divergences.cc).
  // Joins decisions whose wait time has passed with the default reward (or drops them).
  absl::Status ExpireDue() ABSL_LOCKS_EXCLUDED(mu_);
  // Backfills up to one chunk of the oldest backfilling expert; completes it when done.
  // Sets *worked if it did anything.
  absl::Status StepBackfill(bool* worked) ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_);
  // After a load, reads the next kEventIdLoadStep stored event ids into Choose's event-id
  // filter (a restart serves before it has read them: until the last step, every Choose
  // with a caller id looks the id up in the store). Sets *worked if it read any.
  absl::Status StepEventIdLoad(bool* worked) ABSL_LOCKS_EXCLUDED(mu_);
  // Batch boundaries follow rounds (joined samples), as in the paper: the first after the
  // warm-up, then every b sqrt(t) (NextRefresh), whatever the traffic speed. When the log
  // has reached one or more boundaries, re-estimates all divergences once and appends every
  // boundary passed, in order, to *boundaries (auto-training queues one job per boundary,
  // trained on the log up to it). A maintenance round that comes late catches up: no
  // boundary is skipped. min_interval_ms > 0 is the opt-in CPU throttle of
  // --min_refresh_interval_ms: a boundary then waits until the last refresh is that old, and
  // the boundaries passed meanwhile merge into one at the current log size (fewer batches:
  // it changes the algorithm). The divergences are computed without mu_; the estimator
  // takes them in place under mu_ (O(L N^2) for round-robin median of means, O(N^2 + kept
  // entries) for clipped: no pass over the log).
  //
  // The computation runs until `deadline`, at least one step per call (StepDivergences); one
  // not done by then is kept and resumed at the next call, which does nothing else until
  // it is done (the expert-pool round gives each problem a slice of its time, so that one
  // problem's refresh does not hold up the others' backfills). Experts estimated meanwhile
  // (a backfill that completed) keep the pairs their backfill computed.
  absl::Status MaybeRefreshDivergences(
      std::vector<int64_t>* boundaries, int64_t min_interval_ms,
      std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max())
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a refresh MaybeRefreshDivergences started is not done yet (the caller of
  // MaybeRefreshDivergences only).
  bool RefreshInProgress() const { return refresh_ != nullptr; }
  // Whether the expert-pool tasks may have work: set by what can give them some (a learned
  // sample, a registration, a quarantine, a divergence swap) and taken by the round that
  // visits the problem, which gives it back while work remains (PoolWorkRemains). An idle
  // problem is skipped.
  bool TakePoolWork() { return pool_work_.exchange(false); }
  void MarkPoolWork() { pool_work_.store(true); }
  // A backfill, a quarantine to write, or a batch boundary that is due.
  bool PoolWorkRemains() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Checkpoint() ABSL_LOCKS_EXCLUDED(mu_);

  // Moving the problem to another replica (DecisionService.BeginMove). Every call that may
  // change it enters before it touches the problem and leaves once answered (the service
  // does both, around `done`). EnterCall: the fence's status once fenced (UNAVAILABLE),
  // else OK and the call is counted in flight.
  absl::Status EnterCall() ABSL_LOCKS_EXCLUDED(call_mu_);
  void LeaveCall() ABSL_LOCKS_EXCLUDED(call_mu_);
  // Fences: from now on EnterCall and RegisterExpert (training jobs) answer `why`. Waits
  // until no call is in flight and no registration runs, at most `timeout`; if calls are
  // still in flight then, the fence is lifted and UNAVAILABLE returned. Background rounds
  // skip a fenced problem (they ask fenced()).
  absl::Status Fence(absl::Status why, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(call_mu_, expert_writes_mu_);
  void Unfence() ABSL_LOCKS_EXCLUDED(call_mu_);
  bool fenced() const { return fenced_.load(std::memory_order_acquire); }
  // The random generator's state (std::mt19937_64's text form), its parse
  // (INVALID_ARGUMENT for a text that is not one), and setting it: a moved problem goes on
  // drawing what its source would have drawn.
  std::string GeneratorState() const ABSL_LOCKS_EXCLUDED(mu_);
  static absl::StatusOr<std::mt19937_64> ParseGeneratorState(const std::string& state);
  void SetGenerator(const std::mt19937_64& generator) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the FAILED records of experts quarantined since the last call (a restart then
  // keeps them quarantined without loading their models). On a failure the rest wait.
  absl::Status PersistFailures() ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_);
  // `oldest_unfinished_training`: the oldest batch boundary whose training job is not done
  // (0: none; the owner knows the training jobs). The batch lag exported is how many rounds
  // the log is past it or past a boundary whose refresh is not done, whichever is older.
  // An unchanged problem is not exported again.
  void ExportMetrics(int64_t oldest_unfinished_training) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the deferred decisions not yet written and waits for that write (retried once if
  // it fails). Blocks. When it returns OK, every decision answered before the call is
  // written, unless an earlier flush failed while this one was queued (its decisions are
  // unwritten again): a second call then writes them.
  absl::Status FlushDecisions() ABSL_LOCKS_EXCLUDED(mu_);
  // Which write tasks may have work at `now_ms`, in one look: `decisions`, a deferred
  // decision not yet in a flush (or back from one that failed) or in a flush not written
  // yet (else FlushDecisions would only wait for the writer); `chunks`, a log chunk to
  // write; `expiry`, a deadline passed.
  struct WriteWork {
    bool decisions = false;
    bool chunks = false;
    bool expiry = false;
  };
  WriteWork WriteWorkDue(int64_t now_ms) const ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the log chunks completed since the last call, in order (a restart reads the
  // estimators' view from them). On a failure the rest wait for the next call.
  absl::Status WriteLogChunks() ABSL_LOCKS_EXCLUDED(mu_, chunk_writes_mu_);

  // Retention (problem_retention.cc; ProblemConfig.retention in the API).
  // Whether ApplyRetention would check the age against the store at `now_ms` (retention
  // by age moves without traffic).
  bool RetentionDue(int64_t now_ms) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return retention_max_age_ms_ > 0 && now_ms >= next_age_check_ms_;
  }
  // Changes it and rewrites the problem's record; learning goes on unchanged. REQUIRES: a
  // valid setting for this problem (ValidateRetention). Blocks (a store write).
  absl::Status SetRetention(const v1::RetentionConfig& retention)
      ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_);
  // Maintenance: deletes from the store what the setting no longer keeps (Store::
  // ApplyRetention), in whole log chunks, never past what still needs the samples: the
  // last two log chunks (the one being filled and the one before), a backfilling expert's
  // window, and the estimators' state a restart starts from (when that holds retention
  // back by more than an eighth of what it keeps, it writes the state first). The age is
  // checked against the store at most once per second. Blocks (store reads and writes).
  absl::Status ApplyRetention() ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_);
  // DecisionService.DeleteEvents: deletes the events' records and redacts their samples
  // (context and event id). Waits until every acknowledged reward is learned, and first
  // stores the log chunks up to the newest sample it redacts (a restart scores again only
  // the samples after the stored chunks, from their contexts). FAILED_PRECONDITION, with
  // nothing deleted, if some event is still pending. Blocks.
  absl::Status DeleteEvents(const std::vector<std::string>& event_ids,
                            v1::DeleteEventsResponse* response)
      ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_, chunk_writes_mu_);

 private:
  friend class Recovery;

  // One unit of work for the join writer (problem_commit.cc).
  struct WriteOp {
    enum Kind {
      kDecision,    // durable Choose: answered once written
      kFlush,       // deferred decisions, answered already
      kJoin,        // a reward, or the default reward at expiry, joined to its decision
      kDrop,        // an expired decision dropped (drop_unrewarded)
      kLateReward,  // a reward for an event no longer pending: resolved against the store
      kMarkLate,    // a late reward came while the event expired: mark the stored event
      kActivate,    // a deferred decision was activated: rewrite its stored record
    };
    Kind kind = kJoin;
    std::string event_id;
    storage::v1::EventRecord event;
    std::vector<std::pair<std::string, storage::v1::EventRecord>> flushed;  // kFlush
    v1::ChooseResponse* choose_response = nullptr;  // kDecision
    v1::RewardResponse* reward_response = nullptr;  // kJoin from a reward, kLateReward
    double reward = 0.0;  // kJoin
    bool is_default = false;
    bool decision_stored = true;  // kJoin, kDrop: false if the join writes the decision
    bool never_activated = false;  // kDrop: a deferred decision never activated
    bool unlearned_slot = false;   // kDrop: a slate slot the problem does not learn
    v1::ActivateResponse* activate_response = nullptr;  // kActivate
    Done done;                         // may be empty
    // Set by the writer. `writes`: the op added records to the group, so its answer is the
    // group's write status, then `result`; otherwise its answer is `result` alone.
    bool writes = true;
    absl::Status result;
    bool counts_late = false;       // kLateReward: the first late reward of its event
    bool counts_duplicate = false;  // kLateReward: a reward the event had already
    std::vector<ChooseWaiter> waiters;  // kDecision: Choose calls answered with it
  };
  // Rows of samples [chunk * kLogChunkSamples, ...) of the log, as the learner learned
  // them: who chose, the reward, and pi_k(arm | x) of experts [0, width) (NaN where an
  // expert was not registered yet, or not durable when the chunk completed: its value is
  // in its backfill). The chunk being filled is the only per-sample state kept in memory;
  // complete ones wait in unwritten_chunks_ for WriteLogChunks.
  //
  // Experts frozen when the chunk started (retired with their estimate kept) have no
  // column: nothing reads a frozen expert's value but where it is the chooser, and the
  // chooser's value is kept for every sample (chooser_propensity, the logged one). Without
  // this every expert ever registered would cost a column of every chunk, in memory and on
  // disk, for as long as the problem lives. Expand() gives the full rows back (a frozen
  // expert's value is the stand-in's 1/K the join scored it with, the chooser's its own).
  struct ChunkRows {
    int64_t chunk = 0;
    int width = 0;
    std::vector<int32_t> dropped;  // ascending ids < width without a column
    std::vector<int32_t> columns;  // the other ids < width, ascending: the stored columns
    std::vector<int32_t> chooser;
    std::vector<double> reward;
    std::vector<double> chooser_propensity;  // pi_j(s)(V_s | X_s) for chooser j(s)
    std::vector<double> propensities;        // [sample][columns.size()]
    int64_t size() const { return static_cast<int64_t>(chooser.size()); }
    int64_t first() const { return chunk * storage::kLogChunkSamples; }
    int stored() const { return static_cast<int>(columns.size()); }
    // Sample s's values of experts [0, width). REQUIRES: dropped.empty() (Expand).
    const double* row(int64_t s) const { return &propensities[(s - first()) * width]; }
    // Starts an empty chunk over experts [0, n) without the columns of `drop`.
    void Start(int n, std::vector<int32_t> drop);
    // Appends a sample; a wider row widens the chunk (NaN for the earlier samples).
    void Append(int chooser_id, double reward_value, absl::Span<const double> p);
    // At least `n` experts' columns: NaN for the ones added.
    void Widen(int n);
    // Keeps the first `n` experts.
    void Narrow(int n);
    // Keeps the first `n` samples.
    void Truncate(int64_t n);
    // Every expert's column: `fill` for a dropped one, its own value where it chose.
    void Expand(double fill);
    int64_t memory_bytes() const {
      return static_cast<int64_t>(4 * chooser.capacity() + 8 * reward.capacity() +
                                  8 * chooser_propensity.capacity() +
                                  8 * propensities.capacity());
    }
  };

  Problem(uint32_t index, storage::v1::ProblemRecord record, const Env& env, DUcb ducb);

  // Writes through the store, timing the write.
  template <typename F>
  absl::Status Timed(F&& write) const {
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = write();
    env_.metrics->storage_write_latency().Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return s;
  }

  // Who commits a call's write (GroupCommitQueue::Submit): the writer executor, always, for
  // calls from reactor threads; the caller itself, when no group is pending, for callers
  // that may block (the synchronous forms, the maintenance thread, the blocking executor).
  enum class Committer { kWriter, kCaller };
  // `slate_slot`: the decision's slot in a ChooseSlate; -1 for a Choose.
  void ChooseAs(const v1::ChooseRequest& request, v1::ChooseResponse* response, Done done,
                Committer committer, int slate_slot = -1) ABSL_LOCKS_EXCLUDED(mu_);
  void RewardAs(const v1::RewardRequest& request, v1::RewardResponse* response, Done done,
                Committer committer) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Choose (problem.cc)
  // The decision of a Choose whose expert is selected: scores, records, answers.
  struct Selection {
    int expert = -1;
    std::shared_ptr<const Expert> model;
    double u = 0.0;
    std::vector<int32_t> eligible;  // the request's eligible arms (EligibleArmsOf)
    // Why (Explain): the expert's estimate at selection, and the runner-up (-1: none).
    ExpertEstimate estimate;
    int runner_up = -1;
    double runner_up_ucb = 0.0;
  };
  // `offer`: a new decision (once per Choose): checks the pending-decision caps
  // (RESOURCE_EXHAUSTED) and offers x, with its eligible arms, to the divergence reservoir.
  absl::Status CheckPendingCapLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Selection> SelectLocked(absl::Span<const double> x,
                                         std::vector<int32_t> eligible, bool offer = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Decide(const v1::ChooseRequest& request, std::string event_id, bool claimed,
              Selection selection, v1::ChooseResponse* response, Done done,
              Committer committer, int slate_slot)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A claimed Choose whose event id may be stored: looks it up (on the blocking executor).
  void DecideAfterLookup(v1::ChooseRequest request, std::string event_id,
                         v1::ChooseResponse* response, Done done, int slate_slot)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `event` is a slate slot this problem never learns (ProblemRecord.
  // learn_first_slot_only, slot > 0), and the error its reward gets.
  bool UnlearnedSlot(const storage::v1::EventRecord& event) const {
    return record_.learn_first_slot_only() && event.has_slate_slot() && event.slate_slot() > 0;
  }
  absl::Status UnlearnedSlotError(const std::string& event_id,
                                  const storage::v1::EventRecord& event) const;
  absl::Status ExpertCapLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK if a Choose of slate slot `slate_slot` (-1: a plain Choose, always OK) may be
  // answered with `decided`, the decision already made under its event id: it must be that
  // slot of a slate. ALREADY_EXISTS otherwise.
  absl::Status RetryOfSlot(const std::string& event_id, const storage::v1::EventRecord& decided,
                           int slate_slot) const;
  // Fails a claimed Choose and its waiters with `status`.
  void FailClaim(const std::string& event_id, absl::Status status, Done done)
      ABSL_LOCKS_EXCLUDED(mu_);
  static void Answer(const std::string& event_id, const storage::v1::EventRecord& record,
                     v1::ChooseResponse* response);
  static void AnswerWaiters(std::vector<ChooseWaiter> waiters, const std::string& event_id,
                            const storage::v1::EventRecord& record);
  // --- Reward (problem.cc)
  // What a Reward does, decided under mu_ from its event's state (PendingTable).
  struct RewardPlan {
    enum Action {
      kAnswer,  // answer at once with `answer` (duplicate, not yet answerable, racing expiry)
      kJoin,    // join `op`'s event (the learner scores it)
      kExpire,  // past its deadline: expire it (`op`), then answer `answer` (late)
      kLate,    // not pending: the writer resolves it against the store
    };
    Action action = kAnswer;
    absl::Status answer;
    WriteOp op;
  };
  RewardPlan PlanRewardLocked(const std::string& event_id, int64_t now_ms,
                              v1::RewardResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LateError(const std::string& event_id, int64_t deadline_ms) const;

  // --- The join writer (problem_commit.cc)
  void Submit(WriteOp op, Committer committer = Committer::kWriter) {
    writer_.Submit(std::move(op), committer == Committer::kCaller);
  }
  void CommitGroup(std::vector<WriteOp>& group) ABSL_LOCKS_EXCLUDED(mu_);
  // After an expiry is written: if a late reward came after the expiry's record was built,
  // queues the write of the event's late mark.
  void MarkLateAfterExpiryLocked(const WriteOp& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds op to the batch (a late reward reads the store to decide what to write).
  absl::Status AddToBatch(WriteOp& op, storage::Store::WriteGroup* batch, int64_t* seq,
                          int64_t now_ms, absl::flat_hash_set<std::string>* marked_late);
  // A kLateReward (answered from the stored event) or kMarkLate: marks the stored event
  // late once; `marked_late` holds the events marked earlier in the same group.
  absl::Status AddLateMarkToBatch(WriteOp& op, storage::Store::WriteGroup* batch,
                                  absl::flat_hash_set<std::string>* marked_late);
  void ApplyLocked(WriteOp& op, const absl::Status& written)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyJoinLocked(WriteOp& op, const absl::Status& written)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the deferred decisions not yet written as one kFlush op.
  void QueueFlushLocked(Done done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Expiry (problem_maintenance.cc)
  // Starts the expiry of a joinable decision whose wait time passed: the join with the
  // default reward, or the drop.
  void PrepareExpiryLocked(const std::string& event_id, PendingDecision& decision, WriteOp* op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- The learner (problem_learn.cc)
  // A joined sample written to the store and not yet learned.
  struct Unlearned {
    int64_t sequence = 0;
    storage::v1::EventRecord event;  // arm, chooser, logged propensity, features
    double reward = 0.0;
    std::chrono::steady_clock::time_point written;
  };
  // Queues a written join for the learner, in log order (CommitGroup starts the learner).
  void QueueLearnLocked(WriteOp& op, int64_t sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Learns everything queued, a batch at a time. Runs on the learner (or the writer).
  void LearnQueued() ABSL_LOCKS_EXCLUDED(mu_);
  // Scores `batch` with `models` (outside mu_): row s, expert k of the result is
  // pi_k(arm_s | x_s), the logged propensity for the chooser. A model that fails on the
  // batch (an error, or a value outside (0, 1]) gets the stand-in's 1/K for all of it and is
  // added to *failures, its reason prefixed with `where` (the join, or a restart).
  std::vector<double> ScoreBatch(const std::vector<Unlearned>& batch,
                                 const std::vector<std::shared_ptr<const Expert>>& models,
                                 absl::string_view where,
                                 std::vector<ScoringFailure>* failures) const;
  // model.PredictBatchEligible over n rows, split into parts that Env::scorers score side
  // by side (the same probabilities as in one call). The first failing part's error.
  absl::Status ScoreRows(const Expert& model, absl::Span<const double> rows, size_t n,
                         absl::Span<const absl::Span<const int32_t>> eligible,
                         absl::Span<double> probs) const;
  // Learns one scored sample: D-UCB, the tails of backfilling experts, log chunks.
  // `propensities` covers every expert of the pool.
  absl::Status LearnOneLocked(const Unlearned& sample, absl::Span<const double> propensities)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The waiters whose target is learned (or all of them, once learning stopped).
  std::vector<Done> TakeLearnedWaitersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joined samples written to the store, learned or waiting for the learner: the position
  // the next join is written at.
  int64_t WrittenSamplesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ducb_.num_samples() + static_cast<int64_t>(unlearned_.size());
  }

  // --- Experts (problem_experts.cc)
  // Quarantine (see expert_pool.h): expert `id` failed on a context. From now on it is never
  // selected, its model is the uniform stand-in (every later join and backfill gets 1/K for
  // it, and its divergences stay frozen), and its FAILED record is written by the next
  // PersistFailures. Idempotent. Returns true if it was not quarantined yet.
  bool QuarantineLocked(int id, absl::string_view reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QuarantineFailures(const std::vector<ScoringFailure>& failures) ABSL_LOCKS_EXCLUDED(mu_);
  // --- Divergences (problem_divergences.cc)
  // A copy of the divergence reservoir's rows and their stamps, for work outside mu_.
  struct ReservoirCopy {
    std::vector<double> contexts;
    std::vector<uint64_t> stamps;
    std::vector<std::vector<int32_t>> eligible;  // empty: no row restricted
  };
  ReservoirCopy CopyReservoirLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fraction of the reservoir's rows written since the divergences of the estimated
  // experts were last estimated (all of them before the first estimate, and after a
  // restart).
  double ReservoirTurnoverLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the batch schedule past the current log size, adding each boundary passed (or,
  // with a throttle, the current size) to `boundaries`.
  void PassBoundariesLocked(std::vector<int64_t>* boundaries, int64_t min_interval_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Divergences of `models` over the reservoir's rows, keeping the block of experts
  // [0, keep) from `previous`. The models' predictions on rows they have already predicted
  // come from reservoir_predictions_; the experts it does not keep are predicted a block
  // of contexts at a time (Env::divergence_limits). A model that fails on a context is
  // quarantined and scored as its stand-in; the rows and columns of quarantined experts
  // keep their `previous` values (they weigh the samples those experts chose while they
  // were healthy). A model meets the contexts it is predicted on: every reservoir row when
  // the cache keeps its predictions, the rows the estimate reads (all but the last
  // R mod G) when read in blocks.
  absl::StatusOr<DivergenceMatrix> ComputeDivergencesFor(
      std::vector<std::shared_ptr<const Expert>> models, ReservoirCopy reservoir,
      DivergenceMatrix previous, int keep) ABSL_LOCKS_EXCLUDED(mu_);
  // One ComputeDivergencesFor, resumable between steps: its inputs, the predictions taken
  // from the cache, and the core computation.
  struct DivergenceJob {
    std::vector<std::shared_ptr<const Expert>> models;  // a failed one: the stand-in
    ReservoirCopy reservoir;
    std::vector<absl::Span<const int32_t>> eligible;  // into reservoir.eligible
    DivergenceMatrix previous;
    int keep = 0;
    size_t rows = 0;
    std::unique_ptr<bool[]> fixed, absent;  // one flag per expert
    // The predictions the cache keeps, taken before the computation starts (held[e] null:
    // read a block at a time), one expert a step; the next expert to take.
    std::vector<ReservoirPredictions::Shared> held;
    int cached_next = 0;
    std::optional<DivergenceComputation> computation;  // started once `held` is taken
    DivergenceMatrix result;  // once done (at once when no context was seen)
  };
  // The inputs of ComputeDivergencesFor, and which experts' pairs are fixed or absent: no
  // prediction yet.
  absl::StatusOr<std::unique_ptr<DivergenceJob>> StartDivergences(
      std::vector<std::shared_ptr<const Expert>> models, ReservoirCopy reservoir,
      DivergenceMatrix previous, int keep) ABSL_LOCKS_EXCLUDED(mu_);
  // Works on `job` until it is done (true: job.result holds the matrix) or `deadline` has
  // passed (false), in steps of a few milliseconds (DivergenceComputation::Step) or of one
  // expert's predictions taken from the cache, at least one a call. A model that fails is
  // quarantined, and the computation starts again with its stand-in.
  absl::StatusOr<bool> StepDivergences(DivergenceJob& job,
                                       std::chrono::steady_clock::time_point deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // (Re)starts job.computation with the job's fixed and absent experts.
  absl::Status StartComputation(DivergenceJob& job);
  absl::Status BackfillChunk(int expert_id, const std::shared_ptr<const Expert>& model,
                             int64_t from, int64_t total) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CompleteBackfill(int expert_id)
      ABSL_LOCKS_EXCLUDED(mu_, expert_writes_mu_);
  // Writes expert `id`'s record and applies it. REQUIRES expert_writes_mu_.
  // Retires in the estimator every expert frozen in the pool (ExpertPool::Frozen) that is
  // not yet: its row is freed and its column folded (Estimator::Retire). True if any was;
  // the next checkpoint then carries the estimators' state. Nothing for the estimators
  // that keep every row (clipped).
  bool FoldRetiredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The experts retired in the estimator (Estimator::Retired).
  int RetiredInEstimatorLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A record retiring an estimated expert gets its estimate now (retired_mean/width).
  absl::Status WriteExpertRecord(int id, const storage::v1::ExpertRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(expert_writes_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Several, in order, each applied as it is written (a failure stops there), then the
  // experts frozen by them folded under one checkpoint.
  absl::Status WriteExpertRecords(
      absl::Span<const std::pair<int, storage::v1::ExpertRecord>> records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(expert_writes_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // One record written (its model's bytes read back from the store) and applied in
  // memory; no fold.
  absl::Status PutExpertRecord(int id, const storage::v1::ExpertRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(expert_writes_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  int SelectableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Expert k's estimate as reported: kept at its retirement for a frozen expert
  // (ExpertPool::Frozen), else D-UCB's. REQUIRES k < ducb_.num_experts().
  ExpertEstimate ReportedEstimateLocked(int k) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!experts_.Frozen(k)) return ducb_.Estimate(k);
    const storage::v1::ExpertRecord& r = experts_.at(k).record;
    return {r.retired_mean(), r.retired_width()};
  }
  // The selectable experts as (UCB, id), lowest UCB first; *best_lower (if not null) gets
  // the best lower confidence bound (estimate - width) among them. The bounds use the
  // widths times width_scale.
  std::vector<std::pair<double, int>> SelectableByUcbLocked(double* best_lower = nullptr,
                                                            double width_scale = 1.0) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the automatic gates (RetireDominated, PromoteProvenShadows) scale the widths by: a
  // median-of-means problem whose c3 is below the paper's 2 selects with its narrower
  // width, but retires (for good) or promotes only on the paper's, sqrt(2 / c3) times
  // wider: a confidence interval of the analysis' kind, not the tuned exploration bonus.
  double GateWidthScale() const;
  // The scoring cost of `model` (named `name`) over `contexts`, or what the hook makes it.
  // Evaluates the model: never call it under mu_.
  double ScoringCostUs(const std::string& name, const Expert& model,
                       absl::Span<const double> contexts) const;
  // RegisterOptions::retire_to_fit for a new expert that costs cost_us.
  absl::Status RetireToFitBudget(double cost_us)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(expert_writes_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Sets decision_scoring_cost_seconds: call it after each change of which experts count.
  void ExportScoringCostLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Persistence (problem_maintenance.cc)
  // A checkpoint, and the estimators' state if `with_state` or if it changed other than by
  // learning samples since it was last written (or 2^20 samples ago): written together by
  // WriteCheckpoint, outside mu_.
  struct CheckpointWrite {
    storage::v1::CheckpointRecord checkpoint;
    std::optional<storage::v1::EstimatorStateRecord> state;
    uint64_t generation = 0;  // estimator_generation_ when it was taken
  };
  CheckpointWrite CheckpointLocked(bool with_state = false) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes it; gives its state's buffer back to state_buffer_ for the next.
  absl::Status WriteCheckpoint(CheckpointWrite& w) ABSL_LOCKS_EXCLUDED(mu_);
  // Appends a learned sample to the log chunk being filled (`p`: every expert of the pool);
  // a complete chunk, cut to the durable experts, waits in unwritten_chunks_.
  void AppendToLogChunkLocked(int chooser, double reward, absl::Span<const double> p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteLogChunksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunk_writes_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stores the log chunks through sample `sequence` (learned), the chunk being filled as
  // it is so far if it holds `sequence`.
  absl::Status StoreLogChunksThrough(int64_t sequence) ABSL_LOCKS_EXCLUDED(mu_, chunk_writes_mu_);
  // The stored form, built outside the lock (about 1 MB of fresh memory per chunk).
  static storage::v1::LogChunk BuildLogChunk(const ChunkRows& rows);
  // A stored chunk as rows; DATA_LOSS if its sizes do not fit `max_width` experts.
  absl::StatusOr<ChunkRows> ChunkRowsOf(int64_t chunk, const storage::v1::LogChunk& stored,
                                        int max_width) const;
  // Chunk `chunk` of the log, from memory (the chunk being filled, or complete and not yet
  // written) or from the store, with the values of experts [0, width) that it lacks filled
  // in from their backfill where they have one. NOT_FOUND if it is in neither. Blocks.
  absl::StatusOr<ChunkRows> ReadChunkRows(int64_t chunk, int width) ABSL_LOCKS_EXCLUDED(mu_);
  // Feeds `rows` (expert_id's rows, started over the estimator's samples) the samples
  // [rows->num_samples(), ducb_.num_samples()) from the chunks in memory, with the new
  // expert's values from its tail. False (nothing fed) if the first of them is not in
  // memory any more (written: the caller reads it from the store) or is below its
  // backfill_total.
  absl::StatusOr<bool> FeedRowsFromMemoryLocked(int expert_id, ExpertRows* rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Feeds `rows` samples [from, to) from the store: their choosers, rewards and logged
  // propensities, and expert_id's values from its backfill chunks below `total`, from
  // `tail` (its values of [from, to)) from there. Blocks.
  absl::Status FeedRowsFromStore(int expert_id, int64_t total, int64_t from, int64_t to,
                                 absl::Span<const double> tail, ExpertRows* rows)
      ABSL_LOCKS_EXCLUDED(mu_);

  const uint32_t index_;
  const storage::v1::ProblemRecord record_;
  const Env env_;
  const Metrics::ProblemMetrics metrics_;
  GroupCommitQueue<WriteOp> writer_;

  // The fence (EnterCall, Fence): calls in flight, and why new ones are refused.
  absl::Mutex call_mu_;
  int64_t calls_in_flight_ ABSL_GUARDED_BY(call_mu_) = 0;
  absl::Status fence_ ABSL_GUARDED_BY(call_mu_);
  std::atomic<bool> fenced_{false};  // !fence_.ok(), for the background rounds

  absl::Mutex expert_writes_mu_ ABSL_ACQUIRED_BEFORE(mu_, chunk_writes_mu_);
  // Serialises the writes of log chunks (WriteLogChunks, and DeleteEvents' partial chunk),
  // so that a partial chunk never overwrites the complete one.
  absl::Mutex chunk_writes_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  ExpertPool experts_ ABSL_GUARDED_BY(mu_);
  DUcb ducb_ ABSL_GUARDED_BY(mu_);  // estimates experts [0, ducb_.num_experts())
  ContextReservoir reservoir_ ABSL_GUARDED_BY(mu_);
  ReservoirPredictions reservoir_predictions_;  // thread-safe; not under mu_
  // The reservoir's stamps when the estimated experts' divergences were last estimated.
  std::vector<uint64_t> reestimated_stamps_ ABSL_GUARDED_BY(mu_);
  // The divergence refresh in progress between calls of MaybeRefreshDivergences (the
  // expert-pool round's: only it touches this).
  std::unique_ptr<DivergenceJob> refresh_;
  // What ExportMetrics last exported from (it skips an unchanged problem). The generation
  // counts the changes of the estimates that keep the log and the pool's size: divergence
  // swaps, expert state changes, quarantines.
  struct ExportedState {
    int64_t samples;
    int estimated_experts;
    int experts;
    uint64_t generation;
    int64_t batch_lag;
    Metrics::ProblemMetrics::ExpertStateCounts experts_by_state;
    bool operator==(const ExportedState& o) const {
      return std::tie(samples, estimated_experts, experts, generation, batch_lag,
                      experts_by_state) == std::tie(o.samples, o.estimated_experts, o.experts,
                                                    o.generation, o.batch_lag,
                                                    o.experts_by_state);
    }
  };
  uint64_t estimates_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> pool_work_{true};  // a loaded problem is visited once
  std::optional<ExportedState> exported_ ABSL_GUARDED_BY(mu_);
  PendingTable pending_ ABSL_GUARDED_BY(mu_);
  // Every event id decided in this problem, pending or stored: a Choose with a new caller
  // id skips the store lookup when the filter rules the id out. After a load, until
  // StepEventIdLoad has read the stored ids (loading, from after the cursor), it holds only
  // the new ones, and rules nothing out.
  EventIdFilter event_ids_ ABSL_GUARDED_BY(mu_);
  bool event_ids_loading_ ABSL_GUARDED_BY(mu_) = false;
  std::string event_ids_cursor_;  // the last id read; only StepEventIdLoad touches it
  int64_t event_ids_loaded_ = 0;  // ids read so far (the same)
  std::chrono::steady_clock::time_point event_ids_load_start_;  // the same
  // The log chunk being filled by the learner, and the complete ones not yet written
  // (WriteLogChunks), in chunk order.
  ChunkRows current_chunk_ ABSL_GUARDED_BY(mu_);
  std::vector<ChunkRows> unwritten_chunks_ ABSL_GUARDED_BY(mu_);
  int64_t decisions_ ABSL_GUARDED_BY(mu_) = 0;
  // Joined samples written and not yet learned, in log order (the learner's queue).
  std::deque<Unlearned> unlearned_ ABSL_GUARDED_BY(mu_);
  bool learn_scheduled_ ABSL_GUARDED_BY(mu_) = false;  // a LearnQueued task runs or waits
  // WhenLearned callers: (samples the log must reach, the callback).
  std::vector<std::pair<int64_t, Done>> learn_waiters_ ABSL_GUARDED_BY(mu_);
  int64_t next_refresh_at_ ABSL_GUARDED_BY(mu_) = 0;
  // Changes of the estimators other than by learning samples (new divergences, new
  // experts), and which of them the state last written covers, at how many samples.
  uint64_t estimator_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool state_written_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t state_generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t state_samples_ ABSL_GUARDED_BY(mu_) = 0;
  // The bytes of the last state written, kept for the next snapshot: a fresh allocation of
  // a large state (48 MB at N = 160) costs its page faults under mu_ (31 ms).
  mutable std::string state_buffer_ ABSL_GUARDED_BY(mu_);
  int64_t last_refresh_ms_ ABSL_GUARDED_BY(mu_) = 0;  // clock time of the last refresh
  // Retention: the setting (0: off), the first sample the store keeps, the time before
  // which its events are deleted, and when the age is next checked against the store.
  int64_t retention_max_samples_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retention_max_age_ms_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retained_from_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t events_cut_ms_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_age_check_ms_ ABSL_GUARDED_BY(mu_) = 0;
  // The cut at which the store last compacted this problem's events (since the load).
  int64_t events_compacted_at_ ABSL_GUARDED_BY(mu_) = 0;
  // Set when a written sample could not be learned: the estimator no longer matches the
  // store, so every later join fails with it (nothing more is written at that position)
  // until a restart reloads the problem.
  absl::Status learning_stopped_ ABSL_GUARDED_BY(mu_);
  // Samples of the log with a positive reward: training needs at least one. Counted when
  // written; positive_learned_ counts the learned ones (what a checkpoint covers).
  int64_t positive_rewards_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t positive_learned_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 gen_ ABSL_GUARDED_BY(mu_);
  // Failed flushes repeat at the rate of Choose calls while the store cannot write.
  LogLimiter write_error_log_{10'000};
  // The model of every quarantined expert: uniform over the problem's arms.
  std::shared_ptr<const Expert> stand_in_;
};

// The first batch boundary is after the warm-up of 3K samples, then every b sqrt(t) (at
// least 1, at most 2^53; 1 if b is NaN).
int64_t NextRefresh(const storage::v1::ProblemRecord& record, int64_t t);

}  // namespace decision::server

#endif  // DECISION_SERVER_PROBLEM_H_
