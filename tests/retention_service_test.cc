// Retention through the service (ProblemConfig.retention, SetRetention): the store keeps
// what the setting says, in whole log chunks; learning is not reset; a new expert is
// backfilled over the samples kept and its estimate is the literal reference's over its
// window; what a backfill or a restart still needs is kept until it is not; bad settings
// are refused with nothing changed.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/estimator.h"
#include "server/decision_service.h"
#include "storage/format.h"
#include "storage/store.h"
#include "tests/grpc_harness.h"
#include "tests/reference_estimators.h"
#include "tests/service_fixture.h"

namespace decision::server {
namespace {

using ::testing::HasSubstr;
constexpr int64_t kChunk = storage::kLogChunkSamples;

class RetentionTest : public ServiceTest {
 protected:
  absl::Status SetRetention(int64_t max_samples, int64_t max_age_ms, v1::Problem* out = nullptr,
                            const std::string& problem = "p") {
    v1::SetRetentionRequest req;
    req.set_problem_id(problem);
    req.mutable_retention()->set_max_samples(max_samples);
    req.mutable_retention()->set_max_age_ms(max_age_ms);
    v1::Problem p;
    absl::Status s = service_->SetRetention(req, &p);
    if (out != nullptr) *out = p;
    return s;
  }

  // Expert k's estimate equals the literal reference over its window: the exported log
  // (the samples kept), the samples before it standing in as rows its estimate ignores.
  void ExpectWindowedEstimateMatchesReference(int k) {
    const v1::Estimates e = Estimates("p");
    const std::vector<v1::Expert> experts = Experts();
    const int64_t first = experts[k].window_start();
    const auto log = Export("p");
    ASSERT_FALSE(log.empty());
    ASSERT_LE(log.front().sequence(), first);
    ASSERT_EQ(log.back().sequence() + 1, e.samples());
    SampleLog rebuilt(e.n());
    const std::vector<double> stand_in(e.n(), 1.0);
    for (int64_t s = 0; s < log.front().sequence(); ++s) {
      ASSERT_TRUE(rebuilt.Append(0, 0.0, stand_in).ok());
    }
    for (const v1::LoggedSample& s : log) {
      ASSERT_EQ(s.expert_propensities_size(), e.n()) << "sample " << s.sequence();
      const std::vector<double> row(s.expert_propensities().begin(),
                                    s.expert_propensities().end());
      ASSERT_TRUE(rebuilt.Append(s.expert_id(), s.reward(), row).ok());
    }
    DivergenceMatrix d;
    d.num_experts = e.n();
    d.m.assign(e.m().begin(), e.m().end());
    d.sigma.assign(e.sigma().begin(), e.sigma().end());
    const ExpertEstimate ref =
        reference::MedianOfMeans(rebuilt, rebuilt.size(), d, EstimatorOptions(), k, first);
    EXPECT_NEAR(e.experts(k).estimate(), ref.mean, 1e-9 * std::max(1.0, std::abs(ref.mean)));
    EXPECT_NEAR(e.experts(k).width(), ref.width, 1e-9 * std::max(1.0, std::abs(ref.width)));
  }
};

TEST_F(RetentionTest, KeepsTheNewestSamplesAndBackfillsANewExpertOverThem) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  const int early = RegisterLinear("p", 4.0);
  RunMaintenanceUntilActive("p");
  PlayRounds("p", 6 * kChunk + 100);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  const v1::Estimates before = Estimates("p");
  ASSERT_EQ(GetProblem("p").retained_from(), 0);

  // Set at runtime: learning goes on unchanged, the next rounds delete.
  v1::Problem p;
  ASSERT_TRUE(SetRetention(2 * kChunk, 0, &p).ok());
  EXPECT_EQ(p.config().retention().max_samples(), 2 * kChunk);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  const int64_t t = 6 * kChunk + 100;
  // The newest 2 * kChunk samples, from a chunk boundary: (t - 2 kChunk) rounded down.
  EXPECT_EQ(GetProblem("p").retained_from(), 4 * kChunk);
  EXPECT_EQ(MetricValue("decision_retained_from_samples", "problem", "p"), 4 * kChunk);
  const v1::Estimates after = Estimates("p");
  ASSERT_EQ(after.experts_size(), before.experts_size());
  for (int k = 0; k < after.experts_size(); ++k) {
    EXPECT_EQ(after.experts(k).estimate(), before.experts(k).estimate()) << k;
    EXPECT_EQ(after.experts(k).width(), before.experts(k).width()) << k;
  }
  const auto log = Export("p");
  ASSERT_EQ(static_cast<int64_t>(log.size()), t - 4 * kChunk);
  EXPECT_EQ(log.front().sequence(), 4 * kChunk);

  // A new expert: its window is what the store kept.
  const int late = RegisterLinear("p", 8.0);
  std::vector<v1::Expert> experts = Experts();
  EXPECT_EQ(experts[late].window_start(), 4 * kChunk);
  EXPECT_EQ(experts[late].backfill_total(), t - 4 * kChunk);
  EXPECT_EQ(experts[early].window_start(), 0);
  RunMaintenanceUntilActive("p");
  PlayRounds("p", 300);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  ExpectWindowedEstimateMatchesReference(late);
  const v1::Estimates e = Estimates("p");
  EXPECT_GT(e.experts(late).estimate(), e.experts(0).estimate() + 0.3);

  // A restart restores the same estimates, window included.
  Reopen();
  const v1::Estimates restarted = Estimates("p");
  for (int k = 0; k < e.experts_size(); ++k) {
    EXPECT_EQ(restarted.experts(k).estimate(), e.experts(k).estimate()) << k;
    EXPECT_EQ(restarted.experts(k).width(), e.experts(k).width()) << k;
  }
  EXPECT_EQ(GetProblem("p").retained_from(), 4 * kChunk);
  EXPECT_EQ(GetProblem("p").config().retention().max_samples(), 2 * kChunk);
  EXPECT_EQ(Experts()[late].window_start(), 4 * kChunk);
  ExpectWindowedEstimateMatchesReference(late);
  // The log goes on past the cut, and retention follows it.
  PlayRounds("p", 2 * kChunk);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(GetProblem("p").retained_from(), 6 * kChunk);
  // With the late expert's backfill chunks before the cut (it was backfilled over chunks
  // 4, 5 and the start of 6; the early experts, registered before any sample, have none).
  ASSERT_TRUE(service_->Shutdown().ok());
  service_.reset();
  {
    auto store = storage::Store::Open(dir_, storage::StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    std::set<uint64_t> chunks;
    ASSERT_TRUE((*store)
                    ->ForEachBackfillChunk(0, static_cast<uint32_t>(late),
                                           [&](uint64_t c, const storage::v1::BackfillChunk&) {
                                             chunks.insert(c);
                                             return absl::OkStatus();
                                           })
                    .ok());
    EXPECT_EQ(chunks, std::set<uint64_t>({6}));
  }
  Open();
}

// A retired expert's model is unloaded once no kept sample is one it chose: at once if it
// never chose one, and otherwise once retention has cut its last sample, never while a
// decision it made is still pending. What was learned does not change: its frozen estimate
// stays, a later expert's pairs with it are 1 (they weigh no sample of its window) and its
// estimate is the reference's over that window, and a restart does not load the model.
TEST_F(RetentionTest, ARetiredExpertsModelIsUnloadedOnceNoKeptSampleIsOneItChose) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  const int chooser = RegisterLinear("p", 4.0);
  RunMaintenanceUntilActive("p");
  PlayRounds("p", 300);
  // A decision of `chooser`, still pending when it retires.
  v1::ChooseResponse pending;
  for (int i = 0; i < 1000; ++i) {
    pending = Choose("p");
    if (pending.expert_id() == chooser) break;
    ASSERT_TRUE(Reward("p", pending.event_id(), 0.0).ok());
  }
  ASSERT_EQ(pending.expert_id(), chooser);
  const int idle = RegisterLinear("p", 0.5);  // retired before any round: never chooses
  RunMaintenanceUntilActive("p");
  const auto retire = [&](int k) {
    v1::RetireExpertRequest req;
    req.set_problem_id("p");
    req.set_expert_id(k);
    v1::Expert retired;
    ASSERT_TRUE(service_->RetireExpert(req, &retired).ok());
  };
  retire(chooser);
  retire(idle);
  const v1::ExpertEstimate frozen = Estimates("p").experts(chooser);
  const int64_t retired_at = GetProblem("p").samples();
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(MetricValue("decision_experts_unloaded", "problem", "p"), 1);  // idle

  // Retention cuts every sample `chooser` chose so far; its pending decision holds it.
  ASSERT_TRUE(SetRetention(2 * kChunk, 0).ok());
  PlayRounds("p", 4 * kChunk);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  ASSERT_GT(GetProblem("p").retained_from(), retired_at);
  EXPECT_EQ(MetricValue("decision_experts_unloaded", "problem", "p"), 1);
  // Joined now, its sample is kept: still loaded until the cut passes it too.
  ASSERT_TRUE(Reward("p", pending.event_id(), 1.0).ok());
  const int64_t last_chosen = GetProblem("p").samples() - 1;
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(MetricValue("decision_experts_unloaded", "problem", "p"), 1);
  PlayRounds("p", 3 * kChunk);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  ASSERT_GT(GetProblem("p").retained_from(), last_chosen);
  EXPECT_EQ(MetricValue("decision_experts_unloaded", "problem", "p"), 2);

  std::vector<v1::Expert> experts = Experts();
  for (const int k : {chooser, idle}) {
    EXPECT_EQ(experts[k].status(), v1::EXPERT_STATUS_RETIRED) << k;
    EXPECT_EQ(experts[k].kind(), "linear_softmax") << k;  // the record's, not the stand-in's
  }
  EXPECT_EQ(Estimates("p").experts(chooser).estimate(), frozen.estimate());
  EXPECT_EQ(Estimates("p").experts(chooser).width(), frozen.width());

  // A later expert: its window holds no sample of the unloaded ones.
  const int late = RegisterLinear("p", 8.0);
  RunMaintenanceUntilActive("p");
  PlayRounds("p", 300);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  const v1::Estimates e = Estimates("p");
  for (const int k : {chooser, idle}) {
    for (const int64_t cell : {int64_t{late} * e.n() + k, int64_t{k} * e.n() + late}) {
      EXPECT_EQ(e.m(cell), 1.0) << k;
      EXPECT_EQ(e.sigma(cell), 1.0) << k;
    }
  }
  EXPECT_GT(e.m(int64_t{late} * e.n()), 1.0);  // with the uniform expert: estimated
  ExpectWindowedEstimateMatchesReference(late);

  // The store says so, and a restart does not load them again.
  Reopen();
  EXPECT_EQ(MetricValue("decision_experts_unloaded", "problem", "p"), 2);
  const v1::Estimates restarted = Estimates("p");
  for (int k = 0; k < e.experts_size(); ++k) {
    EXPECT_EQ(restarted.experts(k).estimate(), e.experts(k).estimate()) << k;
  }
  experts = Experts();
  EXPECT_EQ(experts[chooser].kind(), "linear_softmax");
  ASSERT_TRUE(service_->Shutdown().ok());
  service_.reset();
  {
    auto store = storage::Store::Open(dir_, storage::StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    for (const int k : {chooser, idle, late}) {
      absl::StatusOr<storage::v1::ExpertRecord> r =
          (*store)->GetExpert(0, static_cast<uint32_t>(k));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->has_unloaded_at_sample(), k != late) << k;
      // An unloaded expert's record keeps the model's kind, not its payload.
      EXPECT_TRUE(r->model().has_linear_softmax()) << k;
      EXPECT_EQ(r->model().linear_softmax().weights_size() > 0, k == late) << k;
    }
  }
  Open();
}

// After a restart D-UCB's counts say which experts chose a sample: one that never did is
// unloaded as soon as it retires, as in the process that registered it, not after a cut
// past the samples written since the restart; one that did still waits for the cut
// (without retention: for good).
TEST_F(RetentionTest, AfterARestartAnExpertThatNeverChoseIsUnloadedAtOnce) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  const int chooser = RegisterLinear("p", 4.0);
  RunMaintenanceUntilActive("p");
  PlayRounds("p", 300);
  const int idle = RegisterLinear("p", 0.5);  // no round after it: never chooses
  RunMaintenanceUntilActive("p");
  {
    const v1::Estimates e = Estimates("p");
    ASSERT_GT(e.experts(chooser).times_selected(), 0);
    ASSERT_EQ(e.experts(idle).times_selected(), 0);
  }
  Reopen();
  for (const int k : {idle, chooser}) {
    v1::RetireExpertRequest req;
    req.set_problem_id("p");
    req.set_expert_id(k);
    v1::Expert retired;
    ASSERT_TRUE(service_->RetireExpert(req, &retired).ok()) << k;
  }
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(MetricValue("decision_experts_unloaded", "problem", "p"), 1);
  PlayRounds("p", 300);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(MetricValue("decision_experts_unloaded", "problem", "p"), 1);  // not `chooser`
  ASSERT_TRUE(service_->Shutdown().ok());
  service_.reset();
  {
    auto store = storage::Store::Open(dir_, storage::StoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    for (const int k : {idle, chooser}) {
      absl::StatusOr<storage::v1::ExpertRecord> r =
          (*store)->GetExpert(0, static_cast<uint32_t>(k));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->has_unloaded_at_sample(), k == idle) << k;
    }
  }
  Open();
}

// ExportLog over gRPC streams the samples in pages: after a cut, a page that starts before
// the first sample kept gets the samples from it on, and the next page must follow those
// (not the requested start plus the page's length, which repeated the first pages).
TEST_F(RetentionTest, AnExportOverGrpcStreamsTheSamplesKeptOnceEach) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  PlayRounds("p", 4 * kChunk + 700);
  ASSERT_TRUE(SetRetention(2 * kChunk, 0).ok());
  ASSERT_TRUE(service_->RunMaintenance().ok());
  const int64_t first = GetProblem("p").retained_from();
  ASSERT_EQ(first, 2 * kChunk);
  std::unique_ptr<GrpcHarness> grpc = GrpcHarness::Start(service_.get(), &metrics_);
  ASSERT_NE(grpc, nullptr);
  const auto exported = [&](int64_t start, int64_t limit) {
    v1::ExportLogRequest req;
    req.set_problem_id("p");
    req.set_start(start);
    req.set_limit(limit);
    grpc::ClientContext ctx;
    std::vector<int64_t> sequences;
    auto reader = grpc->stub().ExportLog(&ctx, req);
    v1::LoggedSample s;
    while (reader->Read(&s)) sequences.push_back(s.sequence());
    EXPECT_TRUE(reader->Finish().ok());
    return sequences;
  };
  const int64_t t = 4 * kChunk + 700;
  for (const int64_t start : {int64_t{0}, first - 1, first, first + 600}) {
    const std::vector<int64_t> all = exported(start, 0);
    const int64_t from = std::max(start, first);
    ASSERT_EQ(static_cast<int64_t>(all.size()), t - from) << "from " << start;
    for (size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(all[i], from + static_cast<int64_t>(i)) << "from " << start;
    }
    // A limit counts the samples streamed, from the first kept.
    const std::vector<int64_t> some = exported(start, 1500);
    ASSERT_EQ(some.size(), 1500u);
    EXPECT_EQ(some.front(), from);
    EXPECT_EQ(some.back(), from + 1499);
  }
}

// Retention by age: the chunks whose samples all joined before now - max_age go; the
// clock, not the traffic, moves the cut.
TEST_F(RetentionTest, KeepsTheSamplesOfTheLastMaxAge) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  PlayRounds("p", 3 * kChunk);
  clock_.AdvanceMs(10'000);
  PlayRounds("p", 3 * kChunk + 10);
  ASSERT_TRUE(SetRetention(0, 5000).ok());
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(GetProblem("p").retained_from(), 3 * kChunk);
  EXPECT_EQ(Export("p").front().sequence(), 3 * kChunk);
  // Without traffic, once the rest is old too: all but the last two chunks (the one being
  // filled, 6, and the one before it are always kept).
  clock_.AdvanceMs(10'000);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(GetProblem("p").retained_from(), 5 * kChunk);
}

// A backfilling expert's window is kept until its backfill completes.
TEST_F(RetentionTest, WaitsForABackfillThatReadsTheSamples) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  PlayRounds("p", 5 * kChunk);
  const int linear = RegisterLinear("p", 8.0);  // window from 0
  fail_writes_ = [](absl::string_view what) { return what == "backfill chunk"; };
  ASSERT_TRUE(SetRetention(2 * kChunk, 0).ok());
  EXPECT_FALSE(service_->RunMaintenance().ok());
  EXPECT_EQ(GetProblem("p").retained_from(), 0) << "the backfill still reads sample 0";
  fail_writes_ = nullptr;
  RunMaintenanceUntilActive("p");
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(GetProblem("p").retained_from(), 3 * kChunk);
  EXPECT_EQ(Experts()[linear].window_start(), 0);
  const v1::Estimates e = Estimates("p");
  EXPECT_GT(e.experts(linear).estimate(), e.experts(0).estimate() + 0.3);
}

TEST_F(RetentionTest, BadSettingsAreRefusedAndChangeNothing) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  ASSERT_TRUE(SetRetention(3 * kChunk, 60'000).ok());
  for (const auto& [samples, age] : std::vector<std::pair<int64_t, int64_t>>{
           {-1, 0}, {100, 0}, {0, -5}, {0, 10}, {int64_t{1} << 60, 0}, {0, int64_t{1} << 62}}) {
    const absl::Status s = SetRetention(samples, age);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << samples << " " << age;
    EXPECT_THAT(s.message(), HasSubstr("retention.max_"));
  }
  EXPECT_EQ(SetRetention(0, 0, nullptr, "nope").code(), absl::StatusCode::kNotFound);
  const v1::Problem p = GetProblem("p");
  EXPECT_EQ(p.config().retention().max_samples(), 3 * kChunk);
  EXPECT_EQ(p.config().retention().max_age_ms(), 60'000);
  // The clipped estimator cannot estimate over a window: refused at creation and later.
  v1::CreateProblemRequest req;
  req.set_problem_id("clipped");
  req.mutable_config()->set_num_arms(kArms);
  req.mutable_config()->set_num_features(kFeatures);
  req.mutable_config()->mutable_estimator()->set_kind(v1::ESTIMATOR_KIND_CLIPPED);
  req.mutable_config()->mutable_retention()->set_max_samples(kChunk * 4);
  v1::Problem created;
  absl::Status s = service_->CreateProblem(req, &created);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("CLIPPED"));
  req.mutable_config()->clear_retention();
  ASSERT_TRUE(service_->CreateProblem(req, &created).ok());
  s = SetRetention(kChunk * 4, 0, nullptr, "clipped");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SetRetention(0, 0, nullptr, "clipped").ok()) << "keeping all is always allowed";
  // The setting survives a restart.
  Reopen();
  EXPECT_EQ(GetProblem("p").config().retention().max_samples(), 3 * kChunk);
}

// DeleteEvents: the events' records go, their samples keep only what learning used, the
// estimates do not move (also through a crash right after), and an expert registered
// later leaves the redacted samples out of its estimate, exactly as the reference does.
TEST_F(RetentionTest, DeletedEventsAreRedactedAndLeftOutOfLaterExperts) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  PlayRounds("p", 3 * kChunk + 50);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  std::vector<v1::LoggedSample> log = Export("p");
  const int64_t t = static_cast<int64_t>(log.size());
  // Old ones, and one in the chunk still being filled.
  const std::vector<int64_t> doomed = {5, 100, kChunk + 7, 2 * kChunk + 1, t - 3};
  v1::DeleteEventsRequest req;
  req.set_problem_id("p");
  for (int64_t s : doomed) req.add_event_ids(log[s].event_id());
  req.add_event_ids("never-decided");
  // A decision still waiting for its reward: refused, and nothing is deleted.
  const v1::ChooseResponse waiting = Choose("p", "waiting");
  req.add_event_ids("waiting");
  v1::DeleteEventsResponse resp;
  absl::Status s = service_->DeleteEvents(req, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("waiting"));
  EXPECT_EQ(Export("p")[5].event_id(), log[5].event_id());
  req.mutable_event_ids()->RemoveLast();
  const v1::Estimates before = Estimates("p");
  ASSERT_TRUE(service_->DeleteEvents(req, &resp).ok());
  EXPECT_EQ(resp.deleted(), static_cast<int64_t>(doomed.size()));
  ASSERT_EQ(resp.not_found_size(), 1);
  EXPECT_EQ(resp.not_found(0), "never-decided");
  // A reward for a deleted event: unknown.
  EXPECT_EQ(Reward("p", log[100].event_id(), 1.0).code(), absl::StatusCode::kNotFound);
  const std::vector<v1::LoggedSample> after = Export("p");
  ASSERT_EQ(static_cast<int64_t>(after.size()), t);
  for (int64_t i = 0; i < t; ++i) {
    const bool gone = std::find(doomed.begin(), doomed.end(), i) != doomed.end();
    EXPECT_EQ(after[i].redacted(), gone) << i;
    EXPECT_EQ(after[i].features_size(), gone ? 0 : kFeatures) << i;
    EXPECT_EQ(after[i].event_id().empty(), gone) << i;
    EXPECT_EQ(after[i].reward(), log[i].reward()) << i;
    EXPECT_EQ(after[i].expert_id(), log[i].expert_id()) << i;
  }
  // Deleting them again: not found.
  v1::DeleteEventsResponse again;
  ASSERT_TRUE(service_->DeleteEvents(req, &again).ok());
  EXPECT_EQ(again.deleted(), 0);
  EXPECT_EQ(again.not_found_size(), 1 + static_cast<int>(doomed.size()));

  // A crash right after (no log chunk or checkpoint written at the stop): the restart
  // scores again only samples whose contexts it has, and the estimates are as before.
  fail_writes_ = [](absl::string_view what) {
    return what == "log chunk" || what == "checkpoint";
  };
  EXPECT_FALSE(service_->Shutdown().ok());
  service_.reset();
  fail_writes_ = nullptr;
  Open();
  const v1::Estimates restarted = Estimates("p");
  ASSERT_EQ(restarted.experts_size(), before.experts_size());
  for (int k = 0; k < before.experts_size(); ++k) {
    EXPECT_EQ(restarted.experts(k).estimate(), before.experts(k).estimate()) << k;
  }

  // A later expert: its backfill skips the redacted samples, and its estimate is the
  // reference's over the samples it could score.
  const int late = RegisterLinear("p", 8.0);
  RunMaintenanceUntilActive("p");
  const v1::Estimates e = Estimates("p");
  const std::vector<v1::LoggedSample> now = Export("p");
  SampleLog rebuilt(e.n());
  for (const v1::LoggedSample& x : now) {
    std::vector<double> row(x.expert_propensities().begin(), x.expert_propensities().end());
    row.resize(e.n(), 1.0);  // a redacted sample has no value of the late expert
    ASSERT_TRUE(rebuilt.Append(x.expert_id(), x.reward(), row).ok());
  }
  DivergenceMatrix d;
  d.num_experts = e.n();
  d.m.assign(e.m().begin(), e.m().end());
  d.sigma.assign(e.sigma().begin(), e.sigma().end());
  const ExpertEstimate ref = reference::MedianOfMeans(rebuilt, rebuilt.size(), d,
                                                      EstimatorOptions(), late, 0, doomed);
  EXPECT_NEAR(e.experts(late).estimate(), ref.mean, 1e-9 * std::max(1.0, std::abs(ref.mean)));
  EXPECT_NEAR(e.experts(late).width(), ref.width, 1e-9 * std::max(1.0, std::abs(ref.width)));
  const ExpertEstimate all = reference::MedianOfMeans(rebuilt, rebuilt.size(), d,
                                                      EstimatorOptions(), late, 0, {});
  EXPECT_NE(e.experts(late).width(), all.width) << "the redacted samples are left out";
  // Training skips them.
  v1::TrainExpertsRequest train;
  train.set_problem_id("p");
  train.set_linear_experts(1);
  train.set_tree_experts(0);
  v1::TrainExpertsResponse job;
  EXPECT_TRUE(service_->TrainExperts(train, &job).ok());
}

TEST_F(RetentionTest, DeleteEventsRefusesBadRequests) {
  CreateProblem("p", /*wait_ms=*/1'000'000);
  v1::DeleteEventsRequest req;
  req.set_problem_id("p");
  v1::DeleteEventsResponse resp;
  EXPECT_EQ(service_->DeleteEvents(req, &resp).code(), absl::StatusCode::kInvalidArgument);
  for (int i = 0; i < 1001; ++i) req.add_event_ids(absl::StrCat("e", i));
  EXPECT_EQ(service_->DeleteEvents(req, &resp).code(), absl::StatusCode::kInvalidArgument);
  req.clear_event_ids();
  req.add_event_ids(std::string(129, 'x'));
  EXPECT_EQ(service_->DeleteEvents(req, &resp).code(), absl::StatusCode::kInvalidArgument);
  req.set_problem_id("nope");
  req.clear_event_ids();
  req.add_event_ids("e");
  EXPECT_EQ(service_->DeleteEvents(req, &resp).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace decision::server
