// Unit tests of server/'s plain parts: the enum tables (conversions.h), the pending table's
// transitions (pending_table.h), the executor's thread priorities and group commit (executor.h).
#include <sched.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <cmath>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "server/conversions.h"
#include "server/executor.h"
#include "server/pending_table.h"
#include "server/placement.h"
#include "server/problem.h"

namespace decision::server {
namespace {

using ::testing::HasSubstr;

// The stored enum values are the integers earlier versions wrote (static_cast of the core
// enum): a table that changed them would misread every stored problem.
TEST(ConversionsTest, StoredEstimatorValuesAreTheCoreEnumsAsWrittenBefore) {
  for (EstimatorKind kind : {EstimatorKind::kClipped, EstimatorKind::kMedianOfMeans}) {
    for (MedianOfMeansGrouping g :
         {MedianOfMeansGrouping::kContiguous, MedianOfMeansGrouping::kRoundRobin}) {
      EstimatorOptions o;
      o.kind = kind;
      o.grouping = g;
      o.epsilon_rule = EpsilonRule::kTwoOverT;
      o.width_rule = WidthRule::kAuthorsCode;
      o.clip_test = ClipTest::kRewardTimesRatio;
      const storage::v1::EstimatorRecord r = EstimatorRecordOf(o);
      EXPECT_EQ(static_cast<int>(r.kind()), static_cast<int>(kind));
      EXPECT_EQ(static_cast<int>(r.grouping()), static_cast<int>(g));
      EXPECT_EQ(static_cast<int>(r.epsilon_rule()), static_cast<int>(EpsilonRule::kTwoOverT));
      EXPECT_EQ(static_cast<int>(r.width_rule()), static_cast<int>(WidthRule::kAuthorsCode));
      EXPECT_EQ(static_cast<int>(r.clip_test()), static_cast<int>(ClipTest::kRewardTimesRatio));
      storage::v1::ProblemRecord problem;
      *problem.mutable_estimator() = r;
      const EstimatorOptions back = EstimatorOptionsOf(problem);
      EXPECT_EQ(back.kind, kind);
      EXPECT_EQ(back.grouping, g);
      EXPECT_EQ(back.epsilon_rule, EpsilonRule::kTwoOverT);
    }
  }
}

TEST(ConversionsTest, WireValuesRoundTripAndUnspecifiedMeansTheDefault) {
  v1::EstimatorConfig wire;
  wire.set_kind(v1::ESTIMATOR_KIND_CLIPPED);
  wire.set_grouping(v1::MEDIAN_OF_MEANS_GROUPING_CONTIGUOUS);
  wire.set_width_rule(v1::WIDTH_RULE_AUTHORS_CODE);
  const v1::EstimatorConfig back =
      EstimatorConfigToWire(EstimatorRecordOf(EstimatorOptionsFromWire(wire)));
  EXPECT_EQ(back.kind(), v1::ESTIMATOR_KIND_CLIPPED);
  EXPECT_EQ(back.grouping(), v1::MEDIAN_OF_MEANS_GROUPING_CONTIGUOUS);
  EXPECT_EQ(back.width_rule(), v1::WIDTH_RULE_AUTHORS_CODE);
  EXPECT_EQ(back.epsilon_rule(), v1::EPSILON_RULE_PAPER);
  EXPECT_EQ(back.clip_test(), v1::CLIP_TEST_RATIO);
  const EstimatorOptions defaults = EstimatorOptionsFromWire(v1::EstimatorConfig());
  EXPECT_EQ(defaults.kind, EstimatorKind::kMedianOfMeans);
  EXPECT_EQ(defaults.grouping, MedianOfMeansGrouping::kRoundRobin);
}

TEST(ConversionsTest, ExpertStates) {
  EXPECT_EQ(ExpertStatusToWire(storage::v1::EXPERT_STATE_BACKFILLING),
            v1::EXPERT_STATUS_BACKFILLING);
  EXPECT_EQ(ExpertStatusToWire(storage::v1::EXPERT_STATE_ACTIVE), v1::EXPERT_STATUS_ACTIVE);
  EXPECT_EQ(ExpertStatusToWire(storage::v1::EXPERT_STATE_RETIRED), v1::EXPERT_STATUS_RETIRED);
}

storage::v1::EventRecord Event(int64_t deadline_ms) {
  storage::v1::EventRecord e;
  e.set_deadline_ms(deadline_ms);
  return e;
}

// Found by tests/fuzz/request_fuzz: a batch_multiplier CreateProblem accepts (finite, > 0)
// made b sqrt(t) overflow int64 in the conversion (undefined; x86 gave INT64_MIN, so a
// divergence refresh at every sample).
TEST(PlacementTest, TheMapFileIsParsedStrictly) {
  auto map = ParsePlacementMap("# placed\nhome decisiond-0   # the front page\n\n"
                               "search\tdecisiond-1\r\n");
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->size(), 2u);
  EXPECT_EQ(map->at("search"), "decisiond-1");
  EXPECT_EQ(ParsePlacementMap("a r1\nb\n").status().message(),
            "placement map line 2: 1 fields; expected \"PROBLEM_ID REPLICA_ID\"");
  EXPECT_EQ(ParsePlacementMap("a r1\na r2\n").status().message(),
            "placement map line 2: problem a is placed twice");
  EXPECT_EQ(ParsePlacementMap(std::string(65, 'p') + " r1").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlacementTest, AReplicaRefusesWhatTheMapPlacesElsewhereAndAReloadKeepsAGoodMap) {
  const std::string path = ::testing::TempDir() + "/placement_test.map";
  std::ofstream(path) << "home r0\nsearch r1\n";
  auto placement = Placement::Open("r0", path);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_TRUE((*placement)->Check("home").ok());
  EXPECT_TRUE((*placement)->Check("unplaced").ok());  // the hash's: served if held here
  absl::Status s = (*placement)->Check("search");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "problem search is placed on replica r1, not on this one (r0): call it there, or "
            "through the proxy with the x-decision-problem metadata set");
  std::ofstream(path) << "home r1\n";
  ASSERT_TRUE((*placement)->Reload().ok());
  EXPECT_EQ((*placement)->Check("home").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*placement)->Check("search").ok());
  std::ofstream(path) << "broken\n";
  EXPECT_EQ((*placement)->Reload().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*placement)->Check("home").code(), absl::StatusCode::kFailedPrecondition);
  // A problem imported here (a move) is served before the map says so, and after reloads.
  (*placement)->Claim("home");
  EXPECT_TRUE((*placement)->Check("home").ok());
  std::ofstream(path) << "home r1\n";
  ASSERT_TRUE((*placement)->Reload().ok());
  EXPECT_TRUE((*placement)->Check("home").ok());
  std::remove(path.c_str());
  EXPECT_EQ(Placement::Open("r0", path).status().code(), absl::StatusCode::kNotFound);
  auto none = Placement::Open("r0", "");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE((*none)->Check("anything").ok());
}

// EndMove with to_replica deletes a copy left behind only where the map places it there.
TEST(PlacementTest, ACopyLeftBehindIsOneTheMapPlacesOnTheReplicaNamed) {
  const std::string path = ::testing::TempDir() + "/placement_left_behind.map";
  std::ofstream(path) << "home r0\nsearch r1\nimported r1\n";
  auto placement = Placement::Open("r0", path);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_TRUE((*placement)->PlacedOn("search", "r1").ok());
  const auto refusal = [&](absl::string_view problem, absl::string_view replica) {
    const absl::Status s = (*placement)->PlacedOn(problem, replica);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << problem << " " << replica;
    return std::string(s.message());
  };
  EXPECT_THAT(refusal("search", "r2"), HasSubstr("the placement map places it on replica r1"));
  EXPECT_THAT(refusal("home", "r0"), HasSubstr("that is this replica"));
  EXPECT_THAT(refusal("home", "r1"), HasSubstr("places it on replica r0"));
  EXPECT_THAT(refusal("unplaced", "r1"), HasSubstr("the placement map does not place it"));
  (*placement)->Claim("imported");
  EXPECT_THAT(refusal("imported", "r1"), HasSubstr("this replica imported it"));
  auto none = Placement::Open("r0", "");
  ASSERT_TRUE(none.ok());
  EXPECT_THAT((*none)->PlacedOn("search", "r1").message(),
              HasSubstr("this replica has no placement map"));
  std::remove(path.c_str());
}

TEST(NextRefreshTest, TheStepIsAtLeastOneAndSaturates) {
  storage::v1::ProblemRecord r;
  r.set_num_arms(4);
  r.set_batch_multiplier(7.0);
  EXPECT_EQ(NextRefresh(r, 0), 12);
  EXPECT_EQ(NextRefresh(r, 10000), 10000 + 700);
  r.set_batch_multiplier(1e300);
  EXPECT_EQ(NextRefresh(r, 1000), 1000 + (int64_t{1} << 53));
  r.set_batch_multiplier(1e-9);
  EXPECT_EQ(NextRefresh(r, 1000), 1001);
  r.set_batch_multiplier(std::nan(""));  // only a corrupt record
  EXPECT_EQ(NextRefresh(r, 1000), 1001);
}

TEST(PendingTableTest, ADeferredDecisionIsFlushedStoredJoinedAndGone) {
  PendingTable t;
  t.Claim("a");
  EXPECT_EQ(t.answered(), 0);
  EXPECT_TRUE(t.Decide("a", Event(100), DecisionState::kUnwritten, /*now_ms=*/0).empty());
  EXPECT_EQ(t.answered(), 1);
  EXPECT_TRUE(t.FlushDue(/*now_ms=*/20, 4096, 20));
  EXPECT_FALSE(t.FlushDue(/*now_ms=*/19, 4096, 20));
  const auto taken = t.TakeUnwritten();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(t.Find("a")->state, DecisionState::kFlushing);
  EXPECT_EQ(t.unwritten(), 0u);
  t.MarkStored("a");
  EXPECT_EQ(t.Find("a")->state, DecisionState::kStored);
  EXPECT_TRUE(t.StartJoin(*t.Find("a"), /*expiry=*/false));
  EXPECT_EQ(t.Find("a")->state, DecisionState::kJoining);
  EXPECT_TRUE(t.Due(1000).empty());  // a join in progress is not due
  t.Erase("a");
  EXPECT_EQ(t.Find("a"), nullptr);
  EXPECT_EQ(t.answered(), 0);
}

TEST(PendingTableTest, AFailedJoinOfAnUnwrittenDecisionPutsItBackOnTheFlushList) {
  PendingTable t;
  t.Decide("a", Event(100), DecisionState::kUnwritten, 0);
  EXPECT_FALSE(t.StartJoin(*t.Find("a"), /*expiry=*/true));  // the join writes it
  EXPECT_EQ(t.unwritten(), 0u);
  t.AbortJoin("a", 5);
  EXPECT_EQ(t.Find("a")->state, DecisionState::kUnwritten);
  EXPECT_EQ(t.unwritten(), 1u);
  EXPECT_EQ(t.Due(101), std::vector<std::string>{"a"});
}

TEST(PendingTableTest, ADecisionWhoseFlushAndJoinBothFailIsFlushedAgain) {
  PendingTable t;
  t.Decide("a", Event(100), DecisionState::kUnwritten, 0);
  t.TakeUnwritten();
  EXPECT_TRUE(t.StartJoin(*t.Find("a"), /*expiry=*/false));  // the flush is ahead of it
  t.ReturnUnwritten("a", 1);  // the flush failed
  EXPECT_EQ(t.Find("a")->state, DecisionState::kJoining);
  t.AbortJoin("a", 2);  // and the join too: never stored, so back on the flush list
  EXPECT_EQ(t.Find("a")->state, DecisionState::kUnwritten);
  EXPECT_EQ(t.unwritten(), 1u);
}

// flushing() is what lets a maintenance round skip an idle problem's flush: it counts the
// decisions of flushes not written yet through every way out of kFlushing.
TEST(PendingTableTest, FlushingCountsTheDecisionsOfFlushesNotWrittenYet) {
  PendingTable t;
  for (const char* id : {"a", "b", "c"}) t.Decide(id, Event(100), DecisionState::kUnwritten, 0);
  EXPECT_EQ(t.flushing(), 0);
  t.TakeUnwritten();
  EXPECT_EQ(t.flushing(), 3);
  t.MarkStored("a");  // written
  EXPECT_EQ(t.flushing(), 2);
  t.ReturnUnwritten("b", 1);  // its flush failed: unwritten again
  EXPECT_EQ(t.flushing(), 1);
  EXPECT_EQ(t.unwritten(), 1u);
  EXPECT_TRUE(t.StartJoin(*t.Find("c"), /*expiry=*/false));  // joined while flushing
  EXPECT_EQ(t.flushing(), 0);
  t.TakeUnwritten();
  EXPECT_EQ(t.flushing(), 1);
  t.Erase("b");
  EXPECT_EQ(t.flushing(), 0);
}

TEST(PendingTableTest, ADurableDecisionAnswersItsWaitersOnceStored) {
  PendingTable t;
  t.Claim("a");
  t.Find("a")->waiters.push_back({nullptr, [](absl::Status) {}});
  EXPECT_TRUE(t.Decide("a", Event(100), DecisionState::kWriting, 0).empty());
  EXPECT_EQ(t.answered(), 0);
  EXPECT_TRUE(t.Due(1000).empty());  // not answered: never expires
  EXPECT_EQ(t.MarkStored("a").size(), 1u);
  EXPECT_EQ(t.answered(), 1);
  EXPECT_EQ(t.Due(1000), std::vector<std::string>{"a"});
}

// What an executor's threads run at: kLow is nice 10, kLowest nice 19 (executor.h says why
// both), kIdle is SCHED_IDLE, and kNormal keeps the creating thread's priority.
TEST(ExecutorTest, ThreadsRunAtTheirPriority) {
  const auto observed = [](ThreadPriority priority) {
    std::pair<int, int> policy_and_nice;
    Executor executor(1, "priority", priority);
    absl::Notification ran;
    executor.Schedule([&] {
      policy_and_nice = {sched_getscheduler(0), getpriority(PRIO_PROCESS, 0)};
      ran.Notify();
    });
    ran.WaitForNotification();
    return policy_and_nice;
  };
  const int own_nice = getpriority(PRIO_PROCESS, 0);
  EXPECT_EQ(observed(ThreadPriority::kLow), std::make_pair(SCHED_OTHER, 10));
  EXPECT_EQ(observed(ThreadPriority::kLowest), std::make_pair(SCHED_OTHER, 19));
  EXPECT_EQ(observed(ThreadPriority::kIdle).first, SCHED_IDLE);
  EXPECT_EQ(observed(ThreadPriority::kNormal), std::make_pair(SCHED_OTHER, own_nice));
  // The caller's own priority is not touched.
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
  EXPECT_EQ(getpriority(PRIO_PROCESS, 0), own_nice);
}

// --background_cpus's lists: Linux's cpuset format, strictly; FormatCpuList writes what
// ParseCpuList reads back.
TEST(CpuListTest, ListsAreParsedStrictlyAndWrittenBack) {
  EXPECT_EQ(*ParseCpuList("3"), std::vector<int>({3}));
  EXPECT_EQ(*ParseCpuList("0,4-6,2"), std::vector<int>({0, 2, 4, 5, 6}));
  EXPECT_EQ(*ParseCpuList("1-1,1"), std::vector<int>({1}));
  for (const char* bad : {"", "a", "1,", ",1", "1-", "-1", "2-1", " 1", "1 ", "+1", "1-2-3",
                          "0x1", "1024", "99999999999"}) {
    const absl::StatusOr<std::vector<int>> cpus = ParseCpuList(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(cpus.status())) << "'" << bad << "'";
    EXPECT_NE(cpus.status().message().find("CPU list"), absl::string_view::npos) << bad;
  }
  EXPECT_EQ(FormatCpuList({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
  EXPECT_EQ(FormatCpuList({}), "");
  EXPECT_EQ(*ParseCpuList(FormatCpuList({0, 1, 2, 5, 7, 8})), std::vector<int>({0, 1, 2, 5, 7, 8}));
}

// An executor's threads run on its CPUs; the creating thread keeps its own.
TEST(ExecutorTest, ThreadsRunOnTheirCpus) {
  const auto observed = [](Executor& executor) {
    std::vector<int> cpus;
    absl::Notification ran;
    executor.Schedule([&] {
      cpus = CurrentThreadCpus();
      ran.Notify();
    });
    ran.WaitForNotification();
    return cpus;
  };
  const std::vector<int> own = CurrentThreadCpus();
  ASSERT_FALSE(own.empty());
  const std::vector<int> one = {own.back()};
  Executor pinned(1, "pinned", ThreadPriority::kNormal, one);
  EXPECT_EQ(observed(pinned), one);
  EXPECT_EQ(CurrentThreadCpus(), own);
  Executor unpinned(1, "unpinned");  // no CPUs: the creating thread's
  EXPECT_EQ(observed(unpinned), own);
}

TEST(ParallelForTest, EveryTaskRunsOnceAndHelpersTakeSome) {
  Executor pool(3, "helper");
  std::vector<std::atomic<int>> runs(200);
  std::atomic<int> on_caller{0};
  const std::thread::id caller = std::this_thread::get_id();
  ParallelFor(&pool, 200, [&](int i) {
    runs[i].fetch_add(1);
    if (std::this_thread::get_id() == caller) on_caller.fetch_add(1);
    // Long enough that a helper wakes up before the caller has run them all.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  });
  for (int i = 0; i < 200; ++i) EXPECT_EQ(runs[i].load(), 1) << i;
  EXPECT_LT(on_caller.load(), 200);  // the helpers took some
  // No pool, or a pool of no thread: every task in the caller, in order.
  std::vector<int> order;
  ParallelFor(nullptr, 5, [&](int i) { order.push_back(i); });
  Executor none(0, "none");
  ParallelFor(&none, 5, [&](int i) { order.push_back(i); });
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
}

TEST(ParallelForTest, TheCallerDoesNotWaitForABusyPool) {
  Executor pool(1, "helper");
  absl::Notification release;
  pool.Schedule([&] { release.WaitForNotification(); });  // the only helper is busy
  std::vector<int> runs(10, 0);
  ParallelFor(&pool, 10, [&](int i) { ++runs[i]; });  // returns: the caller ran them
  EXPECT_EQ(runs, std::vector<int>(10, 1));
  release.Notify();
  pool.Stop();  // the helper's late turn finds the call closed and touches nothing
}

TEST(GroupCommitQueueTest, OpsQueuedDuringACommitRideInTheNextGroup) {
  Executor executor(1, "test");
  absl::Notification first_started, release;
  std::vector<std::vector<int>> groups;
  std::atomic<int> committed{0};
  GroupCommitQueue<int> queue(&executor, [&](std::vector<int>& group) {
    if (groups.empty()) {
      first_started.Notify();
      release.WaitForNotification();
    }
    groups.push_back(group);
    committed += static_cast<int>(group.size());
  });
  queue.Submit(1);
  first_started.WaitForNotification();
  for (int i = 2; i <= 5; ++i) queue.Submit(i);
  release.Notify();
  executor.Stop();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], std::vector<int>{1});
  EXPECT_EQ(groups[1], (std::vector<int>{2, 3, 4, 5}));
  EXPECT_EQ(committed.load(), 5);
}

TEST(GroupCommitQueueTest, ACallerThatMayBlockCommitsItsOwnGroupOnlyWhenIdle) {
  Executor executor(1, "test");
  absl::Notification in_commit, release;
  std::vector<std::pair<int, bool>> committed;  // (op, committed on the calling thread)
  const std::thread::id caller = std::this_thread::get_id();
  GroupCommitQueue<int> queue(&executor, [&](std::vector<int>& group) {
    for (int op : group) committed.push_back({op, std::this_thread::get_id() == caller});
    if (group.front() == 2) {
      in_commit.Notify();
      release.WaitForNotification();
    }
  });
  queue.Submit(1, /*commit_here=*/true);  // idle: committed here, before Submit returns
  ASSERT_EQ(committed.size(), 1u);
  EXPECT_TRUE(committed[0].second);
  queue.Submit(2);  // on the executor, which holds the group until released
  in_commit.WaitForNotification();
  queue.Submit(3, /*commit_here=*/true);  // busy: queued for the executor, not committed here
  EXPECT_EQ(committed.size(), 2u);
  release.Notify();
  executor.Stop();
  ASSERT_EQ(committed.size(), 3u);
  EXPECT_EQ(committed[2].first, 3);
  EXPECT_FALSE(committed[2].second);
}

}  // namespace
}  // namespace decision::server
