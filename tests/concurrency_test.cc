// Races between calls of one problem, made deterministic with the service's testing hooks
// where an interleaving matters, and run many times over where it does not: idempotent
// Choose against a reward joined in between, late rewards against each other and against
// the expiry, training jobs started from two threads.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
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

}  // namespace
}  // namespace decision::server
