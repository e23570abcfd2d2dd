// The cost model of experts (issue 15): each expert's measured scoring cost, in ListExperts
// and the metrics, kept across restarts; the per-problem scoring budget, enforced at
// registration (RESOURCE_EXHAUSTED, nothing stored) and by auto-training (retire to make
// room, or skip); and a backfill that never blocks Choose or Reward. Costs are pinned by
// ProblemHooks::score_cost_us (by expert name) wherever a test depends on their values:
// nothing here asserts a measured time beyond "positive".
#include "server/scoring_cost.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "tests/service_fixture.h"

namespace decision::server {
namespace {

using ::testing::HasSubstr;

class ScoringCostTest : public ServiceTest {
 protected:
  // Problem "p" with `budget_us`; with auto-training, one tree and one linear expert per
  // batch.
  void CreateBudgeted(double budget_us, bool auto_train = false) {
    v1::CreateProblemRequest req;
    req.set_problem_id("p");
    v1::ProblemConfig* c = req.mutable_config();
    c->set_num_arms(kArms);
    c->set_num_features(kFeatures);
    c->set_reward_wait_ms(1'000'000);
    c->set_scoring_budget_us(budget_us);
    if (auto_train) {
      c->mutable_auto_train()->set_enabled(true);
      c->mutable_auto_train()->set_tree_experts(1);
      c->mutable_auto_train()->set_linear_experts(1);
    }
    v1::Problem p;
    const absl::Status s = service_->CreateProblem(req, &p);
    ASSERT_TRUE(s.ok()) << s;
  }
  // A linear softmax expert named `name` preferring arm = argmax of the features.
  absl::StatusOr<v1::Expert> Register(const std::string& name) {
    v1::RegisterExpertRequest req;
    req.set_problem_id("p");
    req.set_name(name);
    auto* l = req.mutable_model()->mutable_linear_softmax();
    for (int a = 0; a < kArms; ++a) {
      for (int f = 0; f < kFeatures; ++f) l->add_weights(a == f ? 5.0 : 0.0);
      l->add_bias(0.0);
    }
    v1::Expert e;
    const absl::Status s = service_->RegisterExpert(req, &e);
    if (!s.ok()) return s;
    return e;
  }
  // Costs pinned by name: `costs[name]`, or the name's first entry that is a substring of
  // it; else the measured cost.
  void PinCosts(std::map<std::string, double> costs) {
    hooks_.score_cost_us = [costs](const std::string& name, double measured) {
      for (const auto& [part, cost] : costs) {
        if (absl::StrContains(name, part)) return cost;
      }
      return measured;
    };
  }
  std::string ExpertsBytes() {
    std::string out;
    for (const v1::Expert& e : Experts()) out += e.SerializeAsString();
    return out;
  }
  // What the budget counts, from ListExperts: the ACTIVE and BACKFILLING experts' costs.
  double CountedCostUs() {
    double total = 0.0;
    for (const v1::Expert& e : Experts()) {
      if (e.status() == v1::EXPERT_STATUS_ACTIVE || e.status() == v1::EXPERT_STATUS_BACKFILLING) {
        total += e.score_cost_us();
      }
    }
    return total;
  }
  // The gauge `name` of problem "p" (and expert `expert` if >= 0); -1 if there is none.
  double Gauge(const std::string& name, int expert = -1) {
    for (const prometheus::MetricFamily& f : metrics_.registry()->Collect()) {
      if (f.name != name) continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        bool match = true;
        for (const prometheus::ClientMetric::Label& l : m.label) {
          if (l.name == "problem") match &= l.value == "p";
          if (l.name == "expert") match &= expert >= 0 && l.value == std::to_string(expert);
        }
        if (match) return m.gauge.value;
      }
    }
    return -1;
  }
  absl::StatusOr<v1::TrainingJob> Job(int64_t job_id) {
    v1::GetTrainingJobRequest req;
    req.set_problem_id("p");
    req.set_job_id(job_id);
    v1::TrainingJob job;
    absl::Status s = service_->GetTrainingJob(req, &job);
    if (!s.ok()) return s;
    return job;
  }
};

TEST(MeasureScoringCostTest, AModelCostsMoreThanNothingAndTheUniformExpertNothing) {
  const std::unique_ptr<Expert> linear =
      MakeLinearSoftmaxExpert(kArms, kFeatures, std::vector<double>(kArms * kFeatures, 1.0),
                              std::vector<double>(kArms, 0.0))
          .value();
  const std::vector<double> contexts(10 * kFeatures, 0.5);
  EXPECT_GT(MeasureScoringCostUs(*linear, contexts), 0.0);
  EXPECT_GT(MeasureScoringCostUs(*linear, {}), 0.0);  // synthetic rows
  EXPECT_EQ(MeasureScoringCostUs(*MakeUniformExpert(kArms, kFeatures).value(), contexts), 0.0);
}

TEST_F(ScoringCostTest, TheMeasuredCostIsInListExpertsAndTheMetrics) {
  CreateBudgeted(0.0);
  PlayRounds("p", 20);  // contexts to measure on
  const absl::StatusOr<v1::Expert> e = Register("lin");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_GT(e->score_cost_us(), 0.0);
  const std::vector<v1::Expert> experts = Experts();
  ASSERT_EQ(experts.size(), 2u);
  EXPECT_EQ(experts[0].score_cost_us(), 0.0);  // uniform
  EXPECT_EQ(experts[1].score_cost_us(), e->score_cost_us());
  EXPECT_DOUBLE_EQ(Gauge("decision_expert_score_cost_seconds", 1), e->score_cost_us() * 1e-6);
  EXPECT_EQ(Gauge("decision_expert_score_cost_seconds", 0), 0.0);
  // Backfilling and active experts are scored per join; a retired one is not counted.
  EXPECT_DOUBLE_EQ(Gauge("decision_scoring_cost_seconds"), e->score_cost_us() * 1e-6);
  RunMaintenanceUntilActive("p");
  EXPECT_DOUBLE_EQ(Gauge("decision_scoring_cost_seconds"), e->score_cost_us() * 1e-6);
  v1::RetireExpertRequest retire;
  retire.set_problem_id("p");
  retire.set_expert_id(1);
  v1::Expert retired;
  ASSERT_TRUE(service_->RetireExpert(retire, &retired).ok());
  EXPECT_EQ(retired.score_cost_us(), e->score_cost_us());
  EXPECT_EQ(Gauge("decision_scoring_cost_seconds"), 0.0);
}

TEST_F(ScoringCostTest, ARestartKeepsTheStoredCostAndMeasuresOnlyExpertsStoredWithout) {
  CreateBudgeted(0.0);
  PinCosts({{"kept", 41.5}, {"unmeasured", 0.0}});
  ASSERT_TRUE(Register("kept").ok());
  ASSERT_TRUE(Register("unmeasured").ok());  // stored with 0, as before costs were stored
  PinCosts({{"kept", 99.0}, {"unmeasured", 7.0}});
  Reopen();
  std::vector<v1::Expert> experts = Experts();
  ASSERT_EQ(experts.size(), 3u);
  EXPECT_EQ(experts[1].score_cost_us(), 41.5);  // not measured again
  EXPECT_EQ(experts[2].score_cost_us(), 7.0);   // measured at load
  EXPECT_DOUBLE_EQ(Gauge("decision_expert_score_cost_seconds", 1), 41.5e-6);
  EXPECT_DOUBLE_EQ(Gauge("decision_scoring_cost_seconds"), 48.5e-6);
  // ... and not written: the store still holds 0 for it.
  std::vector<double> stored;
  ASSERT_TRUE(service_->store_for_testing()
                  .ForEachExpert(0,
                                 [&](uint32_t, const storage::v1::ExpertRecord& r) {
                                   stored.push_back(r.score_cost_us());
                                   return absl::OkStatus();
                                 })
                  .ok());
  EXPECT_EQ(stored, (std::vector<double>{0.0, 41.5, 0.0}));
}

TEST_F(ScoringCostTest, AnExpertOverTheBudgetIsRefusedWithTheFiguresAndNothingIsStored) {
  CreateBudgeted(100.0);
  PinCosts({{"a", 60.0}, {"b", 50.0}, {"c", 40.0}});
  ASSERT_TRUE(Register("a").ok());
  const std::string before = ExpertsBytes();
  const uint64_t writes = StorageWrites(metrics_);
  const absl::StatusOr<v1::Expert> refused = Register("b");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("expert 'b' costs 50.000 us per row; the problem's experts cost 60.000 us "
                        "of its scoring budget of 100 us per decision; retire an expert or "
                        "register a cheaper model"));
  EXPECT_TRUE(IsOverScoringBudget(refused.status()));
  EXPECT_EQ(ExpertsBytes(), before);
  EXPECT_EQ(StorageWrites(metrics_), writes);
  EXPECT_DOUBLE_EQ(Gauge("decision_scoring_cost_seconds"), 60e-6);
  Reopen();
  EXPECT_EQ(ExpertsBytes(), before);
  // Exactly the budget fits.
  const absl::StatusOr<v1::Expert> fits = Register("c");
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(CountedCostUs(), 100.0);
  // A retired expert is free: retiring "a" makes room for "b".
  v1::RetireExpertRequest retire;
  retire.set_problem_id("p");
  retire.set_expert_id(1);
  v1::Expert retired;
  ASSERT_TRUE(service_->RetireExpert(retire, &retired).ok());
  EXPECT_TRUE(Register("b").ok());
  EXPECT_EQ(CountedCostUs(), 90.0);
}

TEST_F(ScoringCostTest, TwoConcurrentRegistrationsCannotBothTakeTheRoomOfOne) {
  CreateBudgeted(100.0);
  PinCosts({{"x", 60.0}});
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] { results[i] = Register(absl::StrCat("x", i)).status(); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(results[0].ok() + results[1].ok(), 1) << results[0] << "; " << results[1];
  EXPECT_EQ(CountedCostUs(), 60.0);
}

TEST_F(ScoringCostTest, ABudgetOfZeroNeverRefuses) {
  CreateBudgeted(0.0);
  PinCosts({{"", 1e9}});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(Register(absl::StrCat("huge", i)).ok());
  EXPECT_EQ(CountedCostUs(), 3e9);
}

TEST_F(ScoringCostTest, InvalidBudgetsAreRefusedAndAValidOneIsKept) {
  for (double budget : {-1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e12}) {
    v1::CreateProblemRequest req;
    req.set_problem_id("bad");
    req.mutable_config()->set_num_arms(kArms);
    req.mutable_config()->set_num_features(kFeatures);
    req.mutable_config()->set_scoring_budget_us(budget);
    v1::Problem p;
    const absl::Status s = service_->CreateProblem(req, &p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << budget;
    EXPECT_THAT(s.message(), HasSubstr("config.scoring_budget_us")) << budget;
  }
  CreateBudgeted(250.5);
  EXPECT_EQ(GetProblem("p").config().scoring_budget_us(), 250.5);
  Reopen();
  EXPECT_EQ(GetProblem("p").config().scoring_budget_us(), 250.5);
  v1::GetProblemRequest bad;
  bad.set_problem_id("bad");
  v1::Problem p;
  EXPECT_EQ(service_->GetProblem(bad, &p).code(), absl::StatusCode::kNotFound);
}

// Auto-training with a tight budget (trees cost 40, linear models 150, budget 100): every
// linear model is skipped with the figures; a tree that does not fit retires the
// lowest-UCB selectable expert to make room; the problem is never over budget. Inline
// maintenance makes the run deterministic, and the trainer's hook sees the state each job
// decides on.
TEST_F(ScoringCostTest, AutoTrainingRetiresTheLeastUsefulToMakeRoomOrSkipsAndStaysInBudget) {
  inline_maintenance_ = true;
  Reopen();
  CreateBudgeted(100.0, /*auto_train=*/true);
  PinCosts({{"-trees-", 40.0}, {"-linear-", 150.0}});
  struct Seen {
    std::vector<v1::Expert> experts;  // before the job's tree
    v1::Estimates estimates;
    std::vector<v1::Expert> after_tree;  // before its linear model
  };
  std::map<int64_t, Seen> seen;  // by job
  trainer_hooks_.before_expert = [&](int64_t job, int expert) {
    if (expert == 0) seen[job] = {Experts(), Estimates("p"), {}};
    if (expert == 1) seen[job].after_tree = Experts();
    return absl::OkStatus();
  };
  for (int round = 0; round < 300; ++round) {
    PlayRounds("p", 1);
    ASSERT_LE(CountedCostUs(), 100.0) << "round " << round;
    ASSERT_DOUBLE_EQ(Gauge("decision_scoring_cost_seconds"), CountedCostUs() * 1e-6);
  }
  ASSERT_GE(seen.size(), 4u);
  int made_room = 0;
  for (const auto& [job_id, before] : seen) {
    const absl::StatusOr<v1::TrainingJob> job = Job(job_id);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->state(), v1::TRAINING_JOB_STATE_SUCCEEDED) << job->ShortDebugString();
    // The linear model alone is over the budget: skipped, with the figures.
    ASSERT_EQ(job->skipped_experts(), 1) << job->ShortDebugString();
    ASSERT_EQ(job->skip_reasons_size(), 1);
    EXPECT_THAT(job->skip_reasons(0), HasSubstr("expert 2 of 2: expert 'job"));
    EXPECT_THAT(job->skip_reasons(0), HasSubstr("costs 150.000 us per row"));
    EXPECT_THAT(job->skip_reasons(0), HasSubstr("scoring budget of 100 us per decision"));
    // The tree fits, by retiring if it must.
    ASSERT_EQ(job->expert_ids_size(), 1) << job->ShortDebugString();
    double counted = 0.0;
    int lowest = -1;
    double lowest_ucb = std::numeric_limits<double>::infinity();
    for (const v1::Expert& e : before.experts) {
      if (e.status() == v1::EXPERT_STATUS_ACTIVE || e.status() == v1::EXPERT_STATUS_BACKFILLING) {
        counted += e.score_cost_us();
      }
      const double ucb = before.estimates.experts(e.expert_id()).ucb();
      if (e.status() == v1::EXPERT_STATUS_ACTIVE && e.expert_id() > 0 && ucb < lowest_ucb) {
        lowest = e.expert_id();
        lowest_ucb = ucb;
      }
    }
    // What the tree's registration retired (nothing else ran in between).
    std::vector<int> retired;
    for (const v1::Expert& e : before.experts) {
      if (e.status() != v1::EXPERT_STATUS_RETIRED &&
          before.after_tree[e.expert_id()].status() == v1::EXPERT_STATUS_RETIRED) {
        retired.push_back(e.expert_id());
      }
    }
    if (counted + 40.0 <= 100.0) {
      EXPECT_TRUE(retired.empty()) << "job " << job_id;
      continue;
    }
    ++made_room;
    ASSERT_GE(lowest, 1) << "job " << job_id;
    EXPECT_EQ(retired, std::vector<int>{lowest}) << "job " << job_id;
  }
  EXPECT_GE(made_room, 1);
}

// Backfill scores the stored log on the expert-pool thread without the problem's lock:
// held in the middle of a backfill step, Choose and Reward still complete, and the progress
// is a metric.
TEST_F(ScoringCostTest, ABackfillInProgressBlocksNeitherChooseNorReward) {
  CreateBudgeted(0.0);
  PlayRounds("p", 50);
  absl::Notification scored, release;
  hooks_.after_backfill_scoring = [&](int) {
    scored.Notify();
    release.WaitForNotification();
  };
  ASSERT_TRUE(Register("slow").ok());
  std::thread maintenance([&] { EXPECT_TRUE(service_->RunMaintenance().ok()); });
  ASSERT_TRUE(scored.WaitForNotificationWithTimeout(absl::Seconds(60)));
  PlayRounds("p", 20);
  EXPECT_EQ(Experts()[1].status(), v1::EXPERT_STATUS_BACKFILLING);
  EXPECT_EQ(Gauge("decision_expert_backfill_progress", 1), 0.0);
  release.Notify();
  maintenance.join();
  hooks_.after_backfill_scoring = nullptr;
  RunMaintenanceUntilActive("p");
  EXPECT_EQ(Gauge("decision_expert_backfill_progress", 1), 1.0);
  EXPECT_EQ(GetProblem("p").samples(), 70);
}

// The backfill runs on the expert-pool thread, apart from the maintenance thread: held in
// the middle of a backfill step, the deferred decisions are still written and a decision
// whose wait passed still expires.
TEST_F(ScoringCostTest, ABackfillInProgressHoldsUpNeitherWritesNorExpiry) {
  start_maintenance_threads_ = true;
  Reopen();
  CreateBudgeted(0.0);
  PlayRounds("p", 50);
  // Shared with the expert-pool thread, which may call the hook again until shutdown.
  struct Gate {
    absl::Notification scored, release;
  };
  auto gate = std::make_shared<Gate>();
  hooks_.after_backfill_scoring = [gate](int) {
    if (!gate->scored.HasBeenNotified()) gate->scored.Notify();
    gate->release.WaitForNotification();
  };
  ASSERT_TRUE(Register("slow").ok());
  ASSERT_TRUE(gate->scored.WaitForNotificationWithTimeout(absl::Seconds(60)));
  const v1::ChooseResponse unrewarded = Choose("p");
  clock_.AdvanceMs(1'000'001);  // past the problem's reward wait
  // Polled (not timed): the maintenance thread expires it within a few rounds; with the
  // backfill on the same thread it would wait for the release below, and this would fail.
  bool expired = false;
  for (int i = 0; i < 3000 && !expired; ++i) {
    expired = GetProblem("p").samples() == 51;
    if (!expired) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(expired);
  EXPECT_EQ(Experts()[1].status(), v1::EXPERT_STATUS_BACKFILLING);
  // Expired, so its reward now comes late.
  EXPECT_TRUE(absl::IsFailedPrecondition(Reward("p", unrewarded.event_id(), 1.0)));
  gate->release.Notify();
}

}  // namespace
}  // namespace decision::server
