// The fixture of the in-process service tests: DecisionService with a fake clock and the
// maintenance run by hand (no background thread), on a fresh temporary directory.
#ifndef DECISION_TESTS_SERVICE_FIXTURE_H_
#define DECISION_TESTS_SERVICE_FIXTURE_H_

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/estimator.h"
#include "server/decision_service.h"
#include "tests/decisiond_process.h"
#include "tests/reference_estimators.h"

namespace decision::server {

inline constexpr int kArms = 4;
inline constexpr int kFeatures = 3;

// Store writes so far (each one observed by the write-latency histogram).
inline uint64_t StorageWrites(Metrics& metrics) {
  return metrics.storage_write_latency().Collect().histogram.sample_count;
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    Open();
  }
  void Open() {
    ServiceOptions options;
    options.data_dir = dir_;
    options.seed = seed_;
    options.start_maintenance_thread = start_maintenance_threads_;
    options.inline_maintenance = inline_maintenance_;
    options.durable_choose = durable_choose_;
    options.store_fault_injection = [this](absl::string_view what) -> absl::Status {
      if (fail_writes_ != nullptr && fail_writes_(what)) {
        return absl::InternalError(absl::StrCat("injected failure writing ", what));
      }
      return absl::OkStatus();
    };
    options.problem_hooks = &hooks_;
    options.trainer_hooks = &trainer_hooks_;
    options.store_env = store_env_;
    options.max_pending_decisions = max_pending_decisions_;
    options.max_pending_decisions_mb = max_pending_decisions_mb_;
    options.max_problems = max_problems_;
    options.metrics_pair_experts = metrics_pair_experts_;
    options.metrics_export_interval_ms = metrics_export_interval_ms_;
    options.max_experts_per_problem = max_experts_per_problem_;
    options.max_problem_memory_mb = max_problem_memory_mb_;
    options.max_divergence_terms = max_divergence_terms_;
    options.training_threads = training_threads_;
    options.scoring_threads = scoring_threads_;
    options.reservoir_predictions_mb = reservoir_predictions_mb_;
    options.refresh_slice_ms = refresh_slice_ms_;
    auto s = DecisionService::Open(options, &clock_, &metrics_);
    ASSERT_TRUE(s.ok()) << s.status();
    service_ = *std::move(s);
  }
  void Reopen() {
    ASSERT_TRUE(service_->Shutdown().ok());
    service_.reset();
    Open();
  }
  // Shuts the service down and starts over on an empty directory with the contexts' seed
  // reset: the caller changes options, then Open()s, to run the same requests again.
  void ShutDownForAFreshStart() {
    ASSERT_TRUE(service_->Shutdown().ok());
    service_.reset();
    dir_ = testing::MakeTempDir();
    gen_.seed(42);
  }

  void CreateProblem(const std::string& id, int64_t wait_ms = 1000, bool drop = false,
                     int auto_train_max_active = 0) {
    v1::CreateProblemRequest req;
    if (auto_train_max_active > 0) {
      req.mutable_config()->mutable_auto_train()->set_enabled(true);
      req.mutable_config()->mutable_auto_train()->set_max_active_experts(auto_train_max_active);
    }
    req.set_problem_id(id);
    req.mutable_config()->set_num_arms(kArms);
    req.mutable_config()->set_num_features(kFeatures);
    req.mutable_config()->set_reward_wait_ms(wait_ms);
    req.mutable_config()->set_default_reward(0.25);
    req.mutable_config()->set_drop_unrewarded(drop);
    v1::Problem p;
    ASSERT_TRUE(service_->CreateProblem(req, &p).ok());
  }

  // A linear softmax expert preferring arm = argmax of the first features.
  static v1::RegisterExpertRequest LinearRequest(const std::string& problem, double strength) {
    v1::RegisterExpertRequest req;
    req.set_problem_id(problem);
    req.set_name("linear");
    auto* l = req.mutable_model()->mutable_linear_softmax();
    for (int a = 0; a < kArms; ++a) {
      for (int f = 0; f < kFeatures; ++f) l->add_weights(a == f ? strength : 0.0);
      l->add_bias(0.0);
    }
    return req;
  }
  int RegisterLinear(const std::string& problem, double strength) {
    v1::Expert e;
    EXPECT_TRUE(service_->RegisterExpert(LinearRequest(problem, strength), &e).ok());
    return e.expert_id();
  }

  // RetireExpert of `expert`; its answer's status.
  absl::Status Retire(const std::string& problem, int expert) {
    v1::RetireExpertRequest req;
    req.set_problem_id(problem);
    req.set_expert_id(expert);
    v1::Expert retired;
    return service_->RetireExpert(req, &retired);
  }

  // The value of metric family `name`'s first series (a gauge or a counter), or -1 if the
  // family has none.
  double MetricValue(const std::string& name) {
    for (const prometheus::MetricFamily& f : metrics_.registry()->Collect()) {
      if (f.name == name && !f.metric.empty()) {
        return f.metric[0].gauge.value + f.metric[0].counter.value;
      }
    }
    return -1;
  }
  // The value of the first series of family `name` with label `label` = `value`, or -1.
  double MetricValue(const std::string& name, const std::string& label,
                     const std::string& value) {
    for (const prometheus::MetricFamily& f : metrics_.registry()->Collect()) {
      if (f.name != name) continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        for (const prometheus::ClientMetric::Label& l : m.label) {
          if (l.name == label && l.value == value) return m.gauge.value + m.counter.value;
        }
      }
    }
    return -1;
  }

  // ListExperts of `problem`.
  std::vector<v1::Expert> Experts(const std::string& problem = "p") {
    v1::ListExpertsRequest req;
    req.set_problem_id(problem);
    v1::ListExpertsResponse resp;
    EXPECT_TRUE(service_->ListExperts(req, &resp).ok());
    return {resp.experts().begin(), resp.experts().end()};
  }

  // A table expert over key feature 0 with two rows (keys in [0, 2): it cannot score a
  // context with a larger key), each row `probabilities` (kArms values).
  static v1::RegisterExpertRequest TableRequest(const std::string& problem,
                                                const std::vector<double>& probabilities) {
    v1::RegisterExpertRequest req;
    req.set_problem_id(problem);
    req.set_name("table");
    auto* t = req.mutable_model()->mutable_table();
    for (int r = 0; r < 2; ++r) {
      t->add_rows()->mutable_probabilities()->Add(probabilities.begin(), probabilities.end());
    }
    t->set_key_feature(0);
    return req;
  }

  void RunMaintenanceUntilActive(const std::string& problem) {
    for (int i = 0; i < 1000; ++i) {
      ASSERT_TRUE(service_->RunMaintenance().ok());
      v1::ListExpertsRequest req;
      req.set_problem_id(problem);
      v1::ListExpertsResponse resp;
      ASSERT_TRUE(service_->ListExperts(req, &resp).ok());
      bool all = true;
      for (const auto& e : resp.experts()) all &= e.status() != v1::EXPERT_STATUS_BACKFILLING;
      if (all) return;
    }
    FAIL() << "backfill did not complete";
  }

  v1::ChooseResponse Choose(const std::string& problem, const std::string& event_id = "") {
    v1::ChooseRequest req;
    req.set_problem_id(problem);
    req.set_event_id(event_id);
    for (int f = 0; f < kFeatures; ++f) req.add_features(std::uniform_real_distribution<>(0, 1)(gen_));
    v1::ChooseResponse resp;
    absl::Status s = service_->Choose(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    last_features_.assign(req.features().begin(), req.features().end());
    return resp;
  }
  absl::Status Reward(const std::string& problem, const std::string& event_id, double value,
                      bool* first = nullptr) {
    v1::RewardRequest req;
    req.set_problem_id(problem);
    req.set_event_id(event_id);
    req.set_value(value);
    v1::RewardResponse resp;
    absl::Status s = service_->Reward(req, &resp);
    if (first != nullptr) *first = resp.first();
    return s;
  }
  // Reward 1 when the arm is the argmax of the context's first features.
  double Label() const {
    return static_cast<double>(std::max_element(last_features_.begin(), last_features_.end()) -
                               last_features_.begin());
  }
  v1::Problem GetProblem(const std::string& id) {
    v1::GetProblemRequest req;
    req.set_problem_id(id);
    v1::Problem p;
    EXPECT_TRUE(service_->GetProblem(req, &p).ok());
    return p;
  }
  v1::Estimates Estimates(const std::string& id) {
    v1::GetEstimatesRequest req;
    req.set_problem_id(id);
    v1::Estimates e;
    EXPECT_TRUE(service_->GetEstimates(req, &e).ok());
    return e;
  }
  // An automatic gate (retirement, promotion) of problem "p" checked as its bounds tighten.
  // Plays rounds rewarding arm 0; every 25 rounds `passes(estimates)` says whether the gate
  // passes for `expert` under the selection width (.first) and under the paper's (.second).
  // When either does, a maintenance round runs, after which the expert must still be
  // `unchanged` (narrow width only) or be `passed` (the paper's width). Stops once the
  // paper's width passed, or after 20000 rounds; *narrow_only and *wide say what was seen.
  void PlayUntilGatePasses(
      int expert, const std::function<std::pair<bool, bool>(const v1::Estimates&)>& passes,
      v1::ExpertStatus unchanged, v1::ExpertStatus passed, bool* narrow_only, bool* wide) {
    *narrow_only = *wide = false;
    for (int round = 1; round <= 20000 && !*wide; ++round) {
      const std::string id = absl::StrCat("e", round);
      const v1::ChooseResponse c = Choose("p", id);
      ASSERT_TRUE(Reward("p", id, c.arm() == 0 ? 1.0 : 0.0).ok());
      if (round % 25 != 0) continue;
      const v1::Estimates est = Estimates("p");
      ASSERT_EQ(est.experts(expert).status(), unchanged) << "round " << round;
      const auto [narrow_passes, wide_passes] = passes(est);
      if (!narrow_passes && !wide_passes) continue;
      ASSERT_TRUE(service_->RunMaintenance().ok());
      EXPECT_EQ(Experts("p")[expert].status(), wide_passes ? passed : unchanged)
          << "round " << round;
      (wide_passes ? *wide : *narrow_only) = true;
    }
  }
  std::vector<v1::LoggedSample> Export(const std::string& id) {
    v1::ExportLogRequest req;
    req.set_problem_id(id);
    std::vector<v1::LoggedSample> out;
    EXPECT_TRUE(service_->ExportLog(req, [&](const v1::LoggedSample& s) {
                  out.push_back(s);
                  return absl::OkStatus();
                }).ok());
    return out;
  }
  // The service's estimates equal the literal reference computed from the exported log
  // (every expert's propensities) and the reported divergences. FAILED experts have no
  // estimate. The experts in `drop` (which must never have been followed) are left out of
  // the reference altogether: it is then over the other experts only.
  void ExpectEstimatesMatchReference(const std::string& problem, std::vector<int> drop = {}) {
    const v1::Estimates e = Estimates(problem);
    const auto log = Export(problem);
    ASSERT_EQ(static_cast<int64_t>(log.size()), e.samples());
    std::vector<int> kept;  // reference column -> expert id
    for (int k = 0; k < e.n(); ++k) {
      if (std::find(drop.begin(), drop.end(), k) == drop.end()) kept.push_back(k);
    }
    const int n = static_cast<int>(kept.size());
    std::vector<int> column(e.n(), -1);
    for (int c = 0; c < n; ++c) column[kept[c]] = c;
    SampleLog rebuilt(n);
    for (const v1::LoggedSample& s : log) {
      ASSERT_EQ(s.expert_propensities_size(), e.n());
      ASSERT_GE(column[s.expert_id()], 0) << "a dropped expert was followed";
      std::vector<double> row;
      for (int k : kept) row.push_back(s.expert_propensities(k));
      ASSERT_TRUE(rebuilt.Append(column[s.expert_id()], s.reward(), row).ok());
    }
    DivergenceMatrix d;
    d.num_experts = n;
    for (int i : kept) {
      for (int j : kept) {
        d.m.push_back(e.m(i * e.n() + j));
        d.sigma.push_back(e.sigma(i * e.n() + j));
      }
    }
    for (int c = 0; c < n; ++c) {
      const v1::ExpertEstimate& got = e.experts(kept[c]);
      // A failed expert has no estimate; a retired one reports its estimate at retirement
      // (RetiredExpertIsFrozenAndScoredByTheStandIn checks it).
      if (got.status() == v1::EXPERT_STATUS_FAILED || got.status() == v1::EXPERT_STATUS_RETIRED) {
        continue;
      }
      const ExpertEstimate ref =
          reference::Estimate(rebuilt, rebuilt.size(), d, EstimatorOptions(), c);
      EXPECT_NEAR(got.estimate(), ref.mean, 1e-9 * std::max(1.0, std::abs(ref.mean)));
      EXPECT_NEAR(got.width(), ref.width, 1e-9 * std::max(1.0, std::abs(ref.width)));
    }
  }

  void PlayRounds(const std::string& problem, int rounds) {
    for (int i = 0; i < rounds; ++i) {
      const v1::ChooseResponse c = Choose(problem);
      ASSERT_TRUE(Reward(problem, c.event_id(), c.arm() == Label() ? 1.0 : 0.0).ok());
    }
  }

  // Store writes for which this returns true fail (storage::StoreOptions::fault_injection).
  std::function<bool(absl::string_view what)> fail_writes_;
  ProblemHooks hooks_;
  TrainerHooks trainer_hooks_;
  // The store's Env (storage::StoreOptions::env): tests/fault_injection_fs.h's, or null.
  std::shared_ptr<rocksdb::Env> store_env_;
  bool inline_maintenance_ = false;
  bool durable_choose_ = false;
  bool start_maintenance_threads_ = false;  // else tests call RunMaintenance themselves
  int64_t max_pending_decisions_ = ServiceOptions().max_pending_decisions;
  int64_t max_pending_decisions_mb_ = ServiceOptions().max_pending_decisions_mb;
  int64_t max_problems_ = ServiceOptions().max_problems;
  int metrics_pair_experts_ = ServiceOptions().metrics_pair_experts;
  int64_t metrics_export_interval_ms_ = ServiceOptions().metrics_export_interval_ms;
  int max_experts_per_problem_ = ServiceOptions().max_experts_per_problem;
  int64_t max_problem_memory_mb_ = ServiceOptions().max_problem_memory_mb;
  int64_t max_divergence_terms_ = ServiceOptions().max_divergence_terms;
  int64_t reservoir_predictions_mb_ = ServiceOptions().reservoir_predictions_mb;
  // A RunMaintenance finishes the divergence refresh it starts, whatever the time it takes
  // (tests read the divergences after it, and sanitizers make it slow), not ServiceOptions'
  // default; ServiceTest.ARefreshComputedInSlicesLetsOtherProblemsBackfill covers slices.
  int64_t refresh_slice_ms_ = -1;
  // One at a time, not ServiceOptions' default (one per CPU): tests that stop a job at its
  // n-th expert count the ones before it as registered.
  // TrainingJobTest.AJobTrainsTheSameModelsOnAnyNumberOfThreads covers several.
  int training_threads_ = 1;
  uint64_t seed_ = 7;  // ServiceOptions::seed
  int scoring_threads_ = ServiceOptions().scoring_threads;
  std::string dir_;
  FakeClock clock_;
  Metrics metrics_;
  std::unique_ptr<DecisionService> service_;
  std::mt19937_64 gen_{42};
  std::vector<double> last_features_;
};

}  // namespace decision::server

#endif  // DECISION_TESTS_SERVICE_FIXTURE_H_
