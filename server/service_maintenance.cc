// DecisionService: the maintenance loop. Each round, for every problem, in order: write the
// deferred decisions and the completed log chunks, expire the decisions whose wait time
// passed, backfill within a time budget, retire dominated experts (auto-training), refresh
// the divergences at a batch boundary (and queue training). Each task runs even when an
// earlier one failed (a full disk that fails a log chunk must not stop the expiry); the
// first error of a round is returned and logged (at a bounded rate: log_limiter.h).
//
// A store that cannot write (a full disk) would fail every task of every round: the round
// then only asks the store to resume, at most every store_recovery_interval_ms, and runs
// its tasks again (writing the deferred decisions first) once it does.
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "server/decision_service.h"

namespace decision::server {

absl::Status DecisionService::RunMaintenance() {
  absl::MutexLock round(&maintenance_mu_);
  std::vector<Problem*> problems;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, p] : problems_) problems.push_back(p.get());
  }
  absl::Status status = absl::OkStatus();
  const auto now = std::chrono::steady_clock::now();
  const bool export_metrics = now - last_metrics_export_ >= std::chrono::milliseconds(500);
  backfill_behind_ = false;
  if (absl::Status store = MaintainStore(); !store.ok()) {
    if (export_metrics) {
      for (Problem* p : problems) ExportProblemMetrics(p);
      last_metrics_export_ = now;
    }
    return store;
  }
  for (Problem* p : problems) {
    absl::Status s = MaintainProblem(p, std::chrono::milliseconds(100));
    if (status.ok()) status = s;
    if (export_metrics) ExportProblemMetrics(p);
  }
  if (export_metrics) {
    last_metrics_export_ = now;
    metrics_->storage_size().Set(static_cast<double>(store_->ApproximateSizeBytes()));
  }
  return status;
}

void DecisionService::ExportProblemMetrics(Problem* p) {
  // The schedule's lag: the oldest boundary whose refresh, or whose training job, is not
  // done yet.
  const int64_t boundary = training_jobs_->OldestUnfinishedBoundary(p->index());
  const int64_t samples = p->Summary().samples();
  p->ExportMetrics(std::max(p->RefreshLag(), boundary > 0 ? samples - boundary : 0));
}

absl::Status DecisionService::MaintainProblem(Problem* p,
                                              std::chrono::milliseconds backfill_budget) {
  absl::Status first = absl::OkStatus();
  auto keep = [&](const char* task, absl::Status s) {
    if (s.ok()) return;
    if (first.ok()) {
      first = absl::Status(s.code(), absl::StrCat("problem ", p->id(), ": ", task, ": ",
                                                  s.message()));
    }
  };
  keep("writing decisions", p->FlushDecisions());
  keep("writing log chunks", p->WriteLogChunks());
  keep("expiry", p->ExpireDue());
  keep("writing quarantined experts", p->PersistFailures());
  // Backfill one chunk at a time, within the budget.
  const auto start = std::chrono::steady_clock::now();
  bool worked = true;
  absl::Status backfill = absl::OkStatus();
  while (worked && backfill.ok() && std::chrono::steady_clock::now() - start < backfill_budget) {
    backfill = p->StepBackfill(&worked);
  }
  keep("backfill", backfill);
  if (worked && backfill.ok()) backfill_behind_ = true;
  const storage::v1::ProblemRecord& r = p->record();
  if (r.auto_train()) keep("retiring dominated experts", p->RetireDominated(r.max_active_experts()));
  std::vector<int64_t> boundaries;
  keep("divergence refresh",
       p->MaybeRefreshDivergences(
           &boundaries, options_.inline_maintenance ? 0 : options_.min_refresh_interval_ms));
  if (r.auto_train()) {
    // One job per boundary, trained on the log up to it: a late round catches up.
    for (int64_t boundary : boundaries) {
      keep("queueing training", trainer_->Enqueue(p, p->index(), r.auto_train_trees(),
                                                  r.auto_train_linear(),
                                                  storage::v1::TRAINING_JOB_ORIGIN_AUTO,
                                                  boundary)
                                    .status());
    }
  }
  return first;
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
  SetCurrentThreadPriority(options_.background_priority == ThreadPriority::kNormal
                               ? ThreadPriority::kNormal
                               : ThreadPriority::kLow);
  bool behind = false;
  while (!stop_.WaitForNotificationWithTimeout(
      behind ? absl::ZeroDuration() : absl::Milliseconds(options_.maintenance_interval_ms))) {
    absl::Status s = RunMaintenance();
    if (!s.ok()) maintenance_log_.Report(clock_->NowMs(), "maintenance: " + s.ToString());
    absl::MutexLock lock(&maintenance_mu_);
    behind = s.ok() && backfill_behind_;
  }
}

}  // namespace decision::server
