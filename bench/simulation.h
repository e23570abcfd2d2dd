// An in-process simulation of the service's learning loop on a labelled data set:
// batched D-UCB (Algorithm 2 of the paper) with experts trained from the log by
// importance-weighted XGBoost classification, or a baseline policy over the same kind of
// expert pool. Used by the regret benchmark and, until the server exists, as the main job.
//
// Simulation shortcut (documented, not used by the service): every expert's distributions
// are computed once for all rows of the data set when the expert is added, so that a round
// costs O(N) look-ups; an expert's prediction for a row does not depend on when it is asked.
#ifndef DECISION_BENCH_SIMULATION_H_
#define DECISION_BENCH_SIMULATION_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/dataset.h"
#include "core/divergence.h"
#include "core/estimator.h"
#include "core/expert.h"
#include "core/policy.h"
#include "core/xgboost_trainer.h"

namespace decision::bench {

struct SimulationOptions {
  // "d-ucb", "ucb1", "epsilon-greedy", "exp4" or "uniform".
  std::string policy = "d-ucb";
  EstimatorOptions estimator;
  BatchOptions batch;
  DivergenceOptions divergence{512, 16};
  // A full divergence refresh (all pairs, current reservoir) happens when the number of
  // rounds has grown by this factor since the last one; other batch starts compute only the
  // new experts' rows.
  double full_refresh_growth = 2.0;
  int tree_experts_per_batch = 3;
  int linear_experts_per_batch = 1;
  // Each new expert trains on a bootstrap of the log (the paper's recipe) instead of the
  // whole log (the service's default, AutoTrainConfig.training_sample).
  bool bootstrap = false;
  // What each trained expert is fitted to (core/xgboost_trainer.h); the paper's is
  // kImportanceWeighted.
  TrainingObjective objective = TrainingObjective::kLikelihood;
  double smoothing = kDefaultSmoothing;
  double epsilon = 0.05;  // epsilon-greedy
  int64_t max_rounds = 0;  // 0: every row of the order
  // Experts of a batch trained at once, one XGBoost thread each (a fixed pool and the late
  // expert train on one thread). A run is the same at any value.
  int train_threads = 2;
  uint64_t seed = 1;
  // Per-round eligibility (0: off): each round, round(share * K) arms are eligible, the
  // label always among them, the others drawn at random from a generator of their own
  // (seeded by `seed`), so every policy sees the same sets. Every expert's distribution is
  // restricted to them as the service restricts it (RestrictToEligible).
  double eligible_share = 0.0;
  // A fixed pool of experts instead of experts trained from the log (0: off), for the
  // question "does sharing information between experts pay": D-UCB's regret should grow
  // with the divergences, not with the number of experts. The first `pool_prefix` rows of
  // the order are held back (never played): they train the pool with full information
  // (every row's label), and give the divergence reservoir its contexts. `pool_good`
  // experts are good (trees of depth 4, 15 rounds, on a random half of it); the others are
  // weak (depth 1 to 3, 2 to 6 rounds, on a random 2-10% of it), in a random order. The
  // uniform expert stays expert 0. There is no warm-up and no training during the run.
  int pool_experts = 0;
  int pool_good = 2;
  int64_t pool_prefix = 2000;
  // With a pool: a stronger expert (depth 8, 60 rounds, on the whole prefix) is added at
  // this round of the run (0: never), as a team registers a new model.
  int64_t late_expert_round = 0;
  // With a pool: each pool expert's model (UBJSON) is also written to
  // save_pool/pool-NNN.ubj, NNN its expert id (1..pool_experts, trained ones only), to
  // register the same pool in decisiond (bench/sharing_service.sh).
  std::string save_pool;
};

struct SimulationResult {
  std::vector<double> progressive_loss;  // 1 - mean reward after each round
  int num_experts = 0;
  int experts_rejected = 0;  // trained models that diverged and were skipped
  double seconds = 0.0;
  double seconds_training = 0.0;
  double seconds_divergences = 0.0;
  // D-UCB only: final estimate and times selected per expert.
  std::vector<ExpertEstimate> estimates;
  std::vector<int64_t> times_selected;
  // Every expert's true mean reward over the rows played (full information; with a pool,
  // the held-back prefix it was trained on is not among them).
  std::vector<double> true_means;
  // With late_expert_round: the rounds after it until, over a window of the last 100
  // decisions, 90% followed the late expert (-1: never; policies that mix experts, such as
  // EXP4, follow none); and the regret after it against the late expert, sum over the
  // rounds from late_expert_round on of (its probability of the label) - reward.
  int64_t late_expert_rounds_to_90 = -1;
  double late_expert_regret = 0.0;
  double late_expert_true_mean = 0.0;  // over the rows played from its round on
  // What the experts allow: the progressive loss of a policy that knows, at each round, which
  // of the experts registered so far has the highest mean reward over the rounds after its
  // registration, and follows it (the comparator of D-UCB's regret). `best_available_loss`
  // samples its arm from that expert's distribution, as a stochastic expert does (the
  // expected loss); `best_available_argmax_loss` plays the most likely arm of the expert
  // with the best accuracy so defined. A policy far above the first chooses badly among its
  // experts; one close to it is bounded by them.
  double best_available_loss = 0.0;
  double best_available_argmax_loss = 0.0;
};

// Called after each round with (round, progressive loss so far).
using ProgressFn = std::function<void(int64_t, double)>;

absl::StatusOr<SimulationResult> Simulate(const Dataset& data, const std::vector<int>& order,
                                          const SimulationOptions& options,
                                          const ProgressFn& progress = nullptr);

}  // namespace decision::bench

#endif  // DECISION_BENCH_SIMULATION_H_
