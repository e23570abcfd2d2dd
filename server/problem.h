// One problem (decision point) of the service: its experts, D-UCB state, pending decisions
// and the reward join, backed by the store. The DecisionService owns one per problem.
//
// Thread safety: every public method may be called concurrently. The maintenance methods
// (ExpireDue, StepBackfill, MaybeRefreshDivergences, Checkpoint, ExportMetrics) must be
// called from one thread at a time (the service's maintenance thread); they are the only
// ones that change the expert set D-UCB estimates and the divergences.
//
// Locking: mu_ guards the in-memory state. Model evaluations and durable writes run outside
// mu_: a decision is visible to a concurrent Choose retry at once, and joinable once it is
// answered (deferred) or stored (not deferred).
//
// Group commit: Choose and Reward do their work (validation, selection, scoring) in the
// caller's thread, then queue one write op. The first thread to find no commit in progress
// becomes the committer: it writes everything queued as one storage write, applies it to
// the in-memory state in queue order, completes each op, and repeats until the queue is
// empty. Joins therefore reach the log in the same order in the store and in memory, and a
// failed group leaves neither a gap nor a partial state. Completion is a callback, so an
// RPC handler queues its op and returns without blocking a thread.
//
// Deferred decisions (Env::defer_decisions, the default of decisiond): Choose answers as
// soon as its decision is in memory, without a write. A decision that is rewarded (or
// expired) before it is written is written once, by its join: the joined event and the
// sample, in the join's group (so an acknowledged reward is durable with its decision). The
// others are written by FlushDecisions, which the maintenance thread calls every round, and
// which a Choose calls when the oldest unwritten decision is Env::decision_flush_ms old or
// kMaxUnwrittenDecisions are unwritten (so a long maintenance round, such as a divergence
// refresh, does not hold them back). A crash forgets the decisions not yet written: their
// rewards then get NOT_FOUND. Without deferral a decision answers once it is durable, and a
// reward that arrives before that gets UNAVAILABLE.
#ifndef DECISION_SERVER_PROBLEM_H_
#define DECISION_SERVER_PROBLEM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/divergence.h"
#include "core/expert.h"
#include "core/policy.h"
#include "core/xgboost_trainer.h"
#include "decision/v1/decision.pb.h"
#include "server/clock.h"
#include "server/event_id_filter.h"
#include "server/metrics.h"
#include "storage/records.pb.h"
#include "storage/store.h"

namespace decision::server {

inline constexpr int kMaxExpertsPerProblem = 256;
inline constexpr size_t kMaxEventIdBytes = 128;
inline constexpr int64_t kBackfillChunk = 4096;  // samples per backfill chunk on disk
inline constexpr int64_t kLogChunk = 4096;       // samples per log chunk on disk
// A log chunk is one chunk of the in-memory log's storage (PendingChunk shares it).
static_assert(kLogChunk == SampleLog::kChunkSamples);
inline constexpr size_t kMaxTrainingSamples = 200'000;
inline constexpr size_t kMaxUnwrittenDecisions = 4096;  // deferred ones before a flush

// Completion of an asynchronous call: called once, from the caller's thread or from the
// thread that commits its write, with no lock of the problem held.
using Done = std::function<void(absl::Status)>;

// Runs `start(done)` and waits until done is called; returns its status.
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

// Builds the core expert of a stored model record.
absl::StatusOr<std::unique_ptr<Expert>> BuildExpert(const storage::v1::ExpertModelRecord& model,
                                                    int num_arms, int num_features,
                                                    double smoothing);

// Core estimator options from a problem record.
EstimatorOptions EstimatorOptionsOf(const storage::v1::ProblemRecord& record);

class Problem {
 public:
  struct Env {
    storage::Store* store;
    const Clock* clock;
    Metrics* metrics;
    uint64_t seed;
    bool defer_decisions = false;  // see "Deferred decisions" above
    int64_t decision_flush_ms = 20;  // the longest a deferred decision waits for a Choose
  };

  // A new problem: persists its record, registers expert 0 (uniform), writes a checkpoint.
  // REQUIRES: `record` is valid (the service validates it).
  static absl::StatusOr<std::unique_ptr<Problem>> Create(uint32_t index,
                                                         storage::v1::ProblemRecord record,
                                                         const Env& env);
  // A problem restored from the store: experts, divergences and reservoir from the last
  // checkpoint, the sample log (with stored propensities), pending decisions.
  static absl::StatusOr<std::unique_ptr<Problem>> Load(uint32_t index,
                                                       storage::v1::ProblemRecord record,
                                                       const Env& env);

  const std::string& id() const { return record_.problem_id(); }
  const storage::v1::ProblemRecord& record() const { return record_; }

  // `done` is called once the joined sample is durable, once the decision is in memory
  // (deferred) or durable (not deferred), or with the error. `request` may be destroyed when
  // the call returns; `response` must live until `done`.
  void Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response, Done done);
  void Reward(const v1::RewardRequest& request, v1::RewardResponse* response, Done done);
  // The same, waiting for `done`.
  absl::Status Choose(const v1::ChooseRequest& request, v1::ChooseResponse* response);
  absl::Status Reward(const v1::RewardRequest& request, v1::RewardResponse* response);
  absl::StatusOr<v1::Expert> RegisterExpert(const std::string& name,
                                            storage::v1::ExpertModelRecord model,
                                            double smoothing);
  absl::StatusOr<v1::Expert> RetireExpert(int expert_id);
  std::vector<v1::Expert> ListExperts() const;
  v1::Estimates GetEstimates() const;
  v1::Problem Summary() const;
  // Samples [start, start + limit) in join order (limit 0: all), until fn fails.
  absl::Status ExportLog(int64_t start, int64_t limit,
                         const std::function<absl::Status(const v1::LoggedSample&)>& fn);

  // Training support (the Trainer's thread).
  // The joined samples with a positive reward, as an importance-weighted training set
  // (label: the arm, weight: reward / propensity); at most the newest kMaxTrainingSamples.
  // FAILED_PRECONDITION if there is none.
  absl::StatusOr<TrainingSet> TrainingSetFromLog();
  // Retires active experts whose UCB is below the best lower confidence bound
  // (mean - width), then the lowest-UCB ones until at most max_active are selectable.
  // Never retires the last selectable expert.
  absl::Status RetireDominated(int max_active);

  // Maintenance (one thread).
  // Joins decisions whose wait time has passed with the default reward (or drops them).
  absl::Status ExpireDue();
  // Backfills up to one chunk of the oldest backfilling expert; completes it when done.
  // Returns true in *worked if it did anything.
  absl::Status StepBackfill(bool* worked);
  // Re-estimates all divergences when the log has grown past the batch boundary, unless the
  // last refresh is less than min_interval_ms old (then the boundary waits). Sets
  // *refreshed when a refresh (a batch boundary) happened. The divergences and the O(N t)
  // rebuild of the estimator run without the problem lock (on a shared prefix of the log);
  // the lock is held to catch up with the samples joined meanwhile and swap it in.
  absl::Status MaybeRefreshDivergences(bool* refreshed = nullptr, int64_t min_interval_ms = 0);
  absl::Status Checkpoint();
  void ExportMetrics();
  // Writes the deferred decisions not yet written (nor joined). With wait = false it returns
  // at once if another thread is committing (that thread writes them with its next group);
  // with wait = true it waits for that commit first, so that every decision answered before
  // the call is written (or failed) when it returns.
  void FlushDecisions(bool wait);
  // Writes the log chunks completed since the last call, in order (a restart reads the
  // estimators' view from them). On a failure the rest wait for the next call.
  absl::Status WriteLogChunks();

 private:
  struct ExpertSlot {
    storage::v1::ExpertRecord record;
    std::shared_ptr<const Expert> model;
    Metrics::ExpertMetrics metrics;
    // While backfilling: propensities of samples [0, backfilled) (from the worker) and of
    // samples joined since registration, [backfill_total, t).
    std::vector<double> backfill;
    std::vector<double> tail;
  };
  struct Pending {
    storage::v1::EventRecord record;
    bool joining = false;  // a reward or the expiry is being joined
    bool durable = true;   // false while Choose is still writing it (not deferred)
    // False while a deferred decision is neither written nor taken by a join or a flush.
    bool written = true;
  };
  // A decision or a join waiting in the commit queue.
  using PendingMap = absl::flat_hash_map<std::string, Pending>;
  struct WriteOp {
    enum Kind {
      kDecision,          // Choose, answered once written (choose_response)
      kDeferredDecision,  // a deferred decision, answered already (FlushDecisions)
      kJoin,              // a reward or the default reward joined to its decision
      kDrop,              // an expired decision dropped (drop_unrewarded)
    };
    Kind kind = kJoin;
    std::string event_id;
    storage::v1::EventRecord event;         // the pending event
    v1::ChooseResponse* choose_response = nullptr;  // kDecision
    double reward = 0.0;                    // join: the reward and how it came
    bool is_default = false;
    bool decision_stored = true;  // join, drop: false if the decision was never written
    std::vector<double> propensities;       // join: pi_k(arm | x) of the experts scored
    Done done;                              // empty for a deferred decision
  };
  struct Snapshot {
    std::vector<std::shared_ptr<const Expert>> models;  // every expert, by id
  };

  Problem(uint32_t index, storage::v1::ProblemRecord record, const Env& env, DUcb ducb);

  // Writes through the store, timing the write.
  template <typename F>
  absl::Status Timed(F&& write);

  v1::Expert ExpertProtoLocked(int id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Snapshot SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // pi_k(arm | features) for every model of the snapshot.
  absl::StatusOr<std::vector<double>> Propensities(const Snapshot& snapshot,
                                                   const storage::v1::EventRecord& event) const;
  // Validate and decide, or find the earlier decision of the same event id (nullopt, the
  // response filled in). With deferred decisions the decision is answered and joinable at
  // once (nullopt; *flush: the caller flushes the unwritten decisions); otherwise it is
  // If event_id is a pending decision, fills in its response and returns true.
  bool AnswerPendingLocked(const std::string& event_id, v1::ChooseResponse* response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // pending, not yet joinable, and the op to commit is returned.
  absl::StatusOr<std::optional<WriteOp>> PrepareDecision(const v1::ChooseRequest& request,
                                                         v1::ChooseResponse* response,
                                                         bool* flush);
  // Validate, find the pending event and score every expert on it; the join to commit, or
  // nullopt for a duplicate (the response filled in). The event is marked joining.
  absl::StatusOr<std::optional<WriteOp>> PrepareReward(const v1::RewardRequest& request,
                                                       v1::RewardResponse* response);
  // Queues `op`; commits groups until the queue is empty unless another thread is
  // committing. See "Group commit" above.
  void Submit(WriteOp op) ABSL_LOCKS_EXCLUDED(mu_, commit_mu_);
  // Commits groups until the queue is empty, unless another thread is committing.
  void CommitQueued() ABSL_LOCKS_EXCLUDED(mu_, commit_mu_);
  // Marks a pending decision as being joined (or dropped). A deferred decision not yet
  // written is then written by the join; returns whether it was stored already.
  bool StartJoinLocked(Pending& pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Undoes StartJoinLocked after a failure: the decision is pending again, and a deferred
  // decision that was not stored goes back to the flush list.
  void AbortJoinLocked(const std::string& event_id, bool decision_stored)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a pending deferred decision (back) on the flush list.
  void ReturnUnwrittenLocked(PendingMap::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `group` as one storage write, applies it, completes every op.
  void CommitGroup(std::vector<WriteOp>& group) ABSL_LOCKS_EXCLUDED(mu_, commit_mu_);
  // The in-memory effect of a committed (or failed) decision or join.
  void ApplyDecisionLocked(WriteOp& op, const absl::Status& written)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyJoinLocked(WriteOp& op, const absl::Status& written)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyDropLocked(WriteOp& op, const absl::Status& written)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A complete log chunk waiting to be written: the log's rows of samples
  // [chunk * kLogChunk, (chunk + 1) * kLogChunk), shared with the log (they never change),
  // and the propensities of the experts still backfilling, copied.
  struct PendingChunk {
    int64_t chunk = 0;
    SampleLog::SharedChunk rows;
    int width = 0;               // experts in the chunk: rows.num_experts, then the others
    std::vector<double> others;  // [sample][width - rows.num_experts]; NaN: in the backfill
  };
  PendingChunk PendingChunkLocked(int64_t chunk) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stored form, built outside the lock: filling ~1 MB of fresh memory (page faults
  // included) held the lock for ~0.6 ms in the join that completed the chunk.
  static storage::v1::LogChunk BuildLogChunk(const PendingChunk& pending);
  // Joins or drops a decision whose wait time passed. REQUIRES: pending, not joining.
  absl::Status ExpireOne(const std::string& event_id);
  // Divergences over the reservoir for experts [0, n), keeping pairs among [0, keep) from
  // `previous`. Identity rows if the reservoir is empty.
  absl::StatusOr<DivergenceMatrix> ComputeDivergencesFor(
      const std::vector<std::shared_ptr<const Expert>>& models, const std::vector<double>& contexts,
      const DivergenceMatrix& previous, int keep) const;
  storage::v1::CheckpointRecord CheckpointLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillResponse(const std::string& event_id, const storage::v1::EventRecord& record,
                    v1::ChooseResponse* response) const;

  const uint32_t index_;
  const storage::v1::ProblemRecord record_;
  const Env env_;
  const Metrics::ProblemMetrics metrics_;

  // Guards the commit queue only; never held while taking mu_ or writing. Lock order:
  // mu_, then commit_mu_ (FlushDecisions queues under mu_).
  absl::Mutex commit_mu_;
  std::vector<WriteOp> commit_queue_ ABSL_GUARDED_BY(commit_mu_);
  bool committing_ ABSL_GUARDED_BY(commit_mu_) = false;
  mutable absl::Mutex mu_;
  std::vector<ExpertSlot> experts_ ABSL_GUARDED_BY(mu_);
  DUcb ducb_ ABSL_GUARDED_BY(mu_);  // estimates experts [0, ducb_.num_experts())
  ContextReservoir reservoir_ ABSL_GUARDED_BY(mu_);
  PendingMap pending_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<int64_t, std::string>> deadlines_ ABSL_GUARDED_BY(mu_);
  // Every event id decided in this problem, pending or stored: a Choose with a new caller
  // id skips the store lookup when the filter rules the id out.
  EventIdFilter event_ids_ ABSL_GUARDED_BY(mu_);
  // Deferred decisions answered since the last flush, in order (some joined since), and
  // the clock time of the first of them.
  std::vector<std::string> unwritten_ ABSL_GUARDED_BY(mu_);
  int64_t unwritten_since_ms_ ABSL_GUARDED_BY(mu_) = 0;
  // Log chunks completed by joins and not yet written (WriteLogChunks), in chunk order.
  std::vector<PendingChunk> unwritten_chunks_ ABSL_GUARDED_BY(mu_);
  int64_t decisions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_refresh_at_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_refresh_ms_ ABSL_GUARDED_BY(mu_) = 0;  // clock time of the last refresh
  std::mt19937_64 gen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace decision::server

#endif  // DECISION_SERVER_PROBLEM_H_
