// The caps of issue 16 that bound what requests can make the server hold: decisions waiting
// for their reward per problem (by count and by estimated memory), and problems per server.
// Past a cap the call gets RESOURCE_EXHAUSTED naming the cap's flag, and nothing stored
// changes; a restart counts what it restores.
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/conversions.h"
#include "server/problem.h"
#include "tests/service_fixture.h"

namespace decision::server {
namespace {

using ::testing::HasSubstr;

class CapsTest : public ServiceTest {
 protected:
  absl::Status TryChoose(const std::string& problem, int features,
                         v1::ChooseResponse* response, const std::string& event_id = "") {
    v1::ChooseRequest req;
    req.set_problem_id(problem);
    req.set_event_id(event_id);
    for (int f = 0; f < features; ++f) req.add_features(0.5);
    return service_->Choose(req, response);
  }
  absl::Status TryCreate(const std::string& id, int features = kFeatures) {
    v1::CreateProblemRequest req;
    req.set_problem_id(id);
    req.mutable_config()->set_num_arms(kArms);
    req.mutable_config()->set_num_features(features);
    req.mutable_config()->set_reward_wait_ms(60'000);
    v1::Problem p;
    return service_->CreateProblem(req, &p);
  }
  // Problem "p" with its uniform expert and two linear ones.
  void CreateWithThreeExperts() {
    CreateProblem("p");
    RegisterLinear("p", 2.0);
    RegisterLinear("p", 1.0);
  }
  // After a cap was lowered below what problem "p" holds: it still loads, with its
  // `experts`, and serves.
  void ExpectReopenedAndServing(size_t experts) {
    Reopen();
    EXPECT_EQ(Experts().size(), experts);
    v1::ChooseResponse r;
    EXPECT_TRUE(TryChoose("p", kFeatures, &r).ok());
  }
  std::vector<std::string> ProblemIds() {
    v1::ListProblemsRequest req;
    v1::ListProblemsResponse resp;
    EXPECT_TRUE(service_->ListProblems(req, &resp).ok());
    std::vector<std::string> ids;
    for (const v1::Problem& p : resp.problems()) ids.push_back(p.problem_id());
    return ids;
  }
};

TEST_F(CapsTest, AChoosePastThePendingDecisionCapIsRefusedUntilARewardMakesRoom) {
  max_pending_decisions_ = 3;
  Reopen();
  ASSERT_TRUE(TryCreate("p").ok());
  std::vector<v1::ChooseResponse> made(3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(TryChoose("p", kFeatures, &made[i], "e" + std::to_string(i)).ok());
  }
  v1::ChooseResponse refused;
  const absl::Status s = TryChoose("p", kFeatures, &refused, "e3");
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("--max_pending_decisions (3)"));
  EXPECT_THAT(s.message(), HasSubstr("holds 3 decisions waiting for their reward"));
  EXPECT_TRUE(absl::IsResourceExhausted(TryChoose("p", kFeatures, &refused)));  // no event id
  EXPECT_EQ(GetProblem("p").decisions(), 3);
  // A retry of a decision already made is answered: it adds nothing.
  v1::ChooseResponse retry;
  ASSERT_TRUE(TryChoose("p", kFeatures, &retry, "e1").ok());
  EXPECT_EQ(retry.arm(), made[1].arm());
  EXPECT_EQ(retry.propensity(), made[1].propensity());
  // The refused event id was not taken: once a reward makes room, it is decided.
  ASSERT_TRUE(Reward("p", "e0", 1.0).ok());
  ASSERT_TRUE(TryChoose("p", kFeatures, &refused, "e3").ok());
  EXPECT_EQ(GetProblem("p").decisions(), 4);
  EXPECT_TRUE(absl::IsResourceExhausted(TryChoose("p", kFeatures, &refused, "e4")));
  // A restart counts the decisions it restores.
  ASSERT_TRUE(service_->RunMaintenance().ok());  // writes the deferred decisions
  Reopen();
  EXPECT_TRUE(absl::IsResourceExhausted(TryChoose("p", kFeatures, &refused, "e4")));
  ASSERT_TRUE(Reward("p", "e3", 0.0).ok());
  EXPECT_TRUE(TryChoose("p", kFeatures, &refused, "e4").ok());
}

// A slate or a batch that the cap stops part-way answers nothing: the decisions it made
// before are not delivered, so they expire unlearned, unless a retry with the same event
// ids gets them back.
TEST_F(CapsTest, ASlateOrABatchTheCapStopsDeliversNoneOfItsDecisions) {
  max_pending_decisions_ = 3;
  Reopen();
  ASSERT_TRUE(TryCreate("p").ok());
  v1::ChooseSlateRequest slate;
  slate.set_problem_id("p");
  slate.set_slots(4);
  for (int f = 0; f < kFeatures; ++f) slate.add_features(0.5);
  v1::ChooseSlateResponse slots;
  absl::Status s = service_->ChooseSlate(slate, &slots);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("slots[3]: "));
  EXPECT_THAT(s.message(), HasSubstr("(the slots before it were not delivered)"));
  EXPECT_EQ(GetProblem("p").decisions(), 3);
  EXPECT_EQ(MetricValue("decision_undelivered_total"), 3.0);
  clock_.AdvanceMs(120'000);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(GetProblem("p").pending(), 0);
  EXPECT_EQ(GetProblem("p").samples(), 0);  // expired, and dropped: never learned

  v1::ChooseBatchRequest batch;
  for (int i = 0; i < 4; ++i) {
    v1::ChooseRequest* r = batch.add_requests();
    r->set_problem_id("p");
    r->set_event_id(absl::StrCat("b", i));
    for (int f = 0; f < kFeatures; ++f) r->add_features(0.5);
  }
  v1::ChooseBatchResponse answered;
  s = service_->ChooseBatch(batch, &answered);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("requests[3]: "));
  EXPECT_THAT(s.message(), HasSubstr("(the decisions before it were not delivered)"));
  EXPECT_EQ(MetricValue("decision_undelivered_total"), 6.0);
  // A retry of the three decided gets them back: delivered, they are learned (with the
  // default reward at their expiry).
  batch.mutable_requests()->RemoveLast();
  v1::ChooseBatchResponse retried;
  ASSERT_TRUE(service_->ChooseBatch(batch, &retried).ok());
  EXPECT_EQ(retried.responses_size(), 3);
  EXPECT_EQ(GetProblem("p").decisions(), 6);
  clock_.AdvanceMs(120'000);
  ASSERT_TRUE(service_->RunMaintenance().ok());
  EXPECT_EQ(GetProblem("p").pending(), 0);
  EXPECT_EQ(GetProblem("p").samples(), 3);
}

TEST_F(CapsTest, TheMemoryCapCountsTheFeaturesOfEachPendingDecision) {
  max_pending_decisions_mb_ = 1;
  Reopen();
  // 8192 features: 8 * 8192 + 512 bytes each, so the 16th passes the megabyte.
  constexpr int kWide = 8192;
  const absl::Status created = TryCreate("wide", kWide);
  ASSERT_TRUE(created.ok()) << created;
  ASSERT_TRUE(TryCreate("narrow").ok());
  const int64_t each = Problem::PendingDecisionBytes(kWide);
  const int64_t fit = ((int64_t{1} << 20) + each - 1) / each;
  v1::ChooseResponse r;
  for (int64_t i = 0; i < fit; ++i) ASSERT_TRUE(TryChoose("wide", kWide, &r).ok()) << i;
  const absl::Status s = TryChoose("wide", kWide, &r);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("--max_pending_decisions_mb (1)"));
  EXPECT_EQ(GetProblem("wide").decisions(), fit);
  // The cap is per problem.
  for (int i = 0; i < 3 * fit; ++i) ASSERT_TRUE(TryChoose("narrow", kFeatures, &r).ok());
}

TEST_F(CapsTest, ACreateProblemPastTheProblemCapIsRefused) {
  max_problems_ = 2;
  Reopen();
  ASSERT_TRUE(TryCreate("a").ok());
  ASSERT_TRUE(TryCreate("b").ok());
  const absl::Status s = TryCreate("c");
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("--max_problems (2)"));
  // An id that exists is still ALREADY_EXISTS: the cap does not hide it.
  EXPECT_TRUE(absl::IsAlreadyExists(TryCreate("a")));
  EXPECT_THAT(ProblemIds(), ::testing::UnorderedElementsAre("a", "b"));
  v1::ChooseResponse r;
  EXPECT_TRUE(TryChoose("a", kFeatures, &r).ok());
  Reopen();
  EXPECT_TRUE(absl::IsResourceExhausted(TryCreate("c")));
  EXPECT_THAT(ProblemIds(), ::testing::UnorderedElementsAre("a", "b"));
  // Raised, the cap lets it in.
  max_problems_ = 3;
  Reopen();
  EXPECT_TRUE(TryCreate("c").ok());
}

// Past --max_experts_per_problem (retired and failed experts count) RegisterExpert is
// refused, naming the flag, with nothing stored changed; a problem that has more experts
// than a lowered cap still loads and serves.
TEST_F(CapsTest, ARegistrationPastTheExpertCapIsRefused) {
  max_experts_per_problem_ = 3;
  Reopen();
  CreateWithThreeExperts();
  v1::RegisterExpertRequest req = LinearRequest("p", 3.0);
  v1::Expert e;
  const absl::Status s = service_->RegisterExpert(req, &e);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("--max_experts_per_problem=3"));
  EXPECT_EQ(Experts().size(), 3u);
  max_experts_per_problem_ = 2;
  ExpectReopenedAndServing(3);
  EXPECT_TRUE(absl::IsResourceExhausted(service_->RegisterExpert(req, &e)));
  max_experts_per_problem_ = 4;
  Reopen();
  EXPECT_TRUE(service_->RegisterExpert(req, &e).ok());
  EXPECT_EQ(Experts().size(), 4u);
}

// --max_problem_memory_mb: the estimator's state grows as N^2 (median of means, 240 fine
// groups), so at 1 MB the 11th expert is refused: twice 0.34 MB of state (it and the buffer
// it is checkpointed from) and 0.41 MB of samples in memory (Problem::MemoryBound).
// Nothing stored changes, and a higher cap lets it in.
TEST_F(CapsTest, ARegistrationPastTheMemoryBudgetIsRefused) {
  storage::v1::ProblemRecord defaults;
  *defaults.mutable_estimator() = EstimatorRecordOf(EstimatorOptions());
  EXPECT_LE(Problem::MemoryBound(defaults, 10), int64_t{1} << 20);
  EXPECT_GT(Problem::MemoryBound(defaults, 11), int64_t{1} << 20);
  max_problem_memory_mb_ = 1;
  Reopen();
  CreateProblem("p");
  absl::Status s;
  for (int i = 0; i < 20 && s.ok(); ++i) {
    v1::Expert e;
    s = service_->RegisterExpert(LinearRequest("p", 1.0 + i), &e);
  }
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("--max_problem_memory_mb=1"));
  EXPECT_THAT(s.message(), HasSubstr("11 experts"));
  EXPECT_EQ(Experts().size(), 10u);
  Reopen();
  EXPECT_EQ(Experts().size(), 10u);
  max_problem_memory_mb_ = 2;
  Reopen();
  v1::Expert e;
  EXPECT_TRUE(service_->RegisterExpert(LinearRequest("p", 30.0), &e).ok());
  EXPECT_EQ(Experts().size(), 11u);
}

// --max_divergence_terms: a divergence refresh computes every ordered pair of live experts
// over the reservoir's contexts and arms, so the cap bounds the live experts. At 4 arms and
// 2048 contexts, a cap of 8 x 4 x 2048 terms takes 3 (6 pairs) and refuses a 4th (12).
// Nothing stored changes; a retired expert makes room; a problem past a lowered cap loads.
TEST_F(CapsTest, ARegistrationPastTheDivergenceCostCapIsRefused) {
  storage::v1::ProblemRecord letter;
  letter.set_num_arms(26);
  letter.set_divergence_reservoir(2048);
  const int64_t cap = ServiceOptions().max_divergence_terms;
  EXPECT_LE(Problem::DivergenceTermsBound(letter, 256, 256), cap);  // never binds on letter
  storage::v1::ProblemRecord wide = letter;
  wide.set_num_arms(4096);
  EXPECT_LE(Problem::DivergenceTermsBound(wide, 32, 256), cap);
  EXPECT_GT(Problem::DivergenceTermsBound(wide, 33, 33), cap);

  max_divergence_terms_ = 8 * kArms * 2048;
  Reopen();
  CreateWithThreeExperts();
  v1::RegisterExpertRequest req = LinearRequest("p", 3.0);
  v1::Expert e;
  absl::Status s = service_->RegisterExpert(req, &e);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("--max_divergence_terms=65536"));
  EXPECT_THAT(s.message(), HasSubstr("4 live experts"));
  EXPECT_EQ(Experts().size(), 3u);
  // A retired expert's pairs are kept, not computed: room for one more.
  RunMaintenanceUntilActive("p");
  ASSERT_TRUE(Retire("p", 1).ok());
  s = service_->RegisterExpert(req, &e);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Experts().size(), 4u);
  // Past a lowered cap the problem still loads and serves.
  max_divergence_terms_ = 1;
  ExpectReopenedAndServing(4);
  EXPECT_TRUE(absl::IsResourceExhausted(service_->RegisterExpert(LinearRequest("p", 4.0), &e)));
}

// The divergence pair series cover only the --metrics_pair_experts active experts of highest
// UCB, and follow the pool when it changes without a new sample (a retirement): the export
// that skips an unchanged problem does not skip that.
TEST_F(CapsTest, PairSeriesCoverTheTopExpertsByUcbAndFollowRetirements) {
  metrics_pair_experts_ = 2;
  metrics_export_interval_ms_ = 0;  // every maintenance round exports
  Reopen();
  CreateProblem("p");
  for (double strength : {4.0, 2.0, 1.0}) RegisterLinear("p", strength);
  RunMaintenanceUntilActive("p");
  PlayRounds("p", 60);
  auto export_now = [&] { ASSERT_TRUE(service_->RunMaintenance().ok()); };
  auto pair_experts = [&] {
    std::set<int> experts;
    int series = 0;
    for (const prometheus::MetricFamily& f : metrics_.registry()->Collect()) {
      if (f.name != "decision_divergence_mij") continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        for (const prometheus::ClientMetric::Label& l : m.label) {
          if (l.name == "expert_i" || l.name == "expert_j") experts.insert(std::stoi(l.value));
        }
        ++series;
      }
    }
    EXPECT_EQ(series, static_cast<int>(experts.size() * (experts.size() - 1)));
    return experts;
  };
  // The top two by UCB, from the estimates.
  auto top_two = [&] {
    std::vector<std::pair<double, int>> by_ucb;
    const v1::Estimates estimates = Estimates("p");
    const std::vector<v1::Expert> experts = Experts();
    for (const v1::ExpertEstimate& e : estimates.experts()) {
      if (experts[e.expert_id()].status() == v1::EXPERT_STATUS_ACTIVE) {
        by_ucb.push_back({-e.ucb(), e.expert_id()});
      }
    }
    std::sort(by_ucb.begin(), by_ucb.end());
    EXPECT_GE(by_ucb.size(), 2u);
    if (by_ucb.size() < 2) return std::set<int>{};
    return std::set<int>{by_ucb[0].second, by_ucb[1].second};
  };
  // Everything learned and any due refresh done, so that the retirement below is the only
  // change between the two exports.
  GetProblem("p");
  export_now();
  export_now();
  const std::set<int> first = top_two();
  EXPECT_EQ(pair_experts(), first);
  // Retire one of them: no sample is learned, yet the series move to the next expert.
  v1::RetireExpertRequest retire;
  retire.set_problem_id("p");
  retire.set_expert_id(*first.rbegin());
  v1::Expert retired;
  ASSERT_TRUE(service_->RetireExpert(retire, &retired).ok());
  export_now();
  const std::set<int> second = top_two();
  EXPECT_EQ(second.count(*first.rbegin()), 0u);
  EXPECT_EQ(pair_experts(), second);
}

}  // namespace
// decision_problem_memory_bytes says what a problem keeps: the sample log in whole
// 4096-row chunks of 4 + 8 + 8 + 8 N bytes (chooser, reward, the chooser's propensity and
// the experts' columns), and the estimator's state, which more samples do not grow.
// Neither part grows with the samples: the log is in the store (issue 16).
TEST_F(CapsTest, MemoryGaugesSplitTheSampleLogFromTheEstimator) {
  metrics_export_interval_ms_ = 0;  // every maintenance round exports
  Reopen();
  CreateProblem("p");
  for (double strength : {4.0, 2.0}) RegisterLinear("p", strength);
  RunMaintenanceUntilActive("p");
  auto memory = [&](const std::string& part) {
    EXPECT_TRUE(service_->RunMaintenance().ok());
    return MetricValue("decision_problem_memory_bytes", "part", part);
  };
  PlayRounds("p", 50);
  GetProblem("p");  // everything learned
  const int n = static_cast<int>(Experts().size());
  ASSERT_EQ(n, 3);  // the uniform expert and the two linear ones
  EXPECT_EQ(memory("sample_log"), 4096.0 * (20 + 8 * n));
  // Round-robin median of means: 240 fine groups of N (N + 4) doubles, and a little more;
  // once a checkpoint carried it, as much again for the buffer it is written from.
  const double state = 240.0 * n * (n + 4) * 8;
  const double estimator = memory("estimator");
  EXPECT_GE(estimator, state);
  EXPECT_LT(estimator, 2 * state + 64 * 1024);
  PlayRounds("p", 200);
  GetProblem("p");
  EXPECT_GE(memory("estimator"), state);
  EXPECT_LT(memory("estimator"), 2 * state + 64 * 1024);
  // Past a chunk: the complete one is written (by the maintenance round) and dropped; only
  // the chunk being filled stays. Nothing per sample grows.
  PlayRounds("p", 4096);
  GetProblem("p");
  EXPECT_EQ(memory("sample_log"), 4096.0 * (20 + 8 * n));
  EXPECT_LT(memory("estimator"), 2 * state + 64 * 1024);
  // A retired expert's row is freed and its column folded: the fine groups keep the sums
  // of the two live experts, 240 x 2 x 2 doubles: 9600 bytes fewer. (The buffer the state
  // is written from is given back only when it is over twice what the state needs.)
  const double before = memory("estimator");
  v1::RetireExpertRequest retire;
  retire.set_problem_id("p");
  retire.set_expert_id(2);
  v1::Expert retired;
  ASSERT_TRUE(service_->RetireExpert(retire, &retired).ok());
  const double after = memory("estimator");
  EXPECT_LE(after, before - 240.0 * (9 - 4) * 8);
  EXPECT_GE(after, 240.0 * (2 * 2 + 4 * n) * 8);
  // The chunks started after its retirement have no column of it (its value is the
  // stand-in's, or where it chose the chooser's, kept for every sample).
  PlayRounds("p", static_cast<int>(2 * 4096 + 10 - GetProblem("p").samples()));
  GetProblem("p");
  EXPECT_EQ(memory("sample_log"), 4096.0 * (20 + 8 * (n - 1)));
}

}  // namespace decision::server
