// DecisionService: the maintenance, in two threads, so that the heavy work never delays the
// work requests wait for.
//   - The maintenance thread, each round, for every problem: writes the deferred decisions
//     (if it has any) and the completed log chunks, and expires the decisions whose wait
//     time passed. Its work is proportional to the traffic; it runs at nice 10 (nice 19 with
//     --background_priority=idle, or normal), never idle.
//   - The expert-pool thread, each round, for every problem that may have work
//     (Problem::TakePoolWork; an idle problem costs nothing): writes the quarantined
//     experts, backfills within a time budget, retires dominated experts (auto-training),
//     and re-estimates the divergences at a batch boundary (and queues training). Its work
//     grows with the experts and the log (a backfill, O(N^2 R K) divergences), and it runs
//     at --background_priority, so that with `idle` it never takes the CPU from a request.
// Each task runs even when an earlier one failed (a full disk that fails a log chunk must
// not stop the expiry); the first error of a round is returned and logged (at a bounded
// rate: log_limiter.h).
//
// A store that cannot write (a full disk) would fail every task of every round: the
// maintenance round then only asks the store to resume, at most every
// store_recovery_interval_ms, and runs its tasks again (writing the deferred decisions
// first) once it does; the expert-pool rounds wait for that.
#include <malloc.h>  // malloc_trim, mallinfo2 (glibc)

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "server/decision_service.h"

namespace decision::server {

absl::Status DecisionService::RunMaintenance() {
  const absl::Status writes = RunWriteRound();
  const absl::Status pool = RunPoolRound();
  return writes.ok() ? pool : writes;
}

std::vector<Problem*> DecisionService::AllProblems() {
  std::vector<Problem*> problems;
  absl::MutexLock lock(&mu_);
  for (auto& [id, p] : problems_) problems.push_back(p.get());
  return problems;
}

absl::Status DecisionService::RunWriteRound() {
  absl::MutexLock round(&maintenance_mu_);
  const std::vector<Problem*> problems = AllProblems();
  absl::Status status = absl::OkStatus();
  const auto now = std::chrono::steady_clock::now();
  const bool export_metrics =
      now - last_metrics_export_ >= std::chrono::milliseconds(options_.metrics_export_interval_ms);
  if (absl::Status store = MaintainStore(); !store.ok()) {
    if (export_metrics) {
      for (Problem* p : problems) ExportProblemMetrics(p);
      last_metrics_export_ = now;
    }
    return store;
  }
  for (Problem* p : problems) {
    absl::Status s = MaintainWrites(p);
    if (status.ok()) status = s;
    if (export_metrics) ExportProblemMetrics(p);
    // Retention by age moves on without traffic: an idle problem with it is visited by the
    // expert-pool round once its age check is due (once a second).
    if (p->RetentionDue(clock_->NowMs())) p->MarkPoolWork();
  }
  if (export_metrics) {
    last_metrics_export_ = now;
    double total = 0;
    for (const storage::Store::FamilySize& f : store_->FamilySizes()) {
      metrics_->store_family_size(f.family).Set(static_cast<double>(f.bytes));
      metrics_->store_live_sst_bytes(f.family).Set(static_cast<double>(f.live_sst_bytes));
      metrics_->store_sst_files(f.family).Set(static_cast<double>(f.sst_files));
      total += static_cast<double>(f.bytes);
    }
    metrics_->storage_size().Set(total);
    // Small record families merged into one file once they have a few (the store's
    // compaction thread; only a metadata read here).
    store_->CompactSmallFamiliesSoon();
    const storage::Store::MemoryUsage memory = store_->Memory();
    metrics_->store_memory("memtables").Set(static_cast<double>(memory.memtables));
    metrics_->store_memory("table_readers").Set(static_cast<double>(memory.table_readers));
    metrics_->store_memory("block_cache").Set(static_cast<double>(memory.block_cache));
  }
  return status;
}

absl::Status DecisionService::RunPoolRound() {
  absl::MutexLock round(&pool_mu_);
  pool_behind_ = false;
  // The maintenance round reports the store and resumes it.
  if (!store_->Health().writable) return absl::OkStatus();
  absl::Status status = absl::OkStatus();
  for (Problem* p : AllProblems()) {
    absl::Status s = MaintainPool(p, std::chrono::milliseconds(100),
                                  std::chrono::milliseconds(options_.refresh_slice_ms));
    if (status.ok()) status = s;
  }
  const auto now = std::chrono::steady_clock::now();
  // mallinfo2 walks every arena's free lists under its lock: every 5 s, not every round.
  if (now - last_allocator_export_ >= std::chrono::seconds(5)) {
    last_allocator_export_ = now;
    ServiceOptions::AllocatorBytes heap;
    if (options_.allocator.bytes) {
      heap = options_.allocator.bytes();
    } else {
#ifdef __GLIBC__
      const struct mallinfo2 info = mallinfo2();
      heap.in_use = static_cast<double>(info.uordblks + info.hblkhd);
      heap.free = static_cast<double>(info.fordblks);
      heap.mapped = static_cast<double>(info.hblkhd);
#endif
    }
    metrics_->allocator_bytes("in_use").Set(heap.in_use);
    metrics_->allocator_bytes("free").Set(heap.free);
    metrics_->allocator_bytes("mapped").Set(heap.mapped);
  }
  if (options_.malloc_trim_interval_ms > 0 &&
      now - last_malloc_trim_ >= std::chrono::milliseconds(options_.malloc_trim_interval_ms)) {
    last_malloc_trim_ = now;
    if (options_.allocator.release) {
      options_.allocator.release();
    } else {
#ifdef __GLIBC__
      malloc_trim(0);
#endif
    }
  }
  return status;
}

void DecisionService::ExportProblemMetrics(Problem* p) {
  p->ExportMetrics(training_jobs_->OldestUnfinishedBoundary(p->index()));
}

namespace {
// Collects the first error of a problem's round, prefixed with the problem and the task.
class FirstError {
 public:
  explicit FirstError(const std::string& problem_id) : problem_id_(problem_id) {}
  void Keep(const char* task, const absl::Status& s) {
    if (s.ok() || !first_.ok()) return;
    first_ = absl::Status(s.code(), absl::StrCat("problem ", problem_id_, ": ", task, ": ",
                                                 s.message()));
  }
  absl::Status status() const { return first_; }

 private:
  const std::string& problem_id_;
  absl::Status first_ = absl::OkStatus();
};
}  // namespace

absl::Status DecisionService::MaintainWrites(Problem* p) {
  // One look under the problem's lock; an idle problem costs nothing more (a flush with
  // nothing to write was a round trip to the writer, for every problem, every round: most
  // of an idle server's CPU).
  // A problem being moved is left as its fence found it (DecisionService::BeginMove).
  if (p->fenced()) return absl::OkStatus();
  const Problem::WriteWork work = p->WriteWorkDue(clock_->NowMs());
  FirstError errors(p->id());
  if (work.decisions) errors.Keep("writing decisions", p->FlushDecisions());
  if (work.chunks) errors.Keep("writing log chunks", p->WriteLogChunks());
  if (work.expiry) errors.Keep("expiry", p->ExpireDue());
  return errors.status();
}

absl::Status DecisionService::MaintainPool(Problem* p,
                                           std::chrono::milliseconds backfill_budget,
                                           std::chrono::milliseconds refresh_slice) {
  // An idle problem is skipped: nothing was learned, registered or quarantined since a
  // visit that left no work.
  if (p->fenced() || !p->TakePoolWork()) return absl::OkStatus();
  FirstError errors(p->id());
  errors.Keep("writing quarantined experts", p->PersistFailures());
  // A restart's event ids, then backfill, one step at a time, within the budget.
  const auto start = std::chrono::steady_clock::now();
  bool worked = true;
  absl::Status load = absl::OkStatus();
  while (worked && load.ok() && std::chrono::steady_clock::now() - start < backfill_budget) {
    load = p->StepEventIdLoad(&worked);
  }
  errors.Keep("reading event ids", load);
  worked = true;
  absl::Status backfill = absl::OkStatus();
  while (worked && backfill.ok() && std::chrono::steady_clock::now() - start < backfill_budget) {
    backfill = p->StepBackfill(&worked);
  }
  errors.Keep("backfill", backfill);
  if (worked && backfill.ok()) pool_behind_ = true;
  const storage::v1::ProblemRecord& r = p->record();
  if (r.auto_promote()) errors.Keep("promoting shadow experts", p->PromoteProvenShadows());
  if (r.auto_train()) {
    errors.Keep("retiring dominated experts", p->RetireDominated(r.max_active_experts()));
  }
  std::vector<int64_t> boundaries;
  const absl::Status refresh = p->MaybeRefreshDivergences(
      &boundaries, options_.inline_maintenance ? 0 : options_.min_refresh_interval_ms,
      refresh_slice.count() >= 0 ? std::chrono::steady_clock::now() + refresh_slice
                                 : std::chrono::steady_clock::time_point::max());
  errors.Keep("divergence refresh", refresh);
  if (refresh.ok() && p->RefreshInProgress()) pool_behind_ = true;
  if (r.auto_train()) {
    // One job per boundary, trained on the log up to it: a late round catches up.
    for (int64_t boundary : boundaries) {
      errors.Keep("queueing training",
                  trainer_->Enqueue(p, p->index(), r.auto_train_trees(), r.auto_train_linear(),
                                    storage::v1::TRAINING_JOB_ORIGIN_AUTO, boundary)
                      .status());
    }
  }
  errors.Keep("retention", p->ApplyRetention());
  errors.Keep("unloading retired experts", p->UnloadQuietExperts());
  // Work left (a backfill beyond the budget, a refresh beyond its slice, a boundary the
  // throttle delays, a failed task retried): the next round visits again.
  if (!errors.status().ok() || p->PoolWorkRemains()) p->MarkPoolWork();
  return errors.status();
}

absl::Status DecisionService::MaintainStore() {
  storage::StoreHealth health = store_->Health();
  const int64_t now_ms = clock_->NowMs();
  absl::Status recovered = absl::OkStatus();
  if (!health.writable) {
    if (store_was_writable_) {
      store_was_writable_ = false;
      std::fprintf(stderr, "decisiond: the store cannot write: %s; decisions, rewards and "
                           "changes are refused until it recovers\n",
                   std::string(health.error.message()).c_str());
    }
    if (last_store_recovery_ms_ == std::numeric_limits<int64_t>::min() ||
        now_ms - last_store_recovery_ms_ >= options_.store_recovery_interval_ms) {
      last_store_recovery_ms_ = now_ms;
      recovered = store_->Recover();
      health = store_->Health();
    }
  }
  metrics_->store_healthy().Set(health.writable ? 1.0 : 0.0);
  if (health.write_errors > store_write_errors_counted_) {
    metrics_->store_write_errors().Increment(
        static_cast<double>(health.write_errors - store_write_errors_counted_));
    store_write_errors_counted_ = health.write_errors;
  }
  if (!health.writable) {
    return recovered.ok() ? CheckStoreWritable("writes") : recovered;
  }
  if (!store_was_writable_) {
    store_was_writable_ = true;
    last_store_recovery_ms_ = std::numeric_limits<int64_t>::min();
    maintenance_log_.Reset();
    std::fprintf(stderr, "decisiond: the store writes again (%lld writes failed since it "
                         "opened); decisions are accepted\n",
                 static_cast<long long>(health.write_errors));
  }
  return absl::OkStatus();
}

void DecisionService::MaintenanceLoop() {
  PinCurrentThread(options_.background_cpus);
  // Never idle: with `idle`, nice 19 (the request threads first, but never starved by the
  // process's own idle threads).
  SetCurrentThreadPriority(options_.background_priority == ThreadPriority::kIdle
                               ? ThreadPriority::kLowest
                               : options_.background_priority);
  while (!stop_.WaitForNotificationWithTimeout(
      absl::Milliseconds(options_.maintenance_interval_ms))) {
    absl::Status s = RunWriteRound();
    if (!s.ok()) maintenance_log_.Report(clock_->NowMs(), "maintenance: " + s.ToString());
  }
}

void DecisionService::ExpertPoolLoop() {
  PinCurrentThread(options_.background_cpus);
  SetCurrentThreadPriority(options_.background_priority);
  bool behind = false;
  while (!stop_.WaitForNotificationWithTimeout(
      behind ? absl::ZeroDuration() : absl::Milliseconds(options_.maintenance_interval_ms))) {
    absl::Status s = RunPoolRound();
    if (!s.ok()) maintenance_log_.Report(clock_->NowMs(), "maintenance: " + s.ToString());
    absl::MutexLock lock(&pool_mu_);
    behind = s.ok() && pool_behind_;
  }
}

}  // namespace decision::server
