// A replay of a labelled data set (the ad-server simulation of decisionctl replay) through
// the real decisiond over gRPC, and through the same service in-process, with the same seed:
// the decisions are identical, including the experts trained from the log on the way.
//
// Why this is the guarantee tested: with the maintenance on background threads (the
// default), when a divergence refresh, a backfill or a training job lands relative to the
// request stream depends on thread scheduling, so two runs can diverge after the first
// batch boundary. With --inline_maintenance that work runs at a fixed point (after each
// Reward), which makes the decisions a function of the seed and the request sequence alone.
// The benchmark simulation (bench/simulation.cc) uses the same core D-UCB but its own
// random stream and precomputed predictions, so it makes statistically equivalent, not
// identical, decisions.
#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "server/clock.h"
#include "server/decision_service.h"
#include "server/metrics.h"
#include "server/problem.h"
#include "tests/decisiond_process.h"

namespace decision {
namespace {

constexpr int kRounds = 600;
constexpr uint64_t kSeed = 5;

struct Rows {
  std::vector<std::vector<double>> x;
  std::vector<int> y;
};

Rows LoadDigitsInOrder() {
  Rows all;
  std::ifstream in(DECISION_SOURCE_DIR "/bench/data/digits.csv");
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string cell;
    std::vector<double> row;
    while (std::getline(ss, cell, ',')) row.push_back(std::stod(cell));
    all.y.push_back(static_cast<int>(row.back()));
    row.pop_back();
    all.x.push_back(std::move(row));
  }
  Rows ordered;
  std::ifstream order(DECISION_SOURCE_DIR "/bench/data/orders/digits.s1.perm.txt");
  int i;
  while (order >> i) {
    ordered.x.push_back(all.x[i]);
    ordered.y.push_back(all.y[i]);
  }
  return ordered;
}

v1::CreateProblemRequest Create() {
  v1::CreateProblemRequest req;
  req.set_problem_id("digits");
  req.mutable_config()->set_num_arms(10);
  req.mutable_config()->set_num_features(64);
  req.mutable_config()->set_reward_wait_ms(3'600'000);
  auto* at = req.mutable_config()->mutable_auto_train();
  at->set_enabled(true);
  at->set_tree_experts(2);
  at->set_linear_experts(1);
  return req;
}

// The two ways to reach the service.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual absl::Status CreateProblem(const v1::CreateProblemRequest& req) = 0;
  virtual absl::StatusOr<v1::ChooseResponse> Choose(const v1::ChooseRequest& req) = 0;
  virtual absl::Status Reward(const v1::RewardRequest& req) = 0;
  virtual absl::StatusOr<v1::ListExpertsResponse> ListExperts() = 0;
};

class InProcess final : public Backend {
 public:
  explicit InProcess(const std::string& dir, int64_t reservoir_predictions_mb = 128) {
    server::ServiceOptions o;
    o.data_dir = dir;
    o.seed = kSeed;
    o.reservoir_predictions_mb = reservoir_predictions_mb;
    o.inline_maintenance = true;
    o.start_maintenance_thread = false;
    auto s = server::DecisionService::Open(o, &clock_, &metrics_);
    EXPECT_TRUE(s.ok()) << s.status();
    service_ = *std::move(s);
  }
  absl::Status CreateProblem(const v1::CreateProblemRequest& req) override {
    v1::Problem p;
    return service_->CreateProblem(req, &p);
  }
  absl::StatusOr<v1::ChooseResponse> Choose(const v1::ChooseRequest& req) override {
    v1::ChooseResponse r;
    if (absl::Status s = service_->Choose(req, &r); !s.ok()) return s;
    return r;
  }
  absl::Status Reward(const v1::RewardRequest& req) override {
    v1::RewardResponse r;
    return service_->Reward(req, &r);
  }
  absl::StatusOr<v1::ListExpertsResponse> ListExperts() override {
    v1::ListExpertsRequest req;
    req.set_problem_id("digits");
    v1::ListExpertsResponse r;
    if (absl::Status s = service_->ListExperts(req, &r); !s.ok()) return s;
    return r;
  }

 private:
  server::SystemClock clock_;
  server::Metrics metrics_;
  std::unique_ptr<server::DecisionService> service_;
};

absl::Status FromGrpc(const grpc::Status& s) {
  return s.ok() ? absl::OkStatus()
                : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

class OverGrpc final : public Backend {
 public:
  explicit OverGrpc(const std::string& dir) {
    auto p = testing::DecisiondProcess::Start(
        dir, {"--inline_maintenance", "--seed=" + std::to_string(kSeed)});
    EXPECT_TRUE(p.ok()) << p.status();
    process_ = *std::move(p);
    stub_ = process_->NewStub();
  }
  template <typename Req, typename Resp, typename Method>
  absl::Status Call(Method method, const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return FromGrpc((stub_.get()->*method)(&ctx, req, resp));
  }
  absl::Status CreateProblem(const v1::CreateProblemRequest& req) override {
    v1::Problem p;
    return Call(&v1::DecisionService::Stub::CreateProblem, req, &p);
  }
  absl::StatusOr<v1::ChooseResponse> Choose(const v1::ChooseRequest& req) override {
    v1::ChooseResponse r;
    if (absl::Status s = Call(&v1::DecisionService::Stub::Choose, req, &r); !s.ok()) return s;
    return r;
  }
  absl::Status Reward(const v1::RewardRequest& req) override {
    v1::RewardResponse r;
    return Call(&v1::DecisionService::Stub::Reward, req, &r);
  }
  absl::StatusOr<v1::ListExpertsResponse> ListExperts() override {
    v1::ListExpertsRequest req;
    req.set_problem_id("digits");
    v1::ListExpertsResponse r;
    if (absl::Status s = Call(&v1::DecisionService::Stub::ListExperts, req, &r); !s.ok()) {
      return s;
    }
    return r;
  }

 private:
  std::unique_ptr<testing::DecisiondProcess> process_;
  std::unique_ptr<v1::DecisionService::Stub> stub_;
};

struct Trace {
  std::vector<std::string> decisions;  // "arm expert propensity" per round
  double reward = 0.0;
  int experts = 0;
};

Trace Replay(Backend& backend, const Rows& rows,
             const v1::CreateProblemRequest& create = Create()) {
  Trace trace;
  EXPECT_TRUE(backend.CreateProblem(create).ok());
  for (int t = 0; t < kRounds; ++t) {
    v1::ChooseRequest choose;
    choose.set_problem_id("digits");
    choose.set_event_id("row-" + std::to_string(t));
    choose.mutable_features()->Add(rows.x[t].begin(), rows.x[t].end());
    absl::StatusOr<v1::ChooseResponse> d = backend.Choose(choose);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return trace;
    char buf[96];
    std::snprintf(buf, sizeof(buf), "%d %d %.17g", d->arm(), d->expert_id(), d->propensity());
    trace.decisions.push_back(buf);
    v1::RewardRequest reward;
    reward.set_problem_id("digits");
    reward.set_event_id(choose.event_id());
    reward.set_value(d->arm() == rows.y[t] ? 1.0 : 0.0);
    trace.reward += reward.value();
    EXPECT_TRUE(backend.Reward(reward).ok());
  }
  absl::StatusOr<v1::ListExpertsResponse> experts = backend.ListExperts();
  EXPECT_TRUE(experts.ok());
  trace.experts = experts.ok() ? experts->experts_size() : 0;
  return trace;
}

// Both replays made all kRounds decisions, the same ones, and trained as many experts.
void ExpectSameReplay(const Trace& a, const Trace& b) {
  ASSERT_EQ(a.decisions.size(), static_cast<size_t>(kRounds));
  ASSERT_EQ(b.decisions.size(), static_cast<size_t>(kRounds));
  for (int t = 0; t < kRounds; ++t) {
    ASSERT_EQ(a.decisions[t], b.decisions[t]) << "first difference at round " << t;
  }
  EXPECT_EQ(a.experts, b.experts);
}

TEST(Replay, GrpcServerAndInProcessServiceMakeTheSameDecisions) {
  const Rows rows = LoadDigitsInOrder();
  ASSERT_GE(rows.x.size(), static_cast<size_t>(kRounds));
  Trace in_process, over_grpc;
  {
    InProcess backend(testing::MakeTempDir());
    in_process = Replay(backend, rows);
  }
  {
    OverGrpc backend(testing::MakeTempDir());
    over_grpc = Replay(backend, rows);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectSameReplay(in_process, over_grpc));
  // Experts were trained from the log on the way, and they helped: the replay earns about
  // twice the uniform expert's 1/10 in these first 600 rounds (measured 0.213, 22 experts).
  EXPECT_GT(in_process.experts, 10);
  std::printf("%d rounds, %d experts, mean reward %.3f\n", kRounds, in_process.experts,
              in_process.reward / kRounds);
  EXPECT_GT(in_process.reward / kRounds, 0.15);
}

// The divergence computations predict only the reservoir rows that changed since the last
// one (server/reservoir_predictions.h): an optimisation, not a behaviour change. With the
// kept predictions off, every refresh predicts all rows, and the decisions, the experts
// trained and the rewards are the same.
TEST(Replay, KeptReservoirPredictionsChangeNoDecision) {
  const Rows rows = LoadDigitsInOrder();
  ASSERT_GE(rows.x.size(), static_cast<size_t>(kRounds));
  // A reservoir of 128 contexts: full after 128 rounds, so later refreshes see rows
  // rewritten, not only rows appended.
  v1::CreateProblemRequest create = Create();
  create.mutable_config()->set_divergence_reservoir(128);
  Trace kept, predicted_again;
  {
    InProcess backend(testing::MakeTempDir());
    kept = Replay(backend, rows, create);
  }
  {
    InProcess backend(testing::MakeTempDir(), /*reservoir_predictions_mb=*/0);
    predicted_again = Replay(backend, rows, create);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectSameReplay(kept, predicted_again));
  EXPECT_GT(kept.experts, 10);
}

// Issue 15's guard on the schedule: a replay through decisiond with its default flags, at
// full speed, trains experts at every batch boundary of the paper's schedule (in rounds,
// however far training lags behind the requests), and they learn. Asserts the schedule and
// a learning bound, never a time: the waits below only bound a failure.
TEST(Replay, DefaultFlagsTrainAtEveryScheduledRoundAndLearn) {
  const Rows rows = LoadDigitsInOrder();
  const int64_t n = static_cast<int64_t>(rows.x.size());
  auto process = testing::DecisiondProcess::Start(testing::MakeTempDir(),
                                                  {"--seed=" + std::to_string(kSeed)});
  ASSERT_TRUE(process.ok()) << process.status();
  std::unique_ptr<v1::DecisionService::Stub> stub = (*process)->NewStub();
  auto call = [&](auto method, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return FromGrpc((stub.get()->*method)(&ctx, req, resp));
  };
  using Stub = v1::DecisionService::Stub;
  const v1::CreateProblemRequest create = Create();
  v1::Problem created;
  ASSERT_TRUE(call(&Stub::CreateProblem, create, &created).ok());
  // One pass over the rows; returns the progressive loss (1 - mean reward).
  auto pass = [&](const std::string& prefix) {
    double reward = 0.0;
    for (int64_t t = 0; t < n; ++t) {
      v1::ChooseRequest choose;
      choose.set_problem_id("digits");
      choose.set_event_id(prefix + std::to_string(t));
      choose.mutable_features()->Add(rows.x[t].begin(), rows.x[t].end());
      v1::ChooseResponse d;
      EXPECT_TRUE(call(&Stub::Choose, choose, &d).ok());
      v1::RewardRequest r;
      r.set_problem_id("digits");
      r.set_event_id(choose.event_id());
      r.set_value(d.arm() == rows.y[t] ? 1.0 : 0.0);
      reward += r.value();
      v1::RewardResponse ack;
      EXPECT_TRUE(call(&Stub::Reward, r, &ack).ok());
    }
    return 1.0 - reward / n;
  };
  const double first_loss = pass("a-");

  // The boundaries of the schedule within the first pass: every one gets its job.
  storage::v1::ProblemRecord record;
  record.set_num_arms(create.config().num_arms());
  record.set_batch_multiplier(7.0);  // the default
  std::vector<int64_t> boundaries;
  for (int64_t b = server::NextRefresh(record, 0); b <= n; b = server::NextRefresh(record, b)) {
    boundaries.push_back(b);
  }
  ASSERT_GT(boundaries.size(), 10u);
  // Wait (bounded) until the jobs of those boundaries are done.
  std::vector<v1::TrainingJob> jobs(boundaries.size());
  for (size_t i = 0; i < boundaries.size(); ++i) {
    v1::GetTrainingJobRequest get;
    get.set_problem_id("digits");
    get.set_job_id(static_cast<int64_t>(i) + 1);
    for (int wait = 0; wait < 6000; ++wait) {
      const absl::Status s = call(&Stub::GetTrainingJob, get, &jobs[i]);
      if (s.ok() && (jobs[i].state() == v1::TRAINING_JOB_STATE_SUCCEEDED ||
                     jobs[i].state() == v1::TRAINING_JOB_STATE_FAILED)) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(jobs[i].origin(), v1::TRAINING_JOB_ORIGIN_AUTO_TRAIN) << i;
    EXPECT_EQ(jobs[i].samples(), boundaries[i]) << "job " << i + 1;
    EXPECT_EQ(jobs[i].state(), v1::TRAINING_JOB_STATE_SUCCEEDED) << jobs[i].error();
    EXPECT_EQ(jobs[i].expert_ids_size() + jobs[i].skipped_experts(), 3);
  }
  // No job for a boundary the first pass did not reach.
  v1::GetTrainingJobRequest next;
  next.set_problem_id("digits");
  next.set_job_id(static_cast<int64_t>(boundaries.size()) + 1);
  v1::TrainingJob none;
  const absl::Status beyond = call(&Stub::GetTrainingJob, next, &none);
  EXPECT_TRUE(absl::IsNotFound(beyond) || none.samples() > n) << beyond;

  // The experts learnt: a second pass over the same rows does far better than uniform
  // guessing (0.9 for 10 classes). How much better depends on how many rounds the jobs of
  // the second pass's boundaries take to train and backfill at full speed (0.23 to 0.56 over
  // 12 runs on an idle 2-core machine), hence a bound with a margin for loaded machines.
  const double second_loss = pass("b-");
  std::printf("digits, default flags: %zu boundaries in the first pass; progressive loss "
              "%.3f then %.3f\n", boundaries.size(), first_loss, second_loss);
  EXPECT_LT(second_loss, 0.7);
}

}  // namespace
}  // namespace decision
