// Prometheus metrics of the decision service (names follow Prometheus conventions:
// counters end in _total, durations are in seconds). Label sets are bounded: per problem,
// per expert of a problem, and per pair of active experts.
//
// Thread safety: all methods may be called concurrently (prometheus-cpp metrics are
// thread-safe; family lookups are guarded by a mutex).
#ifndef DECISION_SERVER_METRICS_H_
#define DECISION_SERVER_METRICS_H_

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "decision/v1/decision.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace decision::server {

class Metrics {
 public:
  Metrics();
  std::shared_ptr<prometheus::Registry> registry() { return registry_; }

  // Per RPC.
  prometheus::Histogram& RpcLatency(const std::string& method);
  prometheus::Counter& RpcErrors(const std::string& method, const std::string& code);

  // Storage.
  prometheus::Histogram& storage_write_latency() { return *storage_write_latency_; }
  prometheus::Gauge& storage_size() { return *storage_size_; }
  // decision_store_family_bytes{family}: the store's size per column family.
  prometheus::Gauge& store_family_size(const std::string& family) {
    return store_family_size_->Add({{"family", family}});
  }
  // decision_store_live_sst_bytes{family}, decision_store_sst_files{family}.
  prometheus::Gauge& store_live_sst_bytes(const std::string& family) {
    return store_live_sst_bytes_->Add({{"family", family}});
  }
  prometheus::Gauge& store_sst_files(const std::string& family) {
    return store_sst_files_->Add({{"family", family}});
  }
  // decision_store_memory_bytes{part}: memtables, table_readers, block_cache.
  prometheus::Gauge& store_memory(const std::string& part) {
    return store_memory_->Add({{"part", part}});
  }
  // decision_allocator_bytes{kind}: in_use, free, mapped (ServiceOptions::allocator).
  prometheus::Gauge& allocator_bytes(const std::string& kind) {
    return allocator_bytes_->Add({{"kind", kind}});
  }
  prometheus::Counter& audit_write_errors() { return *audit_write_errors_; }
  // 1 while the store can write, 0 while RocksDB refuses writes (a full or failing disk).
  prometheus::Gauge& store_healthy() { return *store_healthy_; }
  // Writes RocksDB refused (each failed decision group, reward join, expert, chunk...).
  prometheus::Counter& store_write_errors() { return *store_write_errors_; }

  // Per problem.
  struct ProblemMetrics {
    prometheus::Counter* decisions;
    prometheus::Counter* rewards_learned;
    prometheus::Counter* rewards_late;
    prometheus::Counter* rewards_duplicate;
    prometheus::Counter* reward_sum;
    prometheus::Counter* expired_default;
    prometheus::Counter* expired_dropped;
    prometheus::Counter* expired_never_activated;  // deferred, never activated: dropped
    prometheus::Counter* expired_unlearned_slot;   // a slate slot not learned: dropped
    prometheus::Counter* undelivered;  // answers that never reached the client
    prometheus::Gauge* batch_lag;      // rounds behind the batch schedule
    // Batch boundaries at which the estimated experts' divergences were estimated again,
    // and those at which they were kept (too little of the reservoir changed).
    prometheus::Counter* divergences_reestimated;
    prometheus::Counter* divergences_kept;
    // The share of the divergence refresh in progress computed so far (0: none).
    prometheus::Gauge* divergence_refresh_progress;
    // Checkpoints written, and their bytes with the estimators' state when it went along.
    prometheus::Counter* checkpoints;
    prometheus::Counter* checkpoint_bytes;
    prometheus::Gauge* learning_lag;   // samples written (acknowledged) and not yet learned
    prometheus::Histogram* learning_delay;  // acknowledgement to learning, per sample
    prometheus::Gauge* pending;
    prometheus::Gauge* samples;
    // The first joined sample the store keeps (retention): samples - this is the log kept.
    prometheus::Gauge* retained_from;
    prometheus::Gauge* experts_unloaded;
    // Experts by ListExperts' status, indexed by v1::ExpertStatus (label: its name in
    // lower case, "active" for EXPERT_STATUS_ACTIVE); null for UNSPECIFIED.
    using ExpertStateCounts = std::array<int, v1::ExpertStatus_ARRAYSIZE>;
    std::array<prometheus::Gauge*, v1::ExpertStatus_ARRAYSIZE> experts_by_state{};
    prometheus::Gauge* estimated_regret;
    // Seconds of CPU per join to score the experts that count against the scoring budget.
    prometheus::Gauge* scoring_cost;
    // What the problem keeps in memory: the samples not yet in the store's log chunks (a
    // few chunks at most) and the estimator's state; neither grows with the samples.
    prometheus::Gauge* memory_sample_log;
    prometheus::Gauge* memory_estimator;
    prometheus::Gauge* memory_event_ids;
  };
  ProblemMetrics ForProblem(const std::string& problem);
  // 1 for a problem that failed to load (DecisionService::Open).
  prometheus::Gauge& ProblemFailed(const std::string& problem);

  struct ExpertMetrics {
    prometheus::Gauge* estimate;
    prometheus::Gauge* ucb;
    prometheus::Gauge* effective_sample_size;
    // Off-policy estimates from the samples its estimate counts (core/off_policy.h).
    prometheus::Gauge* off_policy_ips;
    prometheus::Gauge* off_policy_ips_lower;
    prometheus::Gauge* off_policy_snips;
    prometheus::Gauge* off_policy_clipped_ips;
    prometheus::Gauge* off_policy_ess;
    prometheus::Gauge* backfill_progress;
    prometheus::Counter* selected;
    prometheus::Gauge* failed;  // 1 while the expert is FAILED
    prometheus::Gauge* score_cost;  // seconds of CPU per row to score it (scoring_cost.h)
  };
  ExpertMetrics ForExpert(const std::string& problem, int expert);

  // Exports M_ij and sigma_ij for exactly the given pairs of a problem: series of pairs
  // not listed (retired experts) are removed.
  struct Pair {
    int i, j;
    double m, sigma;
  };
  void SetPairs(const std::string& problem, const std::vector<Pair>& pairs);

  // Removes every series of the problem (ForProblem, ForExpert, ProblemFailed, SetPairs):
  // it moved to another replica, which exports it from now on. REQUIRES: nothing uses the
  // pointers ForProblem and ForExpert gave for it any more.
  void RemoveProblem(const std::string& problem);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>& rpc_latency_;
  prometheus::Family<prometheus::Counter>& rpc_errors_;
  prometheus::Family<prometheus::Counter>& decisions_;
  prometheus::Family<prometheus::Counter>& rewards_;
  prometheus::Family<prometheus::Counter>& reward_sum_;
  prometheus::Family<prometheus::Counter>& expired_;
  prometheus::Family<prometheus::Counter>& divergence_boundaries_;
  prometheus::Family<prometheus::Counter>& checkpoints_;
  prometheus::Family<prometheus::Counter>& checkpoint_bytes_;
  prometheus::Family<prometheus::Counter>& undelivered_;
  prometheus::Family<prometheus::Gauge>& problem_failed_;
  prometheus::Family<prometheus::Gauge>& batch_lag_;
  prometheus::Family<prometheus::Gauge>& divergence_refresh_progress_;
  prometheus::Family<prometheus::Gauge>& learning_lag_;
  prometheus::Family<prometheus::Gauge>& problem_memory_;
  prometheus::Family<prometheus::Histogram>& learning_delay_;
  prometheus::Family<prometheus::Gauge>& pending_;
  prometheus::Family<prometheus::Gauge>& samples_;
  prometheus::Family<prometheus::Gauge>& retained_from_;
  prometheus::Family<prometheus::Gauge>& experts_unloaded_;
  prometheus::Family<prometheus::Gauge>& experts_;
  prometheus::Family<prometheus::Gauge>& regret_;
  prometheus::Family<prometheus::Gauge>& scoring_cost_;
  prometheus::Family<prometheus::Gauge>& expert_estimate_;
  prometheus::Family<prometheus::Gauge>& expert_ucb_;
  prometheus::Family<prometheus::Gauge>& expert_ess_;
  prometheus::Family<prometheus::Gauge>& expert_off_policy_;
  prometheus::Family<prometheus::Gauge>& expert_off_policy_ess_;
  prometheus::Family<prometheus::Gauge>& expert_backfill_;
  prometheus::Family<prometheus::Gauge>& expert_failed_;
  prometheus::Family<prometheus::Gauge>& expert_score_cost_;
  prometheus::Family<prometheus::Counter>& expert_selected_;
  prometheus::Family<prometheus::Gauge>& divergence_m_;
  prometheus::Family<prometheus::Gauge>& divergence_sigma_;
  prometheus::Histogram* storage_write_latency_;
  prometheus::Gauge* storage_size_;
  prometheus::Family<prometheus::Gauge>* store_memory_;
  prometheus::Family<prometheus::Gauge>* allocator_bytes_;
  prometheus::Family<prometheus::Gauge>* store_family_size_;
  prometheus::Family<prometheus::Gauge>* store_live_sst_bytes_;
  prometheus::Family<prometheus::Gauge>* store_sst_files_;
  prometheus::Counter* audit_write_errors_;
  prometheus::Gauge* store_healthy_;
  prometheus::Counter* store_write_errors_;

  absl::Mutex mu_;
  std::map<std::string, prometheus::Histogram*> rpc_latency_by_method_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, prometheus::Counter*> rpc_errors_by_key_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string,
           std::map<std::pair<int, int>, std::pair<prometheus::Gauge*, prometheus::Gauge*>>>
      pairs_ ABSL_GUARDED_BY(mu_);
  // Each problem's series, and how to remove each (RemoveProblem).
  std::map<std::string, std::map<const void*, std::function<void()>>> problem_series_
      ABSL_GUARDED_BY(mu_);
  // family.Add(labels, args...), noted as one of `problem`'s series (RemoveProblem).
  template <typename T, typename... Args>
  T* AddFor(const std::string& problem, prometheus::Family<T>& family,
            const std::map<std::string, std::string>& labels, Args&&... args) {
    T& metric = family.Add(labels, std::forward<Args>(args)...);
    absl::MutexLock lock(&mu_);
    problem_series_[problem][&metric] = [&family, &metric] { family.Remove(&metric); };
    return &metric;
  }
};

}  // namespace decision::server

#endif  // DECISION_SERVER_METRICS_H_
