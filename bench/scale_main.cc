// scale: the costs that grow with the log, measured on the service in-process
// (DecisionService without gRPC, the maintenance thread running as in production).
//
//   build/bench/scale --samples=1000000 --experts=32
//
// It fills a problem (K arms, d features, N experts: the uniform one plus N-1 linear softmax
// experts) with Choose+Reward pairs and reports:
//   - Choose+Reward pairs per second, and the process's CPU time per pair (every thread),
//     over the first and the last window of samples (--window, default a tenth of the
//     samples up to 1M: the ratio says whether the service slows down as the log grows), and
//     the p50 / p99 latency of each call in the same two windows (from log-bucket
//     histograms, 1.5% wide: no per-call memory);
//
// Run it on one core (taskset -c 1): each synchronous Reward waits for the learner thread,
// and on this VM a hand-off to a thread sleeping on the other, idle, core costs tens of
// microseconds of wake-up latency, which the measure would then be mostly of (bench/README.md).
//   - resident memory, and RocksDB bytes per sample, at the end;
//   - the time to backfill a newly registered linear expert over the whole log;
//   - the time to restart (reopen the store and rebuild every estimator, until it serves)
//     and whether the estimates after the restart are identical; then how long until the
//     stored event ids are read back (Choose looks every caller id up in the store until
//     then: measured with Choose calls with new ids, through a ProblemHooks counter).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/process_stats.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/clock.h"
#include "server/decision_service.h"
#include "prometheus/registry.h"
#include "server/metrics.h"

ABSL_FLAG(int64_t, samples, 1'000'000, "joined samples to fill the log with");
ABSL_FLAG(int, experts, 32, "experts (the uniform one plus linear ones)");
ABSL_FLAG(int, arms, 26, "arms K");
ABSL_FLAG(int, features, 16, "features d");
ABSL_FLAG(std::string, data_dir, "", "store directory (default: a fresh temporary one)");
ABSL_FLAG(uint64_t, seed, 1, "seed");
ABSL_FLAG(int64_t, window, 0,
          "samples in the first and the last window compared (0: a tenth of --samples, at "
          "most 1,000,000)");
ABSL_FLAG(int64_t, reward_wait_ms, 3'600'000,
          "the problem's reward wait: Choose's idempotency filter keeps the event ids of the "
          "last wait (and of the retained window)");
ABSL_FLAG(int64_t, retention_samples, 0,
          "the problem's retention (ProblemConfig.retention.max_samples; 0: keep all): the "
          "store's size is then reported as the samples pass");

namespace {

// Latencies in log buckets 1.5% wide from 0.1 us to about 10 s: quantiles to that
// resolution in constant memory, whatever the window.
class Histogram {
 public:
  void Add(double us) {
    const double x = std::max(us, kLowest);
    const size_t b = std::min(kBuckets - 1, static_cast<size_t>(std::log(x / kLowest) / kStep));
    ++counts_[b];
    ++total_;
  }
  double Quantile(double q) const {
    if (total_ == 0) return 0.0;
    const int64_t rank = std::min(total_ - 1, static_cast<int64_t>(q * total_));
    int64_t seen = 0;
    for (size_t b = 0; b < kBuckets; ++b) {
      seen += counts_[b];
      if (seen > rank) return kLowest * std::exp((b + 0.5) * kStep);  // the bucket's middle
    }
    return kLowest * std::exp(kBuckets * kStep);
  }

 private:
  static constexpr double kLowest = 0.1;
  static constexpr double kStep = 0.015;  // log of a bucket's width ratio
  static constexpr size_t kBuckets = 1200;
  std::vector<int64_t> counts_ = std::vector<int64_t>(kBuckets, 0);
  int64_t total_ = 0;
};

namespace v1 = decision::v1;
using decision::server::DecisionService;
using decision::bench::Clock;
using decision::bench::ProcessCpuSeconds;
using decision::bench::ResidentBytes;
using decision::bench::Seconds;

int64_t DirectoryBytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) total += static_cast<int64_t>(entry.file_size());
  }
  return total;
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "scale: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

v1::ExpertModel LinearModel(std::mt19937_64& gen) {
  const int k = absl::GetFlag(FLAGS_arms), d = absl::GetFlag(FLAGS_features);
  std::normal_distribution<double> weight(0.0, 1.0);
  v1::ExpertModel model;
  auto* l = model.mutable_linear_softmax();
  for (int i = 0; i < k * d; ++i) l->add_weights(weight(gen));
  for (int i = 0; i < k; ++i) l->add_bias(0.0);
  return model;
}

// The first series of family `name` with label `label` = `value` (0 if none).
double GaugeValue(decision::server::Metrics& metrics, const std::string& name,
                  const std::string& label, const std::string& value) {
  for (const prometheus::MetricFamily& f : metrics.registry()->Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        if (l.name == label && l.value == value) return m.gauge.value;
      }
    }
  }
  return 0.0;
}

bool AllActive(DecisionService& service) {
  v1::ListExpertsRequest req;
  req.set_problem_id("scale");
  v1::ListExpertsResponse resp;
  Check(service.ListExperts(req, &resp), "ListExperts");
  for (const v1::Expert& e : resp.experts()) {
    if (e.status() == v1::EXPERT_STATUS_BACKFILLING) return false;
  }
  return true;
}

void WaitAllActive(DecisionService& service) {
  while (!AllActive(service)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As decisiond (server/decisiond_main.cc): no lock-order graph kept on every Mutex acquisition.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const int64_t samples = absl::GetFlag(FLAGS_samples);
  const int d = absl::GetFlag(FLAGS_features);
  std::string dir = absl::GetFlag(FLAGS_data_dir);
  if (dir.empty()) {
    dir = (std::filesystem::temp_directory_path() /
           absl::StrCat("decision-scale-", getpid()))
              .string();
  }
  std::filesystem::remove_all(dir);
  decision::server::SystemClock clock;
  decision::server::Metrics metrics;
  decision::server::ServiceOptions options;
  options.data_dir = dir;
  options.seed = absl::GetFlag(FLAGS_seed);
  // Counts the Choose calls whose event id the filter could not rule out (a store lookup):
  // all of them after a restart until the stored ids are read back.
  std::atomic<int64_t> lookups{0};
  decision::server::ProblemHooks hooks;
  hooks.before_event_lookup = [&lookups](const std::string&) { lookups++; };
  options.problem_hooks = &hooks;
  auto opened = DecisionService::Open(options, &clock, &metrics);
  Check(opened.status(), "Open");
  std::unique_ptr<DecisionService> service = *std::move(opened);

  v1::CreateProblemRequest create;
  create.set_problem_id("scale");
  create.mutable_config()->set_num_arms(absl::GetFlag(FLAGS_arms));
  create.mutable_config()->set_num_features(d);
  create.mutable_config()->set_reward_wait_ms(absl::GetFlag(FLAGS_reward_wait_ms));
  create.mutable_config()->mutable_retention()->set_max_samples(
      absl::GetFlag(FLAGS_retention_samples));
  v1::Problem problem;
  Check(service->CreateProblem(create, &problem), "CreateProblem");
  std::mt19937_64 gen(absl::GetFlag(FLAGS_seed));
  for (int e = 1; e < absl::GetFlag(FLAGS_experts); ++e) {
    v1::RegisterExpertRequest req;
    req.set_problem_id("scale");
    req.set_name(absl::StrCat("linear-", e));
    *req.mutable_model() = LinearModel(gen);
    v1::Expert expert;
    Check(service->RegisterExpert(req, &expert), "RegisterExpert");
  }
  WaitAllActive(*service);

  // Fill.
  std::printf("filling %lld samples: %d experts, K = %d, d = %d\n",
              static_cast<long long>(samples), absl::GetFlag(FLAGS_experts),
              absl::GetFlag(FLAGS_arms), d);
  std::uniform_real_distribution<double> feature(0.0, 1.0);
  v1::ChooseRequest choose;
  choose.set_problem_id("scale");
  for (int f = 0; f < d; ++f) choose.add_features(0.0);
  v1::RewardRequest reward;
  reward.set_problem_id("scale");
  const int64_t window_flag = absl::GetFlag(FLAGS_window);
  const int64_t window_size = std::max<int64_t>(
      1, std::min(samples / 2, window_flag > 0 ? window_flag
                                               : std::min<int64_t>(1'000'000, samples / 10)));
  double first_rate = 0.0, last_rate = 0.0, first_cpu_us = 0.0, last_cpu_us = 0.0;
  double window_cpu = ProcessCpuSeconds();
  struct Latencies {
    Histogram choose_us, reward_us;
  } first, last;  // per-call latencies in the first and the last window
  auto window_start = Clock::now();
  const auto fill_start = Clock::now();
  int64_t max_disk = 0, max_disk_second_half = 0;
  for (int64_t t = 0; t < samples; ++t) {
    if (t == window_size) {
      first_rate = window_size / Seconds(window_start);
      first_cpu_us = (ProcessCpuSeconds() - window_cpu) * 1e6 / window_size;
    }
    if (t == samples - window_size) {
      window_start = Clock::now();
      window_cpu = ProcessCpuSeconds();
    }
    for (int f = 0; f < d; ++f) choose.set_features(f, feature(gen));
    choose.set_event_id(absl::StrCat("e", t));
    v1::ChooseResponse decision;
    const auto t0 = Clock::now();
    Check(service->Choose(choose, &decision), "Choose");
    const auto t1 = Clock::now();
    reward.set_event_id(decision.event_id());
    reward.set_value(std::bernoulli_distribution(0.3)(gen) ? 1.0 : 0.0);
    v1::RewardResponse ack;
    Check(service->Reward(reward, &ack), "Reward");
    const auto t2 = Clock::now();
    Latencies* window = t < window_size ? &first : t >= samples - window_size ? &last : nullptr;
    if (window != nullptr) {
      window->choose_us.Add(std::chrono::duration<double, std::micro>(t1 - t0).count());
      window->reward_us.Add(std::chrono::duration<double, std::micro>(t2 - t1).count());
    }
    if ((t + 1) % std::max<int64_t>(100'000, samples / 100) == 0) {
      // The store as it is (SST files and WAL, before or after RocksDB's compactions).
      const int64_t disk = DirectoryBytes(dir);
      max_disk = std::max(max_disk, disk);
      if (t + 1 > samples / 2) max_disk_second_half = std::max(max_disk_second_half, disk);
      // Parts of it, as decisiond exports them (the maintenance thread's last values).
      const auto mib = [&](const char* name, const char* label, const char* part) {
        return GaugeValue(metrics, name, label, part) / 1048576.0;
      };
      std::printf("  %lld samples, %.0f s, store %.0f MiB, resident %.0f MiB (event ids %.0f, "
                  "estimator %.0f; RocksDB memtables %.0f, table readers %.0f, block cache "
                  "%.0f MiB; families: events %.0f, samples %.0f, logchunks %.0f, backfill "
                  "%.0f MiB)\n",
                  static_cast<long long>(t + 1), Seconds(fill_start), disk / 1048576.0,
                  ResidentBytes() / 1048576.0,
                  mib("decision_problem_memory_bytes", "part", "event_ids"),
                  mib("decision_problem_memory_bytes", "part", "estimator"),
                  mib("decision_store_memory_bytes", "part", "memtables"),
                  mib("decision_store_memory_bytes", "part", "table_readers"),
                  mib("decision_store_memory_bytes", "part", "block_cache"),
                  mib("decision_store_family_bytes", "family", "events"),
                  mib("decision_store_family_bytes", "family", "samples"),
                  mib("decision_store_family_bytes", "family", "logchunks"),
                  mib("decision_store_family_bytes", "family", "backfill"));
      std::fflush(stdout);
    }
  }
  last_rate = window_size / Seconds(window_start);
  last_cpu_us = (ProcessCpuSeconds() - window_cpu) * 1e6 / window_size;
  const double fill_seconds = Seconds(fill_start);
  const int64_t rss = ResidentBytes();

  // Backfill of a new expert over the log kept (all of it without retention).
  int64_t window = samples;
  {
    v1::GetProblemRequest get;
    get.set_problem_id("scale");
    v1::Problem kept;
    Check(service->GetProblem(get, &kept), "GetProblem");
    window -= kept.retained_from();
  }
  v1::RegisterExpertRequest extra;
  extra.set_problem_id("scale");
  extra.set_name("late-linear");
  *extra.mutable_model() = LinearModel(gen);
  v1::Expert expert;
  const auto backfill_start = Clock::now();
  Check(service->RegisterExpert(extra, &expert), "RegisterExpert");
  WaitAllActive(*service);
  const double backfill_seconds = Seconds(backfill_start);

  // Restart.
  v1::GetEstimatesRequest estimates_request;
  estimates_request.set_problem_id("scale");
  v1::Estimates before, after;
  // Quiesce first: a batch boundary the fill crossed within the last
  // min_refresh_interval_ms (10 s) is refreshed by the maintenance thread when that interval
  // has passed, and would change the estimates between this snapshot and the shutdown.
  Check(service->GetEstimates(estimates_request, &before), "GetEstimates");
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options.min_refresh_interval_ms + 500));
    v1::Estimates again;
    Check(service->GetEstimates(estimates_request, &again), "GetEstimates");
    const bool settled = again.SerializeAsString() == before.SerializeAsString();
    before = std::move(again);
    if (settled) break;
  }
  Check(service->Shutdown(), "Shutdown");
  service.reset();
  const int64_t store_bytes = DirectoryBytes(dir);
  const auto restart_start = Clock::now();
  opened = DecisionService::Open(options, &clock, &metrics);
  Check(opened.status(), "reopen");
  service = *std::move(opened);
  const double restart_seconds = Seconds(restart_start);
  Check(service->GetEstimates(estimates_request, &after), "GetEstimates after restart");
  const bool identical = before.SerializeAsString() == after.SerializeAsString();
  // Then the stored event ids are read back while the problem serves: Choose calls with new
  // ids until 100 in a row needed no lookup (the filter answers about 99% of them then).
  const auto reload_start = Clock::now();
  int64_t reload_chooses = 0, run = 0;
  const int64_t lookups_before = lookups.load();
  while (run < 100) {
    const int64_t seen = lookups.load();
    for (int f = 0; f < d; ++f) choose.set_features(f, feature(gen));
    choose.set_event_id(absl::StrCat("after-restart-", reload_chooses++));
    v1::ChooseResponse decision;
    Check(service->Choose(choose, &decision), "Choose after restart");
    run = lookups.load() == seen ? run + 1 : 0;
    if (run == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double reload_seconds = Seconds(reload_start);
  const int64_t reload_lookups = lookups.load() - lookups_before;

  std::printf("\n| measure | value |\n|---|---|\n");
  std::printf("| fill: %lld Choose+Reward pairs | %.1f s (%.0f pairs/s) |\n",
              static_cast<long long>(samples), fill_seconds, samples / fill_seconds);
  std::printf("| pairs/s, first %lld samples | %.0f |\n", static_cast<long long>(window_size),
              first_rate);
  std::printf("| pairs/s, last %lld samples | %.0f |\n", static_cast<long long>(window_size),
              last_rate);
  std::printf("| last / first | %.2f |\n", last_rate / first_rate);
  std::printf("| CPU per pair (all threads), first / last window | %.1f / %.1f us (ratio %.2f) |\n",
              first_cpu_us, last_cpu_us, last_cpu_us / first_cpu_us);
  for (auto [name, a, b] : {std::tuple{"Choose", &first.choose_us, &last.choose_us},
                            std::tuple{"Reward", &first.reward_us, &last.reward_us}}) {
    const double p50a = a->Quantile(0.5), p99a = a->Quantile(0.99);
    const double p50b = b->Quantile(0.5), p99b = b->Quantile(0.99);
    std::printf("| %s p50 / p99, first window | %.1f / %.1f us |\n", name, p50a, p99a);
    std::printf("| %s p50 / p99, last window | %.1f / %.1f us (ratio %.2f / %.2f) |\n", name,
                p50b, p99b, p50b / p50a, p99b / p99a);
  }
  std::printf("| resident memory at %lld samples | %.0f MiB |\n", static_cast<long long>(samples),
              rss / 1048576.0);
  std::printf("| RocksDB size | %.0f MiB (%.0f bytes/sample) |\n", store_bytes / 1048576.0,
              static_cast<double>(store_bytes) / samples);
  std::printf("| store size, largest seen while filling / in the second half | %.0f / %.0f "
              "MiB |\n",
              max_disk / 1048576.0, max_disk_second_half / 1048576.0);
  if (absl::GetFlag(FLAGS_retention_samples) > 0) {
    v1::GetProblemRequest get;
    get.set_problem_id("scale");
    v1::Problem kept;
    Check(service->GetProblem(get, &kept), "GetProblem");
    std::printf("| retention: %lld samples; the store keeps the samples from | %lld |\n",
                static_cast<long long>(absl::GetFlag(FLAGS_retention_samples)),
                static_cast<long long>(kept.retained_from()));
  }
  std::printf("| backfill of a new linear expert over the %lld samples kept | %.2f s |\n",
              static_cast<long long>(window), backfill_seconds);
  std::printf("| restart (reopen + rebuild %d estimators' state) | %.2f s |\n",
              before.n(), restart_seconds);
  std::printf("| estimates identical after restart | %s |\n", identical ? "yes" : "NO");
  std::printf("| then, until Choose finds the stored event ids read back | %.2f s (%lld of "
              "%lld Choose calls looked their id up in the store) |\n",
              reload_seconds, static_cast<long long>(reload_lookups),
              static_cast<long long>(reload_chooses));
  Check(service->Shutdown(), "Shutdown");
  std::filesystem::remove_all(dir);
  return identical ? 0 : 1;
}
