// Races between calls of one problem, made deterministic with the service's testing hooks
// where an interleaving matters, and run many times over where it does not: idempotent
// Choose against a reward joined in between, late rewards against each other and against
// the expiry, training jobs started from two threads; and, below the service, several
// threads scoring on one XGBoost expert (core/xgboost_expert.h), which takes no lock.
#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "core/xgboost_expert.h"
#include "core/xgboost_trainer.h"
#include "tests/service_fixture.h"

namespace decision::server {
namespace {

// Two Choose calls with one event id: the first is rewarded and joined between the second
// call's selection and its decision. The second must answer with the first's decision, and
// only one sample may be learned for the event.
TEST_F(ServiceTest, ChooseRacingAJoinOfItsEventIdDecidesOnce) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  const v1::ChooseResponse other = Choose("p", "other");  // the id filter now holds ids
  int calls = 0;
  absl::Status inner_choose = absl::UnknownError("not called");
  v1::ChooseResponse inner;
  absl::Notification inner_done;
  absl::Status inner_reward;
  hooks_.after_select = [&](const std::string& event_id) {
    if (event_id != "x" || calls++ > 0) return;
    // Between the outer Choose's two critical sections: a concurrent Choose of the same id,
    // and a reward for it.
    v1::ChooseRequest req;
    req.set_problem_id("p");
    req.set_event_id("x");
    for (int f = 0; f < kFeatures; ++f) req.add_features(0.5);
    service_->Choose(req, &inner, [&](absl::Status s) {
      inner_choose = s;
      inner_done.Notify();
    });
    inner_reward = Reward("p", "x", 1.0);
  };
  const v1::ChooseResponse outer = Choose("p", "x");
  inner_done.WaitForNotification();
  ASSERT_TRUE(inner_choose.ok()) << inner_choose;
  EXPECT_EQ(inner.SerializeAsString(), outer.SerializeAsString());
  // The reward came before any decision of "x" was answered.
  EXPECT_EQ(inner_reward.code(), absl::StatusCode::kUnavailable) << inner_reward;
  bool first = false;
  ASSERT_TRUE(Reward("p", "x", 1.0, &first).ok());
  EXPECT_TRUE(first);
  ASSERT_TRUE(Reward("p", "x", 0.0, &first).ok());
  EXPECT_FALSE(first);
  // A retry after the join still answers the same decision.
  EXPECT_EQ(Choose("p", "x").SerializeAsString(), outer.SerializeAsString());
  int samples_of_x = 0;
  for (const v1::LoggedSample& s : Export("p")) samples_of_x += s.event_id() == "x";
  EXPECT_EQ(samples_of_x, 1);
  EXPECT_EQ(GetProblem("p").samples(), 1);
}

// Late rewards for one expired event, from several threads at once: every one is told the
// event expired, and exactly one is counted as late.
TEST_F(ServiceTest, ConcurrentLateRewardsAreCountedOnce) {
  CreateProblem("p", /*wait_ms=*/1000);
  constexpr int kEvents = 100;
  constexpr int kThreads = 4;
  for (int i = 0; i < kEvents; ++i) Choose("p", absl::StrCat("e", i));
  clock_.AdvanceMs(5000);
  ASSERT_TRUE(service_->RunMaintenance().ok());  // every decision expires
  ASSERT_EQ(GetProblem("p").samples(), kEvents);
  std::atomic<int> not_late{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEvents; ++i) {
        const absl::Status s = Reward("p", absl::StrCat("e", i), 1.0);
        not_late += s.code() != absl::StatusCode::kFailedPrecondition;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(not_late.load(), 0);
  const Metrics::ProblemMetrics m = metrics_.ForProblem("p");
  EXPECT_EQ(m.rewards_late->Value(), kEvents);
  EXPECT_EQ(m.rewards_duplicate->Value(), kEvents * (kThreads - 1));
  EXPECT_EQ(GetProblem("p").samples(), kEvents);  // nothing learned from them
}

// Rewards sent after the deadline while the maintenance expires the same decisions: each is
// late (FAILED_PRECONDITION), whether it comes before, during or after the expiry's join.
TEST_F(ServiceTest, RewardRacingTheExpiryOfItsEventIsLate) {
  CreateProblem("p", /*wait_ms=*/1000);
  constexpr int kEvents = 300;
  for (int i = 0; i < kEvents; ++i) Choose("p", absl::StrCat("e", i));
  clock_.AdvanceMs(5000);
  std::atomic<bool> go{false};
  std::thread maintenance([&] {
    while (!go.load()) std::this_thread::yield();
    ASSERT_TRUE(service_->RunMaintenance().ok());
  });
  std::vector<absl::Status> answers(kEvents);
  go = true;
  for (int i = 0; i < kEvents; ++i) answers[i] = Reward("p", absl::StrCat("e", i), 1.0);
  maintenance.join();
  for (int i = 0; i < kEvents; ++i) {
    EXPECT_EQ(answers[i].code(), absl::StatusCode::kFailedPrecondition) << "e" << i << ": "
                                                                         << answers[i];
  }
  EXPECT_EQ(metrics_.ForProblem("p").rewards_late->Value(), kEvents);
  EXPECT_EQ(metrics_.ForProblem("p").rewards_learned->Value(), 0);
}

// Training jobs run one at a time even when RunPending is called from two threads (inline
// maintenance after a Reward, and TrainExperts). ThreadSanitizer (the tsan build of
// deploy/test.sh) reports the trainer's random generator if two jobs run at once.
TEST_F(ServiceTest, TrainingJobsFromTwoThreadsRunOneAtATime) {
  inline_maintenance_ = true;
  Reopen();
  CreateProblem("p", /*wait_ms=*/1'000'000);
  PlayRounds("p", 60);
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 3; ++i) {
        v1::TrainExpertsRequest req;
        req.set_problem_id("p");
        req.set_tree_experts(1);
        v1::TrainExpertsResponse resp;
        failed += !service_->TrainExperts(req, &resp).ok();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_GE(GetProblem("p").experts(), 2);
}

// Several threads predicting on one XGBoost expert, rows one at a time and in batches of
// varied sizes, get exactly what one thread gets. The expert holds no lock while libxgboost
// predicts (core/xgboost_expert.cc says why that is safe); ThreadSanitizer (the tsan stage
// of deploy/test.sh) checks the expert's own state: the pool of scratch buffers and proxy
// DMatrix handles that calls in flight take and return. libxgboost itself is not
// instrumented.
class XgboostExpertThreads : public ::testing::TestWithParam<bool> {};  // param: gblinear

INSTANTIATE_TEST_SUITE_P(Boosters, XgboostExpertThreads, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "gblinear" : "gbtree";
                         });

TEST_P(XgboostExpertThreads, ConcurrentPredictionsOnOneExpertMatchSingleThreaded) {
  constexpr int kArms = 4, kFeatures = 6, kRows = 400, kThreads = 4, kCalls = 60;
  // A fixed-seed problem: the logged arm is the largest of the first 4 features.
  std::mt19937_64 gen(20261126);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> rows(kRows * kFeatures);
  for (double& x : rows) x = unit(gen);
  TrainingSet set;
  set.num_features = kFeatures;
  for (int i = 0; i < kRows; ++i) {
    const double* x = &rows[i * kFeatures];
    const int arm = static_cast<int>(std::max_element(x, x + kArms) - x);
    set.Add(absl::MakeConstSpan(x, kFeatures), arm, 1.0, 1.0 / kArms);
  }
  XgboostTrainOptions options;
  options.linear = GetParam();
  options.rounds = 5;
  options.max_depth = 4;
  options.seed = 1;
  const absl::StatusOr<std::string> model = TrainXgboostModel(set, kArms, options);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<Expert>> loaded = MakeXgboostExpert(kArms, kFeatures, *model);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Expert& expert = **loaded;
  std::vector<double> expected(kRows * kArms);
  ASSERT_TRUE(expert.PredictBatch(rows, kRows, absl::MakeSpan(expected)).ok());

  std::atomic<bool> go{false};
  std::vector<int> failures(kThreads, 0), mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<double> probs(32 * kArms);
      while (!go.load()) std::this_thread::yield();
      for (int call = 0; call < kCalls; ++call) {
        const size_t n = (call + t) % 2 == 0 ? 1 : 1 + (call * 7 + t) % 32;  // 1..32 rows
        const size_t first = (call * 37 + t * 101) % (kRows - 32);
        const absl::Status s = expert.PredictBatch(
            absl::MakeConstSpan(rows).subspan(first * kFeatures, n * kFeatures), n,
            absl::MakeSpan(probs).subspan(0, n * kArms));
        if (!s.ok()) {
          ++failures[t];
          continue;
        }
        mismatches[t] += !std::equal(probs.begin(), probs.begin() + n * kArms,
                                     expected.begin() + first * kArms);
      }
    });
  }
  go = true;
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
    EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  }
}

}  // namespace
}  // namespace decision::server
