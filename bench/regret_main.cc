// regret: replays a labelled data set as a contextual-bandit problem through batched D-UCB
// (or a baseline) with experts trained from the log, and reports the progressive loss.
//
//   build/bench/regret --data=bench/data/letter.csv --order=bench/data/orders/letter.s1.perm.txt
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "bench/dataset.h"
#include "bench/simulation.h"

ABSL_FLAG(std::string, data, "bench/data/letter.csv", "labelled CSV data set");
ABSL_FLAG(std::string, order, "bench/data/orders/letter.s1.perm.txt",
          "row order (one 0-based row index per line)");
ABSL_FLAG(std::string, policy, "d-ucb", "d-ucb, ucb1, epsilon-greedy, exp4 or uniform");
ABSL_FLAG(std::string, estimator, "median_of_means", "median_of_means or clipped");
ABSL_FLAG(int64_t, rounds, 0, "stop after this many rounds (0: the whole order)");
ABSL_FLAG(uint64_t, seed, 1, "random seed");
ABSL_FLAG(int, train_threads, 2,
          "experts of a batch trained at once, one thread each (the result is the same at any "
          "value)");
ABSL_FLAG(std::string, curve_csv, "", "write the progressive-loss curve to this CSV file");
ABSL_FLAG(std::string, grouping, "round_robin",
          "median-of-means grouping: contiguous (the paper) or round_robin");
ABSL_FLAG(double, c2, decision::EstimatorConstants{}.c2,
          "median-of-means group constant c2 (l = c2 * 2 log t)");
ABSL_FLAG(double, c3, decision::EstimatorConstants{}.c3,
          "median-of-means width constant c3 (the paper's: 2)");
ABSL_FLAG(double, big_c, decision::EstimatorConstants{}.C, "clipped-estimator constant C");
ABSL_FLAG(double, smoothing, 0.05, "expert smoothing eta");
ABSL_FLAG(double, batch_multiplier, 7.0, "batch length = multiplier * sqrt(t)");
ABSL_FLAG(int, tree_experts, 3, "tree experts trained per batch");
ABSL_FLAG(int, linear_experts, 1, "gblinear experts trained per batch");
ABSL_FLAG(std::string, objective, "likelihood",
          "what trained experts are fitted to: likelihood (of every logged reward) or "
          "importance_weighted (the paper: the rewarded arms as labels, weight r / p)");
ABSL_FLAG(bool, bootstrap, false,
          "train each new expert on a bootstrap of the log (the paper) instead of all of it");
ABSL_FLAG(double, eligible_share, 0.0,
          "per-round eligibility: this share of the arms is eligible each round, the label "
          "always among them (0: every arm)");
ABSL_FLAG(int, pool_experts, 0,
          "a fixed pool of this many experts trained on a held-back prefix (0: experts "
          "trained from the log, the paper's batched algorithm)");
ABSL_FLAG(int, pool_good, 2, "with a pool: how many of its experts are good (the rest weak)");
ABSL_FLAG(int64_t, pool_prefix, 2000,
          "with a pool: rows of the order held back to train it (never played)");
ABSL_FLAG(int64_t, late_expert_round, 0,
          "with a pool: add a stronger expert at this round (0: never)");
ABSL_FLAG(std::string, save_pool, "",
          "with a pool: write its models to this directory (pool-NNN.ubj, NNN the expert id)");
ABSL_FLAG(bool, show_estimates, false, "print every expert's final estimate (D-UCB)");
ABSL_FLAG(int64_t, report_every, 1000, "print the progressive loss every N rounds (0: never)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Replays a labelled data set through batched D-UCB (or a baseline) and reports the "
      "progressive loss.");
  absl::ParseCommandLine(argc, argv);
  using namespace decision;
  auto data = bench::LoadCsv(absl::GetFlag(FLAGS_data));
  if (!data.ok()) {
    std::fprintf(stderr, "regret: %s\n", data.status().ToString().c_str());
    return 2;
  }
  auto order = bench::LoadOrder(absl::GetFlag(FLAGS_order), data->size());
  if (!order.ok()) {
    std::fprintf(stderr, "regret: %s\n", order.status().ToString().c_str());
    return 2;
  }
  bench::SimulationOptions options;
  options.policy = absl::GetFlag(FLAGS_policy);
  const std::string estimator = absl::GetFlag(FLAGS_estimator);
  if (estimator == "clipped") {
    options.estimator.kind = EstimatorKind::kClipped;
  } else if (estimator != "median_of_means") {
    std::fprintf(stderr, "regret: --estimator must be median_of_means or clipped\n");
    return 2;
  }
  const std::string grouping = absl::GetFlag(FLAGS_grouping);
  if (grouping == "round_robin") {
    options.estimator.grouping = MedianOfMeansGrouping::kRoundRobin;
  } else if (grouping == "contiguous") {
    options.estimator.grouping = MedianOfMeansGrouping::kContiguous;
  } else {
    std::fprintf(stderr, "regret: --grouping must be contiguous or round_robin\n");
    return 2;
  }
  options.estimator.constants.c2 = absl::GetFlag(FLAGS_c2);
  options.estimator.constants.c3 = absl::GetFlag(FLAGS_c3);
  options.estimator.constants.C = absl::GetFlag(FLAGS_big_c);
  options.smoothing = absl::GetFlag(FLAGS_smoothing);
  options.batch.batch_multiplier = absl::GetFlag(FLAGS_batch_multiplier);
  options.bootstrap = absl::GetFlag(FLAGS_bootstrap);
  const std::string objective = absl::GetFlag(FLAGS_objective);
  if (objective == "importance_weighted") {
    options.objective = TrainingObjective::kImportanceWeighted;
  } else if (objective != "likelihood") {
    std::fprintf(stderr, "regret: --objective must be likelihood or importance_weighted\n");
    return 2;
  }
  options.tree_experts_per_batch = absl::GetFlag(FLAGS_tree_experts);
  options.linear_experts_per_batch = absl::GetFlag(FLAGS_linear_experts);
  if (options.tree_experts_per_batch < 0 || options.linear_experts_per_batch < 0 ||
      options.tree_experts_per_batch + options.linear_experts_per_batch < 1) {
    std::fprintf(stderr, "regret: --tree_experts and --linear_experts must be >= 0, with at "
                         "least one expert per batch\n");
    return 2;
  }
  options.max_rounds = absl::GetFlag(FLAGS_rounds);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.train_threads = absl::GetFlag(FLAGS_train_threads);
  options.eligible_share = absl::GetFlag(FLAGS_eligible_share);
  options.pool_experts = absl::GetFlag(FLAGS_pool_experts);
  options.pool_good = absl::GetFlag(FLAGS_pool_good);
  options.pool_prefix = absl::GetFlag(FLAGS_pool_prefix);
  options.late_expert_round = absl::GetFlag(FLAGS_late_expert_round);
  options.save_pool = absl::GetFlag(FLAGS_save_pool);
  const int64_t every = absl::GetFlag(FLAGS_report_every);
  std::printf("data %s: %zu rows, %d features, K = %d; policy %s, estimator %s\n",
              absl::GetFlag(FLAGS_data).c_str(), data->size(), data->num_features,
              data->num_classes, options.policy.c_str(), estimator.c_str());
  auto result = bench::Simulate(*data, *order, options, [&](int64_t t, double loss) {
    if (every > 0 && t % every == 0) {
      std::printf("round %6lld  progressive loss %.4f\n", static_cast<long long>(t), loss);
      std::fflush(stdout);
    }
  });
  if (!result.ok()) {
    std::fprintf(stderr, "regret: %s\n", result.status().ToString().c_str());
    return 1;
  }
  const std::string csv = absl::GetFlag(FLAGS_curve_csv);
  if (!csv.empty()) {
    std::ofstream out(csv);
    out << "round,progressive_loss\n";
    for (size_t t = 0; t < result->progressive_loss.size(); ++t) {
      out << t + 1 << "," << result->progressive_loss[t] << "\n";
    }
  }
  std::printf("final progressive loss %.4f after %zu rounds; %d experts; %.1f s "
              "(training %.1f s, divergences %.1f s)\n",
              result->progressive_loss.back(), result->progressive_loss.size(),
              result->num_experts, result->seconds, result->seconds_training,
              result->seconds_divergences);
  std::printf("best available expert: %.4f (its most likely arm: %.4f)\n",
              result->best_available_loss, result->best_available_argmax_loss);
  if (options.pool_experts > 0) {
    // The best expert of the pool (not the late one) over the rows played, and the regret
    // against it: rounds * its mean - the reward collected.
    const size_t pool_size = std::min<size_t>(result->true_means.size(),
                                              static_cast<size_t>(options.pool_experts) + 1);
    double best = 0.0;
    for (size_t e = 0; e < pool_size; ++e) best = std::max(best, result->true_means[e]);
    const double rounds = static_cast<double>(result->progressive_loss.size());
    std::printf("pool: best_true_mean %.4f regret %.1f\n", best,
                rounds * best - rounds * (1.0 - result->progressive_loss.back()));
  }
  if (options.late_expert_round > 0) {
    // One line for scripts: rounds until followed in 90% of a 100-decision window (-1:
    // never), regret after the late expert's round against it, and its true mean there.
    std::printf("late expert: rounds_to_90 %lld regret_after %.1f true_mean %.4f\n",
                static_cast<long long>(result->late_expert_rounds_to_90),
                result->late_expert_regret, result->late_expert_true_mean);
  }
  if (result->experts_rejected > 0) {
    std::printf("%d trained experts diverged and were skipped\n", result->experts_rejected);
  }
  if (absl::GetFlag(FLAGS_show_estimates)) {
    std::printf("expert  mean     width    ucb      selected  true_mean\n");
    for (size_t e = 0; e < result->estimates.size(); ++e) {
      const auto& est = result->estimates[e];
      std::printf("%6zu  %.4f  %.4f  %.4f  %8lld  %.4f\n", e, est.mean, est.width,
                  est.mean + est.width, static_cast<long long>(result->times_selected[e]),
                  result->true_means[e]);
    }
  }
  return 0;
}
