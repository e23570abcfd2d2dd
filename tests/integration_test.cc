// End-to-end tests of the real decisiond binary on loopback (port 0, a temporary data
// directory per test), driven through the generated client: the Choose -> Reward loop,
// runtime registration with backfill, estimates across a restart, the Prometheus endpoint,
// the standard health service and a clean SIGTERM.
//
// Every RPC carries a deadline (kRpcTimeout). Every random draw comes from a seeded
// std::mt19937_64 and decisiond runs with --seed=1. Background work (backfill, divergence
// refresh, metrics export) is awaited by polling for the state with a generous timeout
// (kPollTimeout); nothing asserts on elapsed time.
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <google/protobuf/util/json_util.h>
#include <gmock/gmock.h>
#include <grpcpp/support/byte_buffer.h>
#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/decision_client.h"
#include "core/xgboost_trainer.h"
#include "decision/v1/decision.grpc.pb.h"
#include "tests/decisiond_fixture.h"
#include "tests/decisiond_process.h"
#include "tests/dsjson_line.pb.h"

namespace decision {
namespace {

using testing::DecisiondProcess;
using testing::HttpGet;
using testing::MakeTempDir;
using testing::ParseCpus;

constexpr int kArms = 4;
constexpr int kFeatures = 3;
constexpr auto kRpcTimeout = std::chrono::seconds(10);
constexpr auto kPollTimeout = std::chrono::seconds(30);
constexpr auto kPollInterval = std::chrono::milliseconds(20);
// The default smoothing of the problem (ProblemConfig.smoothing unset).
constexpr double kSmoothing = 0.05;
// The linear expert's weights: strong enough that it plays the argmax arm most of the time.
constexpr double kLinearStrength = 12.0;

using Stub = v1::DecisionService::Stub;
using ::decision::testing::Call;

std::vector<double> RandomFeatures(std::mt19937_64& gen) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> x(kFeatures);
  for (double& v : x) v = u(gen);
  return x;
}

int ArgMax(const std::vector<double>& x) {
  return static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
}

// The reward of the test world: 1 if the arm is the index of the largest feature.
double ArgMaxReward(const std::vector<double>& x, int arm) { return arm == ArgMax(x) ? 1.0 : 0.0; }

// W[a][f] = strength if a == f: prefers arm argmax(x); arm 3 (no feature) is never best.
v1::ExpertModel LinearArgMaxModel() {
  v1::ExpertModel model;
  auto* l = model.mutable_linear_softmax();
  for (int a = 0; a < kArms; ++a) {
    for (int f = 0; f < kFeatures; ++f) l->add_weights(a == f ? kLinearStrength : 0.0);
    l->add_bias(0.0);
  }
  return model;
}

// pi'(arm | x) of LinearArgMaxModel under the default smoothing, computed here
// independently of the server: (1 - eta) softmax(W x)[arm] + eta / K.
double LinearArgMaxPropensity(const std::vector<double>& x, int arm) {
  std::vector<double> z(kArms, 0.0);
  for (int a = 0; a < kFeatures; ++a) z[a] = kLinearStrength * x[a];
  const double top = *std::max_element(z.begin(), z.end());
  double sum = 0.0;
  for (double v : z) sum += std::exp(v - top);
  return (1.0 - kSmoothing) * std::exp(z[arm] - top) / sum + kSmoothing / kArms;
}

// An XGBoost multi:softprob model trained with the project's trainer on synthetic data
// labelled with the argmax arm (seeded data and seeded training).
std::string TrainArgMaxXgboost() {
  std::mt19937_64 gen(42);
  TrainingSet set;
  set.num_features = kFeatures;
  for (int i = 0; i < 2000; ++i) {
    const std::vector<double> x = RandomFeatures(gen);
    set.Add(x, ArgMax(x), 1.0, 1.0);
  }
  XgboostTrainOptions options;
  options.rounds = 20;
  options.max_depth = 4;
  options.seed = 1;
  absl::StatusOr<std::string> model = TrainXgboostModel(set, kArms, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : std::string();
}

// Polls `done` every kPollInterval until it returns true or kPollTimeout passes.
bool PollUntil(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + kPollTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(kPollInterval);
  }
  return done();
}

// One parsed sample of the Prometheus text format.
struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0.0;
};

// Parses `name{k="v",...} value [timestamp]` lines; skips comments and blank lines.
// Label values here never contain '"', ',' or '}' (problem ids are [A-Za-z0-9_.-]).
std::vector<MetricSample> ParsePrometheusText(const std::string& text) {
  std::vector<MetricSample> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    MetricSample sample;
    size_t value_start;
    const size_t brace = line.find('{');
    const size_t space = line.find(' ');
    if (brace != absl::string_view::npos && brace < space) {
      const size_t close = line.find('}', brace);
      if (close == absl::string_view::npos) continue;
      sample.name = std::string(line.substr(0, brace));
      const absl::string_view labels = line.substr(brace + 1, close - brace - 1);
      for (absl::string_view pair : absl::StrSplit(labels, ',', absl::SkipEmpty())) {
        const size_t eq = pair.find('=');
        if (eq == absl::string_view::npos) continue;
        absl::string_view value = pair.substr(eq + 1);
        if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
          value = value.substr(1, value.size() - 2);
        }
        sample.labels[std::string(pair.substr(0, eq))] = std::string(value);
      }
      value_start = close + 1;
    } else {
      if (space == absl::string_view::npos) continue;
      sample.name = std::string(line.substr(0, space));
      value_start = space;
    }
    std::string rest(line.substr(value_start));
    std::istringstream fields(rest);
    std::string value;
    fields >> value;
    // strtod reads "+Inf", "-Inf" and "NaN" as the text format writes them.
    char* end = nullptr;
    sample.value = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size()) continue;
    out.push_back(std::move(sample));
  }
  return out;
}

class ScrapedMetrics {
 public:
  explicit ScrapedMetrics(std::vector<MetricSample> samples) : samples_(std::move(samples)) {}
  // The value of the one series called `name` whose labels are exactly `labels`.
  std::optional<double> Get(const std::string& name,
                            const std::map<std::string, std::string>& labels) const {
    for (const MetricSample& s : samples_) {
      if (s.name == name && s.labels == labels) return s.value;
    }
    return std::nullopt;
  }
  // Every series called `name` whose labels include `labels`.
  std::vector<MetricSample> All(const std::string& name,
                                const std::map<std::string, std::string>& labels) const {
    std::vector<MetricSample> out;
    for (const MetricSample& s : samples_) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [k, v] : labels) {
        auto it = s.labels.find(k);
        match = match && it != s.labels.end() && it->second == v;
      }
      if (match) out.push_back(s);
    }
    return out;
  }

 private:
  std::vector<MetricSample> samples_;
};

std::optional<ScrapedMetrics> Scrape(const DecisiondProcess& process) {
  absl::StatusOr<std::string> body = HttpGet(process.metrics_address(), "/metrics");
  if (!body.ok()) return std::nullopt;
  return ScrapedMetrics(ParsePrometheusText(*body));
}

class IntegrationTest : public ::decision::testing::DecisiondTest {
 protected:
  // SIGTERM; returns decisiond's exit code. The client channel is closed first: an idle
  // client channel is only polled every few seconds by gRPC's backup poller, so an open one
  // would hold the server's graceful shutdown for up to its grace period.
  int Terminate() {
    stub_.reset();
    return process_->Terminate();
  }

  v1::Problem CreateProblem(const std::string& id) {
    v1::CreateProblemRequest request;
    request.set_problem_id(id);
    request.mutable_config()->set_num_arms(kArms);
    request.mutable_config()->set_num_features(kFeatures);
    v1::Problem problem;
    EXPECT_GRPC_OK(Call(&Stub::CreateProblem, stub_.get(), request, &problem));
    return problem;
  }

  v1::Expert Register(const std::string& problem, const std::string& name,
                      const v1::ExpertModel& model) {
    v1::RegisterExpertRequest request;
    request.set_problem_id(problem);
    request.set_name(name);
    *request.mutable_model() = model;
    v1::Expert expert;
    EXPECT_GRPC_OK(Call(&Stub::RegisterExpert, stub_.get(), request, &expert));
    return expert;
  }

  std::vector<v1::Expert> ListExperts(const std::string& problem) {
    v1::ListExpertsRequest request;
    request.set_problem_id(problem);
    v1::ListExpertsResponse response;
    EXPECT_GRPC_OK(Call(&Stub::ListExperts, stub_.get(), request, &response));
    return {response.experts().begin(), response.experts().end()};
  }

  // Waits until every expert of the problem is ACTIVE.
  // Waits until the background work has nothing left that changes the problem without
  // traffic: every expert backfilled and no batch boundary due (a state, not a time). The
  // server must run with --min_refresh_interval_ms=0, or a due boundary may wait 10 s.
  void WaitUntilSettled(const std::string& problem) {
    const bool settled = PollUntil([&] {
      const v1::Problem p = GetProblem(problem);
      const std::vector<v1::Expert> experts = ListExperts(problem);
      return p.samples() < p.next_batch_at() &&
             std::all_of(experts.begin(), experts.end(), [](const v1::Expert& e) {
               return e.status() == v1::EXPERT_STATUS_ACTIVE;
             });
    });
    ASSERT_TRUE(settled) << "a batch boundary or a backfill is still due";
  }

  void WaitAllActive(const std::string& problem) {
    std::vector<v1::Expert> last;
    const bool active = PollUntil([&] {
      last = ListExperts(problem);
      return std::all_of(last.begin(), last.end(), [](const v1::Expert& e) {
        return e.status() == v1::EXPERT_STATUS_ACTIVE;
      });
    });
    ASSERT_TRUE(active) << "experts not ACTIVE after " << kPollTimeout.count() << " s; last: "
                        << (last.empty() ? "" : last.back().DebugString());
  }

  v1::Problem GetProblem(const std::string& problem) {
    v1::GetProblemRequest request;
    request.set_problem_id(problem);
    v1::Problem response;
    EXPECT_GRPC_OK(Call(&Stub::GetProblem, stub_.get(), request, &response));
    return response;
  }

  v1::Estimates GetEstimates(const std::string& problem) {
    v1::GetEstimatesRequest request;
    request.set_problem_id(problem);
    v1::Estimates response;
    EXPECT_GRPC_OK(Call(&Stub::GetEstimates, stub_.get(), request, &response));
    return response;
  }

  v1::ChooseResponse Choose(const std::string& problem, const std::vector<double>& x,
                            const std::string& event_id) {
    v1::ChooseRequest request;
    request.set_problem_id(problem);
    request.mutable_features()->Add(x.begin(), x.end());
    request.set_event_id(event_id);
    v1::ChooseResponse response;
    EXPECT_GRPC_OK(Call(&Stub::Choose, stub_.get(), request, &response));
    return response;
  }

  v1::RewardResponse Reward(const std::string& problem, const std::string& event_id,
                            double value) {
    v1::RewardRequest request;
    request.set_problem_id(problem);
    request.set_event_id(event_id);
    request.set_value(value);
    v1::RewardResponse response;
    EXPECT_GRPC_OK(Call(&Stub::Reward, stub_.get(), request, &response));
    return response;
  }

  // `rounds` Choose + Reward(ArgMaxReward) pairs with caller-supplied event ids
  // prefix-0, prefix-1, ...; checks each response. Returns the sum of the rewards.
  double RunRounds(const std::string& problem, const std::string& prefix, int rounds,
                   std::mt19937_64& gen, int num_experts) {
    double sum = 0.0;
    for (int i = 0; i < rounds; ++i) {
      const std::vector<double> x = RandomFeatures(gen);
      const v1::ChooseResponse c = Choose(problem, x, absl::StrCat(prefix, "-", i));
      EXPECT_GE(c.arm(), 0);
      EXPECT_LT(c.arm(), kArms);
      EXPECT_GE(c.expert_id(), 0);
      EXPECT_LT(c.expert_id(), num_experts);
      const double value = ArgMaxReward(x, c.arm());
      EXPECT_TRUE(Reward(problem, c.event_id(), value).first());
      sum += value;
    }
    return sum;
  }

};

const v1::ExpertEstimate& EstimateOf(const v1::Estimates& estimates, int expert_id) {
  for (const v1::ExpertEstimate& e : estimates.experts()) {
    if (e.expert_id() == expert_id) return e;
  }
  ADD_FAILURE() << "no estimate for expert " << expert_id << " in " << estimates.DebugString();
  static const v1::ExpertEstimate kNone;
  return kNone;
}

// 1. The full loop: a linear expert that knows the world is learned to be better than the
// uniform one and followed most of the time; Choose is idempotent on caller event ids and
// a repeated Reward is acknowledged but not counted.
TEST_F(IntegrationTest, ChooseRewardLoopLearnsTheBetterExpert) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string problem = "loop";
  const v1::Problem created = CreateProblem(problem);
  EXPECT_EQ(created.config().num_arms(), kArms);
  EXPECT_EQ(created.config().num_features(), kFeatures);
  EXPECT_EQ(created.experts(), 1);

  const v1::Expert linear = Register(problem, "linear", LinearArgMaxModel());
  EXPECT_EQ(linear.expert_id(), 1);
  EXPECT_EQ(linear.kind(), "linear_softmax");
  EXPECT_EQ(linear.status(), v1::EXPERT_STATUS_BACKFILLING);
  EXPECT_EQ(linear.backfill_total(), 0);
  ASSERT_NO_FATAL_FAILURE(WaitAllActive(problem));

  constexpr int kRounds = 2000;
  std::mt19937_64 gen(1);
  std::vector<v1::ChooseResponse> decisions;
  std::vector<std::vector<double>> contexts;
  std::set<std::string> event_ids;
  for (int i = 0; i < kRounds; ++i) {
    const std::vector<double> x = RandomFeatures(gen);
    // Even rounds supply their event id, odd rounds let the server generate one.
    const std::string requested = i % 2 == 0 ? absl::StrCat("loop-", i) : std::string();
    const v1::ChooseResponse c = Choose(problem, x, requested);
    ASSERT_FALSE(c.event_id().empty());
    if (!requested.empty()) {
      EXPECT_EQ(c.event_id(), requested);
    }
    EXPECT_TRUE(event_ids.insert(c.event_id()).second) << "event id reused: " << c.event_id();
    ASSERT_GE(c.arm(), 0);
    ASSERT_LT(c.arm(), kArms);
    ASSERT_TRUE(c.expert_id() == 0 || c.expert_id() == 1) << c.expert_id();
    EXPECT_GT(c.propensity(), 0.0);
    EXPECT_LE(c.propensity(), 1.0);
    // The propensity is the followed expert's probability of the arm.
    const double expected = c.expert_id() == 0 ? 1.0 / kArms : LinearArgMaxPropensity(x, c.arm());
    EXPECT_NEAR(c.propensity(), expected, 1e-9) << "round " << i;
    EXPECT_TRUE(Reward(problem, c.event_id(), ArgMaxReward(x, c.arm())).first()) << "round " << i;
    decisions.push_back(c);
    contexts.push_back(x);
  }

  const v1::Problem after = GetProblem(problem);
  EXPECT_EQ(after.samples(), kRounds);
  EXPECT_EQ(after.pending(), 0);
  EXPECT_EQ(after.decisions(), kRounds);
  EXPECT_EQ(after.experts(), 2);

  const v1::Estimates estimates = GetEstimates(problem);
  EXPECT_EQ(estimates.samples(), kRounds);
  ASSERT_EQ(estimates.experts_size(), 2);
  const v1::ExpertEstimate& uniform = EstimateOf(estimates, 0);
  const v1::ExpertEstimate& learned = EstimateOf(estimates, 1);
  // The uniform expert earns exactly 1/4 in expectation and the linear one (which puts about
  // 0.9 on the argmax arm, minus smoothing) well over 0.7; with 2000 samples both estimates
  // are within a few hundredths of that, so a 0.3 gap is a wide margin.
  EXPECT_NEAR(uniform.estimate(), 0.25, 0.1);
  EXPECT_GT(learned.estimate(), uniform.estimate() + 0.3);
  EXPECT_EQ(uniform.times_selected() + learned.times_selected(), kRounds);
  EXPECT_GT(learned.times_selected(), kRounds * 3 / 4);
  for (const v1::ExpertEstimate& e : estimates.experts()) {
    EXPECT_EQ(e.status(), v1::EXPERT_STATUS_ACTIVE);
    EXPECT_GT(e.effective_sample_size(), 0.0);
    EXPECT_GE(e.width(), 0.0);
    EXPECT_DOUBLE_EQ(e.ucb(), e.estimate() + e.width());
  }
  EXPECT_EQ(estimates.n(), 2);
  EXPECT_EQ(estimates.m_size(), 4);
  EXPECT_EQ(estimates.sigma_size(), 4);

  // Idempotent Choose: a retry with a used event id (and other features) returns the
  // identical decision, for caller ids and for ids the server generated.
  std::mt19937_64 other(99);
  for (int i : {0, 1, 1000, 1001, kRounds - 2, kRounds - 1}) {
    const v1::ChooseResponse retry = Choose(problem, RandomFeatures(other), decisions[i].event_id());
    EXPECT_EQ(retry.SerializeAsString(), decisions[i].SerializeAsString())
        << "retry of round " << i << ": " << retry.DebugString() << " vs "
        << decisions[i].DebugString();
  }

  // A second reward for a joined event is acknowledged, not counted.
  EXPECT_FALSE(Reward(problem, decisions[0].event_id(), 1.0).first());
  EXPECT_FALSE(Reward(problem, decisions[1].event_id(), 0.0).first());
  const v1::Problem final_problem = GetProblem(problem);
  EXPECT_EQ(final_problem.samples(), kRounds);
  EXPECT_EQ(final_problem.decisions(), kRounds);
  EXPECT_EQ(final_problem.pending(), 0);
  EXPECT_EQ(GetEstimates(problem).samples(), kRounds);

  // The log holds each decision once, in join order, with the rewards that were sent.
  const std::vector<v1::LoggedSample> log = ExportLog(problem);
  ASSERT_EQ(log.size(), static_cast<size_t>(kRounds));
  for (int i = 0; i < kRounds; ++i) {
    EXPECT_EQ(log[i].sequence(), i);
    EXPECT_EQ(log[i].event_id(), decisions[i].event_id());
    EXPECT_EQ(log[i].arm(), decisions[i].arm());
    EXPECT_EQ(log[i].expert_id(), decisions[i].expert_id());
    EXPECT_EQ(log[i].propensity(), decisions[i].propensity());
    EXPECT_EQ(log[i].reward(), ArgMaxReward(contexts[i], decisions[i].arm()));
    EXPECT_FALSE(log[i].default_reward());
    ASSERT_EQ(log[i].expert_propensities_size(), 2);
    EXPECT_EQ(log[i].expert_propensities(decisions[i].expert_id()), decisions[i].propensity());
  }
}

// 2. Experts registered after 1500 samples are backfilled over the whole log and estimated
// from it before any new sample arrives.
TEST_F(IntegrationTest, RuntimeRegistrationBackfillsTheWholeHistory) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string problem = "backfill";
  CreateProblem(problem);
  constexpr int kRounds = 1500;
  std::mt19937_64 gen(2);
  std::vector<std::vector<double>> contexts;
  for (int i = 0; i < kRounds; ++i) {
    const std::vector<double> x = RandomFeatures(gen);
    const v1::ChooseResponse c = Choose(problem, x, absl::StrCat("bf-", i));
    ASSERT_EQ(c.expert_id(), 0);
    ASSERT_EQ(c.propensity(), 1.0 / kArms);
    ASSERT_TRUE(Reward(problem, c.event_id(), ArgMaxReward(x, c.arm())).first());
    contexts.push_back(x);
  }
  ASSERT_EQ(GetProblem(problem).samples(), kRounds);

  const std::string xgboost_bytes = TrainArgMaxXgboost();
  ASSERT_FALSE(xgboost_bytes.empty());
  v1::ExpertModel xgboost;
  xgboost.mutable_xgboost()->set_model(xgboost_bytes);

  const v1::Expert linear = Register(problem, "linear", LinearArgMaxModel());
  const v1::Expert trees = Register(problem, "xgboost", xgboost);
  EXPECT_EQ(linear.expert_id(), 1);
  EXPECT_EQ(trees.expert_id(), 2);
  EXPECT_EQ(linear.kind(), "linear_softmax");
  EXPECT_EQ(trees.kind(), "xgboost");
  EXPECT_EQ(linear.status(), v1::EXPERT_STATUS_BACKFILLING);
  EXPECT_EQ(trees.status(), v1::EXPERT_STATUS_BACKFILLING);
  EXPECT_EQ(linear.backfill_total(), kRounds);
  EXPECT_EQ(trees.backfill_total(), kRounds);

  {
    const std::vector<v1::Expert> listed = ListExperts(problem);
    ASSERT_EQ(listed.size(), 3u);
    EXPECT_EQ(listed[1].backfill_total(), kRounds);
    EXPECT_EQ(listed[2].backfill_total(), kRounds);
    for (const v1::Expert& e : listed) {
      EXPECT_GE(e.backfilled(), 0);
      EXPECT_LE(e.backfilled(), e.backfill_total());
    }
  }
  ASSERT_NO_FATAL_FAILURE(WaitAllActive(problem));
  for (const v1::Expert& e : ListExperts(problem)) {
    EXPECT_EQ(e.backfilled(), e.backfill_total()) << e.DebugString();
    if (e.expert_id() > 0) {
      EXPECT_EQ(e.backfill_total(), kRounds) << e.DebugString();
    }
  }

  // Estimates from the whole history, with no new sample.
  const v1::Estimates estimates = GetEstimates(problem);
  EXPECT_EQ(estimates.samples(), kRounds);
  ASSERT_EQ(estimates.experts_size(), 3);
  EXPECT_EQ(estimates.n(), 3);
  EXPECT_EQ(estimates.m_size(), 9);
  EXPECT_EQ(estimates.sigma_size(), 9);
  const v1::ExpertEstimate& uniform = EstimateOf(estimates, 0);
  EXPECT_EQ(uniform.times_selected(), kRounds);
  // Under the uniform logging policy the uniform expert's estimate is the plain mean of
  // 1500 Bernoulli(1/4) rewards: within 0.1 of 0.25 (over 4 standard deviations).
  EXPECT_NEAR(uniform.estimate(), 0.25, 0.1);
  for (int k : {1, 2}) {
    const v1::ExpertEstimate& e = EstimateOf(estimates, k);
    EXPECT_EQ(e.status(), v1::EXPERT_STATUS_ACTIVE);
    EXPECT_EQ(e.times_selected(), 0);
    EXPECT_GT(e.effective_sample_size(), 0.0) << "expert " << k;
    // Both experts play the argmax arm with probability about 0.9 (true value >= 0.7); the
    // importance-weighted estimate from 1500 uniform samples is within about 0.1 of it.
    EXPECT_GT(e.estimate(), uniform.estimate() + 0.25) << "expert " << k;
    EXPECT_TRUE(std::isfinite(e.width())) << "expert " << k;
  }

  // The backfilled propensities are the experts' probabilities of the logged arms.
  const std::vector<v1::LoggedSample> log = ExportLog(problem);
  ASSERT_EQ(log.size(), static_cast<size_t>(kRounds));
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_EQ(log[i].expert_propensities_size(), 3) << "sample " << i;
    EXPECT_EQ(log[i].expert_propensities(0), 1.0 / kArms);
    EXPECT_NEAR(log[i].expert_propensities(1), LinearArgMaxPropensity(contexts[i], log[i].arm()),
                1e-9)
        << "sample " << i;
    EXPECT_GT(log[i].expert_propensities(2), 0.0);
    EXPECT_LE(log[i].expert_propensities(2), 1.0);
  }

  // The backfill progress metric of both reaches 1.
  std::optional<ScrapedMetrics> metrics;
  const bool done = PollUntil([&] {
    metrics = Scrape(*process_);
    if (!metrics) return false;
    for (const char* expert : {"1", "2"}) {
      const std::optional<double> v = metrics->Get("decision_expert_backfill_progress",
                                                   {{"problem", problem}, {"expert", expert}});
      if (!v || *v != 1.0) return false;
    }
    return true;
  });
  EXPECT_TRUE(done) << "decision_expert_backfill_progress did not reach 1 for experts 1, 2";
}

// 3. A clean restart restores exactly the same estimates, log and counters, and the
// service carries on from there.
// The refresh throttle (--min_refresh_interval_ms, 10 s by default) is off here: with it, a
// batch boundary reached within 10 s of the last refresh waits, and the restarted server
// (which does not remember when it last refreshed) takes it at its first maintenance round,
// so the estimates read after the restart depended on whether that round came first.
TEST_F(IntegrationTest, EstimatesAreIdenticalAfterRestart) {
  const std::vector<std::string> flags = {"--min_refresh_interval_ms=0"};
  ASSERT_NO_FATAL_FAILURE(StartServer(flags));
  const std::string problem = "restart";
  CreateProblem(problem);
  Register(problem, "linear", LinearArgMaxModel());
  ASSERT_NO_FATAL_FAILURE(WaitAllActive(problem));
  std::mt19937_64 gen(3);
  RunRounds(problem, "a", 200, gen, 2);
  // A context-free table expert registered mid-way: backfilled over the first 200.
  v1::ExpertModel table;
  auto* row = table.mutable_table()->add_rows();
  for (double p : {0.1, 0.2, 0.3, 0.4}) row->add_probabilities(p);
  EXPECT_EQ(Register(problem, "table", table).backfill_total(), 200);
  ASSERT_NO_FATAL_FAILURE(WaitAllActive(problem));
  RunRounds(problem, "b", 200, gen, 3);
  // Five decisions left pending across the restart.
  std::vector<std::pair<std::string, std::vector<double>>> pending;
  for (int i = 0; i < 5; ++i) {
    const std::vector<double> x = RandomFeatures(gen);
    const v1::ChooseResponse c = Choose(problem, x, absl::StrCat("pending-", i));
    pending.emplace_back(c.event_id(), x);
  }

  ASSERT_NO_FATAL_FAILURE(WaitUntilSettled(problem));
  const v1::Estimates before = GetEstimates(problem);
  const std::vector<v1::LoggedSample> log_before = ExportLog(problem);
  const v1::Problem problem_before = GetProblem(problem);
  const std::vector<v1::Expert> experts_before = ListExperts(problem);
  EXPECT_EQ(problem_before.samples(), 400);
  EXPECT_EQ(problem_before.pending(), 5);
  EXPECT_EQ(problem_before.decisions(), 405);
  ASSERT_EQ(before.n(), 3);

  ASSERT_EQ(Terminate(), 0);
  ASSERT_NO_FATAL_FAILURE(StartServer(flags));

  const v1::Estimates after = GetEstimates(problem);
  EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString())
      << "before:\n" << before.DebugString() << "after:\n" << after.DebugString();
  // The same, field by field, for a readable failure.
  ASSERT_EQ(after.experts_size(), before.experts_size());
  for (int k = 0; k < before.experts_size(); ++k) {
    EXPECT_EQ(after.experts(k).estimate(), before.experts(k).estimate()) << "expert " << k;
    EXPECT_EQ(after.experts(k).width(), before.experts(k).width()) << "expert " << k;
    EXPECT_EQ(after.experts(k).times_selected(), before.experts(k).times_selected());
    EXPECT_EQ(after.experts(k).effective_sample_size(),
              before.experts(k).effective_sample_size()) << "expert " << k;
  }
  EXPECT_EQ(std::vector<double>(after.m().begin(), after.m().end()),
            std::vector<double>(before.m().begin(), before.m().end()));
  EXPECT_EQ(std::vector<double>(after.sigma().begin(), after.sigma().end()),
            std::vector<double>(before.sigma().begin(), before.sigma().end()));
  EXPECT_EQ(after.estimated_regret(), before.estimated_regret());

  const std::vector<v1::LoggedSample> log_after = ExportLog(problem);
  ASSERT_EQ(log_after.size(), log_before.size());
  for (size_t i = 0; i < log_before.size(); ++i) {
    EXPECT_EQ(log_after[i].SerializeAsString(), log_before[i].SerializeAsString())
        << "sample " << i << " before:\n" << log_before[i].DebugString() << "after:\n"
        << log_after[i].DebugString();
  }
  EXPECT_EQ(GetProblem(problem).SerializeAsString(), problem_before.SerializeAsString())
      << GetProblem(problem).DebugString() << " vs " << problem_before.DebugString();
  const std::vector<v1::Expert> experts_after = ListExperts(problem);
  ASSERT_EQ(experts_after.size(), experts_before.size());
  for (size_t k = 0; k < experts_before.size(); ++k) {
    EXPECT_EQ(experts_after[k].SerializeAsString(), experts_before[k].SerializeAsString())
        << experts_after[k].DebugString() << " vs " << experts_before[k].DebugString();
  }

  // The pending decisions survived and can be rewarded; the log continues at 400.
  for (const auto& [event_id, x] : pending) {
    EXPECT_TRUE(Reward(problem, event_id, 1.0).first()) << event_id;
  }
  RunRounds(problem, "c", 50, gen, 3);
  const v1::Problem continued = GetProblem(problem);
  EXPECT_EQ(continued.samples(), 455);
  EXPECT_EQ(continued.decisions(), 455);
  EXPECT_EQ(continued.pending(), 0);
  const std::vector<v1::LoggedSample> log_continued = ExportLog(problem);
  ASSERT_EQ(log_continued.size(), 455u);
  for (size_t i = 0; i < log_continued.size(); ++i) EXPECT_EQ(log_continued[i].sequence(), i);
  EXPECT_EQ(log_continued[400].event_id(), "pending-0");
}

// 4. The Prometheus endpoint exports the documented series with consistent values.
TEST_F(IntegrationTest, MetricsEndpointExportsTheServiceState) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string problem = "metrics";
  CreateProblem(problem);
  Register(problem, "linear", LinearArgMaxModel());
  ASSERT_NO_FATAL_FAILURE(WaitAllActive(problem));

  constexpr int kRounds = 300;
  const double kValues[] = {0.0, 0.25, 0.5, 1.0};  // exact in binary: the sum is exact
  std::mt19937_64 gen(4);
  double reward_sum = 0.0;
  for (int i = 0; i < kRounds; ++i) {
    const v1::ChooseResponse c = Choose(problem, RandomFeatures(gen), absl::StrCat("m-", i));
    const double value = kValues[i % 4];
    ASSERT_TRUE(Reward(problem, c.event_id(), value).first());
    reward_sum += value;
  }
  // Three decisions left pending.
  for (int i = 0; i < 3; ++i) Choose(problem, RandomFeatures(gen), absl::StrCat("p-", i));

  // Polls until the exported state catches up: counters, the estimates and the divergences
  // of the latest export (the first divergence refresh runs after 3K samples). The text format
  // prints doubles with limited precision: estimates match to 1e-9.
  const std::map<std::string, std::string> by_problem = {{"problem", problem}};
  std::optional<ScrapedMetrics> m;
  const bool ready = PollUntil([&] {
    const v1::Estimates estimates = GetEstimates(problem);
    m = Scrape(*process_);
    if (!m) return false;
    const auto decisions = m->Get("decision_decisions_total", by_problem);
    const auto samples = m->Get("decision_samples", by_problem);
    const auto pending = m->Get("decision_pending", by_problem);
    const auto estimate =
        m->Get("decision_expert_estimate", {{"problem", problem}, {"expert", "1"}});
    // M_10 from a refresh over the contexts seen: the linear expert differs from the
    // uniform one, so D_f1 > 0 and M_10 > 1 (the identity before the first refresh is 1).
    const auto m10 = m->Get("decision_divergence_mij",
                            {{"problem", problem}, {"expert_i", "1"}, {"expert_j", "0"}});
    const bool refreshed = estimates.n() == 2 && estimates.m_size() == 4 && estimates.m(2) > 1.0;
    return decisions == kRounds + 3 && samples == kRounds && pending == 3 && estimate &&
           std::abs(*estimate - EstimateOf(estimates, 1).estimate()) < 1e-9 && refreshed &&
           m10 && std::abs(*m10 - estimates.m(2)) < 1e-9 * estimates.m(2);
  });
  ASSERT_TRUE(ready) << "metrics did not reach the expected values in "
                     << kPollTimeout.count() << " s";

  EXPECT_EQ(m->Get("decision_decisions_total", by_problem), kRounds + 3);
  EXPECT_EQ(m->Get("decision_rewards_total", {{"problem", problem}, {"outcome", "learned"}}),
            kRounds);
  EXPECT_EQ(m->Get("decision_rewards_total", {{"problem", problem}, {"outcome", "duplicate"}}),
            0.0);
  EXPECT_EQ(m->Get("decision_reward_sum_total", by_problem), reward_sum);
  EXPECT_EQ(m->Get("decision_pending", by_problem), 3.0);
  EXPECT_EQ(m->Get("decision_samples", by_problem), kRounds);
  // The uniform expert and the linear one, both active.
  for (const char* state : {"active", "shadow", "backfilling", "retired", "failed"}) {
    EXPECT_EQ(m->Get("decision_experts", {{"problem", problem}, {"state", state}}),
              std::string(state) == "active" ? 2.0 : 0.0)
        << state;
  }

  const std::optional<double> regret = m->Get("decision_estimated_regret", by_problem);
  ASSERT_TRUE(regret.has_value());
  EXPECT_TRUE(std::isfinite(*regret));
  EXPECT_GE(*regret, -1e-9);  // t max_k estimate_k >= sum_j n_j estimate_j

  double selected = 0.0;
  for (const char* expert : {"0", "1"}) {
    const std::map<std::string, std::string> labels = {{"problem", problem}, {"expert", expert}};
    const std::optional<double> estimate = m->Get("decision_expert_estimate", labels);
    ASSERT_TRUE(estimate.has_value()) << "expert " << expert;
    EXPECT_GE(*estimate, 0.0);
    EXPECT_LE(*estimate, 1.0);
    const std::optional<double> ucb = m->Get("decision_expert_ucb", labels);
    ASSERT_TRUE(ucb.has_value()) << "expert " << expert;
    EXPECT_GE(*ucb, *estimate);
    const std::optional<double> count = m->Get("decision_expert_selected_total", labels);
    ASSERT_TRUE(count.has_value()) << "expert " << expert;
    selected += *count;
    EXPECT_EQ(m->Get("decision_expert_backfill_progress", labels), 1.0);
  }
  EXPECT_EQ(selected, kRounds + 3);

  // Divergences between the two active experts, both directions.
  for (const char* name : {"decision_divergence_mij", "decision_divergence_sigmaij"}) {
    const std::vector<MetricSample> pairs = m->All(name, by_problem);
    EXPECT_EQ(pairs.size(), 2u) << name;
    for (const MetricSample& s : pairs) {
      EXPECT_TRUE(s.labels.count("expert_i") && s.labels.count("expert_j")) << name;
      EXPECT_NE(s.labels.at("expert_i"), s.labels.at("expert_j")) << name;
      EXPECT_GE(s.value, 1.0) << name;
      EXPECT_TRUE(std::isfinite(s.value)) << name;
    }
  }

  // RPC latency histogram of Choose: kRounds + 3 calls, the +Inf bucket holds them all.
  const std::map<std::string, std::string> choose = {{"method", "Choose"}};
  EXPECT_EQ(m->Get("decision_rpc_latency_seconds_count", choose), kRounds + 3);
  EXPECT_EQ(m->Get("decision_rpc_latency_seconds_bucket", {{"method", "Choose"}, {"le", "+Inf"}}),
            kRounds + 3);
  EXPECT_GT(m->All("decision_rpc_latency_seconds_bucket", choose).size(), 2u);
  const std::optional<double> choose_sum = m->Get("decision_rpc_latency_seconds_sum", choose);
  ASSERT_TRUE(choose_sum.has_value());
  EXPECT_GT(*choose_sum, 0.0);
  EXPECT_EQ(m->Get("decision_rpc_latency_seconds_count", {{"method", "Reward"}}), kRounds);

  const std::optional<double> writes = m->Get("decision_storage_write_latency_seconds_count", {});
  ASSERT_TRUE(writes.has_value());
  // At least one durable write per join (a deferred decision shares its reward's write).
  EXPECT_GE(*writes, kRounds);
  const std::optional<double> size = m->Get("decision_storage_size_bytes", {});
  ASSERT_TRUE(size.has_value());
  EXPECT_GT(*size, 0.0);

  // The allocator's heap (jemalloc's statistics, or glibc's mallinfo2 in a build without
  // jemalloc; exported at the first expert-pool round and every 5 s). Under a sanitizer,
  // which brings its own allocator, glibc's heap is not the process's: only the series
  // are checked there.
  const std::optional<double> in_use = m->Get("decision_allocator_bytes", {{"kind", "in_use"}});
  const std::optional<double> free = m->Get("decision_allocator_bytes", {{"kind", "free"}});
  const std::optional<double> mapped = m->Get("decision_allocator_bytes", {{"kind", "mapped"}});
  ASSERT_TRUE(in_use.has_value() && free.has_value() && mapped.has_value());
  EXPECT_GE(*free, 0.0);
#ifdef DECISIOND_USES_JEMALLOC
  EXPECT_GE(*mapped, *in_use);  // everything jemalloc mapped, what is in use included
#else
  EXPECT_LE(*mapped, *in_use);  // glibc: the allocations of their own mapping
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // decisiond with a store, a problem and an expert holds megabytes (RocksDB's block cache
  // and table readers, the estimator, gRPC's buffers).
  EXPECT_GT(*in_use, 1 << 20);
#endif
}

// 5. The standard grpc.health.v1 service answers SERVING for the server as a whole.
TEST_F(IntegrationTest, HealthServiceAnswersServing) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  int status = -1;
  ASSERT_GRPC_OK(testing::HealthCheck(process_->address(), "", &status));
  EXPECT_EQ(status, 1) << "expected SERVING";
  // An unknown service name is NOT_FOUND, as the health protocol specifies.
  const grpc::Status unknown =
      testing::HealthCheck(process_->address(), "no.such.Service", &status);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND) << unknown.error_message();
}

// The caps' flags are range-checked at start-up: decisiond refuses to start (exit code 2)
// rather than run with a cap that cannot hold or means nothing.
TEST_F(IntegrationTest, CapFlagsOutOfRangeRefuseToStart) {
  for (const char* flag :
       {"--max_experts_per_problem=0", "--max_experts_per_problem=257", "--max_problems=0",
        "--max_pending_decisions=0", "--max_pending_decisions_mb=0",
        "--metrics_pair_experts=-1", "--metrics_pair_experts=257",
        "--max_problem_memory_mb=0", "--max_divergence_terms=0",
        "--malloc_mmap_threshold_kb=-1",
        "--malloc_mmap_threshold_kb=32769"}) {
    EXPECT_FALSE(DecisiondProcess::Start(dir_, {flag}).ok()) << flag;
  }
  auto p = DecisiondProcess::Start(
      dir_, {"--max_experts_per_problem=1", "--max_problems=1", "--max_problem_memory_mb=1",
             "--malloc_mmap_threshold_kb=0"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->Terminate(), 0);
}

// Redirects this process's stderr to a file while a child is started (the child inherits
// it), then restores it.
class StderrToFile {
 public:
  explicit StderrToFile(const std::string& path) {
    std::fflush(stderr);
    saved_ = dup(STDERR_FILENO);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  ~StderrToFile() {
    std::fflush(stderr);
    dup2(saved_, STDERR_FILENO);
    close(saved_);
  }

 private:
  int saved_ = -1;
};

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// 6. SIGTERM after traffic: exit code 0, only the two shutdown lines on stderr, and the
// next start serves the same state.
// Without the refresh throttle, for the reason given at EstimatesAreIdenticalAfterRestart:
// the problem's next_batch_at must not move across the restart.
TEST_F(IntegrationTest, SigtermExitsCleanlyAndRestarts) {
  const std::vector<std::string> flags = {"--min_refresh_interval_ms=0"};
  const std::string log_path = dir_ + ".stderr";
  {
    StderrToFile redirect(log_path);
    ASSERT_NO_FATAL_FAILURE(StartServer(flags));
  }
  const std::string problem = "sigterm";
  CreateProblem(problem);
  std::mt19937_64 gen(6);
  RunRounds(problem, "s", 100, gen, 1);
  Choose(problem, RandomFeatures(gen), "left-pending");
  ASSERT_NO_FATAL_FAILURE(WaitUntilSettled(problem));
  const v1::Problem before = GetProblem(problem);
  EXPECT_EQ(before.samples(), 100);
  EXPECT_EQ(before.pending(), 1);

  ASSERT_EQ(Terminate(), 0);
  const std::vector<std::string> lines = ReadLines(log_path);
  std::filesystem::remove(log_path);
  // The drain and the clean stop are announced, and nothing else looks like trouble: no
  // error, warning or failure from decisiond, RocksDB or gRPC (whose log lines start with
  // E or W and the date, e.g. "E1125 ...").
  ASSERT_GE(lines.size(), 2u) << absl::StrJoin(lines, "\n");
  EXPECT_EQ(lines.front(), "decisiond: signal 15: draining");
  EXPECT_EQ(lines.back(), "decisiond: stopped cleanly");
  for (const std::string& line : lines) {
    const std::string lower = absl::AsciiStrToLower(line);
    for (const char* alarming : {"error", "fail", "warn", "abort", "cannot", "corrupt", "loss",
                                 "maintenance:", "shutdown:", "not learned"}) {
      EXPECT_EQ(lower.find(alarming), std::string::npos) << "decisiond said: " << line;
    }
    const bool grpc_log = line.size() > 5 && (line[0] == 'E' || line[0] == 'W') &&
                          std::all_of(line.begin() + 1, line.begin() + 5, ::isdigit);
    EXPECT_FALSE(grpc_log) << "decisiond said: " << line;
  }

  ASSERT_NO_FATAL_FAILURE(StartServer(flags));
  EXPECT_EQ(GetProblem(problem).SerializeAsString(), before.SerializeAsString());
  EXPECT_TRUE(Reward(problem, "left-pending", 0.5).first());
  RunRounds(problem, "t", 10, gen, 1);
  EXPECT_EQ(GetProblem(problem).samples(), 111);
  EXPECT_EQ(Terminate(), 0);
}

// The CPUs of a list in Linux's format ("0-2,5", as /proc/PID/status prints them).
std::set<int> CpusOf(absl::string_view list) {
  cpu_set_t set;
  EXPECT_TRUE(ParseCpus(list, &set)) << list;
  std::set<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.insert(c);
  }
  return cpus;
}

// --background_cpus: the background threads run on those CPUs and the threads that answer
// requests on the others; a list decisiond cannot keep refuses to start, saying why.
TEST_F(IntegrationTest, BackgroundCpusSplitTheThreadsAndBadListsRefuseToStart) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::set<int> allowed;  // what decisiond inherits
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) allowed.insert(c);
  }
  std::vector<std::pair<std::string, std::string>> refused = {
      {"x", "not a CPU or a range"},
      {"3-2", "backwards"},
      {absl::StrJoin(allowed, ","), "leaves no CPU for the threads that answer requests"},
  };
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!allowed.count(c)) {
      refused.push_back({std::to_string(c), "names CPUs decisiond may not run on"});
      break;
    }
  }
  const std::string log_path = dir_ + ".stderr";
  for (const auto& [list, why] : refused) {
    {
      StderrToFile redirect(log_path);
      EXPECT_FALSE(DecisiondProcess::Start(dir_, {"--background_cpus=" + list}).ok()) << list;
    }
    const std::string said = absl::StrJoin(ReadLines(log_path), "\n");
    EXPECT_NE(said.find(why), std::string::npos) << list << ": " << said;
  }
  std::filesystem::remove(log_path);
  // With one CPU every list is refused (its own is, above); with more, the last is the
  // background's.
  if (allowed.size() < 2) return;
  const int background = *allowed.rbegin();
  std::set<int> request = allowed;
  request.erase(background);
  ASSERT_NO_FATAL_FAILURE(StartServer({"--background_cpus=" + std::to_string(background)}));
  const std::string problem = "pinned";
  CreateProblem(problem);
  std::mt19937_64 gen(8);
  RunRounds(problem, "p", 50, gen, 1);
  ASSERT_NO_FATAL_FAILURE(WaitUntilSettled(problem));

  std::map<std::string, std::vector<std::set<int>>> cpus_by_name;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", process_->pid(), "/task"))) {
    std::string name;
    std::getline(std::ifstream(task.path() / "comm"), name);
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (absl::StartsWith(line, "Cpus_allowed_list:")) {
        cpus_by_name[name].push_back(
            CpusOf(absl::StripAsciiWhitespace(absl::string_view(line).substr(line.find(':') + 1))));
      }
    }
  }
  const std::set<int> only_background = {background};
  int rocksdb_threads = 0;
  for (const auto& [name, masks] : cpus_by_name) {
    // jemalloc's purge thread (in a build with jemalloc) starts before main; decisiond
    // restarts it on the background CPUs.
    const bool background_thread = name == "learner" || name == "scorer" ||
                                   name == "trainer" || name == "expert-pool" ||
                                   name == "maintenance" || absl::StartsWith(name, "rocksdb:") ||
                                   absl::StartsWith(name, "jemalloc");
    rocksdb_threads += absl::StartsWith(name, "rocksdb:") ? static_cast<int>(masks.size()) : 0;
    // Threads no one named (started by RocksDB in the store's Open) say nothing about the
    // split.
    if (name == "decisiond") continue;
    for (const std::set<int>& mask : masks) {
      EXPECT_EQ(mask, background_thread ? only_background : request) << name;
    }
  }
  for (const char* name : {"learner", "trainer", "expert-pool", "maintenance", "writer",
                           "blocking"}) {
    EXPECT_TRUE(cpus_by_name.count(name)) << name << " is not among decisiond's threads";
  }
  EXPECT_GT(rocksdb_threads, 0);
  EXPECT_EQ(GetProblem(problem).samples(), 50);
  EXPECT_EQ(Terminate(), 0);
}

}  // namespace
}  // namespace decision

namespace decision {
namespace {

// What an ad server needs around Choose, through gRPC against the real decisiond (issue
// 18): eligible arms on every request, deferred decisions (never activated: dropped and
// counted; activated: learned), a shadow expert that is estimated but never selected until
// promoted, EvaluateModel giving the shadow expert's SNIPS over the same log, Explain
// reproducing a decision, a two-slot slate rewarded per slot, and the DSJSON export parsed
// back.
// What gRPC cannot send in a header (a newline, bytes outside printable ASCII) fails the
// call with INVALID_ARGUMENT: gRPC would abort the caller's whole process (an ad server).
TEST_F(IntegrationTest, ClientLibraryRefusesHeaderBytesInsteadOfAborting) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  client::ClientOptions options;
  options.address = process_->address();
  options.token = "s3cret\n";
  client::DecisionClient with_newline(options);
  EXPECT_EQ(with_newline.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with_newline.GetProblem("p").status().code(), absl::StatusCode::kInvalidArgument);
  options.token.clear();
  client::DecisionClient c(options);
  for (const std::string id : {"p\n", "Z\xc3\xbcrich"}) {
    const absl::Status s = c.GetProblem(id).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("has a character outside"));
  }
}

// The client library's slates and batches: ids it fills in itself make a retry return the
// same decisions, and a problem that learns first slots only refuses a lower slot's reward.
TEST_F(IntegrationTest, ClientLibrarySlatesAndBatchesAreRetrySafe) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  client::ClientOptions options;
  options.address = process_->address();
  client::DecisionClient c(options);
  ASSERT_TRUE(c.status().ok()) << c.status();
  v1::ProblemConfig config;
  config.set_num_arms(kArms);
  config.set_num_features(kFeatures);
  config.set_slate_learning(v1::SLATE_LEARNING_FIRST_SLOT);
  ASSERT_TRUE(c.CreateProblem("slates", config).ok());
  v1::ChooseSlateRequest slate;
  slate.set_problem_id("slates");
  slate.set_slots(2);
  for (int f = 0; f < kFeatures; ++f) slate.add_features(0.1 * f);
  absl::StatusOr<v1::ChooseSlateResponse> chosen = c.ChooseSlate(slate);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_EQ(chosen->slots_size(), 2);
  EXPECT_FALSE(chosen->event_id().empty());
  EXPECT_EQ(chosen->slots(1).event_id(), chosen->event_id() + "/1");
  EXPECT_NE(chosen->slots(0).arm(), chosen->slots(1).arm());
  slate.set_event_id(chosen->event_id());
  absl::StatusOr<v1::ChooseSlateResponse> again = c.ChooseSlate(slate);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), chosen->SerializeAsString());
  EXPECT_TRUE(c.Reward("slates", chosen->slots(0).event_id(), 1.0).ok());
  EXPECT_EQ(c.Reward("slates", chosen->slots(1).event_id(), 1.0).status().code(),
            absl::StatusCode::kFailedPrecondition);

  v1::ChooseBatchRequest batch;
  for (int i = 0; i < 3; ++i) {
    v1::ChooseRequest* r = batch.add_requests();
    r->set_problem_id("slates");
    for (int f = 0; f < kFeatures; ++f) r->add_features(0.3 * i + f);
  }
  absl::StatusOr<v1::ChooseBatchResponse> decided = c.ChooseBatch(batch);
  ASSERT_TRUE(decided.ok()) << decided.status();
  ASSERT_EQ(decided->responses_size(), 3);
  std::set<std::string> ids;
  for (const v1::ChooseResponse& r : decided->responses()) {
    ids.insert(r.event_id());
    EXPECT_TRUE(c.Reward("slates", r.event_id(), 0.5).ok());
  }
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.count(""), 0u);
}

// A proxy routes by the x-decision-problem metadata (deploy/haproxy): a call whose metadata
// names another problem than its request is refused before it does anything.
TEST_F(IntegrationTest, TheRoutingMetadataMustNameTheRequestsProblem) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  CreateProblem("routed");
  v1::ChooseRequest request;
  request.set_problem_id("routed");
  request.set_event_id("r1");
  for (int f = 0; f < kFeatures; ++f) request.add_features(0.1);
  const auto choose = [&](const char* routed) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.AddMetadata("x-decision-problem", routed);
    v1::ChooseResponse response;
    return stub_->Choose(&ctx, request, &response);
  };
  const grpc::Status refused = choose("other");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(),
            "the x-decision-problem metadata names problem other, the request problem routed: "
            "a proxy routes by the metadata, so they must agree");
  EXPECT_GRPC_OK(choose("routed"));
  v1::GetProblemRequest get;
  get.set_problem_id("routed");
  v1::Problem problem;
  ASSERT_GRPC_OK(Call(&Stub::GetProblem, stub_.get(), get, &problem));
  EXPECT_EQ(problem.decisions(), 1);  // the refused call decided nothing
}

TEST_F(IntegrationTest, AdServerFunnel) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string problem = "funnel";
  {
    v1::CreateProblemRequest request;
    request.set_problem_id(problem);
    request.mutable_config()->set_num_arms(kArms);
    request.mutable_config()->set_num_features(kFeatures);
    request.mutable_config()->set_reward_wait_ms(1000);
    v1::Problem created;
    ASSERT_GRPC_OK(Call(&Stub::CreateProblem, stub_.get(), request, &created));
  }
  Register(problem, "linear", LinearArgMaxModel());
  ASSERT_NO_FATAL_FAILURE(WaitAllActive(problem));
  std::mt19937_64 gen(18);
  // Chooses with a random eligible set (every arm one time in four) and checks the arm.
  const auto choose = [&](const std::string& event_id, bool deferred,
                          std::vector<double>* x_out = nullptr) {
    v1::ChooseRequest request;
    request.set_problem_id(problem);
    request.set_event_id(event_id);
    request.set_deferred(deferred);
    const std::vector<double> x = RandomFeatures(gen);
    request.mutable_features()->Add(x.begin(), x.end());
    std::vector<int32_t> eligible;
    if (std::uniform_int_distribution<int>(0, 3)(gen) != 0) {
      for (int a = 0; a < kArms; ++a) {
        if (std::bernoulli_distribution(0.5)(gen)) eligible.push_back(a);
      }
      if (eligible.empty()) eligible.push_back(ArgMax(x));
      request.mutable_eligible()->mutable_arms()->Add(eligible.begin(), eligible.end());
    }
    v1::ChooseResponse response;
    EXPECT_GRPC_OK(Call(&Stub::Choose, stub_.get(), request, &response));
    EXPECT_TRUE(eligible.empty() ||
                std::count(eligible.begin(), eligible.end(), response.arm()) == 1)
        << event_id << ": arm " << response.arm() << " was not eligible";
    if (x_out != nullptr) *x_out = x;
    return response;
  };
  const auto play = [&](const std::string& prefix, int rounds) {
    for (int i = 0; i < rounds; ++i) {
      std::vector<double> x;
      const v1::ChooseResponse c = choose(absl::StrCat(prefix, i), false, &x);
      Reward(problem, c.event_id(), ArgMaxReward(x, c.arm()));
    }
  };
  play("m", 300);

  // Deferred decisions: a reward before the activation is refused.
  std::vector<std::vector<double>> shown(5);
  for (int i = 0; i < 5; ++i) {
    choose(absl::StrCat("hidden", i), true);
    choose(absl::StrCat("shown", i), true, &shown[i]);
  }
  {
    v1::RewardRequest request;
    request.set_problem_id(problem);
    request.set_event_id("shown0");
    request.set_value(1.0);
    v1::RewardResponse response;
    const grpc::Status s = Call(&Stub::Reward, stub_.get(), request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  for (int i = 0; i < 5; ++i) {
    v1::ActivateRequest request;
    request.set_problem_id(problem);
    request.set_event_id(absl::StrCat("shown", i));
    v1::ActivateResponse response;
    ASSERT_GRPC_OK(Call(&Stub::Activate, stub_.get(), request, &response));
    EXPECT_TRUE(response.first());
    Reward(problem, request.event_id(), 1.0);
  }

  // A shadow expert: estimated, never selected.
  v1::ExpertModel candidate = LinearArgMaxModel();
  for (double& w : *candidate.mutable_linear_softmax()->mutable_weights()) w *= 0.5;
  v1::Expert shadow;
  {
    v1::RegisterExpertRequest request;
    request.set_problem_id(problem);
    request.set_name("candidate");
    *request.mutable_model() = candidate;
    request.set_shadow(true);
    ASSERT_GRPC_OK(Call(&Stub::RegisterExpert, stub_.get(), request, &shadow));
  }
  ASSERT_TRUE(PollUntil([&] {
    return ListExperts(problem)[shadow.expert_id()].status() == v1::EXPERT_STATUS_SHADOW;
  }));
  for (int i = 0; i < 200; ++i) {
    std::vector<double> x;
    const v1::ChooseResponse c = choose(absl::StrCat("s", i), false, &x);
    EXPECT_NE(c.expert_id(), shadow.expert_id());
    Reward(problem, c.event_id(), ArgMaxReward(x, c.arm()));
  }
  const v1::Estimates estimates = GetEstimates(problem);
  const v1::ExpertEstimate& estimate = EstimateOf(estimates, shadow.expert_id());
  EXPECT_EQ(estimate.status(), v1::EXPERT_STATUS_SHADOW);
  EXPECT_EQ(estimate.times_selected(), 0);
  EXPECT_TRUE(std::isfinite(estimate.width()));

  // EvaluateModel of the same model over the same log: the SNIPS of its column.
  v1::ModelEvaluation evaluation;
  {
    v1::EvaluateModelRequest request;
    request.set_problem_id(problem);
    *request.mutable_model() = candidate;
    ASSERT_GRPC_OK(Call(&Stub::EvaluateModel, stub_.get(), request, &evaluation));
  }
  const std::vector<v1::LoggedSample> log = ExportLog(problem);
  double sum_w = 0, sum_wy = 0;
  for (const v1::LoggedSample& s : log) {
    ASSERT_GT(s.expert_propensities_size(), shadow.expert_id());
    const double w = s.expert_propensities(shadow.expert_id()) / s.propensity();
    sum_w += w;
    sum_wy += w * s.reward();
  }
  EXPECT_EQ(evaluation.samples(), static_cast<int64_t>(log.size()));
  EXPECT_NEAR(evaluation.snips(), sum_wy / sum_w, 1e-12);
  // GetEstimates reports the same off-policy estimates of the shadow expert, kept as the
  // samples were learnt (its backfill, then every join).
  v1::Estimates learned;
  ASSERT_TRUE(PollUntil([&] {
    learned = GetEstimates(problem);
    return learned.samples() == evaluation.samples();
  }));
  const v1::ModelEvaluation tracked = EstimateOf(learned, shadow.expert_id()).off_policy();
  EXPECT_EQ(tracked.samples(), evaluation.samples());
  EXPECT_NEAR(tracked.ips(), evaluation.ips(), 1e-9);
  EXPECT_NEAR(tracked.ips_lower(), evaluation.ips_lower(), 1e-9);
  EXPECT_NEAR(tracked.ips_upper(), evaluation.ips_upper(), 1e-9);
  EXPECT_NEAR(tracked.snips(), evaluation.snips(), 1e-9);
  EXPECT_NEAR(tracked.clipped_ips(), evaluation.clipped_ips(), 1e-9);
  EXPECT_NEAR(tracked.effective_sample_size(), evaluation.effective_sample_size(), 1e-6);
  EXPECT_GT(tracked.effective_sample_size(), 0.0);

  // Promoted: selectable.
  {
    v1::PromoteRequest request;
    request.set_problem_id(problem);
    request.set_expert_id(shadow.expert_id());
    v1::Expert promoted;
    ASSERT_GRPC_OK(Call(&Stub::Promote, stub_.get(), request, &promoted));
    EXPECT_EQ(promoted.status(), v1::EXPERT_STATUS_ACTIVE);
  }

  // Explain reproduces a decision made under eligibility.
  for (const v1::LoggedSample& s : log) {
    if (s.eligible_arms_size() == 0) continue;
    v1::ExplainRequest request;
    request.set_problem_id(problem);
    request.set_event_id(s.event_id());
    v1::Explanation why;
    ASSERT_GRPC_OK(Call(&Stub::Explain, stub_.get(), request, &why));
    EXPECT_THAT(why.eligible_arms(), ::testing::ElementsAreArray(s.eligible_arms()));
    EXPECT_EQ(why.arm(), s.arm());
    EXPECT_EQ(why.outcome(), v1::DECISION_OUTCOME_JOINED);
    EXPECT_TRUE(why.reproduced());
    break;
  }

  // A two-slot slate, rewarded per slot ("<id>/<slot>").
  {
    v1::ChooseSlateRequest request;
    request.set_problem_id(problem);
    request.set_event_id("page");
    request.set_slots(2);
    const std::vector<double> x = RandomFeatures(gen);
    request.mutable_features()->Add(x.begin(), x.end());
    v1::ChooseSlateResponse slate;
    ASSERT_GRPC_OK(Call(&Stub::ChooseSlate, stub_.get(), request, &slate));
    ASSERT_EQ(slate.slots_size(), 2);
    EXPECT_NE(slate.slots(0).arm(), slate.slots(1).arm());
    EXPECT_TRUE(Reward(problem, "page/0", ArgMaxReward(x, slate.slots(0).arm())).first());
    EXPECT_TRUE(Reward(problem, "page/1", ArgMaxReward(x, slate.slots(1).arm())).first());
  }

  // The decisions never activated are dropped once their wait expires.
  ASSERT_TRUE(PollUntil([&] {
    v1::ExplainRequest request;
    request.set_problem_id(problem);
    request.set_event_id("hidden4");
    v1::Explanation why;
    return Call(&Stub::Explain, stub_.get(), request, &why).ok() &&
           why.outcome() == v1::DECISION_OUTCOME_DROPPED;
  }));
  std::optional<ScrapedMetrics> metrics;
  ASSERT_TRUE(PollUntil([&] {
    metrics = Scrape(*process_);
    if (!metrics.has_value()) return false;
    const std::vector<MetricSample> dropped = metrics->All(
        "decision_expired_total", {{"problem", problem}, {"handling", "never_activated"}});
    return dropped.size() == 1 && dropped[0].value == 5;
  })) << "decision_expired_total{handling=never_activated} is not 5";

  // The DSJSON export parses back: one line per joined decision, none of the hidden ones.
  v1::ExportLogRequest request;
  request.set_problem_id(problem);
  request.set_format(v1::EXPORT_FORMAT_DSJSON);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
  std::unique_ptr<grpc::ClientReader<v1::LoggedSample>> reader = stub_->ExportLog(&ctx, request);
  v1::LoggedSample sample;
  int lines = 0;
  std::set<std::string> ids;
  while (reader->Read(&sample)) {
    testing::DsjsonLine line;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(sample.dsjson(), &line).ok())
        << sample.dsjson();
    EXPECT_EQ(line.label_probability(), sample.propensity());
    EXPECT_EQ(line.label_action(), sample.arm() + 1);
    ids.insert(line.event_id());
    ++lines;
  }
  ASSERT_GRPC_OK(reader->Finish());
  EXPECT_EQ(lines, 300 + 5 + 200 + 2);
  EXPECT_EQ(ids.count("page/0") + ids.count("page/1"), 2u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(ids.count(absl::StrCat("hidden", i)), 0u);
    EXPECT_EQ(ids.count(absl::StrCat("shown", i)), 1u);
  }
}

}  // namespace
}  // namespace decision
