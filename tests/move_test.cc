// Moving a problem between replicas (server/service_move.cc): two services in one process,
// the fixture's as the source and a second one, with another seed and store, as the
// target. The records are copied page by page as decisionctl move-problem copies them.
#include <algorithm>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "core/status_macros.h"
#include "core/xgboost_trainer.h"
#include "server/placement.h"
#include "tests/service_fixture.h"

namespace decision::server {
namespace {

using ::testing::HasSubstr;

class MoveTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    target_dir_ = testing::MakeTempDir();
    OpenTarget();
  }
  void OpenTarget() {
    ServiceOptions options;
    options.data_dir = target_dir_;
    options.seed = 1234;  // not the source's: the generator's state must travel
    options.start_maintenance_thread = false;
    auto s = DecisionService::Open(options, &clock_, &target_metrics_);
    ASSERT_TRUE(s.ok()) << s.status();
    target_ = *std::move(s);
  }
  void ReopenTarget() {
    ASSERT_TRUE(target_->Shutdown().ok());
    target_.reset();
    OpenTarget();
  }

  // A move as decisionctl move-problem makes it, without the placement switch and EndMove:
  // BeginMove, every page exported and imported, the last one with the commit. With
  // `while_serving`, the catch-up: BeginMove with catch_up, the pages at the snapshot,
  // then `while_serving()` (the problem serves meanwhile), then the fence and the changes.
  // Returns the first error.
  absl::Status Move(const std::string& problem,
                    const std::function<void()>& while_serving = nullptr) {
    v1::BeginMoveRequest begin = BeginMoveOf(problem);
    v1::ImportProblemRequest import;
    import.set_problem_id(problem);
    import.set_first(true);
    pages_ = 0;
    changes_ = 0;
    parts_ = 0;
    max_page_bytes_ = 0;
    auto copy = [&](bool changes, const std::string* commit_state) -> absl::Status {
      v1::ExportProblemRequest page;
      page.set_problem_id(problem);
      page.set_max_bytes(4096);
      page.set_changes(changes);
      for (bool done = false; !done; ++pages_) {
        v1::ExportProblemResponse exported;
        DECISION_RETURN_IF_ERROR(service_->ExportProblem(page, &exported));
        done = exported.done();
        *page.mutable_cursor() = exported.next();
        *import.mutable_entries() = exported.entries();
        if (changes) changes_ += exported.entries_size();
        int64_t page_bytes = 0;
        for (const v1::ProblemEntry& e : exported.entries()) {
          page_bytes += static_cast<int64_t>(e.key().size() + e.value().size());
          parts_ += e.value_size() > 0;
        }
        max_page_bytes_ = std::max(max_page_bytes_, page_bytes);
        if (done && commit_state != nullptr) {
          import.set_commit(true);
          import.set_generator_state(*commit_state);
        }
        v1::ImportProblemResponse imported;
        DECISION_RETURN_IF_ERROR(target_->ImportProblem(import, &imported));
        import.set_first(false);
      }
      return absl::OkStatus();
    };
    v1::BeginMoveResponse begun;
    if (while_serving) {
      begin.set_catch_up(true);
      DECISION_RETURN_IF_ERROR(service_->BeginMove(begin, &begun));
      DECISION_RETURN_IF_ERROR(copy(/*changes=*/false, nullptr));
      while_serving();
      begin.set_catch_up(false);
    }
    DECISION_RETURN_IF_ERROR(service_->BeginMove(begin, &begun));
    return copy(/*changes=*/static_cast<bool>(while_serving), &begun.generator_state());
  }
  // `to_replica` and `placed_on_target` (what the placement map says of it) end a copy
  // left behind.
  absl::Status EndMove(const std::string& problem, bool abort, const std::string& to_replica = "",
                       const absl::Status& placed_on_target =
                           absl::FailedPreconditionError("no placement map")) {
    v1::EndMoveRequest end;
    end.set_problem_id(problem);
    end.set_abort(abort);
    end.set_to_replica(to_replica);
    v1::EndMoveResponse ended;
    return service_->EndMove(end, &ended, placed_on_target);
  }

  static v1::ChooseRequest ChooseRequestAt(const std::string& problem, int i) {
    v1::ChooseRequest req;
    req.set_problem_id(problem);
    req.set_event_id(absl::StrCat("after-", i));
    for (int f = 0; f < kFeatures; ++f) req.add_features(((i * 7 + f * 3) % 10) / 10.0);
    return req;
  }
  // BeginMove of `problem` to replica-b (the fence; with catch_up set, the snapshot).
  static v1::BeginMoveRequest BeginMoveOf(const std::string& problem) {
    v1::BeginMoveRequest begin;
    begin.set_problem_id(problem);
    begin.set_to_replica("replica-b");
    return begin;
  }
  // The same Choose (ChooseRequestAt("p", i)) on the source and the target: the same
  // answer, which it returns.
  v1::ChooseResponse ChooseOnBoth(int i) {
    const v1::ChooseRequest req = ChooseRequestAt("p", i);
    v1::ChooseResponse on_source, on_target;
    EXPECT_TRUE(service_->Choose(req, &on_source).ok());
    EXPECT_TRUE(target_->Choose(req, &on_target).ok());
    EXPECT_EQ(on_target.SerializeAsString(), on_source.SerializeAsString()) << "decision " << i;
    return on_source;
  }
  static v1::Estimates EstimatesOf(DecisionService& s, const std::string& problem) {
    v1::GetEstimatesRequest req;
    req.set_problem_id(problem);
    v1::Estimates e;
    EXPECT_TRUE(s.GetEstimates(req, &e).ok());
    return e;
  }
  static std::string ExpertsOf(DecisionService& s, const std::string& problem) {
    v1::ListExpertsRequest req;
    req.set_problem_id(problem);
    v1::ListExpertsResponse resp;
    EXPECT_TRUE(s.ListExperts(req, &resp).ok());
    return resp.SerializeAsString();
  }
  // Samples of the problem at `index` in `store` (its records after a deletion: none).
  static int64_t StoredSamples(storage::Store& store, uint32_t index) {
    int64_t n = 0;
    EXPECT_TRUE(store
                    .ForEachSample(index, 0, 0,
                                   [&](int64_t, const storage::v1::SampleRecord&) {
                                     ++n;
                                     return absl::OkStatus();
                                   })
                    .ok());
    return n;
  }

  // A problem with a linear expert, 400 learned rounds and one decision waiting.
  void PlayedProblem() {
    CreateProblem("p", /*wait_ms=*/1'000'000);
    RegisterLinear("p", 4.0);
    RunMaintenanceUntilActive("p");
    PlayRounds("p", 400);
    ASSERT_TRUE(service_->RunMaintenance().ok());
    open_ = Choose("p", "open-decision");
    open_features_ = last_features_;
  }

  std::string target_dir_;
  Metrics target_metrics_;
  std::unique_ptr<DecisionService> target_;
  v1::ChooseResponse open_;
  std::vector<double> open_features_;
  int pages_ = 0;
  int changes_ = 0;  // records of the catch-up
  int parts_ = 0;    // entries that were parts of a record larger than a page
  int64_t max_page_bytes_ = 0;  // of keys and values
  void ExpectTheSameFuture();
};

// The target serves the problem as the source would have: the same estimates, experts,
// log and waiting decision, and, for the same requests, the same decisions (the source's
// generator travels with the records; the target's seed differs).
TEST_F(MoveTest, TheTargetDecidesAsTheSourceWouldHave) {
  PlayedProblem();
  const std::string estimates = EstimatesOf(*service_, "p").SerializeAsString();
  const std::string experts = ExpertsOf(*service_, "p");
  ASSERT_TRUE(Move("p").ok());
  EXPECT_GT(pages_, 10);  // 4 KB pages
  EXPECT_EQ(EstimatesOf(*target_, "p").SerializeAsString(), estimates);
  EXPECT_EQ(ExpertsOf(*target_, "p"), experts);
  ExpectTheSameFuture();
}

// The same with the catch-up: the copy at a snapshot while the problem serves 300 more
// rounds, gets a new expert (its record and backfill chunks), a divergence refresh and a
// deletion of two events (records deleted, samples rewritten); the fence, then only what
// changed since.
TEST_F(MoveTest, WithTheCatchUpTheTargetDecidesAsTheSourceWouldHave) {
  PlayedProblem();
  Choose("p", "deleted-1");
  ASSERT_TRUE(Reward("p", "deleted-1", 1.0).ok());
  ASSERT_TRUE(Move("p", [&] {
                PlayRounds("p", 300);
                RegisterLinear("p", 2.0);
                RunMaintenanceUntilActive("p");
                v1::DeleteEventsRequest del;
                del.set_problem_id("p");
                del.add_event_ids("deleted-1");
                v1::DeleteEventsResponse deleted;
                ASSERT_TRUE(service_->DeleteEvents(del, &deleted).ok());
                ASSERT_EQ(deleted.deleted(), 1);
                PlayRounds("p", 100);
              }).ok());
  EXPECT_GT(changes_, 600);  // 400 rounds: an event and a sample each, and more
  EXPECT_EQ(EstimatesOf(*target_, "p").SerializeAsString(),
            EstimatesOf(*service_, "p").SerializeAsString());
  EXPECT_EQ(ExpertsOf(*target_, "p"), ExpertsOf(*service_, "p"));
  EXPECT_EQ(EstimatesOf(*target_, "p").samples(), 801);
  // The deleted event is gone on the target too.
  v1::ExplainRequest explain;
  explain.set_problem_id("p");
  explain.set_event_id("deleted-1");
  v1::Explanation why;
  EXPECT_EQ(target_->Explain(explain, &why).code(), absl::StatusCode::kNotFound);
  ExpectTheSameFuture();
}

// An XGBoost expert (80 trees) of many 4 KB pages: its record comes in parts, every
// page stays within its 4 KB, and the target serves the same model. In the copy at the
// snapshot, and in the catch-up's changes (a second one registered while serving).
TEST_F(MoveTest, ARecordLargerThanAPageMovesInParts) {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  TrainingSet set;
  set.num_features = kFeatures;
  for (int i = 0; i < 2000; ++i) {
    std::vector<double> x(kFeatures);
    for (double& v : x) v = unit(gen);
    set.Add(x, static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin()), 1.0, 1.0);
  }
  XgboostTrainOptions options;
  options.rounds = 20;
  options.max_depth = 4;
  options.seed = 1;
  const absl::StatusOr<std::string> model = TrainXgboostModel(set, kArms, options);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_GT(model->size(), 3 * 4096);
  const auto register_trees = [&](const std::string& name) {
    v1::RegisterExpertRequest req;
    req.set_problem_id("p");
    req.set_name(name);
    req.mutable_model()->mutable_xgboost()->set_model(*model);
    v1::Expert e;
    ASSERT_TRUE(service_->RegisterExpert(req, &e).ok());
    RunMaintenanceUntilActive("p");
  };
  PlayedProblem();
  register_trees("trees");
  ASSERT_TRUE(Move("p", [&] {
                register_trees("trees-2");
                PlayRounds("p", 100);
              }).ok());
  EXPECT_GE(parts_, 2 * 3);  // the second model's record, in the changes
  EXPECT_LE(max_page_bytes_, 4096);
  EXPECT_EQ(EstimatesOf(*target_, "p").SerializeAsString(),
            EstimatesOf(*service_, "p").SerializeAsString());
  EXPECT_EQ(ExpertsOf(*target_, "p"), ExpertsOf(*service_, "p"));
  // The target scores with the models it put together as the source does.
  ASSERT_TRUE(EndMove("p", /*abort=*/true).ok());
  for (int i = 0; i < 50 && !HasFailure(); ++i) ChooseOnBoth(i);
  // And restarts with them.
  ReopenTarget();
  EXPECT_EQ(EstimatesOf(*target_, "p").SerializeAsString(),
            EstimatesOf(*service_, "p").SerializeAsString());
  v1::ListExpertsRequest list;
  list.set_problem_id("p");
  v1::ListExpertsResponse listed;
  ASSERT_TRUE(target_->ListExperts(list, &listed).ok());
  int trees = 0;
  for (const v1::Expert& e : listed.experts()) {
    EXPECT_EQ(e.status(), v1::EXPERT_STATUS_ACTIVE) << e.name();
    trees += e.kind() == "xgboost";
  }
  EXPECT_EQ(trees, 2);
}

// After a move (the source still fenced): the open decision has the same answer on the
// target; then the move is aborted on the source, and both get the same 300 calls: the
// same decisions, and the same estimates at the end, also after the target restarts.
void MoveTest::ExpectTheSameFuture() {
  // The decision waiting for its reward moved with it: the same answer, then its reward.
  v1::ChooseRequest again;
  again.set_problem_id("p");
  again.set_event_id("open-decision");
  again.mutable_features()->Assign(open_features_.begin(), open_features_.end());
  v1::ChooseResponse answer;
  ASSERT_TRUE(target_->Choose(again, &answer).ok());
  EXPECT_EQ(answer.SerializeAsString(), open_.SerializeAsString());
  // What the source would have done: abort the move there and send both the same calls.
  ASSERT_TRUE(EndMove("p", /*abort=*/true).ok());
  for (DecisionService* s : {service_.get(), target_.get()}) {
    v1::RewardRequest reward;
    reward.set_problem_id("p");
    reward.set_event_id("open-decision");
    reward.set_value(1.0);
    v1::RewardResponse rewarded;
    ASSERT_TRUE(s->Reward(reward, &rewarded).ok());
  }
  for (int i = 0; i < 300; ++i) {
    const v1::ChooseResponse on_source = ChooseOnBoth(i);
    if (HasFailure()) return;
    v1::RewardRequest reward;
    reward.set_problem_id("p");
    reward.set_event_id(ChooseRequestAt("p", i).event_id());
    reward.set_value(on_source.arm() == i % kArms ? 1.0 : 0.0);
    v1::RewardResponse rewarded;
    ASSERT_TRUE(service_->Reward(reward, &rewarded).ok());
    ASSERT_TRUE(target_->Reward(reward, &rewarded).ok());
    if (i % 100 == 99) {
      ASSERT_TRUE(service_->RunMaintenance().ok());
      ASSERT_TRUE(target_->RunMaintenance().ok());
    }
  }
  EXPECT_EQ(EstimatesOf(*target_, "p").SerializeAsString(),
            EstimatesOf(*service_, "p").SerializeAsString());
  // And a restart of the target restores it as a restart of any problem does.
  const std::string moved = EstimatesOf(*target_, "p").SerializeAsString();
  ReopenTarget();
  EXPECT_EQ(EstimatesOf(*target_, "p").SerializeAsString(), moved);
}

// While it moves, the source refuses every change (UNAVAILABLE, which clients retry),
// answers reads, and refuses a second move; a problem not fenced cannot be exported.
TEST_F(MoveTest, AFencedProblemRefusesChangesAndAnswersReads) {
  PlayedProblem();
  CreateProblem("q");
  v1::ExportProblemRequest page;
  page.set_problem_id("p");
  v1::ExportProblemResponse exported;
  EXPECT_EQ(service_->ExportProblem(page, &exported).code(),
            absl::StatusCode::kFailedPrecondition);
  v1::BeginMoveRequest begin = BeginMoveOf("p");
  v1::BeginMoveResponse begun;
  ASSERT_TRUE(service_->BeginMove(begin, &begun).ok());
  EXPECT_EQ(begun.samples(), 400);
  EXPECT_EQ(service_->BeginMove(begin, &begun).code(), absl::StatusCode::kFailedPrecondition);
  v1::ChooseRequest choose;
  choose.set_problem_id("p");
  choose.add_features(0.1);
  choose.add_features(0.2);
  choose.add_features(0.3);
  v1::ChooseResponse chosen;
  const absl::Status refused = service_->Choose(choose, &chosen);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr("moving to replica replica-b"));
  EXPECT_EQ(Reward("p", "open-decision", 1.0).code(), absl::StatusCode::kUnavailable);
  v1::Expert expert;
  EXPECT_EQ(service_->RegisterExpert(LinearRequest("p", 2.0), &expert).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(GetProblem("p").samples(), 400);  // reads go on
  Choose("q");                                // and the other problems
  // Bad requests are refused with the field named.
  begin.set_problem_id("q");
  begin.set_to_replica("no spaces");
  EXPECT_EQ(service_->BeginMove(begin, &begun).code(), absl::StatusCode::kInvalidArgument);
  page.mutable_cursor()->set_family(8);
  EXPECT_EQ(service_->ExportProblem(page, &exported).code(), absl::StatusCode::kInvalidArgument);
  // Aborted, it serves again.
  ASSERT_TRUE(EndMove("p", /*abort=*/true).ok());
  EXPECT_TRUE(Reward("p", "open-decision", 1.0).ok());
  EXPECT_EQ(EndMove("p", /*abort=*/true).code(), absl::StatusCode::kFailedPrecondition);
}

// A move begun with catch_up serves until its fence; it has no changes to export before,
// cannot end before, and an abort releases its snapshot (a new move can begin).
TEST_F(MoveTest, ACatchUpMoveServesUntilItsFence) {
  PlayedProblem();
  v1::BeginMoveRequest begin = BeginMoveOf("p");
  begin.set_catch_up(true);
  v1::BeginMoveResponse begun;
  ASSERT_TRUE(service_->BeginMove(begin, &begun).ok());
  EXPECT_EQ(begun.samples(), 400);
  EXPECT_TRUE(begun.generator_state().empty());  // the fence gives it
  PlayRounds("p", 10);  // it serves
  EXPECT_EQ(service_->BeginMove(begin, &begun).code(), absl::StatusCode::kFailedPrecondition);
  begin.set_catch_up(false);
  begin.set_to_replica("replica-c");
  EXPECT_EQ(service_->BeginMove(begin, &begun).code(), absl::StatusCode::kFailedPrecondition);
  v1::ExportProblemRequest page;
  page.set_problem_id("p");
  page.set_changes(true);
  v1::ExportProblemResponse exported;
  EXPECT_EQ(service_->ExportProblem(page, &exported).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(EndMove("p", /*abort=*/false).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(EndMove("p", /*abort=*/true).ok());
  begin.set_catch_up(true);
  ASSERT_TRUE(service_->BeginMove(begin, &begun).ok());
  EXPECT_EQ(begun.samples(), 410);
  ASSERT_TRUE(EndMove("p", /*abort=*/true).ok());
}

// EndMove with to_replica deletes a problem that is not moving only where the placement
// map says it is a copy left behind for that replica: a typo, or a replica without a map,
// must not delete a live problem.
TEST_F(MoveTest, EndMoveWithToReplicaDeletesOnlyACopyTheMapPlacesElsewhere) {
  PlayedProblem();
  const absl::Status not_placed =
      NotLeftBehind("p", "typo", "this replica has no placement map (--placement_map)");
  const absl::Status refused = EndMove("p", /*abort=*/false, "typo", not_placed);
  EXPECT_EQ(refused, not_placed);
  EXPECT_THAT(refused.message(), HasSubstr("nothing was changed"));
  EXPECT_EQ(StoredSamples(service_->store_for_testing(), 0), 400);
  PlayRounds("p", 10);  // it serves, unfenced
  Reopen();
  EXPECT_EQ(StoredSamples(service_->store_for_testing(), 0), 410);
  // A problem that does not exist is NOT_FOUND first; one the map places on the replica
  // named is replaced with the stub.
  EXPECT_EQ(EndMove("q", /*abort=*/false, "replica-b", absl::OkStatus()).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(EndMove("p", /*abort=*/false, "replica-b", absl::OkStatus()).ok());
  EXPECT_EQ(StoredSamples(service_->store_for_testing(), 0), 0);
  v1::GetProblemRequest get;
  get.set_problem_id("p");
  v1::Problem problem;
  EXPECT_THAT(service_->GetProblem(get, &problem).message(),
              HasSubstr("moved to replica replica-b"));
}

// Two EndMoves at once (a mover's retry after its deadline, an operator's end-move): the
// second is refused while the first deletes the problem's records, whether it would finish
// or abort the move; the first's outcome stands.
TEST_F(MoveTest, ASecondEndMoveWhileOneEndsTheMoveIsRefused) {
  PlayedProblem();
  ASSERT_TRUE(Move("p").ok());
  absl::Notification deleting, release;
  fail_writes_ = [&](absl::string_view what) {
    if (what == "problem deletion" && !deleting.HasBeenNotified()) {
      deleting.Notify();
      release.WaitForNotification();
    }
    return false;
  };
  absl::Status first;
  std::thread ending([&] { first = EndMove("p", /*abort=*/false); });
  deleting.WaitForNotification();
  for (const bool abort : {false, true}) {
    const absl::Status second = EndMove("p", abort);
    EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
    EXPECT_THAT(second.message(), HasSubstr("is being ended by another EndMove"));
  }
  release.Notify();
  ending.join();
  fail_writes_ = nullptr;
  ASSERT_TRUE(first.ok()) << first;
  EXPECT_TRUE(EndMove("p", /*abort=*/false).ok());  // a retry of the move that ended
  EXPECT_THAT(EndMove("p", /*abort=*/true).message(), HasSubstr("moved to replica replica-b"));
  EXPECT_EQ(StoredSamples(service_->store_for_testing(), 0), 0);
}

// EndMove leaves a stub: the source's records are deleted, and every call for the problem,
// CreateProblem included, is refused naming the new owner, also after a restart.
TEST_F(MoveTest, TheSourceKeepsAStubNamingTheOwner) {
  PlayedProblem();
  ASSERT_EQ(StoredSamples(service_->store_for_testing(), 0), 400);
  ASSERT_TRUE(service_->RunMaintenance().ok());  // exports the problem's metrics
  EXPECT_EQ(MetricValue("decision_samples", "problem", "p"), 400);
  ASSERT_TRUE(Move("p").ok());
  ASSERT_TRUE(EndMove("p", /*abort=*/false).ok());
  // Its series leave the source's /metrics: the new owner exports them.
  for (const prometheus::MetricFamily& f : metrics_.registry()->Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        EXPECT_FALSE(l.name == "problem" && l.value == "p") << f.name;
      }
    }
  }
  ASSERT_TRUE(EndMove("p", /*abort=*/false).ok());  // a retry
  EXPECT_EQ(StoredSamples(service_->store_for_testing(), 0), 0);
  for (int restart = 0; restart < 2; ++restart) {
    v1::GetProblemRequest get;
    get.set_problem_id("p");
    v1::Problem problem;
    const absl::Status refused = service_->GetProblem(get, &problem);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.message(), HasSubstr("moved to replica replica-b"));
    v1::CreateProblemRequest create;
    create.set_problem_id("p");
    create.mutable_config()->set_num_arms(kArms);
    create.mutable_config()->set_num_features(kFeatures);
    EXPECT_EQ(service_->CreateProblem(create, &problem).code(),
              absl::StatusCode::kFailedPrecondition);
    v1::ListProblemsResponse list;
    ASSERT_TRUE(service_->ListProblems(v1::ListProblemsRequest(), &list).ok());
    EXPECT_EQ(list.problems_size(), 0);
    Reopen();
  }
  // Moving it back replaces the stub with the problem.
  std::swap(service_, target_);
  ASSERT_TRUE(Move("p").ok());
  std::swap(service_, target_);
  EXPECT_EQ(GetProblem("p").samples(), 400);
  Reopen();
  EXPECT_EQ(GetProblem("p").samples(), 400);
}

// An import that never committed is not served, and a restart deletes its records.
TEST_F(MoveTest, AnImportThatDidNotCommitIsDeletedAtRestart) {
  PlayedProblem();
  v1::BeginMoveRequest begin = BeginMoveOf("p");
  v1::BeginMoveResponse begun;
  ASSERT_TRUE(service_->BeginMove(begin, &begun).ok());
  v1::ImportProblemRequest import;
  import.set_problem_id("p");
  import.set_first(true);
  v1::ExportProblemRequest page;  // the first page only, imported without the commit
  page.set_problem_id("p");
  v1::ExportProblemResponse exported;
  ASSERT_TRUE(service_->ExportProblem(page, &exported).ok());
  *import.mutable_entries() = exported.entries();
  v1::ImportProblemResponse imported;
  ASSERT_TRUE(target_->ImportProblem(import, &imported).ok());
  EXPECT_GT(StoredSamples(target_->store_for_testing(), 0), 0);
  v1::GetProblemRequest get;
  get.set_problem_id("p");
  v1::Problem problem;
  EXPECT_EQ(target_->GetProblem(get, &problem).code(), absl::StatusCode::kNotFound);
  ReopenTarget();
  EXPECT_EQ(StoredSamples(target_->store_for_testing(), 0), 0);
  import.set_first(false);
  EXPECT_EQ(target_->ImportProblem(import, &imported).code(),
            absl::StatusCode::kInvalidArgument);
  // The index is not reused, and the id is free.
  v1::CreateProblemRequest create;
  create.set_problem_id("p");
  create.mutable_config()->set_num_arms(kArms);
  create.mutable_config()->set_num_features(kFeatures);
  ASSERT_TRUE(target_->CreateProblem(create, &problem).ok());
  EXPECT_EQ(problem.samples(), 0);
}

// Bad imports are refused with what is wrong, and a failed commit keeps nothing.
TEST_F(MoveTest, ImportRefusesBadRecordsAndKeepsNothingOfAFailedCommit) {
  PlayedProblem();
  v1::ImportProblemRequest import;
  import.set_problem_id("p");
  import.set_first(true);
  v1::ImportProblemResponse imported;
  v1::ProblemEntry* audit = import.add_entries();
  audit->set_family(8);  // the audit log is not a problem's
  audit->set_key("k");
  EXPECT_EQ(target_->ImportProblem(import, &imported).code(), absl::StatusCode::kInvalidArgument);
  // A bad page in the middle of an import ends it: nothing of it is kept.
  import.clear_entries();
  ASSERT_TRUE(target_->ImportProblem(import, &imported).ok());  // started
  import.set_first(false);
  import.add_entries()->set_family(9);  // the training jobs are not a problem's
  EXPECT_EQ(target_->ImportProblem(import, &imported).code(), absl::StatusCode::kInvalidArgument);
  import.clear_entries();
  const absl::Status ended = target_->ImportProblem(import, &imported);
  EXPECT_EQ(ended.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ended.message(), HasSubstr("no import of problem p is in progress"));
  import.set_first(true);
  v1::ProblemEntry* other = import.add_entries();
  other->set_family(0);
  storage::v1::ProblemRecord record;
  record.set_problem_id("q");
  other->set_value(record.SerializeAsString());
  EXPECT_EQ(target_->ImportProblem(import, &imported).code(), absl::StatusCode::kInvalidArgument);
  // A commit without a problem record, and with a record the restart code refuses.
  import.clear_entries();
  import.set_commit(true);
  std::ostringstream state;
  state << std::mt19937_64(5);
  import.set_generator_state(state.str());
  EXPECT_EQ(target_->ImportProblem(import, &imported).code(), absl::StatusCode::kInvalidArgument);
  record.set_problem_id("p");
  record.set_num_arms(-3);
  v1::ProblemEntry* bad = import.add_entries();
  bad->set_family(0);
  bad->set_value(record.SerializeAsString());
  const absl::Status refused = target_->ImportProblem(import, &imported);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("do not load"));
  import.set_generator_state("not a generator");
  EXPECT_EQ(target_->ImportProblem(import, &imported).code(), absl::StatusCode::kInvalidArgument);
  v1::ListProblemsResponse list;
  ASSERT_TRUE(target_->ListProblems(v1::ListProblemsRequest(), &list).ok());
  EXPECT_EQ(list.problems_size(), 0);
  // The source's copy of a problem it serves cannot be imported over it.
  import.set_generator_state(state.str());
  import.clear_entries();
  EXPECT_EQ(service_->ImportProblem(import, &imported).code(), absl::StatusCode::kAlreadyExists);
}

// A record in parts is put together only from parts in order, the first at offset 0, and
// only up to 256 MiB; an import that commits, or sends another record, before a record is
// whole is refused. Each refusal ends the import.
TEST_F(MoveTest, ImportRefusesPartsOutOfOrder) {
  const auto part = [](int64_t offset, int64_t size, const std::string& value,
                       const std::string& key = "k") {
    v1::ProblemEntry e;
    e.set_family(1);
    e.set_key(key);
    e.set_value(value);
    e.set_value_offset(offset);
    e.set_value_size(size);
    return e;
  };
  // Each case: a first page with one part, then a page with `next`.
  const auto refused = [&](const v1::ProblemEntry& next, bool commit) {
    v1::ImportProblemRequest import;
    import.set_problem_id("p");
    import.set_first(true);
    *import.add_entries() = part(0, 10, "abcd");
    v1::ImportProblemResponse imported;
    EXPECT_TRUE(target_->ImportProblem(import, &imported).ok());
    import.set_first(false);
    import.clear_entries();
    if (next.family() != 0) *import.add_entries() = next;
    if (commit) {
      std::ostringstream state;
      state << std::mt19937_64(5);
      import.set_commit(true);
      import.set_generator_state(state.str());
    }
    const absl::Status s = target_->ImportProblem(import, &imported);
    // The import is over.
    import.clear_entries();
    import.set_commit(false);
    EXPECT_EQ(target_->ImportProblem(import, &imported).code(),
              absl::StatusCode::kInvalidArgument);
    return s;
  };
  absl::Status s = refused(part(6, 10, "efgh"), false);  // a gap
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("does not continue"));
  EXPECT_EQ(refused(part(4, 10, "efgh", "other"), false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(part(4, 11, "efgh"), false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(part(4, 10, "efghijk"), false).code(),  // past its size
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(part(4, 10, ""), false).code(), absl::StatusCode::kInvalidArgument);
  s = refused(part(0, 10, "abcd", "other"), false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("starts another record"));
  v1::ProblemEntry whole;
  whole.set_family(1);
  whole.set_key("w");
  whole.set_value("v");
  s = refused(whole, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("4 of its 10 bytes came"));
  s = refused(v1::ProblemEntry(), /*commit=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the import commits before the record"));
  // Larger than an import puts together: refused before anything is held.
  s = refused(part(0, (int64_t{256} << 20) + 1, "a"), false);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  v1::ListProblemsResponse list;
  ASSERT_TRUE(target_->ListProblems(v1::ListProblemsRequest(), &list).ok());
  EXPECT_EQ(list.problems_size(), 0);
  // The export refuses a cursor that continues a record it has not started.
  PlayedProblem();
  v1::BeginMoveRequest begin = BeginMoveOf("p");
  v1::BeginMoveResponse begun;
  ASSERT_TRUE(service_->BeginMove(begin, &begun).ok());
  v1::ExportProblemRequest page;
  page.set_problem_id("p");
  page.mutable_cursor()->set_offset(5);
  v1::ExportProblemResponse exported;
  EXPECT_EQ(service_->ExportProblem(page, &exported).code(), absl::StatusCode::kInvalidArgument);
  page.mutable_cursor()->set_started(true);
  page.mutable_cursor()->set_after("no such key");
  EXPECT_EQ(service_->ExportProblem(page, &exported).code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace decision::server
