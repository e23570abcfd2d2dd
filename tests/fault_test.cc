// Faults inside the service, made with its testing seams (store writes that fail, a sample
// the estimator refuses) or by writing bad records into the store: each stays local, is
// reported with the right status, and nothing stored is lost or overwritten.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "rocksdb/db.h"
#include "server/auth.h"
#include "server/grpc_service.h"
#include "storage/format.h"
#include "storage/store.h"
#include "tests/grpc_harness.h"
#include "tests/service_fixture.h"

namespace decision::server {
namespace {

using ::testing::HasSubstr;

// A sample written but not learned (the estimator refused it) must not be overwritten by
// the next join, which would take the same log position: its reward is acknowledged (it
// is durable), then joins stop until a restart, which learns the stored sample.
TEST_F(ServiceTest, ASampleThatCannotBeLearnedIsNeverOverwritten) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  Choose("p", "a");
  Choose("p", "b");
  int failures = 1;
  hooks_.before_learn = [&](int64_t) {
    return failures-- > 0 ? absl::InternalError("injected") : absl::OkStatus();
  };
  const absl::Status a = Reward("p", "a", 1.0);
  EXPECT_TRUE(a.ok()) << a;  // written: learning trails the acknowledgement
  EXPECT_EQ(GetProblem("p").samples(), 0);  // and the learner refused it
  const absl::Status b = Reward("p", "b", 0.0);
  EXPECT_EQ(b.code(), absl::StatusCode::kInternal) << b;
  EXPECT_THAT(b.message(), HasSubstr("restart"));
  std::vector<v1::LoggedSample> log = Export("p");
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].event_id(), "a");

  hooks_.before_learn = nullptr;
  Reopen();
  EXPECT_EQ(GetProblem("p").samples(), 1);  // "a", learned from the store
  bool first = false;
  ASSERT_TRUE(Reward("p", "b", 0.0, &first).ok());
  EXPECT_TRUE(first);
  log = Export("p");
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].event_id(), "a");
  EXPECT_EQ(log[1].event_id(), "b");
  ExpectEstimatesMatchReference("p");
}

// The same when the refused sample shares its group with later joins: they were written
// (and acknowledged) past it, so they are not learned (not at the wrong position either),
// the joins after them are refused, and a restart learns all of them from the store.
TEST_F(ServiceTest, JoinsAfterARefusedSampleInItsGroupAreNotLearnedOutOfPlace) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  for (const char* e : {"a0", "a", "b", "c"}) Choose("p", e);
  absl::Notification in_write, release;
  std::atomic<bool> hold{true};
  // The first group write (a0's join) waits in the writer until a and b are queued.
  fail_writes_ = [&](absl::string_view what) {
    if (what == "group" && hold.exchange(false)) {
      in_write.Notify();
      release.WaitForNotification();
    }
    return false;
  };
  int failures = 1;  // sample 1 ("a") is refused once
  hooks_.before_learn = [&](int64_t seq) {
    return seq == 1 && failures-- > 0 ? absl::InternalError("injected") : absl::OkStatus();
  };
  std::vector<absl::Status> answers(3);
  std::vector<v1::RewardResponse> responses(3);
  std::vector<v1::RewardRequest> requests(3);
  absl::BlockingCounter answered(3);
  auto reward = [&](int i, const char* event_id) {
    requests[i].set_problem_id("p");
    requests[i].set_event_id(event_id);
    requests[i].set_value(1.0);
    service_->Reward(requests[i], &responses[i], [&, i](absl::Status s) {
      answers[i] = s;
      answered.DecrementCount();
    });
  };
  reward(0, "a0");  // the asynchronous form: committed by the writer thread
  in_write.WaitForNotification();
  reward(1, "a");
  reward(2, "b");  // a and b: one group, after a0's
  release.Notify();
  answered.Wait();
  for (const absl::Status& answer : answers) EXPECT_TRUE(answer.ok()) << answer;
  EXPECT_EQ(GetProblem("p").samples(), 1);
  const absl::Status c = Reward("p", "c", 1.0);
  EXPECT_EQ(c.code(), absl::StatusCode::kInternal) << c;
  EXPECT_THAT(c.message(), HasSubstr("restart"));
  std::vector<v1::LoggedSample> log = Export("p");
  ASSERT_EQ(log.size(), 3u);  // all three are stored, c is not
  EXPECT_EQ(log[1].event_id(), "a");
  EXPECT_EQ(log[2].event_id(), "b");

  hooks_.before_learn = nullptr;
  fail_writes_ = nullptr;
  Reopen();
  EXPECT_EQ(GetProblem("p").samples(), 3);
  ExpectEstimatesMatchReference("p");
}

// CreateProblem is one write: whichever write fails, after a restart the problem either
// exists and serves, or does not exist; and it exists exactly when the call succeeded.
TEST_F(ServiceTest, CreateProblemIsAtomic) {
  for (int fail_from = 0; fail_from < 5; ++fail_from) {
    SCOPED_TRACE(absl::StrCat("store writes fail from the ", fail_from, "th on"));
    const std::string id = absl::StrCat("p", fail_from);
    int writes = 0;
    fail_writes_ = [&](absl::string_view) { return writes++ >= fail_from; };
    v1::CreateProblemRequest req;
    req.set_problem_id(id);
    req.mutable_config()->set_num_arms(kArms);
    req.mutable_config()->set_num_features(kFeatures);
    v1::Problem created;
    const absl::Status s = service_->CreateProblem(req, &created);
    fail_writes_ = nullptr;
    Reopen();
    v1::GetProblemRequest get;
    get.set_problem_id(id);
    v1::Problem p;
    const absl::Status found = service_->GetProblem(get, &p);
    if (!s.ok()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
      EXPECT_EQ(found.code(), absl::StatusCode::kNotFound) << found;
      continue;
    }
    ASSERT_TRUE(found.ok()) << found;
    EXPECT_EQ(p.experts(), 1);
    v1::ChooseRequest choose;
    choose.set_problem_id(id);
    for (int f = 0; f < kFeatures; ++f) choose.add_features(0.5);
    v1::ChooseResponse c;
    EXPECT_TRUE(service_->Choose(choose, &c).ok());
  }
}

// Shutdown is clean only if everything answered is on disk.
TEST_F(ServiceTest, ShutdownReportsAFailedFinalWriteOfDecisions) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  Choose("p", "a");  // deferred: answered, not written yet
  fail_writes_ = [](absl::string_view what) { return what == "group"; };
  const absl::Status s = service_->Shutdown();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_THAT(s.message(), HasSubstr("injected"));
  fail_writes_ = nullptr;
  service_.reset();
  Open();
  EXPECT_EQ(GetProblem("p").pending(), 0);  // the decision was lost, and that was reported
}

// A failing task of a maintenance round (here: writing a log chunk) is reported, and the
// round's other tasks still run (here: the expiry).
TEST_F(ServiceTest, AFailedMaintenanceTaskDoesNotStopTheOthers) {
  CreateProblem("p", /*wait_ms=*/1000);
  PlayRounds("p", static_cast<int>(storage::kLogChunkSamples));  // completes log chunk 0
  Choose("p", "late");
  clock_.AdvanceMs(5000);
  fail_writes_ = [](absl::string_view what) { return what == "log chunk"; };
  const absl::Status round = service_->RunMaintenance();
  EXPECT_EQ(round.code(), absl::StatusCode::kInternal) << round;
  EXPECT_THAT(round.message(), HasSubstr("log chunk"));
  const v1::Problem p = GetProblem("p");
  EXPECT_EQ(p.pending(), 0);  // expired all the same
  EXPECT_EQ(p.samples(), storage::kLogChunkSamples + 1);
  fail_writes_ = nullptr;
  EXPECT_TRUE(service_->RunMaintenance().ok());  // the chunk is written now
  Reopen();
  EXPECT_EQ(GetProblem("p").samples(), storage::kLogChunkSamples + 1);
  ExpectEstimatesMatchReference("p");
}

// A store that cannot be opened (here: another service holds its lock) is a clear error,
// and the half-built service is torn down without touching what it never started.
TEST_F(ServiceTest, AStoreThatCannotBeOpenedIsAClearError) {
  ServiceOptions options;
  options.data_dir = dir_;  // the fixture's service holds it
  options.start_maintenance_thread = false;
  const absl::StatusOr<std::unique_ptr<DecisionService>> second =
      DecisionService::Open(options, &clock_, &metrics_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInternal) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("cannot open the store at"));
  EXPECT_THAT(second.status().message(), HasSubstr("lock"));
}

// Restart checks every size a record states before indexing with it: a record that does not
// fit the problem is DATA_LOSS, never a read out of bounds.
class CorruptRecordTest : public ServiceTest {
 protected:
  // A problem with a few samples, and a second one, then the service closed and `corrupt`
  // applied to the store (problem index 0, "p"), then the service opened again. Returns
  // what loading "p" gave. Whatever it is, the service opens and "q" serves: one problem
  // that cannot be loaded never keeps the others down.
  absl::Status OpenAfter(const std::function<absl::Status(storage::Store&)>& corrupt) {
    CreateProblem("p", /*wait_ms=*/1'000'000);
    CreateProblem("q", /*wait_ms=*/1'000'000);
    RegisterLinear("p", 4.0);
    RunMaintenanceUntilActive("p");
    PlayRounds("p", 20);
    PlayRounds("q", 5);
    EXPECT_TRUE(service_->Shutdown().ok());
    service_.reset();
    {
      absl::StatusOr<std::unique_ptr<storage::Store>> store =
          storage::Store::Open(dir_, storage::StoreOptions());
      EXPECT_TRUE(store.ok()) << store.status();
      EXPECT_TRUE(corrupt(**store).ok());
    }
    ServiceOptions options;
    options.data_dir = dir_;
    options.start_maintenance_thread = false;
    absl::StatusOr<std::unique_ptr<DecisionService>> opened =
        DecisionService::Open(options, &clock_, &metrics_);
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) return opened.status();
    service_ = *std::move(opened);
    v1::ChooseRequest choose;
    choose.set_problem_id("q");
    for (int i = 0; i < kFeatures; ++i) choose.add_features(0.5);
    v1::ChooseResponse chosen;
    EXPECT_TRUE(service_->Choose(choose, &chosen).ok());
    const absl::Status loaded = service_->ProblemLoadStatus("p");
    if (!loaded.ok()) {
      // Every call to the failed problem says why; it is listed with its error.
      v1::GetProblemRequest get;
      get.set_problem_id("p");
      v1::Problem problem;
      const absl::Status got = service_->GetProblem(get, &problem);
      EXPECT_EQ(got.code(), absl::StatusCode::kFailedPrecondition) << got;
      EXPECT_THAT(got.message(), HasSubstr(loaded.ToString()));
      choose.set_problem_id("p");
      EXPECT_EQ(service_->Choose(choose, &chosen).code(), absl::StatusCode::kFailedPrecondition);
      v1::ListProblemsResponse list;
      EXPECT_TRUE(service_->ListProblems({}, &list).ok());
      EXPECT_EQ(list.problems_size(), 2);
      if (list.problems_size() == 2) {
        EXPECT_THAT(list.problems(0).error(), HasSubstr(std::string(loaded.message())));
        EXPECT_EQ(list.problems(1).error(), "");
      }
      EXPECT_EQ(metrics_.ProblemFailed("p").Value(), 1.0);
    }
    return loaded;
  }
};

// The value of gauge `name` with label expert=`expert`, or -1.
double ExpertGauge(Metrics& metrics, const std::string& name, const std::string& expert) {
  for (const prometheus::MetricFamily& family : metrics.registry()->Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      for (const prometheus::ClientMetric::Label& label : m.label) {
        if (label.name == "expert" && label.value == expert) return m.gauge.value;
      }
    }
  }
  return -1.0;
}

// A stored model that no longer loads (written by another version, or damaged) marks its
// expert FAILED at restart; the problem serves with the others.
TEST_F(CorruptRecordTest, AStoredModelThatNoLongerLoadsFailsItsExpertAlone) {
  ASSERT_TRUE(OpenAfter([](storage::Store& store) -> absl::Status {
                storage::v1::ExpertRecord linear;
                absl::Status found = store.ForEachExpert(
                    0, [&](uint32_t id, const storage::v1::ExpertRecord& r) {
                      if (id == 1) linear = r;
                      return absl::OkStatus();
                    });
                if (!found.ok()) return found;
                linear.mutable_model()->set_xgboost("{\"learner\": {\"truncated");
                return store.PutExpert(0, 1, linear);
              }).ok());
  v1::ListExpertsRequest list;
  list.set_problem_id("p");
  v1::ListExpertsResponse listed;
  ASSERT_TRUE(service_->ListExperts(list, &listed).ok());
  const auto& experts = listed.experts();
  ASSERT_EQ(experts.size(), 2);
  EXPECT_EQ(experts[0].status(), v1::EXPERT_STATUS_ACTIVE);
  EXPECT_EQ(experts[1].status(), v1::EXPERT_STATUS_FAILED);
  EXPECT_THAT(experts[1].error(), HasSubstr("xgboost"));
  EXPECT_EQ(ExpertGauge(metrics_, "decision_expert_failed", "1"), 1.0);
  EXPECT_EQ(ExpertGauge(metrics_, "decision_expert_failed", "0"), 0.0);
  // The problem serves: never with the failed expert, and rewards are learned.
  const int64_t before = GetProblem("p").samples();
  for (int i = 0; i < 30; ++i) {
    const v1::ChooseResponse c = Choose("p");
    EXPECT_EQ(c.expert_id(), 0);
    ASSERT_TRUE(Reward("p", c.event_id(), 1.0).ok());
  }
  EXPECT_EQ(GetProblem("p").samples(), before + 30);
  // It can be retired although it is not selectable (and expert 0 is the last that is).
  v1::RetireExpertRequest retire;
  retire.set_problem_id("p");
  retire.set_expert_id(1);
  v1::Expert retired;
  ASSERT_TRUE(service_->RetireExpert(retire, &retired).ok());
}

// Applies `edit` to problem 0's checkpoint.
std::function<absl::Status(storage::Store&)> EditCheckpoint(
    std::function<void(storage::v1::CheckpointRecord*)> edit) {
  return [edit](storage::Store& store) -> absl::Status {
    absl::StatusOr<storage::v1::CheckpointRecord> c = store.GetCheckpoint(0);
    if (!c.ok()) return c.status();
    edit(&*c);
    return store.PutCheckpoint(0, *c);
  };
}

// The same for the estimators' state; a null edit deletes it (a store written before it
// existed).
std::function<absl::Status(storage::Store&)> EditEstimatorState(
    std::function<void(storage::v1::EstimatorStateRecord*)> edit) {
  return [edit](storage::Store& store) -> absl::Status {
    if (edit == nullptr) return store.DeleteEstimatorState(0);
    absl::StatusOr<storage::v1::CheckpointRecord> c = store.GetCheckpoint(0);
    absl::StatusOr<storage::v1::EstimatorStateRecord> state = store.GetEstimatorState(0);
    if (!c.ok()) return c.status();
    if (!state.ok()) return state.status();
    edit(&*state);
    return store.PutCheckpoint(0, *c, &*state);
  };
}

storage::v1::LogChunk FullChunk(int experts) {
  storage::v1::LogChunk c;
  c.set_num_experts(experts);
  for (int64_t i = 0; i < storage::kLogChunkSamples; ++i) {
    c.add_chooser(0);
    c.add_reward(0.0);
    for (int k = 0; k < experts; ++k) c.add_propensities(0.25);
  }
  return c;
}

// Found by tests/fuzz/record_fuzz: nothing checked the problem record itself, which sizes
// the problem: a damaged one (here num_features = 2^30) made the restart allocate the
// context reservoir, 2048 x 2^30 doubles, and die of std::bad_alloc instead of DATA_LOSS.
TEST_F(CorruptRecordTest, ProblemRecordOutsideWhatCreateProblemAccepts) {
  const absl::Status s = OpenAfter([](storage::Store& store) -> absl::Status {
    storage::v1::ProblemRecord problem;
    storage::v1::ExpertRecord first;
    absl::Status read =
        store.ForEachProblem([&](uint32_t index, const storage::v1::ProblemRecord& r) {
          if (index == 0) problem = r;
          return absl::OkStatus();
        });
    if (read.ok()) {
      read = store.ForEachExpert(0, [&](uint32_t id, const storage::v1::ExpertRecord& r) {
        if (id == 0) first = r;
        return absl::OkStatus();
      });
    }
    absl::StatusOr<storage::v1::CheckpointRecord> checkpoint = store.GetCheckpoint(0);
    absl::StatusOr<storage::v1::EstimatorStateRecord> state = store.GetEstimatorState(0);
    if (!read.ok() || !checkpoint.ok() || !state.ok()) {
      return absl::InternalError("reading the store");
    }
    problem.set_num_features(1 << 30);
    storage::Store::WriteGroup group;
    absl::Status added = store.AddProblem(&group, 0, problem, first, *checkpoint, *state);
    return added.ok() ? store.Commit(&group) : added;
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("num_features"));
}

// Found while writing tests/fuzz/recovery_fuzz (confirmed by it): a negative backfill_total
// made LoadBackfills resize the expert's column to 2^64 - 1 (std::length_error).
TEST_F(CorruptRecordTest, NegativeBackfillTotal) {
  const absl::Status s = OpenAfter([](storage::Store& store) -> absl::Status {
    storage::v1::ExpertRecord linear;
    absl::Status read = store.ForEachExpert(0, [&](uint32_t id, const storage::v1::ExpertRecord& r) {
      if (id == 1) linear = r;
      return absl::OkStatus();
    });
    if (!read.ok()) return read;
    linear.set_backfill_total(-1);
    return store.PutExpert(0, 1, linear);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("backfill_total -1"));
}

TEST_F(CorruptRecordTest, LogChunkWithTooFewPropensities) {
  const absl::Status s = OpenAfter([](storage::Store& store) {
    storage::v1::LogChunk c = FullChunk(2);
    c.mutable_propensities()->Truncate(10);
    return store.PutLogChunk(0, 0, c);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("log chunk 0"));
}

TEST_F(CorruptRecordTest, LogChunkWiderThanTheExperts) {
  const absl::Status s = OpenAfter([](storage::Store& store) {
    return store.PutLogChunk(0, 0, FullChunk(9));
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST_F(CorruptRecordTest, LogChunkWithAChooserOutOfRange) {
  const absl::Status s = OpenAfter([](storage::Store& store) {
    storage::v1::LogChunk c = FullChunk(2);
    c.set_chooser(7, 5);
    return store.PutLogChunk(0, 0, c);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("sample 7"));
}

// A chunk without the columns of experts frozen when it started (Problem::ChunkRows):
// the dropped ids must be ascending experts of the chunk, and the chooser's propensity of
// every sample must come with them.
TEST_F(CorruptRecordTest, LogChunkWithDamagedDroppedColumns) {
  const auto dropped_chunk = [] {
    storage::v1::LogChunk c = FullChunk(1);  // expert 0's column; expert 1 dropped
    c.set_num_experts(2);
    c.add_dropped(1);
    for (int64_t i = 0; i < storage::kLogChunkSamples; ++i) c.add_chooser_propensity(0.25);
    return c;
  };
  const std::vector<std::pair<std::string, std::function<void(storage::v1::LogChunk*)>>> damages = {
      {"dropped expert 2", [](storage::v1::LogChunk* c) { c->set_dropped(0, 2); }},
      {"dropped expert 1", [](storage::v1::LogChunk* c) { c->add_dropped(1); }},
      {"chooser propensities", [](storage::v1::LogChunk* c) { c->clear_chooser_propensity(); }},
      {"chooser propensities", [](storage::v1::LogChunk* c) { c->add_propensities(0.25); }},
  };
  for (const auto& [what, damage] : damages) {
    SCOPED_TRACE(what);
    if (service_ != nullptr) {  // a fresh store for each damage
      ASSERT_TRUE(service_->Shutdown().ok());
      service_.reset();
      dir_ = testing::MakeTempDir();
      Open();
    }
    const absl::Status s = OpenAfter([&](storage::Store& store) {
      storage::v1::LogChunk c = dropped_chunk();
      damage(&c);
      return store.PutLogChunk(0, 0, c);
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr("log chunk 0"));
    EXPECT_THAT(s.message(), HasSubstr(what));
  }
}

TEST_F(CorruptRecordTest, CheckpointMatricesOfTheWrongSize) {
  const absl::Status s =
      OpenAfter(EditCheckpoint([](storage::v1::CheckpointRecord* c) { c->mutable_m()->RemoveLast(); }));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("divergence matrices"));
}

// The estimators' state in a checkpoint is checked like any record: damaged bytes, or a
// state that does not match the checkpoint around it, are DATA_LOSS naming it.
TEST_F(CorruptRecordTest, CheckpointWithADamagedEstimatorState) {
  const absl::Status s = OpenAfter(EditEstimatorState([](storage::v1::EstimatorStateRecord* c) {
    c->mutable_state()->resize(c->state().size() / 2);
  }));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("estimator state is damaged"));
}

TEST_F(CorruptRecordTest, CheckpointWhoseEstimatorStateDoesNotMatchIt) {
  const absl::Status s = OpenAfter(EditEstimatorState([](storage::v1::EstimatorStateRecord* c) {
    c->set_samples(c->samples() + 1);
  }));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("estimator state covers"));
}

// A store written before the estimators' state was (no EstimatorStateRecord): the restart
// learns the whole log again from the log chunks and the samples.
TEST_F(CorruptRecordTest, ACheckpointWithoutEstimatorStateLearnsTheWholeLogAgain) {
  const absl::Status s = OpenAfter(EditEstimatorState(nullptr));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(GetProblem("p").samples(), 20);
  ExpectEstimatesMatchReference("p");
}

TEST_F(CorruptRecordTest, CheckpointCoveringMoreExpertsThanStored) {
  const absl::Status s =
      OpenAfter(EditCheckpoint([](storage::v1::CheckpointRecord* c) { c->set_num_experts(5); }));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST_F(CorruptRecordTest, ReservoirNotAMultipleOfTheFeatures) {
  const absl::Status s =
      OpenAfter(EditCheckpoint([](storage::v1::CheckpointRecord* c) { c->add_reservoir(1.0); }));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("reservoir"));
}

TEST_F(CorruptRecordTest, BackfillChunkLongerThanAChunk) {
  const absl::Status s = OpenAfter([](storage::Store& store) {
    storage::v1::BackfillChunk c;
    for (int64_t i = 0; i <= storage::kBackfillChunkSamples; ++i) c.add_values(0.25);
    storage::v1::ExpertRecord expert;
    expert.set_name("late");
    expert.mutable_model()->set_uniform(true);
    expert.set_status(storage::v1::EXPERT_STATE_BACKFILLING);
    expert.set_backfill_total(20);
    if (absl::Status w = store.PutExpert(0, 2, expert); !w.ok()) return w;
    return store.PutBackfillChunk(0, 2, 0, c);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("backfill chunk"));
}

// Issue 14's reproducers: experts that are valid models but cannot score the contexts this
// problem sees. Registration scores a new expert on a sample of them and refuses it with
// INVALID_ARGUMENT; nothing is stored and the problem goes on learning.
class ExpertThatCannotScoreTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    CreateProblem("p", /*wait_ms=*/1'000'000);
    for (int i = 0; i < 20; ++i) {
      v1::ChooseRequest req;
      req.set_problem_id("p");
      for (int f = 0; f < kFeatures; ++f) req.add_features(5.0 + i);
      v1::ChooseResponse resp;
      ASSERT_TRUE(service_->Choose(req, &resp).ok());
      ASSERT_TRUE(Reward("p", resp.event_id(), 1.0).ok());
    }
  }
  void ExpectRefusedAndNothingStored(const v1::RegisterExpertRequest& req) {
    v1::Expert e;
    const absl::Status s = service_->RegisterExpert(req, &e);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("cannot score a context"));
    v1::ListExpertsRequest list;
    list.set_problem_id("p");
    v1::ListExpertsResponse listed;
    ASSERT_TRUE(service_->ListExperts(list, &listed).ok());
    EXPECT_EQ(listed.experts_size(), 1);
    // The problem still learns, and a restart finds the same single expert.
    PlayRounds("p", 5);
    EXPECT_EQ(GetProblem("p").samples(), 25);
    Reopen();
    v1::ListExpertsResponse after_restart;
    ASSERT_TRUE(service_->ListExperts(list, &after_restart).ok());
    EXPECT_EQ(after_restart.experts_size(), 1);
  }
};

TEST_F(ExpertThatCannotScoreTest, TableWhoseKeysMissTheContextsIsRefused) {
  // The contexts have 5..24 in feature 0: no row.
  ExpectRefusedAndNothingStored(TableRequest("p", std::vector<double>(kArms, 1.0 / kArms)));
}

TEST_F(ExpertThatCannotScoreTest, LinearWhoseLogitsOverflowIsRefused) {
  v1::RegisterExpertRequest req;
  req.set_problem_id("p");
  req.set_name("huge");
  auto* l = req.mutable_model()->mutable_linear_softmax();
  for (int i = 0; i < kArms * kFeatures; ++i) l->add_weights(1e308);
  for (int a = 0; a < kArms; ++a) l->add_bias(0.0);
  ExpectRefusedAndNothingStored(req);
}

// A problem record that does not even parse (its id is in it) fails that problem alone,
// listed as "#INDEX"; the service opens and the other problems serve.
TEST_F(ServiceTest, AProblemRecordThatDoesNotParseFailsOnlyItsProblem) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  CreateProblem("q", /*wait_ms=*/1'000'000);
  PlayRounds("q", 5);
  ASSERT_TRUE(service_->Shutdown().ok());
  service_.reset();
  {
    std::vector<rocksdb::ColumnFamilyDescriptor> families;
    families.emplace_back(rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions());
    for (const char* name : storage::kFamilyNames) {
      families.emplace_back(name, rocksdb::ColumnFamilyOptions());
    }
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir_, families, &handles, &db).ok());
    std::unique_ptr<rocksdb::Iterator> first(
        db->NewIterator(rocksdb::ReadOptions(), handles[1]));  // "problems": index 0 is p
    first->SeekToFirst();
    ASSERT_TRUE(first->Valid());
    const std::string key = first->key().ToString();
    first.reset();
    // A length-delimited field that claims more bytes than follow.
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[1], key, "\x0a\x7f").ok());
    for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
    ASSERT_TRUE(db->Close().ok());
    delete db;
  }
  Open();
  EXPECT_EQ(service_->ProblemLoadStatus("#0").code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(service_->ProblemLoadStatus("#0").message(), HasSubstr("does not parse"));
  v1::ListProblemsResponse list;
  ASSERT_TRUE(service_->ListProblems({}, &list).ok());
  ASSERT_EQ(list.problems_size(), 2);
  EXPECT_EQ(list.problems(0).problem_id(), "#0");
  EXPECT_THAT(list.problems(0).error(), HasSubstr("does not parse"));
  PlayRounds("q", 5);
  EXPECT_EQ(GetProblem("q").samples(), 10);
  // A new problem does not reuse the damaged one's index.
  CreateProblem("r", /*wait_ms=*/1'000'000);
  PlayRounds("r", 1);
  Reopen();
  EXPECT_EQ(GetProblem("r").samples(), 1);
}

constexpr double kPrefersArm0[] = {0.97, 0.01, 0.01, 0.01};
static_assert(std::size(kPrefersArm0) == kArms);

// Runtime quarantine: an expert registered while every context it saw fit it, that later
// cannot score one, is FAILED and excluded; rewards keep being learned by the others.
class QuarantineTest : public ServiceTest {
 protected:
  // A table expert over key feature 0 with two rows (keys in [0, 2)); it fails on larger
  // keys. Strongly prefers arm 0.
  int RegisterTable() {
    v1::Expert e;
    const absl::Status s = service_->RegisterExpert(TableRequest("p", {std::begin(kPrefersArm0), std::end(kPrefersArm0)}), &e);
    EXPECT_TRUE(s.ok()) << s;
    return e.expert_id();
  }
  // Choose and reward once with key feature `key`; returns the expert followed.
  int PlayKey(double key) {
    v1::ChooseRequest req;
    req.set_problem_id("p");
    req.add_features(key);
    for (int f = 1; f < kFeatures; ++f) req.add_features(0.5);
    v1::ChooseResponse resp;
    const absl::Status chosen = service_->Choose(req, &resp);
    EXPECT_TRUE(chosen.ok()) << chosen;
    const absl::Status rewarded = Reward("p", resp.event_id(), resp.arm() == 0 ? 1.0 : 0.0);
    EXPECT_TRUE(rewarded.ok()) << rewarded;
    return resp.expert_id();
  }
  v1::Expert ExpertOf(int id) {
    v1::ListExpertsRequest req;
    req.set_problem_id("p");
    v1::ListExpertsResponse resp;
    EXPECT_TRUE(service_->ListExperts(req, &resp).ok());
    return id < resp.experts_size() ? resp.experts(id) : v1::Expert();
  }
};

TEST_F(QuarantineTest, AnExpertThatFailsInChooseOrJoinIsQuarantinedAndTheRestLearn) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  const int table = RegisterTable();
  RunMaintenanceUntilActive("p");
  int followed = 0;
  for (int i = 0; i < 40; ++i) followed += PlayKey(0.5) == table;
  EXPECT_GT(followed, 0);  // it took traffic while healthy
  // The tester's reproducer: a key outside the table. Every call still succeeds.
  const int64_t before = GetProblem("p").samples();
  for (int i = 0; i < 10; ++i) EXPECT_NE(PlayKey(7.0), table);
  EXPECT_EQ(GetProblem("p").samples(), before + 10);
  const v1::Expert failed = ExpertOf(table);
  EXPECT_EQ(failed.status(), v1::EXPERT_STATUS_FAILED);
  EXPECT_THAT(failed.error(), HasSubstr("quarantined"));
  EXPECT_THAT(failed.error(), HasSubstr("outside the table's rows"));
  EXPECT_EQ(ExpertGauge(metrics_, "decision_expert_failed", std::to_string(table)), 1.0);
  // Never followed again, even on contexts it could score; its column holds 1/K.
  for (int i = 0; i < 30; ++i) EXPECT_NE(PlayKey(0.5), table);
  const std::vector<v1::LoggedSample> log = Export("p");
  for (size_t s = before; s < log.size(); ++s) {
    EXPECT_EQ(log[s].expert_propensities(table), 1.0 / kArms);
  }
  ExpectEstimatesMatchReference("p");
  const v1::Estimates estimates = Estimates("p");
  EXPECT_EQ(estimates.experts(table).status(), v1::EXPERT_STATUS_FAILED);

  // The FAILED record is written by maintenance; a restart keeps it quarantined (without
  // loading the model) and computes the same estimates.
  ASSERT_TRUE(service_->RunMaintenance().ok());
  Reopen();
  EXPECT_EQ(ExpertOf(table).status(), v1::EXPERT_STATUS_FAILED);
  EXPECT_EQ(ExpertOf(table).error(), failed.error());
  const v1::Estimates reopened = Estimates("p");
  for (int k = 0; k < estimates.experts_size(); ++k) {
    EXPECT_EQ(reopened.experts(k).estimate(), estimates.experts(k).estimate()) << k;
  }
  for (int i = 0; i < 20; ++i) EXPECT_NE(PlayKey(0.5), table);
  ExpectEstimatesMatchReference("p");
}

TEST_F(QuarantineTest, AnExpertWhoseBackfillFailsIsQuarantinedAndTheNextOnesGetEstimated) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  // 600 contexts it fits, then 5 it does not: registration scores the first 512 of the
  // reservoir only, so it is accepted and the backfill meets the bad ones.
  for (int i = 0; i < 600; ++i) PlayKey(0.5);
  for (int i = 0; i < 5; ++i) PlayKey(9.0);
  const int table = RegisterTable();
  const int linear = RegisterLinear("p", 4.0);
  RunMaintenanceUntilActive("p");
  EXPECT_EQ(ExpertOf(table).status(), v1::EXPERT_STATUS_FAILED);
  EXPECT_THAT(ExpertOf(table).error(), HasSubstr("backfill"));
  EXPECT_EQ(ExpertOf(linear).status(), v1::EXPERT_STATUS_ACTIVE);
  for (int i = 0; i < 50; ++i) EXPECT_NE(PlayKey(0.5), table);
  // The failed expert was never followed: the others' estimates equal the reference over
  // them alone, as if it had never been registered.
  ExpectEstimatesMatchReference("p", /*drop=*/{table});
  ASSERT_TRUE(service_->RunMaintenance().ok());
  Reopen();
  EXPECT_EQ(ExpertOf(table).status(), v1::EXPERT_STATUS_FAILED);
  ExpectEstimatesMatchReference("p", /*drop=*/{table});
}

// An expert that fails on a context of the divergence reservoir that is in no joined sample
// (chosen, never rewarded): the registration check (the first 512 contexts) and the
// backfill (the log) pass, and the estimate of its divergences meets it. It is quarantined
// with that reason, and the expert registered after it is estimated. With the reservoir
// predictions not kept (budget 0) the experts are predicted a block of contexts at a time
// inside the computation, and the computation starts again without the failed model.
class DivergenceQuarantineTest : public QuarantineTest {
 protected:
  void ExpectQuarantined() {
    CreateProblem("p", /*wait_ms=*/1'000'000);
    // Contexts 520-524 of the reservoir's 605: past the registration check, and in the
    // 16 groups of 37 the estimate reads (the last 605 mod 16 are read by none).
    for (int i = 0; i < 520; ++i) PlayKey(0.5);
    for (int i = 0; i < 5; ++i) {  // into the reservoir, never into the log
      v1::ChooseRequest req;
      req.set_problem_id("p");
      req.add_features(9.0);
      for (int f = 1; f < kFeatures; ++f) req.add_features(0.5);
      v1::ChooseResponse resp;
      ASSERT_TRUE(service_->Choose(req, &resp).ok());
    }
    for (int i = 0; i < 80; ++i) PlayKey(0.5);
    const int table = RegisterTable();
    const int linear = RegisterLinear("p", 4.0);
    RunMaintenanceUntilActive("p");
    EXPECT_EQ(ExpertOf(table).status(), v1::EXPERT_STATUS_FAILED);
    EXPECT_THAT(ExpertOf(table).error(), HasSubstr("divergence estimation"));
    EXPECT_THAT(ExpertOf(table).error(), HasSubstr("outside the table's rows"));
    EXPECT_EQ(ExpertOf(linear).status(), v1::EXPERT_STATUS_ACTIVE);
    for (int i = 0; i < 30; ++i) EXPECT_NE(PlayKey(0.5), table);
    const v1::Estimates estimates = Estimates("p");
    ASSERT_EQ(estimates.experts_size(), 3);
    EXPECT_GT(estimates.experts(linear).effective_sample_size(), 0.0);
  }
};

TEST_F(DivergenceQuarantineTest, PredictionsKept) { ExpectQuarantined(); }

TEST_F(DivergenceQuarantineTest, PredictionsReadInBlocks) {
  reservoir_predictions_mb_ = 0;
  Reopen();
  ExpectQuarantined();
}

// Undelivered decisions, through an in-process gRPC server: a Choose whose caller went away
// before the answer was sent is never learned, and is counted.
class UndeliveredTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    // Installed before serving; the test sets what it does under a lock.
    grpc_ = GrpcHarness::Start(service_.get(), &metrics_, [this](GrpcDecisionService& g) {
      g.set_before_decide_for_testing([this](grpc::CallbackServerContext* ctx) {
        std::function<void(grpc::CallbackServerContext*)> hook;
        {
          absl::MutexLock lock(&hook_mu_);
          hook = before_decide_;
        }
        if (hook) hook(ctx);
      });
    });
    ASSERT_NE(grpc_, nullptr);
  }
  void TearDown() override { grpc_.reset(); }
  v1::DecisionService::Stub* stub() { return &grpc_->stub(); }
  double Undelivered() { return std::max(0.0, MetricValue("decision_undelivered_total")); }
  v1::ChooseRequest Request(const std::string& event_id) {
    v1::ChooseRequest req;
    req.set_problem_id("p");
    req.set_event_id(event_id);
    for (int f = 0; f < kFeatures; ++f) req.add_features(0.5);
    return req;
  }

  absl::Mutex hook_mu_;
  std::function<void(grpc::CallbackServerContext*)> before_decide_ ABSL_GUARDED_BY(hook_mu_);
  std::unique_ptr<GrpcHarness> grpc_;
};

TEST_F(UndeliveredTest, AChooseCancelledBeforeItsAnswerIsSentIsNeverLearned) {
  CreateProblem("p", /*wait_ms=*/1000);
  // The decision waits until the server has seen the cancellation (gRPC learns of it
  // asynchronously).
  absl::Notification entered, release;
  std::atomic<bool> first{true};
  {
    absl::MutexLock lock(&hook_mu_);
    before_decide_ = [&](grpc::CallbackServerContext* ctx) {
      if (!first.exchange(false)) return;
      entered.Notify();
      release.WaitForNotification();
      for (int i = 0; i < 3000 && !ctx->IsCancelled(); ++i) {
        absl::SleepFor(absl::Milliseconds(10));
      }
    };
  }
  // The decision is made while the caller is already gone.
  grpc::ClientContext ctx;
  const v1::ChooseRequest lost = Request("lost");
  v1::ChooseResponse lost_response;
  absl::Notification finished;
  grpc::Status lost_status;
  stub()->async()->Choose(&ctx, &lost, &lost_response, [&](grpc::Status s) {
    lost_status = std::move(s);
    finished.Notify();
  });
  entered.WaitForNotification();
  ctx.TryCancel();
  finished.WaitForNotification();
  EXPECT_EQ(lost_status.error_code(), grpc::StatusCode::CANCELLED);
  release.Notify();
  // gRPC reports the lost answer once it is done with the call.
  for (int i = 0; i < 1000 && Undelivered() < 1.0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(Undelivered(), 1.0);

  // A delivered one, for comparison.
  grpc::ClientContext kept_ctx;
  v1::ChooseResponse kept;
  ASSERT_TRUE(stub()->Choose(&kept_ctx, Request("kept"), &kept).ok());
  EXPECT_EQ(GetProblem("p").decisions(), 2);

  // A reward for the lost one is refused; at expiry it is dropped, not learned with the
  // default reward. The delivered one is learned.
  const absl::Status refused = Reward("p", "lost", 1.0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("never delivered"));
  clock_.AdvanceMs(5000);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(GetProblem("p").samples(), 1);
  EXPECT_EQ(GetProblem("p").pending(), 0);
  const std::vector<v1::LoggedSample> log = Export("p");
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].event_id(), "kept");
  EXPECT_EQ(Undelivered(), 1.0);
}

// The same for a batch and a slate: every decision of a call whose answer was lost is
// undelivered, and none is learned.
TEST_F(UndeliveredTest, ABatchOrASlateCancelledBeforeItsAnswerIsSentIsNeverLearned) {
  CreateProblem("p", /*wait_ms=*/1000);
  absl::Notification entered[2], release[2];
  std::atomic<int> calls{0};
  {
    absl::MutexLock lock(&hook_mu_);
    before_decide_ = [&](grpc::CallbackServerContext* ctx) {
      const int call = calls.fetch_add(1);
      if (call > 1) return;
      entered[call].Notify();
      release[call].WaitForNotification();
      for (int i = 0; i < 3000 && !ctx->IsCancelled(); ++i) {
        absl::SleepFor(absl::Milliseconds(10));
      }
    };
  }
  // `send(ctx, on_done)` starts the call.
  const auto lose = [&](int call, const auto& send) {
    grpc::ClientContext ctx;
    absl::Notification finished;
    grpc::Status status;
    send(&ctx, [&](grpc::Status s) {
      status = std::move(s);
      finished.Notify();
    });
    entered[call].WaitForNotification();
    ctx.TryCancel();
    finished.WaitForNotification();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
    release[call].Notify();
  };
  v1::ChooseBatchRequest batch;
  *batch.add_requests() = Request("b0");
  *batch.add_requests() = Request("b1");
  v1::ChooseBatchResponse batch_response;
  lose(0, [&](grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
    stub()->async()->ChooseBatch(ctx, &batch, &batch_response, std::move(done));
  });
  for (int i = 0; i < 1000 && Undelivered() < 2.0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(Undelivered(), 2.0);
  v1::ChooseSlateRequest slate;
  slate.set_problem_id("p");
  slate.set_event_id("page");
  slate.set_slots(2);
  for (int f = 0; f < kFeatures; ++f) slate.add_features(0.5);
  v1::ChooseSlateResponse slate_response;
  lose(1, [&](grpc::ClientContext* ctx, std::function<void(grpc::Status)> done) {
    stub()->async()->ChooseSlate(ctx, &slate, &slate_response, std::move(done));
  });
  for (int i = 0; i < 1000 && Undelivered() < 4.0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(Undelivered(), 4.0);
  EXPECT_EQ(GetProblem("p").decisions(), 4);
  clock_.AdvanceMs(5000);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(GetProblem("p").pending(), 0);
  EXPECT_EQ(GetProblem("p").samples(), 0);
}

// The tester's reproducer: Choose calls with 1 ms deadlines. How many answers arrive depends
// on timing; what must hold whatever it is: every answer the client got is learned, and
// every decision is either learned or counted undelivered and dropped.
TEST_F(UndeliveredTest, OneMillisecondDeadlinesLearnOnlyWhatWasDelivered) {
  CreateProblem("p", /*wait_ms=*/1000);
  // A loaded server, roughly: every other decision takes 2 ms.
  hooks_.after_select = [](const std::string& event_id) {
    if ((event_id.back() - '0') % 2 == 1) absl::SleepFor(absl::Milliseconds(2));
  };
  int answered = 0;
  for (int i = 0; i < 300; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1));
    v1::ChooseResponse resp;
    answered += stub()->Choose(&ctx, Request(absl::StrCat("e", i)), &resp).ok();
  }
  // Let the server finish the calls (it may still be deciding some), then expire them all.
  int64_t decisions = -1;
  for (int i = 0; i < 500; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    clock_.AdvanceMs(5000);
    ASSERT_TRUE(service_->RunMaintenance().ok());
    const v1::Problem p = GetProblem("p");
    if (p.decisions() == decisions && p.pending() == 0) break;
    decisions = p.decisions();
  }
  const int64_t samples = GetProblem("p").samples();
  std::printf("300 calls: %d answered, %lld decisions, %lld learned, %.0f undelivered\n",
              answered, static_cast<long long>(decisions), static_cast<long long>(samples),
              Undelivered());
  EXPECT_GE(samples, answered);
  EXPECT_EQ(samples + static_cast<int64_t>(Undelivered()), decisions);
  EXPECT_EQ(GetProblem("p").pending(), 0);
}

// The tester's contract slip: smoothing 5e-324 was accepted, but eta / K underflows to 0,
// so the expert could never be learned with.
// An expert quarantined in a join while a divergence refresh is computed a slice at a
// time keeps its pairs as they were when the refresh applies (a failed expert's pairs stay
// at their last values), and the refresh gives the others'.
TEST_F(QuarantineTest, AnExpertQuarantinedDuringASlicedRefreshKeepsItsPairs) {
  refresh_slice_ms_ = 0;  // one block of contexts a maintenance round
  reservoir_predictions_mb_ = 0;
  Reopen();
  CreateProblem("p", /*wait_ms=*/1'000'000);
  const int table = RegisterTable();
  const int linear = RegisterLinear("p", 1.0);
  const int other = RegisterLinear("p", 3.0);
  RunMaintenanceUntilActive("p");
  const int64_t boundary = GetProblem("p").next_batch_at();
  PlayRounds("p", static_cast<int>(boundary));  // keys in [0, 1): the table scores them
  const v1::Estimates before = Estimates("p");  // identity: no refresh yet
  ASSERT_TRUE(service_->RunMaintenance().ok());  // the refresh's first block
  ASSERT_EQ(GetProblem("p").next_batch_at(), boundary);
  PlayKey(7.0);  // outside the table: quarantined in the join
  ASSERT_EQ(ExpertOf(table).status(), v1::EXPERT_STATUS_FAILED);
  for (int round = 0; round < 100 && GetProblem("p").next_batch_at() == boundary; ++round) {
    ASSERT_TRUE(service_->RunMaintenance().ok());
  }
  ASSERT_GT(GetProblem("p").next_batch_at(), boundary);
  const v1::Estimates after = Estimates("p");
  const int n = after.experts_size();
  ASSERT_EQ(n, 4);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != table && j != table) continue;
      EXPECT_EQ(after.m(i * n + j), before.m(i * n + j)) << i << ", " << j;
      EXPECT_EQ(after.sigma(i * n + j), before.sigma(i * n + j)) << i << ", " << j;
    }
  }
  EXPECT_GT(after.m(linear * n + other), 1.0);
  EXPECT_EQ(before.m(linear * n + other), 1.0);
  ExpectEstimatesMatchReference("p");
}

TEST_F(QuarantineTest, SmoothingTooSmallToKeepEveryArmPositiveIsRefused) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  v1::RegisterExpertRequest req;
  req.set_problem_id("p");
  req.mutable_model()->mutable_uniform();
  req.mutable_model()->set_smoothing(5e-324);
  v1::Expert e;
  const absl::Status s = service_->RegisterExpert(req, &e);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("model.smoothing"));
  v1::CreateProblemRequest create;
  create.set_problem_id("q");
  create.mutable_config()->set_num_arms(kArms);
  create.mutable_config()->set_smoothing(1e-300);
  v1::Problem p;
  EXPECT_EQ(service_->CreateProblem(create, &p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace decision::server
