#include "server/metrics.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"

namespace decision::server {
namespace {

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  // 10 us .. ~10 s, a factor of 2 apart.
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1e-5; v < 10.0; v *= 2.0) b.push_back(v);
  return b;
}

}  // namespace

// Long (90 lines) by design: one initializer per metric family, a table that splitting would
// only scatter.
Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      rpc_latency_(prometheus::BuildHistogram()
                       .Name("decision_rpc_latency_seconds")
                       .Help("Server-side latency of each RPC")
                       .Register(*registry_)),
      rpc_errors_(prometheus::BuildCounter()
                      .Name("decision_rpc_errors_total")
                      .Help("RPCs that returned a non-OK status, by method and code")
                      .Register(*registry_)),
      decisions_(prometheus::BuildCounter()
                     .Name("decision_decisions_total")
                     .Help("Decisions made (Choose calls that chose an arm)")
                     .Register(*registry_)),
      rewards_(prometheus::BuildCounter()
                   .Name("decision_rewards_total")
                   .Help("Rewards received, by outcome: learned, late (after the wait time, "
                         "not learned), duplicate (not counted again)")
                   .Register(*registry_)),
      reward_sum_(prometheus::BuildCounter()
                      .Name("decision_reward_sum_total")
                      .Help("Sum of the learned reward values")
                      .Register(*registry_)),
      expired_(prometheus::BuildCounter()
                   .Name("decision_expired_total")
                   .Help("Decisions whose reward never came within the wait time, by "
                         "handling: default (learned with the default reward), dropped, or "
                         "never_activated (chosen deferred, never activated: dropped), or "
                         "unlearned_slot (a slate slot the problem does not learn: dropped)")
                   .Register(*registry_)),
      divergence_boundaries_(
          prometheus::BuildCounter()
              .Name("decision_divergence_boundaries_total")
              .Help("Batch boundaries passed, by what happened to the divergences of the "
                    "experts already estimated: reestimated over the reservoir, or kept "
                    "(less than divergence_refresh_turnover of the reservoir had changed)")
              .Register(*registry_)),
      checkpoints_(prometheus::BuildCounter()
                       .Name("decision_checkpoints_total")
                       .Help("Checkpoints written (the divergences, the reservoir and, when "
                             "more than learning changed it, the estimators' state)")
                       .Register(*registry_)),
      checkpoint_bytes_(prometheus::BuildCounter()
                            .Name("decision_checkpoint_bytes_total")
                            .Help("Bytes of the checkpoints written, with the estimators' "
                                  "state when it went along")
                            .Register(*registry_)),
      undelivered_(prometheus::BuildCounter()
                       .Name("decision_undelivered_total")
                       .Help("Decisions whose Choose was cancelled or passed its deadline "
                             "before the answer was sent: dropped, never learned")
                       .Register(*registry_)),
      problem_failed_(prometheus::BuildGauge()
                          .Name("decision_problem_failed")
                          .Help("1 if the problem failed to load at start-up and serves no call")
                          .Register(*registry_)),
      batch_lag_(prometheus::BuildGauge()
                     .Name("decision_batch_lag_rounds")
                     .Help("Joined samples since the oldest batch boundary whose divergence "
                           "refresh or training job is not done: 0 when the schedule is kept")
                     .Register(*registry_)),
      divergence_refresh_progress_(
          prometheus::BuildGauge()
              .Name("decision_divergence_refresh_progress")
              .Help("The share of the divergence refresh in progress computed so far, 0 when "
                    "none is: the expert-pool round computes a refresh a slice at a time "
                    "and visits the other problems between slices")
              .Register(*registry_)),
      learning_lag_(prometheus::BuildGauge()
                        .Name("decision_learning_lag_samples")
                        .Help("Joined samples acknowledged (durable) and not yet learned: "
                              "scored by every expert and taught to D-UCB")
                        .Register(*registry_)),
      problem_memory_(prometheus::BuildGauge()
                          .Name("decision_problem_memory_bytes")
                          .Help("Bytes a problem keeps in memory, by part: sample_log, "
                                "the samples kept in memory (the log chunk being filled, "
                                "complete chunks not yet written, the tails of backfilling "
                                "experts: at most a few chunks), estimator, the "
                                "estimator's state (neither grows with the samples), and "
                                "event_ids, Choose's filter of the event ids decided (it "
                                "grows with the ids the retention keeps)")
                          .Register(*registry_)),
      learning_delay_(prometheus::BuildHistogram()
                          .Name("decision_learning_delay_seconds")
                          .Help("Time from a joined sample's write (its acknowledgement) to "
                                "its learning")
                          .Register(*registry_)),
      pending_(prometheus::BuildGauge()
                   .Name("decision_pending")
                   .Help("Decisions waiting for their reward")
                   .Register(*registry_)),
      samples_(prometheus::BuildGauge()
                   .Name("decision_samples")
                   .Help("Joined samples in the log")
                   .Register(*registry_)),
      retained_from_(prometheus::BuildGauge()
                         .Name("decision_retained_from_samples")
                         .Help("The first joined sample the store keeps (retention deleted the "
                               "ones before it; 0 without retention)")
                         .Register(*registry_)),
      experts_unloaded_(prometheus::BuildGauge()
                            .Name("decision_experts_unloaded")
                            .Help("Retired experts whose model is no longer in memory: no "
                                  "kept sample is one they chose (retention cut them all, "
                                  "or they never chose one)")
                            .Register(*registry_)),
      experts_(prometheus::BuildGauge()
                   .Name("decision_experts")
                   .Help("Experts by status (ListExperts'): active, shadow, backfilling, "
                         "retired, failed. The models in memory are all of them but the "
                         "failed ones and decision_experts_unloaded")
                   .Register(*registry_)),
      regret_(prometheus::BuildGauge()
                  .Name("decision_estimated_regret")
                  .Help("Estimated cumulative regret against the best expert in hindsight: "
                        "t * max_k estimate_k - sum_j n_j estimate_j")
                  .Register(*registry_)),
      scoring_cost_(prometheus::BuildGauge()
                        .Name("decision_scoring_cost_seconds")
                        .Help("Seconds of CPU per joined sample to score the problem's experts: "
                              "the sum of decision_expert_score_cost_seconds over the ACTIVE "
                              "and BACKFILLING experts, what its scoring budget bounds")
                        .Register(*registry_)),
      expert_estimate_(prometheus::BuildGauge()
                           .Name("decision_expert_estimate")
                           .Help("Estimated mean reward of an expert")
                           .Register(*registry_)),
      expert_ucb_(prometheus::BuildGauge()
                      .Name("decision_expert_ucb")
                      .Help("Upper confidence bound of an expert (estimate + width)")
                      .Register(*registry_)),
      expert_ess_(prometheus::BuildGauge()
                      .Name("decision_expert_effective_sample_size")
                      .Help("Importance-weighted sample count behind an expert's estimate")
                      .Register(*registry_)),
      expert_off_policy_(prometheus::BuildGauge()
                             .Name("decision_expert_off_policy_value")
                             .Help("An expert's value estimated off-policy from the samples "
                                   "its estimate counts (GetEstimates' off_policy): "
                                   "estimator=ips, ips_lower (95% lower bound), snips, "
                                   "clipped_ips (weights clipped at 100)")
                             .Register(*registry_)),
      expert_off_policy_ess_(prometheus::BuildGauge()
                                 .Name("decision_expert_off_policy_effective_sample_size")
                                 .Help("(sum w)^2 / sum w^2 of an expert's importance weights "
                                       "over the logged samples: how many on-policy samples "
                                       "its off-policy estimates are worth")
                                 .Register(*registry_)),
      expert_backfill_(prometheus::BuildGauge()
                           .Name("decision_expert_backfill_progress")
                           .Help("Share of the stored log backfilled for an expert (1 = done)")
                           .Register(*registry_)),
      expert_failed_(prometheus::BuildGauge()
                         .Name("decision_expert_failed")
                         .Help("1 if the expert is FAILED: quarantined after it could not "
                               "score a context, or its stored model no longer loads")
                         .Register(*registry_)),
      expert_score_cost_(prometheus::BuildGauge()
                             .Name("decision_expert_score_cost_seconds")
                             .Help("Seconds of CPU per row to score an expert in a batch, "
                                   "measured at its registration (0 for a uniform expert)")
                             .Register(*registry_)),
      expert_selected_(prometheus::BuildCounter()
                           .Name("decision_expert_selected_total")
                           .Help("Decisions that followed an expert")
                           .Register(*registry_)),
      divergence_m_(prometheus::BuildGauge()
                        .Name("decision_divergence_mij")
                        .Help("M_ij = 1 + log(1 + D_f1(pi_i || pi_j)) between active experts")
                        .Register(*registry_)),
      divergence_sigma_(prometheus::BuildGauge()
                            .Name("decision_divergence_sigmaij")
                            .Help("sigma_ij = sqrt(1 + D_f2(pi_i || pi_j)) between active experts")
                            .Register(*registry_)) {
  storage_write_latency_ = &prometheus::BuildHistogram()
                                .Name("decision_storage_write_latency_seconds")
                                .Help("Latency of durable writes to RocksDB")
                                .Register(*registry_)
                                .Add({}, LatencyBuckets());
  storage_size_ = &prometheus::BuildGauge()
                       .Name("decision_storage_size_bytes")
                       .Help("Approximate size of the RocksDB store")
                       .Register(*registry_)
                       .Add({});
  allocator_bytes_ =
      &prometheus::BuildGauge()
           .Name("decision_allocator_bytes")
           .Help("The allocator's heap, every 5 s (jemalloc's stats, or glibc's mallinfo2 "
                 "in a build without jemalloc): in_use, the bytes of live allocations, the "
                 "store's memtables and block cache included; free, what it holds besides "
                 "(jemalloc: resident and not allocated; glibc: its free chunks, pages of "
                 "them given back by the periodic trim still counted); mapped, what it has "
                 "mapped (glibc: the allocations of their own mapping, at least "
                 "--malloc_mmap_threshold_kb). RSS well above in_use without a rising "
                 "in_use is memory the allocator holds, not a leak")
           .Register(*registry_);
  store_memory_ = &prometheus::BuildGauge()
                       .Name("decision_store_memory_bytes")
                       .Help("RocksDB's memory by part: memtables, table_readers (index and "
                             "filter blocks outside the block cache), block_cache")
                       .Register(*registry_);
  store_family_size_ = &prometheus::BuildGauge()
                            .Name("decision_store_family_bytes")
                            .Help("Approximate size of each of the store's column families "
                                  "(SST files and memtables): events, samples, logchunks, ...")
                            .Register(*registry_);
  store_live_sst_bytes_ = &prometheus::BuildGauge()
                               .Name("decision_store_live_sst_bytes")
                               .Help("Size of each column family's live SST files (the "
                                     "current version's; files compaction replaced are not)")
                               .Register(*registry_);
  store_sst_files_ = &prometheus::BuildGauge()
                          .Name("decision_store_sst_files")
                          .Help("Live SST files of each column family (RocksDB keeps each "
                                "open: one file descriptor each)")
                          .Register(*registry_);
  audit_write_errors_ = &prometheus::BuildCounter()
                             .Name("decision_audit_write_errors_total")
                             .Help("Audit records of administrative calls that could not be written")
                             .Register(*registry_)
                             .Add({});
  store_healthy_ = &prometheus::BuildGauge()
                        .Name("decision_store_healthy")
                        .Help("1 while the store can write; 0 while it refuses writes (a full "
                              "or failing disk): decisions and rewards are refused meanwhile")
                        .Register(*registry_)
                        .Add({});
  store_healthy_->Set(1.0);
  store_write_errors_ = &prometheus::BuildCounter()
                             .Name("decision_store_write_errors_total")
                             .Help("Writes that RocksDB refused")
                             .Register(*registry_)
                             .Add({});
}

prometheus::Histogram& Metrics::RpcLatency(const std::string& method) {
  absl::MutexLock lock(&mu_);
  prometheus::Histogram*& h = rpc_latency_by_method_[method];
  if (h == nullptr) h = &rpc_latency_.Add({{"method", method}}, LatencyBuckets());
  return *h;
}

prometheus::Counter& Metrics::RpcErrors(const std::string& method, const std::string& code) {
  absl::MutexLock lock(&mu_);
  prometheus::Counter*& c = rpc_errors_by_key_[{method, code}];
  if (c == nullptr) c = &rpc_errors_.Add({{"method", method}, {"code", code}});
  return *c;
}

Metrics::ProblemMetrics Metrics::ForProblem(const std::string& problem) {
  const std::map<std::string, std::string> labels = {{"problem", problem}};
  auto with = [&](const char* k, const char* v) {
    auto l = labels;
    l[k] = v;
    return l;
  };
  ProblemMetrics m;
  m.decisions = AddFor(problem, decisions_, labels);
  m.rewards_learned = AddFor(problem, rewards_, with("outcome", "learned"));
  m.rewards_late = AddFor(problem, rewards_, with("outcome", "late"));
  m.rewards_duplicate = AddFor(problem, rewards_, with("outcome", "duplicate"));
  m.reward_sum = AddFor(problem, reward_sum_, labels);
  m.expired_default = AddFor(problem, expired_, with("handling", "default"));
  m.expired_dropped = AddFor(problem, expired_, with("handling", "dropped"));
  m.expired_never_activated = AddFor(problem, expired_, with("handling", "never_activated"));
  m.expired_unlearned_slot = AddFor(problem, expired_, with("handling", "unlearned_slot"));
  m.undelivered = AddFor(problem, undelivered_, labels);
  m.batch_lag = AddFor(problem, batch_lag_, labels);
  m.divergences_reestimated =
      AddFor(problem, divergence_boundaries_, with("divergences", "reestimated"));
  m.divergences_kept = AddFor(problem, divergence_boundaries_, with("divergences", "kept"));
  m.divergence_refresh_progress = AddFor(problem, divergence_refresh_progress_, labels);
  m.checkpoints = AddFor(problem, checkpoints_, labels);
  m.checkpoint_bytes = AddFor(problem, checkpoint_bytes_, labels);
  m.learning_lag = AddFor(problem, learning_lag_, labels);
  m.learning_delay = AddFor(
      problem, learning_delay_, labels,
      prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                              0.1, 0.2, 0.5, 1, 2, 5, 10});
  // 0: the problem loaded (ProblemFailed sets 1 otherwise).
  AddFor(problem, problem_failed_, labels);
  m.pending = AddFor(problem, pending_, labels);
  m.samples = AddFor(problem, samples_, labels);
  m.retained_from = AddFor(problem, retained_from_, labels);
  m.experts_unloaded = AddFor(problem, experts_unloaded_, labels);
  for (int s = 0; s < v1::ExpertStatus_ARRAYSIZE; ++s) {
    if (s == v1::EXPERT_STATUS_UNSPECIFIED || !v1::ExpertStatus_IsValid(s)) continue;
    const std::string state = absl::AsciiStrToLower(absl::StripPrefix(
        v1::ExpertStatus_Name(static_cast<v1::ExpertStatus>(s)), "EXPERT_STATUS_"));
    m.experts_by_state[s] = AddFor(problem, experts_, with("state", state.c_str()));
  }
  m.estimated_regret = AddFor(problem, regret_, labels);
  m.scoring_cost = AddFor(problem, scoring_cost_, labels);
  m.memory_sample_log = AddFor(problem, problem_memory_, with("part", "sample_log"));
  m.memory_estimator = AddFor(problem, problem_memory_, with("part", "estimator"));
  m.memory_event_ids = AddFor(problem, problem_memory_, with("part", "event_ids"));
  return m;
}

prometheus::Gauge& Metrics::ProblemFailed(const std::string& problem) {
  return *AddFor(problem, problem_failed_, {{"problem", problem}});
}

Metrics::ExpertMetrics Metrics::ForExpert(const std::string& problem, int expert) {
  const std::map<std::string, std::string> labels = {{"problem", problem},
                                                     {"expert", std::to_string(expert)}};
  ExpertMetrics m;
  m.estimate = AddFor(problem, expert_estimate_, labels);
  m.ucb = AddFor(problem, expert_ucb_, labels);
  m.effective_sample_size = AddFor(problem, expert_ess_, labels);
  const auto with = [&](const char* estimator) {
    std::map<std::string, std::string> l = labels;
    l["estimator"] = estimator;
    return AddFor(problem, expert_off_policy_, l);
  };
  m.off_policy_ips = with("ips");
  m.off_policy_ips_lower = with("ips_lower");
  m.off_policy_snips = with("snips");
  m.off_policy_clipped_ips = with("clipped_ips");
  m.off_policy_ess = AddFor(problem, expert_off_policy_ess_, labels);
  m.backfill_progress = AddFor(problem, expert_backfill_, labels);
  m.selected = AddFor(problem, expert_selected_, labels);
  m.failed = AddFor(problem, expert_failed_, labels);
  m.score_cost = AddFor(problem, expert_score_cost_, labels);
  return m;
}

void Metrics::SetPairs(const std::string& problem, const std::vector<Pair>& pairs) {
  absl::MutexLock lock(&mu_);
  auto& current = pairs_[problem];
  std::map<std::pair<int, int>, std::pair<prometheus::Gauge*, prometheus::Gauge*>> next;
  for (const Pair& p : pairs) {
    const std::pair<int, int> key(p.i, p.j);
    auto it = current.find(key);
    std::pair<prometheus::Gauge*, prometheus::Gauge*> gauges;
    if (it != current.end()) {
      gauges = it->second;
      current.erase(it);
    } else {
      const std::map<std::string, std::string> labels = {{"problem", problem},
                                                         {"expert_i", std::to_string(p.i)},
                                                         {"expert_j", std::to_string(p.j)}};
      gauges = {&divergence_m_.Add(labels), &divergence_sigma_.Add(labels)};
    }
    gauges.first->Set(p.m);
    gauges.second->Set(p.sigma);
    next[key] = gauges;
  }
  for (auto& [key, gauges] : current) {
    divergence_m_.Remove(gauges.first);
    divergence_sigma_.Remove(gauges.second);
  }
  current = std::move(next);
}

void Metrics::RemoveProblem(const std::string& problem) {
  absl::MutexLock lock(&mu_);
  if (auto it = problem_series_.find(problem); it != problem_series_.end()) {
    for (auto& [metric, remove] : it->second) remove();
    problem_series_.erase(it);
  }
  if (auto it = pairs_.find(problem); it != pairs_.end()) {
    for (auto& [key, gauges] : it->second) {
      divergence_m_.Remove(gauges.first);
      divergence_sigma_.Remove(gauges.second);
    }
    pairs_.erase(it);
  }
}

}  // namespace decision::server
