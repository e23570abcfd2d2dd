// Training jobs (issue 14: a kill -9 during TrainExperts lost the job silently). The service
// in-process: a job's lifecycle (QUEUED, RUNNING, SUCCEEDED with its experts, FAILED with
// the reason), polling and its errors, a second request joining a queued job, and restarts
// that find a job unfinished: resumed for the experts still missing, never trained twice,
// or failed with the reason. The trainer runs on its own thread; TrainerHooks hold it at a
// chosen expert, so every state asserted is reached by construction, not by timing. The
// kill -9 of the real process is in crash_test.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/xgboost_trainer.h"
#include "server/training_jobs.h"
#include "storage/store.h"
#include "tests/service_fixture.h"

namespace decision::server {
namespace {

using ::testing::HasSubstr;
using storage::v1::TrainingJobRecord;

constexpr auto kJobDeadline = std::chrono::seconds(120);

class TrainingJobTest : public ServiceTest {
 protected:
  absl::StatusOr<v1::TrainExpertsResponse> Train(int trees, int linear) {
    v1::TrainExpertsRequest req;
    req.set_problem_id("p");
    req.set_tree_experts(trees);
    req.set_linear_experts(linear);
    v1::TrainExpertsResponse resp;
    absl::Status s = service_->TrainExperts(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }
  absl::StatusOr<v1::TrainingJob> Job(int64_t job_id, const std::string& problem = "p") {
    v1::GetTrainingJobRequest req;
    req.set_problem_id(problem);
    req.set_job_id(job_id);
    v1::TrainingJob job;
    absl::Status s = service_->GetTrainingJob(req, &job);
    if (!s.ok()) return s;
    return job;
  }
  // Polls until the job ended (the trainer's thread runs it); fails after kJobDeadline.
  v1::TrainingJob WaitForEnd(int64_t job_id) {
    const auto deadline = std::chrono::steady_clock::now() + kJobDeadline;
    while (true) {
      absl::StatusOr<v1::TrainingJob> job = Job(job_id);
      EXPECT_TRUE(job.ok()) << job.status();
      if (!job.ok()) return {};
      if (job->state() == v1::TRAINING_JOB_STATE_SUCCEEDED ||
          job->state() == v1::TRAINING_JOB_STATE_FAILED) {
        return *job;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "job " << job_id << " did not end: " << job->ShortDebugString();
        return *job;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // The ids of the experts named for `job_id`.
  std::set<int> ExpertsOfJob(int64_t job_id) {
    std::set<int> ids;
    for (const v1::Expert& e : Experts()) {
      if (ExpertNameIsOfJob(e.name(), job_id)) ids.insert(e.expert_id());
    }
    return ids;
  }
  // What the job reports equals what the problem holds: its experts exist under its name,
  // and a SUCCEEDED job accounts for every requested expert.
  void ExpectJobAccountsForItsExperts(const v1::TrainingJob& job) {
    const std::set<int> reported(job.expert_ids().begin(), job.expert_ids().end());
    EXPECT_EQ(static_cast<int>(reported.size()), job.expert_ids_size()) << "duplicate ids";
    EXPECT_EQ(reported, ExpertsOfJob(job.job_id())) << job.ShortDebugString();
    if (job.state() == v1::TRAINING_JOB_STATE_SUCCEEDED) {
      EXPECT_EQ(job.expert_ids_size() + job.skipped_experts(),
                job.tree_experts() + job.linear_experts())
          << job.ShortDebugString();
      EXPECT_TRUE(job.error().empty()) << job.error();
    }
  }
  // The problem with rewarded samples to train on.
  void SetUpProblem() {
    CreateProblem("p", /*wait_ms=*/1'000'000);
    PlayRounds("p", 300);
  }
  // Problem "p" with `arms` arms and `rounds` joined samples, the even arms rewarded.
  void SetUpProblemWithArms(int arms, int rounds) {
    v1::CreateProblemRequest create;
    create.set_problem_id("p");
    create.mutable_config()->set_num_arms(arms);
    create.mutable_config()->set_num_features(kFeatures);
    create.mutable_config()->set_reward_wait_ms(1'000'000);
    v1::Problem created;
    ASSERT_TRUE(service_->CreateProblem(create, &created).ok());
    for (int i = 0; i < rounds; ++i) {
      const v1::ChooseResponse c = Choose("p");
      ASSERT_TRUE(Reward("p", c.event_id(), c.arm() % 2 == 0 ? 1.0 : 0.0).ok());
    }
  }
};

// Issue 15: batch boundaries follow rounds. A maintenance round that comes late (here: the
// first one after 300 samples) queues one auto-training job per boundary passed, each
// trained on the log up to its boundary, and the lag behind the schedule is a metric.
TEST_F(TrainingJobTest, ALateMaintenanceRoundQueuesAJobForEveryBoundaryItPassed) {
  absl::Notification reached, release;
  trainer_hooks_.before_expert = [&](int64_t job, int expert) {
    if (job == 1 && expert == 0) {
      reached.Notify();
      release.WaitForNotification();
    }
    return absl::OkStatus();
  };
  CreateProblem("p", /*wait_ms=*/1'000'000, /*drop=*/false, /*auto_train_max_active=*/8);
  PlayRounds("p", 300);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  v1::GetProblemRequest get;
  get.set_problem_id("p");
  v1::Problem problem;
  ASSERT_TRUE(service_->GetProblem(get, &problem).ok());
  storage::v1::ProblemRecord record;
  record.set_num_arms(kArms);
  record.set_batch_multiplier(problem.config().batch_multiplier());
  std::vector<int64_t> boundaries;
  for (int64_t b = NextRefresh(record, 0); b <= 300; b = NextRefresh(record, b)) {
    boundaries.push_back(b);
  }
  ASSERT_GE(boundaries.size(), 4u);  // 12, 36, 78, 139, 221 with K = 4, b = 7
  EXPECT_EQ(problem.next_batch_at(), NextRefresh(record, boundaries.back()));
  for (size_t i = 0; i < boundaries.size(); ++i) {
    const absl::StatusOr<v1::TrainingJob> job = Job(static_cast<int64_t>(i) + 1);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->origin(), v1::TRAINING_JOB_ORIGIN_AUTO_TRAIN);
    EXPECT_EQ(job->samples(), boundaries[i]);
  }
  EXPECT_TRUE(absl::IsNotFound(Job(static_cast<int64_t>(boundaries.size()) + 1).status()));
  // The trainer is held at job 1: the schedule is 300 - 12 rounds behind.
  ASSERT_TRUE(reached.WaitForNotificationWithTimeout(absl::Seconds(120)));
  clock_.AdvanceMs(1000);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(MetricValue("decision_batch_lag_rounds"), 300 - boundaries[0]);
  release.Notify();
  // Each job trained on its own prefix: its experts are named for its boundary.
  for (size_t i = 0; i < boundaries.size(); ++i) {
    const v1::TrainingJob job = WaitForEnd(static_cast<int64_t>(i) + 1);
    EXPECT_EQ(job.state(), v1::TRAINING_JOB_STATE_SUCCEEDED) << job.error();
    for (int id : job.expert_ids()) {
      EXPECT_THAT(Experts()[id].name(), HasSubstr(absl::StrCat("-t", boundaries[i])));
    }
  }
}

TEST_F(TrainingJobTest, AJobIsQueuedRunsAndSucceedsWithItsExpertsDurably) {
  absl::Notification reached, release;
  trainer_hooks_.before_expert = [&](int64_t job, int expert) {
    if (job == 1 && expert == 1) {
      reached.Notify();
      release.WaitForNotification();
    }
    return absl::OkStatus();
  };
  SetUpProblem();
  const absl::StatusOr<v1::TrainExpertsResponse> first = Train(2, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->job_id(), 1);
  EXPECT_FALSE(first->joined_queued_job());
  EXPECT_GE(first->queued_jobs(), 0);
  {
    // Recorded before the call answered: QUEUED or already RUNNING.
    const absl::StatusOr<v1::TrainingJob> job = Job(1);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_THAT(job->state(), ::testing::AnyOf(v1::TRAINING_JOB_STATE_QUEUED,
                                               v1::TRAINING_JOB_STATE_RUNNING));
    EXPECT_EQ(job->problem_id(), "p");
    EXPECT_EQ(job->origin(), v1::TRAINING_JOB_ORIGIN_TRAIN_EXPERTS);
    EXPECT_EQ(job->tree_experts(), 2);
    EXPECT_EQ(job->linear_experts(), 1);
    EXPECT_EQ(job->created_at_ms(), clock_.NowMs());
  }
  ASSERT_TRUE(reached.WaitForNotificationWithTimeout(absl::Seconds(120)));
  // Held before its second expert: RUNNING, its first expert registered (or skipped).
  absl::StatusOr<v1::TrainingJob> running = Job(1);
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->state(), v1::TRAINING_JOB_STATE_RUNNING);
  EXPECT_EQ(running->expert_ids_size() + running->skipped_experts(), 1);
  // A request while job 1 runs queues job 2; another while job 2 waits joins it, and job
  // 2's counts stand.
  const absl::StatusOr<v1::TrainExpertsResponse> second = Train(1, 0);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->job_id(), 2);
  EXPECT_FALSE(second->joined_queued_job());
  EXPECT_EQ(Job(2)->state(), v1::TRAINING_JOB_STATE_QUEUED);
  const absl::StatusOr<v1::TrainExpertsResponse> third = Train(3, 3);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->job_id(), 2);
  EXPECT_TRUE(third->joined_queued_job());
  EXPECT_EQ(Job(2)->tree_experts(), 1);
  EXPECT_EQ(Job(2)->linear_experts(), 0);
  EXPECT_EQ(Job(3).status().code(), absl::StatusCode::kNotFound);
  release.Notify();

  const v1::TrainingJob one = WaitForEnd(1);
  EXPECT_EQ(one.state(), v1::TRAINING_JOB_STATE_SUCCEEDED) << one.ShortDebugString();
  ExpectJobAccountsForItsExperts(one);
  for (int id : one.expert_ids()) EXPECT_EQ(Experts()[id].kind(), "xgboost");
  const v1::TrainingJob two = WaitForEnd(2);
  EXPECT_EQ(two.state(), v1::TRAINING_JOB_STATE_SUCCEEDED) << two.ShortDebugString();
  ExpectJobAccountsForItsExperts(two);
  // Durable: a restart reports both as they ended, and resumes neither.
  const int experts = GetProblem("p").experts();
  Reopen();
  EXPECT_EQ(Job(1)->SerializeAsString(), one.SerializeAsString());
  EXPECT_EQ(Job(2)->SerializeAsString(), two.SerializeAsString());
  EXPECT_EQ(GetProblem("p").experts(), experts);
}

TEST_F(TrainingJobTest, AFailedJobRecordsWhyAndIsNotResumed) {
  SetUpProblem();
  fail_writes_ = [](absl::string_view what) { return what == "expert"; };
  const absl::StatusOr<v1::TrainExpertsResponse> r = Train(1, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::TrainingJob job = WaitForEnd(r->job_id());
  fail_writes_ = nullptr;
  EXPECT_EQ(job.state(), v1::TRAINING_JOB_STATE_FAILED);
  EXPECT_THAT(job.error(), HasSubstr("injected failure writing expert"));
  EXPECT_THAT(job.error(), HasSubstr("registering expert 1 of 1"));
  EXPECT_EQ(job.expert_ids_size(), 0);
  ExpectJobAccountsForItsExperts(job);
  Reopen();
  EXPECT_EQ(Job(r->job_id())->SerializeAsString(), job.SerializeAsString());
}

// A problem with many arms: multi:softprob grows a tree per arm and round, and a recipe of
// 40 rounds made 81,920 trees at 2048 arms, which registration refused after training: the
// job failed at its first such expert, every time. The trainer now caps the rounds of each
// tree recipe to what registration accepts (a depth-10 recipe gets four at 2048 arms).
TEST_F(TrainingJobTest, AJobOnManyArmsTrainsOnlyModelsThatRegister) {
  // Seed 12 draws two depth-10, 40-round recipes first.
  ASSERT_NO_FATAL_FAILURE(ShutDownForAFreshStart());
  seed_ = 12;
  Open();
  ASSERT_NO_FATAL_FAILURE(SetUpProblemWithArms(2048, 64));
  absl::Mutex mu;
  std::vector<XgboostTrainOptions> recipes;
  trainer_hooks_.on_start = [&](int64_t, int, const XgboostTrainOptions& recipe) {
    absl::MutexLock lock(&mu);
    recipes.push_back(recipe);
  };
  const absl::StatusOr<v1::TrainExpertsResponse> r = Train(2, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::TrainingJob job = WaitForEnd(r->job_id());
  EXPECT_EQ(job.state(), v1::TRAINING_JOB_STATE_SUCCEEDED) << job.ShortDebugString();
  EXPECT_EQ(job.expert_ids_size(), 2) << job.ShortDebugString();
  ExpectJobAccountsForItsExperts(job);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(recipes.size(), 2);
  for (const XgboostTrainOptions& recipe : recipes) {
    EXPECT_EQ(recipe.max_depth, 10);
    EXPECT_EQ(recipe.rounds, 4);
  }
}

// Training keeps a gradient, a curvature and a prediction per sample and arm, and the
// sample's features, so a job reads at most 2^23 / (arms + features) samples of the log
// (the newest): 2046 at 4096 arms and 3 features. Where arms + features <= 41 the 200,000
// samples of kMaxTrainingSamples bind first.
TEST_F(TrainingJobTest, AJobOnManyArmsReadsAtMostItsRowsTimesArmsOfTheLog) {
  EXPECT_EQ(MaxTrainingSamples(2, 3), kMaxTrainingSamples);
  EXPECT_EQ(MaxTrainingSamples(26, 15), kMaxTrainingSamples);
  EXPECT_EQ(MaxTrainingSamples(26, 16), (size_t{1} << 23) / 42);  // letter
  EXPECT_EQ(MaxTrainingSamples(4096, 3), (size_t{1} << 23) / 4099);
  EXPECT_EQ(MaxTrainingSamples(2, 65536), (size_t{1} << 23) / 65538);
  EXPECT_EQ(MaxTrainingSamples(4096, 65536 * 128), 1);
  ASSERT_NO_FATAL_FAILURE(SetUpProblemWithArms(4096, 2100));
  absl::Notification read;
  size_t samples_read = 0;
  trainer_hooks_.on_training_set = [&](int64_t, size_t samples) {
    samples_read = samples;
    read.Notify();
  };
  // The job stops there, as a shutdown would stop it: training is not what is tested.
  trainer_hooks_.before_expert = [](int64_t, int) { return absl::CancelledError("test"); };
  ASSERT_TRUE(Train(0, 1).ok());
  ASSERT_TRUE(read.WaitForNotificationWithTimeout(absl::Seconds(120)));
  EXPECT_EQ(samples_read, (size_t{1} << 23) / (4096 + kFeatures));
}

// TrainExperts answers OK only for a job it recorded.
TEST_F(TrainingJobTest, AJobThatCannotBeRecordedIsRefusedAndNotQueued) {
  SetUpProblem();
  fail_writes_ = [](absl::string_view what) { return what == "training job"; };
  EXPECT_EQ(Train(1, 0).status().code(), absl::StatusCode::kInternal);
  fail_writes_ = nullptr;
  EXPECT_EQ(Job(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetProblem("p").experts(), 1);
  const absl::StatusOr<v1::TrainExpertsResponse> r = Train(1, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->job_id(), 1);
  EXPECT_EQ(WaitForEnd(1).state(), v1::TRAINING_JOB_STATE_SUCCEEDED);
}

// A job trains its experts side by side on --training_threads threads, one XGBoost thread
// each, every recipe drawn in the experts' order: the same log gives the same models, byte
// for byte, on one thread or three.
TEST_F(TrainingJobTest, AJobTrainsTheSameModelsOnAnyNumberOfThreads) {
  std::vector<std::string> models[2];
  for (int run = 0; run < 2; ++run) {
    ASSERT_NO_FATAL_FAILURE(ShutDownForAFreshStart());
    training_threads_ = run == 0 ? 1 : 3;
    Open();
    SetUpProblem();
    ASSERT_TRUE(Train(3, 2).ok());
    const v1::TrainingJob job = WaitForEnd(1);
    ASSERT_EQ(job.state(), v1::TRAINING_JOB_STATE_SUCCEEDED) << job.error();
    ASSERT_EQ(job.expert_ids_size(), 5) << job.ShortDebugString();
    ASSERT_TRUE(service_->Shutdown().ok());
    service_.reset();
    {
      auto store = storage::Store::Open(dir_, storage::StoreOptions());
      ASSERT_TRUE(store.ok()) << store.status();
      for (int id : job.expert_ids()) {
        absl::StatusOr<storage::v1::ExpertRecord> r =
            (*store)->GetExpert(0, static_cast<uint32_t>(id));
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_FALSE(r->model().xgboost().empty()) << id;
        models[run].push_back(r->model().xgboost());
      }
    }
    Open();
  }
  ASSERT_EQ(models[0].size(), 5u);
  for (size_t i = 0; i < models[0].size(); ++i) {
    EXPECT_TRUE(models[0][i] == models[1][i]) << "expert " << i << " differs";
  }
  // The experts differ from one another (each draws its own recipe and seed).
  EXPECT_NE(models[0][0], models[0][1]);
}

// A job registers its experts in order, but a thread that has finished one starts another
// at once: with two threads, expert 2 starts while expert 0 is still training.
TEST_F(TrainingJobTest, AFreeThreadStartsTheNextExpertWhileAnEarlierOneTrains) {
  ASSERT_NO_FATAL_FAILURE(ShutDownForAFreshStart());
  training_threads_ = 2;
  absl::Notification third_started, release;
  trainer_hooks_.after_training = [&](int64_t job, int expert) {
    if (job == 1 && expert == 0) release.WaitForNotification();  // expert 0 stays busy
  };
  trainer_hooks_.before_expert = [&](int64_t job, int expert) {
    if (job == 1 && expert == 2) third_started.Notify();
    return absl::OkStatus();
  };
  Open();
  SetUpProblem();
  ASSERT_TRUE(Train(3, 0).ok());
  EXPECT_TRUE(third_started.WaitForNotificationWithTimeout(absl::Seconds(120)))
      << "expert 2 waited for expert 0";
  release.Notify();
  const v1::TrainingJob job = WaitForEnd(1);
  EXPECT_EQ(job.state(), v1::TRAINING_JOB_STATE_SUCCEEDED) << job.error();
  ExpectJobAccountsForItsExperts(job);
}

// With more than one thread, a free thread starts the costliest expert not started yet
// (the longest first: a long expert started last would end the job alone), and the
// experts still register in their order.
TEST_F(TrainingJobTest, AFreeThreadStartsTheCostliestExpertNotStarted) {
  ASSERT_NO_FATAL_FAILURE(ShutDownForAFreshStart());
  training_threads_ = 2;
  absl::Mutex mu;
  std::vector<int> started;    // guarded by mu
  std::map<int, double> cost;  // guarded by mu
  trainer_hooks_.on_start = [&](int64_t job, int expert, const XgboostTrainOptions& recipe) {
    absl::MutexLock lock(&mu);
    if (job != 1) return;
    started.push_back(expert);
    cost[expert] = RelativeTrainingCost(recipe);
  };
  Open();
  SetUpProblem();
  ASSERT_TRUE(Train(5, 1).ok());
  const v1::TrainingJob job = WaitForEnd(1);
  ASSERT_EQ(job.state(), v1::TRAINING_JOB_STATE_SUCCEEDED) << job.error();
  ExpectJobAccountsForItsExperts(job);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(started.size(), 6u);
  std::string order;
  for (int e : started) absl::StrAppend(&order, " ", e, " (", cost[e], ")");
  for (size_t k = 1; k < started.size(); ++k) {
    EXPECT_GE(cost[started[k - 1]], cost[started[k]]) << "started:" << order;
  }
  // This seed's recipes are not drawn in the order of their costs (else the test would
  // not tell the two rules apart).
  EXPECT_FALSE(std::is_sorted(started.begin(), started.end())) << "started:" << order;
  // Registered in the experts' order: ids ascending.
  EXPECT_TRUE(std::is_sorted(job.expert_ids().begin(), job.expert_ids().end()))
      << job.ShortDebugString();
}

TEST_F(TrainingJobTest, PollingErrorsNameWhatIsWrong) {
  SetUpProblem();
  EXPECT_EQ(Job(1).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(Train(1, 0).ok());
  EXPECT_TRUE(Job(1).ok());
  const absl::Status zero = Job(0).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(zero.message()), HasSubstr("job_id is 0"));
  EXPECT_EQ(Job(-5).status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status unknown = Job(2).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("no training job 2"));
  EXPECT_EQ(Job(1, "nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Job(1, "").status().code(), absl::StatusCode::kInvalidArgument);
  // Counts whose int32 sum overflows are refused, not wrapped into a small job.
  EXPECT_EQ(Train(std::numeric_limits<int32_t>::max(), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Train(1, std::numeric_limits<int32_t>::max()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WaitForEnd(1).state(), v1::TRAINING_JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Job(2).status().code(), absl::StatusCode::kNotFound);
}

// The job stops after two of its four experts, its record RUNNING, as a crash would leave
// it; the restart queues it again for the two missing.
TEST_F(TrainingJobTest, ARestartResumesAJobLeftRunningForTheMissingExperts) {
  absl::Notification abandoned;
  std::atomic<bool> crash{true};
  trainer_hooks_.before_expert = [&](int64_t job, int expert) {
    if (job == 1 && expert == 2 && crash.load()) {
      abandoned.Notify();
      return absl::InternalError("simulated crash");
    }
    return absl::OkStatus();
  };
  SetUpProblem();
  ASSERT_TRUE(Train(4, 0).ok());
  ASSERT_TRUE(abandoned.WaitForNotificationWithTimeout(absl::Seconds(120)));
  const absl::StatusOr<v1::TrainingJob> before = Job(1);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->state(), v1::TRAINING_JOB_STATE_RUNNING);
  EXPECT_EQ(before->expert_ids_size() + before->skipped_experts(), 2);
  crash = false;
  Reopen();
  const v1::TrainingJob after = WaitForEnd(1);
  EXPECT_EQ(after.state(), v1::TRAINING_JOB_STATE_SUCCEEDED) << after.ShortDebugString();
  EXPECT_EQ(after.interruptions(), 1);
  ExpectJobAccountsForItsExperts(after);
  // The experts of the first run are kept, not trained again.
  for (int i = 0; i < before->expert_ids_size(); ++i) {
    EXPECT_EQ(after.expert_ids(i), before->expert_ids(i));
  }
}

// A crash between an expert's registration and the job's record update: the restart finds
// the expert by its name and does not train it again.
TEST_F(TrainingJobTest, AnExpertRegisteredAfterTheLastRecordWriteIsCountedAtRestart) {
  SetUpProblem();
  ASSERT_TRUE(Train(3, 0).ok());
  const v1::TrainingJob ended = WaitForEnd(1);
  ASSERT_EQ(ended.state(), v1::TRAINING_JOB_STATE_SUCCEEDED);
  ASSERT_GE(ended.expert_ids_size(), 1) << "every expert diverged";
  const int experts = GetProblem("p").experts();
  ASSERT_TRUE(service_->Shutdown().ok());
  service_.reset();
  {
    // The record as it was before its last expert's update, and still RUNNING.
    auto store = storage::Store::Open(dir_, {});
    ASSERT_TRUE(store.ok()) << store.status();
    TrainingJobRecord record;
    uint32_t index = 0;
    ASSERT_TRUE((*store)
                    ->ForEachTrainingJob([&](uint32_t problem, int64_t, const TrainingJobRecord& r) {
                      index = problem;
                      record = r;
                      return absl::OkStatus();
                    })
                    .ok());
    record.set_state(storage::v1::TRAINING_JOB_STATE_RUNNING);
    record.mutable_expert_ids()->RemoveLast();
    ASSERT_TRUE((*store)->PutTrainingJob(index, 1, record).ok());
    ASSERT_TRUE((*store)->Close().ok());
  }
  Open();
  const absl::StatusOr<v1::TrainingJob> job = Job(1);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::TRAINING_JOB_STATE_SUCCEEDED) << job->ShortDebugString();
  EXPECT_EQ(std::vector<int>(job->expert_ids().begin(), job->expert_ids().end()),
            std::vector<int>(ended.expert_ids().begin(), ended.expert_ids().end()));
  EXPECT_EQ(GetProblem("p").experts(), experts);
  ExpectJobAccountsForItsExperts(*job);
}

// A restart requeues the auto-training jobs it finds unfinished; a TrainExperts then gets a
// job of its own, as before the restart, rather than joining one of them (whose counts and
// training set are the schedule's, not the caller's).
TEST_F(TrainingJobTest, ATrainExpertsAfterARestartDoesNotJoinAnAutoTrainingJob) {
  std::atomic<bool> abandon{true};
  absl::Notification held, release;
  trainer_hooks_.before_expert = [&](int64_t, int) -> absl::Status {
    if (abandon.load()) return absl::InternalError("simulated crash");
    if (!held.HasBeenNotified()) {
      held.Notify();
      release.WaitForNotification();
    }
    return absl::OkStatus();
  };
  // The trainer calls the hook, which refers to this test's locals: the service stops
  // before they go, whatever the test's outcome.
  absl::Cleanup stop_service = [&] {
    abandon = true;
    if (!release.HasBeenNotified()) release.Notify();
    if (service_ != nullptr) {
      EXPECT_TRUE(service_->Shutdown().ok());
      service_.reset();
    }
  };
  CreateProblem("p", /*wait_ms=*/1'000'000, /*drop=*/false, /*auto_train_max_active=*/8);
  PlayRounds("p", 300);
  ASSERT_TRUE(service_->RunMaintenance().ok());  // queues a job per boundary passed
  int64_t jobs = 0;
  while (Job(jobs + 1).ok()) ++jobs;
  ASSERT_GE(jobs, 2);
  for (int64_t j = 1; j <= jobs; ++j) {
    for (int i = 0; i < 24000 && Job(j)->state() != v1::TRAINING_JOB_STATE_RUNNING; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(Job(j)->state(), v1::TRAINING_JOB_STATE_RUNNING);  // abandoned mid-way
  }
  abandon = false;
  Reopen();  // requeues them all; the trainer holds the first, the others stay queued
  ASSERT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(120)));
  const absl::StatusOr<v1::TrainExpertsResponse> mine = Train(1, 0);
  abandon = true;  // the rest end quickly
  release.Notify();
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_FALSE(mine->joined_queued_job());
  EXPECT_EQ(mine->job_id(), jobs + 1);
  const absl::StatusOr<v1::TrainingJob> job = Job(mine->job_id());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->origin(), v1::TRAINING_JOB_ORIGIN_TRAIN_EXPERTS);
}

// A restart counts an expert named "job<id>-trees-t<n>" as that job's: a client may not
// register one under such a name.
TEST_F(TrainingJobTest, AClientCannotRegisterAnExpertUnderATrainedExpertsName) {
  SetUpProblem();
  for (const std::string name : {"job3-trees-t4000", "job12-linear-t7"}) {
    v1::RegisterExpertRequest req = LinearRequest("p", 1.0);
    req.set_name(name);
    v1::Expert e;
    const absl::Status s = service_->RegisterExpert(req, &e);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(s.message(), HasSubstr("has the form of a trained expert's name")) << name;
  }
  for (const std::string name : {"job-trees-t1", "jobx-trees-t1", "job3-tree", "my-job3"}) {
    EXPECT_FALSE(IsTrainedExpertName(name)) << name;
  }
  EXPECT_TRUE(IsTrainedExpertName(TrainedExpertName(42, /*linear=*/true, 100)));
  EXPECT_EQ(GetProblem("p").experts(), 1);
}

// A problem at its expert cap could register none of the experts a job would train: the
// request is refused before the training's CPU is spent.
TEST_F(TrainingJobTest, TrainExpertsAtTheExpertCapIsRefusedUpFront) {
  max_experts_per_problem_ = 2;
  Reopen();
  SetUpProblem();
  RegisterLinear("p", 1.0);
  const absl::StatusOr<v1::TrainExpertsResponse> r = Train(1, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("--max_experts_per_problem=2"));
  EXPECT_TRUE(absl::IsNotFound(Job(1).status()));
}

// ------------------------------------------------------- PrepareResume, the pure decision

std::vector<v1::Expert> ExpertsNamed(const std::vector<std::string>& names) {
  std::vector<v1::Expert> out;
  for (const std::string& name : names) {
    v1::Expert e;
    e.set_expert_id(static_cast<int>(out.size()));
    e.set_name(name);
    out.push_back(e);
  }
  return out;
}

TrainingJobRecord RunningJob(int trees, std::vector<int> ids, int first_expert_id) {
  TrainingJobRecord r;
  r.set_job_id(1);
  r.set_problem_id("p");
  r.set_tree_experts(trees);
  r.set_state(storage::v1::TRAINING_JOB_STATE_RUNNING);
  for (int id : ids) r.add_expert_ids(id);
  r.set_first_expert_id(first_expert_id);
  return r;
}

TEST(PrepareResumeTest, QueuesTheMissingExpertsAndAdoptsOnlyThisJobsUnrecordedOnes) {
  // Expert 1: another job's (job11); 2 recorded; 3 unrecorded (a crash before the update);
  // 4 a client's expert with an unrelated name.
  const auto experts =
      ExpertsNamed({"uniform", "job11-trees-t5", "job1-trees-t9", "job1-trees-t9", "mine"});
  TrainingJobRecord r = RunningJob(4, {2}, 2);
  EXPECT_TRUE(PrepareResume(&experts, true, &r));
  EXPECT_EQ(r.state(), storage::v1::TRAINING_JOB_STATE_QUEUED);
  EXPECT_EQ(std::vector<int>(r.expert_ids().begin(), r.expert_ids().end()),
            std::vector<int>({2, 3}));
  EXPECT_EQ(r.interruptions(), 1);
  // Found QUEUED (never started, or resumed and not started again): not an interruption.
  r.set_state(storage::v1::TRAINING_JOB_STATE_QUEUED);
  EXPECT_TRUE(PrepareResume(&experts, true, &r));
  EXPECT_EQ(r.interruptions(), 1);
}

TEST(PrepareResumeTest, AJobWithNothingLeftSucceeds) {
  const auto experts = ExpertsNamed({"uniform", "job1-trees-t9", "job1-linear-t9"});
  TrainingJobRecord r = RunningJob(1, {1}, 1);
  r.set_linear_experts(1);
  EXPECT_FALSE(PrepareResume(&experts, false, &r));
  EXPECT_EQ(r.state(), storage::v1::TRAINING_JOB_STATE_SUCCEEDED);
  EXPECT_EQ(r.expert_ids_size(), 2);
}

TEST(PrepareResumeTest, AJobThatCannotGoOnFailsWithTheReason) {
  const auto experts = ExpertsNamed({"uniform", "job1-trees-t9"});
  struct Case {
    const char* name;
    TrainingJobRecord record;
    const std::vector<v1::Expert>* experts;
    bool positive;
    const char* why;
  };
  TrainingJobRecord too_many = RunningJob(17, {}, 1);
  TrainingJobRecord negative = RunningJob(-1, {}, 1);
  TrainingJobRecord bad_id = RunningJob(3, {7}, 1);
  TrainingJobRecord interrupted = RunningJob(3, {1}, 1);
  interrupted.set_interruptions(kMaxTrainingJobInterruptions - 1);
  const Case cases[] = {
      {"problem gone", RunningJob(3, {}, 1), nullptr, true, "not loaded"},
      {"no positive reward", RunningJob(3, {1}, 1), &experts, false, "positive reward"},
      {"counts over the limit", too_many, &experts, true, "inconsistent"},
      {"negative count", negative, &experts, true, "inconsistent"},
      {"expert id out of range", bad_id, &experts, true, "inconsistent"},
      {"interrupted too often", interrupted, &experts, true, "interrupted by 3 restarts"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TrainingJobRecord r = c.record;
    EXPECT_FALSE(PrepareResume(c.experts, c.positive, &r));
    EXPECT_EQ(r.state(), storage::v1::TRAINING_JOB_STATE_FAILED);
    EXPECT_THAT(r.error(), HasSubstr(c.why));
    EXPECT_THAT(r.error(), HasSubstr("found RUNNING at a restart"));
  }
}

TEST(TrainedExpertNameTest, NamesTheJobAndIsRecognisedOnlyForIt) {
  EXPECT_EQ(TrainedExpertName(7, false, 1234), "job7-trees-t1234");
  EXPECT_EQ(TrainedExpertName(7, true, 5), "job7-linear-t5");
  EXPECT_TRUE(ExpertNameIsOfJob("job7-trees-t1234", 7));
  EXPECT_TRUE(ExpertNameIsOfJob("job7-linear-t5", 7));
  EXPECT_FALSE(ExpertNameIsOfJob("job7-trees-t1234", 70));
  EXPECT_FALSE(ExpertNameIsOfJob("job70-trees-t1234", 7));
  EXPECT_FALSE(ExpertNameIsOfJob("job7-", 7));
  EXPECT_FALSE(ExpertNameIsOfJob("trained-trees-t12", 7));
}

}  // namespace
}  // namespace decision::server
