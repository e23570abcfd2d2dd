// estimator_scale: the estimators alone (core/, no log, no service) over up to 10^8 joined
// samples, to show that their memory and their cost per sample do not grow with t.
//
//   build/bench/estimator_scale --samples=100000000 --experts=32 --estimator=median_of_means
//
// Samples are drawn from a pool of 4096 synthetic rows (N smoothed propensities over K arms,
// the chooser's arm drawn from its distribution, reward 1 with probability 0.3), so drawing
// costs little next to the update. At 10^6, 10^7 and 10^8 samples (and at --samples) it
// prints: the process's resident memory, the estimator's own state (EstimatorStats), the
// mean time per Add over the last 10^6 samples, and the mean time of ArgmaxUcb. One
// divergence refresh happens at every power of 10, as the server's would, and its time is
// printed too.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/process_stats.h"
#include "core/divergence.h"
#include "core/estimator.h"
#include "core/sample_log.h"

ABSL_FLAG(int64_t, samples, 100'000'000, "joined samples");
ABSL_FLAG(int, experts, 32, "experts N");
ABSL_FLAG(int, arms, 26, "arms K");
ABSL_FLAG(std::string, estimator, "median_of_means", "median_of_means or clipped");
ABSL_FLAG(uint64_t, seed, 1, "seed");

namespace {

using decision::bench::Clock;
using decision::bench::ResidentBytes;
using decision::bench::Seconds;

struct Row {
  int chooser;
  double reward;
  std::vector<double> propensities;
};

std::vector<Row> MakePool(int n, int k, std::mt19937_64& gen) {
  std::vector<Row> pool(4096);
  std::exponential_distribution<double> base_dist(1.0);
  std::normal_distribution<double> noise(0.0, 1.0);
  std::vector<std::vector<double>> dist(n, std::vector<double>(k));
  for (Row& row : pool) {
    std::vector<double> base(k);
    for (double& b : base) b = base_dist(gen);
    for (int e = 0; e < n; ++e) {
      double total = 0.0;
      for (int v = 0; v < k; ++v) total += dist[e][v] = base[v] * std::exp(noise(gen));
      for (double& x : dist[e]) x = 0.95 * x / total + 0.05 / k;
    }
    row.chooser = static_cast<int>(gen() % n);
    std::discrete_distribution<int> arm(dist[row.chooser].begin(), dist[row.chooser].end());
    const int played = arm(gen);
    row.propensities.resize(n);
    for (int e = 0; e < n; ++e) row.propensities[e] = dist[e][played];
    row.reward = std::bernoulli_distribution(0.3)(gen) ? 1.0 : 0.0;
  }
  return pool;
}

decision::DivergenceMatrix RandomDivergences(int n, std::mt19937_64& gen) {
  decision::DivergenceMatrix d = decision::DivergenceMatrix::Identity(n);
  std::uniform_real_distribution<double> u(0.0, 2.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j) {
        d.m[i * n + j] = 1.0 + u(gen);
        d.sigma[i * n + j] = 1.0 + u(gen);
      }
    }
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t samples = absl::GetFlag(FLAGS_samples);
  const int n = absl::GetFlag(FLAGS_experts);
  const int k = absl::GetFlag(FLAGS_arms);
  const std::string kind = absl::GetFlag(FLAGS_estimator);
  if (samples < 1 || n < 1 || k < 2 || (kind != "median_of_means" && kind != "clipped")) {
    std::fprintf(stderr,
                 "estimator_scale: need --samples >= 1, --experts >= 1, --arms >= 2, "
                 "--estimator=median_of_means|clipped\n");
    return 2;
  }
  std::mt19937_64 gen(absl::GetFlag(FLAGS_seed));
  decision::EstimatorOptions options;
  options.kind = kind == "clipped" ? decision::EstimatorKind::kClipped
                                   : decision::EstimatorKind::kMedianOfMeans;
  auto made = decision::MakeEstimator(options, n);
  if (!made.ok()) {
    std::fprintf(stderr, "estimator_scale: %s\n", made.status().ToString().c_str());
    return 1;
  }
  decision::Estimator& e = **made;
  const decision::SampleLog no_log(n);  // SetDivergences reads a log only for new experts
  const std::vector<Row> pool = MakePool(n, k, gen);
  std::printf("estimator=%s N=%d K=%d\n", kind.c_str(), n, k);
  std::printf("%12s %10s %12s %10s %12s %12s %12s %10s\n", "samples", "rss_MiB", "state_KiB",
              "kept", "add_ns", "argmax_ns", "refresh_ms", "first_add");
  std::vector<bool> selectable(n, true);
  double first_window_ns = 0.0;
  const int64_t window = std::min<int64_t>(1'000'000, samples);
  auto window_start = Clock::now();
  int64_t next_report = 1'000'000;
  for (int64_t t = 1; t <= samples; ++t) {
    if (t % window == 1 || window == 1) window_start = Clock::now();
    const Row& row = pool[(t * 2654435761u) & 4095];
    if (absl::Status s = e.Add(row.chooser, row.reward, row.propensities); !s.ok()) {
      std::fprintf(stderr, "estimator_scale: %s\n", s.ToString().c_str());
      return 1;
    }
    if (t % window != 0) continue;
    const double add_ns = Seconds(window_start) * 1e9 / static_cast<double>(window);
    if (t == window) first_window_ns = add_ns;
    if (t != next_report && t != samples) continue;
    if (t == next_report) next_report *= 10;
    const auto argmax_start = Clock::now();
    int chosen = 0;
    for (int i = 0; i < 10000; ++i) chosen += e.ArgmaxUcb(selectable, gen);
    const double argmax_ns = Seconds(argmax_start) * 1e9 / 10000.0;
    const auto refresh_start = Clock::now();
    if (absl::Status s = e.SetDivergences(no_log, RandomDivergences(n, gen)); !s.ok()) {
      // no_log has 0 samples: a refresh reads it only for experts it does not know.
      std::fprintf(stderr, "estimator_scale: refresh: %s\n", s.ToString().c_str());
      return 1;
    }
    const double refresh_ms = Seconds(refresh_start) * 1e3;
    const decision::EstimatorStats stats = e.Stats();
    std::printf("%12lld %10.1f %12.1f %10lld %12.1f %12.1f %12.2f %10.1f%s\n",
                static_cast<long long>(t), ResidentBytes() / 1048576.0,
                stats.state_bytes / 1024.0, static_cast<long long>(stats.clipped_kept), add_ns,
                argmax_ns, refresh_ms, first_window_ns, chosen < 0 ? " (no expert)" : "");
    std::fflush(stdout);
  }
  return 0;
}
