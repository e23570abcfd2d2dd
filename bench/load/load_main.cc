// load: drives a mix of Choose and Reward at fixed concurrency levels against decisiond and,
// in the same run, against null_server (the same API with trivial handlers), and prints
// throughput and latency percentiles per RPC and the ratios of the two.
//
//   build/bench/load/load --concurrency=1,8,32 --duration_s=10
//
// Each of the `concurrency` client threads keeps one RPC in flight: it sends the Reward of
// one of its own earlier decisions once that reward is due (--reward_delay_ms after the
// decision), otherwise a new Choose. A share of decisions (--unrewarded_share) never gets a
// reward. Both servers run as child processes on loopback, on this same machine.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "decision/v1/decision.grpc.pb.h"
#include "tests/decisiond_process.h"

ABSL_FLAG(std::string, decisiond, DECISIOND_BINARY, "decisiond binary");
ABSL_FLAG(std::string, null_server, NULL_SERVER_BINARY, "null_server binary");
ABSL_FLAG(std::string, concurrency, "1,8,32", "comma-separated concurrency levels");
ABSL_FLAG(double, duration_s, 10.0, "measured seconds per concurrency level and server");
ABSL_FLAG(double, warmup_s, 2.0, "unmeasured seconds before each measurement");
ABSL_FLAG(int, experts, 32, "experts in the problem (the uniform one plus linear ones)");
ABSL_FLAG(int, arms, 26, "arms K");
ABSL_FLAG(int, features, 16, "features d");
ABSL_FLAG(int64_t, reward_delay_ms, 0, "delay between a decision and its reward");
ABSL_FLAG(double, unrewarded_share, 0.1, "share of decisions that never get a reward");
ABSL_FLAG(int, channels, 4, "gRPC channels (connections) the client threads share");
ABSL_FLAG(uint64_t, seed, 1, "seed of the features and of the linear experts");

namespace {

namespace v1 = decision::v1;
using Clock = std::chrono::steady_clock;

struct Result {
  double seconds = 0.0;
  std::vector<double> choose_us, reward_us;
  int64_t errors = 0;
  double rps() const { return (choose_us.size() + reward_us.size()) / seconds; }
};

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0.0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

Result Drive(const std::string& address, const std::string& problem, int concurrency) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < std::max(1, absl::GetFlag(FLAGS_channels)); ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c);  // distinct connections
    channels.push_back(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }
  const int d = absl::GetFlag(FLAGS_features);
  const auto warmup = std::chrono::duration<double>(absl::GetFlag(FLAGS_warmup_s));
  const auto duration = std::chrono::duration<double>(absl::GetFlag(FLAGS_duration_s));
  const auto delay = std::chrono::milliseconds(absl::GetFlag(FLAGS_reward_delay_ms));
  const double unrewarded = absl::GetFlag(FLAGS_unrewarded_share);
  const auto start = Clock::now();
  const auto measure_from = start + std::chrono::duration_cast<Clock::duration>(warmup);
  const auto end = measure_from + std::chrono::duration_cast<Clock::duration>(duration);
  std::vector<Result> per_thread(concurrency);
  std::vector<std::thread> threads;
  for (int w = 0; w < concurrency; ++w) {
    threads.emplace_back([&, w] {
      auto stub = v1::DecisionService::NewStub(channels[w % channels.size()]);
      std::mt19937_64 gen(absl::GetFlag(FLAGS_seed) * 1000 + w);
      std::uniform_real_distribution<double> feature(0.0, 1.0);
      std::deque<std::pair<Clock::time_point, std::string>> due;
      Result& r = per_thread[w];
      int64_t counter = 0;
      v1::ChooseRequest choose;
      choose.set_problem_id(problem);
      for (int f = 0; f < d; ++f) choose.add_features(0.0);
      v1::RewardRequest reward;
      reward.set_problem_id(problem);
      while (true) {
        const auto now = Clock::now();
        if (now >= end) break;
        const bool measured = now >= measure_from;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        grpc::Status status;
        const auto t0 = Clock::now();
        bool is_choose;
        if (!due.empty() && due.front().first <= now) {
          is_choose = false;
          reward.set_event_id(due.front().second);
          reward.set_value(std::bernoulli_distribution(0.3)(gen) ? 1.0 : 0.0);
          due.pop_front();
          v1::RewardResponse resp;
          status = stub->Reward(&ctx, reward, &resp);
        } else {
          is_choose = true;
          for (int f = 0; f < d; ++f) choose.set_features(f, feature(gen));
          choose.set_event_id(absl::StrCat("w", w, "-", counter++));
          v1::ChooseResponse resp;
          status = stub->Choose(&ctx, choose, &resp);
          if (status.ok() && !std::bernoulli_distribution(unrewarded)(gen)) {
            due.emplace_back(Clock::now() + delay, choose.event_id());
          }
        }
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        if (!status.ok()) {
          ++r.errors;
          continue;
        }
        if (measured) (is_choose ? r.choose_us : r.reward_us).push_back(us);
      }
    });
  }
  for (auto& t : threads) t.join();
  Result total;
  total.seconds = std::chrono::duration<double>(duration).count();
  for (Result& r : per_thread) {
    total.choose_us.insert(total.choose_us.end(), r.choose_us.begin(), r.choose_us.end());
    total.reward_us.insert(total.reward_us.end(), r.reward_us.begin(), r.reward_us.end());
    total.errors += r.errors;
  }
  return total;
}

void Print(const char* name, int concurrency, Result& r) {
  std::printf("%-10s c=%-3d %9.0f rpc/s  Choose p50/p99/p999 %7.1f %7.1f %7.1f us  "
              "Reward p50/p99/p999 %7.1f %7.1f %7.1f us  errors %lld\n",
              name, concurrency, r.rps(), Percentile(r.choose_us, 0.5),
              Percentile(r.choose_us, 0.99), Percentile(r.choose_us, 0.999),
              Percentile(r.reward_us, 0.5), Percentile(r.reward_us, 0.99),
              Percentile(r.reward_us, 0.999), static_cast<long long>(r.errors));
  std::fflush(stdout);
}

// Creates the problem and registers experts-1 random linear experts; waits until active.
bool SetUpProblem(v1::DecisionService::Stub& stub, const std::string& problem) {
  const int k = absl::GetFlag(FLAGS_arms), d = absl::GetFlag(FLAGS_features);
  auto deadline = [] {
    return std::chrono::system_clock::now() + std::chrono::seconds(10);
  };
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    v1::CreateProblemRequest req;
    req.set_problem_id(problem);
    req.mutable_config()->set_num_arms(k);
    req.mutable_config()->set_num_features(d);
    req.mutable_config()->set_reward_wait_ms(60'000);
    v1::Problem resp;
    if (grpc::Status s = stub.CreateProblem(&ctx, req, &resp); !s.ok()) {
      std::fprintf(stderr, "load: CreateProblem: %s\n", s.error_message().c_str());
      return false;
    }
  }
  std::mt19937_64 gen(absl::GetFlag(FLAGS_seed));
  std::normal_distribution<double> weight(0.0, 1.0);
  for (int e = 1; e < absl::GetFlag(FLAGS_experts); ++e) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    v1::RegisterExpertRequest req;
    req.set_problem_id(problem);
    req.set_name(absl::StrCat("linear-", e));
    auto* l = req.mutable_model()->mutable_linear_softmax();
    for (int i = 0; i < k * d; ++i) l->add_weights(weight(gen));
    for (int i = 0; i < k; ++i) l->add_bias(0.0);
    v1::Expert resp;
    if (grpc::Status s = stub.RegisterExpert(&ctx, req, &resp); !s.ok()) {
      std::fprintf(stderr, "load: RegisterExpert: %s\n", s.error_message().c_str());
      return false;
    }
  }
  for (int attempt = 0; attempt < 600; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    v1::ListExpertsRequest req;
    req.set_problem_id(problem);
    v1::ListExpertsResponse resp;
    if (!stub.ListExperts(&ctx, req, &resp).ok()) return false;
    if (std::all_of(resp.experts().begin(), resp.experts().end(), [](const v1::Expert& e) {
          return e.status() == v1::EXPERT_STATUS_ACTIVE;
        })) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int> levels;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int v;
    if (!absl::SimpleAtoi(c, &v) || v < 1) {
      std::fprintf(stderr, "load: bad --concurrency\n");
      return 2;
    }
    levels.push_back(v);
  }
  std::printf("load: %d experts (%d linear + uniform), K = %d, d = %d, reward delay %lld ms, "
              "%.0f%% unrewarded, %.0f s per level (+%.0f s warm-up)\n",
              absl::GetFlag(FLAGS_experts), absl::GetFlag(FLAGS_experts) - 1,
              absl::GetFlag(FLAGS_arms), absl::GetFlag(FLAGS_features),
              static_cast<long long>(absl::GetFlag(FLAGS_reward_delay_ms)),
              100 * absl::GetFlag(FLAGS_unrewarded_share), absl::GetFlag(FLAGS_duration_s),
              absl::GetFlag(FLAGS_warmup_s));
  std::vector<Result> null_results, real_results;
  {
    std::string line;
    auto null = decision::testing::ChildProcess::Start(
        {absl::GetFlag(FLAGS_null_server), "--listen=127.0.0.1:0"}, &line);
    if (!null.ok()) {
      std::fprintf(stderr, "load: %s\n", null.status().ToString().c_str());
      return 1;
    }
    const std::string address = line.substr(line.rfind(' ') + 1);
    for (int c : levels) {
      null_results.push_back(Drive(address, "null", c));
      Print("null", c, null_results.back());
    }
  }
  {
    const std::string dir = decision::testing::MakeTempDir();
    std::string line;
    auto real = decision::testing::ChildProcess::Start(
        {absl::GetFlag(FLAGS_decisiond), "--listen=127.0.0.1:0", "--metrics_listen=",
         "--data_dir=" + dir, "--seed=1"},
        &line);
    if (!real.ok()) {
      std::fprintf(stderr, "load: %s\n", real.status().ToString().c_str());
      return 1;
    }
    const std::vector<std::string> words = absl::StrSplit(line, ' ');
    const std::string address = words.size() > 3 ? words[3] : "";
    auto stub = v1::DecisionService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    if (!SetUpProblem(*stub, "load")) return 1;
    for (int c : levels) {
      real_results.push_back(Drive(address, "load", c));
      Print("decisiond", c, real_results.back());
    }
  }
  std::printf("\nconcurrency  throughput decisiond/null  Choose p99 decisiond/null  "
              "Reward p99 decisiond/null\n");
  for (size_t i = 0; i < levels.size(); ++i) {
    Result& n = null_results[i];
    Result& r = real_results[i];
    std::printf("%11d  %27.2f  %25.2f  %25.2f\n", levels[i], r.rps() / n.rps(),
                Percentile(r.choose_us, 0.99) / Percentile(n.choose_us, 0.99),
                Percentile(r.reward_us, 0.99) / Percentile(n.reward_us, 0.99));
  }
  return 0;
}
