// load: drives a mix of Choose and Reward at fixed concurrency levels against decisiond and,
// in the same run, against null_server (the same API with trivial handlers), and prints
// throughput and latency percentiles per RPC and the ratios of the two.
//
//   build/bench/load --concurrency=1,8,32 --duration_s=10
//
// The client uses gRPC's callback API: each of `concurrency` slots keeps one RPC in flight
// and issues the next from the completion of the last. A slot sends the Reward of one of its
// own earlier decisions once that reward is due (--reward_delay_ms after the decision),
// otherwise a new Choose. A share of decisions (--unrewarded_share) never gets a reward.
// Both servers run as child processes on loopback, on this same machine; the CPU time each
// server and this client spend per RPC is read from /proc, as the machine is shared.
//
// --calibrate_work_us=5,10,20 also drives null_server --work_us=W for each W (handlers that
// burn W us of CPU before answering) and prints their ratios to the plain null server: what
// a server that adds W us of work per RPC gets from gRPC on this machine, the scale against
// which decisiond's ratio is read.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
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
ABSL_FLAG(std::string, decisiond_flags, "",
          "extra decisiond flags, space-separated (e.g. \"--durable_choose\")");
ABSL_FLAG(std::string, token, "",
          "bearer token sent on every call (for a decisiond with --tokens_file; a decisiond "
          "without one ignores it)");
ABSL_FLAG(std::string, calibrate_work_us, "",
          "comma-separated W: also drive null_server --work_us=W and print its ratios");

namespace {

// The --token metadata, read once (flags are not read in the hot loop).
void AddToken(grpc::ClientContext* ctx) {
  static const std::string* const header = [] {
    const std::string token = absl::GetFlag(FLAGS_token);
    return token.empty() ? nullptr : new std::string("Bearer " + token);
  }();
  if (header != nullptr) ctx->AddMetadata("authorization", *header);
}

namespace v1 = decision::v1;
using Clock = std::chrono::steady_clock;

struct Result {
  double seconds = 0.0;
  std::vector<double> choose_us, reward_us;
  int64_t errors = 0;
  double server_cpu_s = 0.0;  // CPU time of the server process while measured
  double client_cpu_s = 0.0;  // CPU time of this process while measured
  double rpcs() const { return static_cast<double>(choose_us.size() + reward_us.size()); }
  double rps() const { return rpcs() / seconds; }
  double server_us_per_rpc() const { return 1e6 * server_cpu_s / rpcs(); }
  double client_us_per_rpc() const { return 1e6 * client_cpu_s / rpcs(); }
};

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0.0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i];
}

// User + system CPU seconds of a process so far (from /proc/<pid>/stat).
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start after the last ')'.
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(stat.rfind(')') + 2), ' ');
  int64_t utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return 0.0;
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

// One slot of the load: keeps one RPC in flight with the callback API, issuing the next
// one from the completion of the last. It sends the Reward of one of its own earlier
// decisions once that reward is due, otherwise a new Choose.
class Slot {
 public:
  Slot(v1::DecisionService::Stub* stub, const std::string& problem, int index,
       Clock::time_point measure_from, Clock::time_point end, Result* result,
       std::function<void()> finished)
      : stub_(stub), index_(index), measure_from_(measure_from), end_(end), result_(result),
        finished_(std::move(finished)),
        gen_(absl::GetFlag(FLAGS_seed) * 1000 + index),
        delay_(std::chrono::milliseconds(absl::GetFlag(FLAGS_reward_delay_ms))),
        unrewarded_(absl::GetFlag(FLAGS_unrewarded_share)) {
    choose_.set_problem_id(problem);
    for (int f = 0; f < absl::GetFlag(FLAGS_features); ++f) choose_.add_features(0.0);
    reward_.set_problem_id(problem);
  }

  void Next() {
    const auto now = Clock::now();
    if (now >= end_) return finished_();
    ctx_ = std::make_unique<grpc::ClientContext>();
    ctx_->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    AddToken(ctx_.get());
    start_ = Clock::now();
    if (!due_.empty() && due_.front().first <= now) {
      reward_.set_event_id(due_.front().second);
      reward_.set_value(std::bernoulli_distribution(0.3)(gen_) ? 1.0 : 0.0);
      due_.pop_front();
      stub_->async()->Reward(ctx_.get(), &reward_, &reward_response_,
                             [this](grpc::Status s) { Done(s, false); });
    } else {
      for (int f = 0; f < choose_.features_size(); ++f) choose_.set_features(f, feature_(gen_));
      choose_.set_event_id(absl::StrCat("w", index_, "-", counter_++));
      stub_->async()->Choose(ctx_.get(), &choose_, &choose_response_,
                             [this](grpc::Status s) { Done(s, true); });
    }
  }

 private:
  void Done(const grpc::Status& status, bool is_choose) {
    const auto now = Clock::now();
    if (!status.ok()) {
      ++result_->errors;
    } else {
      if (start_ >= measure_from_) {
        const double us = std::chrono::duration<double, std::micro>(now - start_).count();
        (is_choose ? result_->choose_us : result_->reward_us).push_back(us);
      }
      if (is_choose && !std::bernoulli_distribution(unrewarded_)(gen_)) {
        due_.emplace_back(now + delay_, choose_.event_id());
      }
    }
    Next();
  }

  v1::DecisionService::Stub* stub_;
  const int index_;
  const Clock::time_point measure_from_, end_;
  Result* result_;  // this slot's own
  std::function<void()> finished_;
  std::mt19937_64 gen_;
  std::uniform_real_distribution<double> feature_{0.0, 1.0};
  const std::chrono::milliseconds delay_;
  const double unrewarded_;
  std::deque<std::pair<Clock::time_point, std::string>> due_;
  int64_t counter_ = 0;
  std::unique_ptr<grpc::ClientContext> ctx_;
  Clock::time_point start_;
  v1::ChooseRequest choose_;
  v1::ChooseResponse choose_response_;
  v1::RewardRequest reward_;
  v1::RewardResponse reward_response_;
};

Result Drive(const std::string& address, const std::string& problem, int concurrency,
             pid_t server) {
  std::vector<std::unique_ptr<v1::DecisionService::Stub>> stubs;
  for (int c = 0; c < std::max(1, absl::GetFlag(FLAGS_channels)); ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c);  // distinct connections
    stubs.push_back(v1::DecisionService::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
  }
  const auto warmup = std::chrono::duration<double>(absl::GetFlag(FLAGS_warmup_s));
  const auto duration = std::chrono::duration<double>(absl::GetFlag(FLAGS_duration_s));
  const auto start = Clock::now();
  const auto measure_from = start + std::chrono::duration_cast<Clock::duration>(warmup);
  const auto end = measure_from + std::chrono::duration_cast<Clock::duration>(duration);
  std::vector<Result> per_slot(concurrency);
  absl::Mutex mu;
  int running = concurrency;
  std::vector<std::unique_ptr<Slot>> slots;
  for (int w = 0; w < concurrency; ++w) {
    slots.push_back(std::make_unique<Slot>(stubs[w % stubs.size()].get(), problem, w,
                                           measure_from, end, &per_slot[w], [&] {
                                             absl::MutexLock lock(&mu);
                                             --running;
                                           }));
  }
  for (auto& slot : slots) slot->Next();
  std::this_thread::sleep_until(measure_from);
  const double server0 = ProcessCpuSeconds(server), client0 = ProcessCpuSeconds(getpid());
  std::this_thread::sleep_until(end);
  const double server1 = ProcessCpuSeconds(server), client1 = ProcessCpuSeconds(getpid());
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(+[](int* n) { return *n == 0; }, &running));
  }
  Result total;
  total.seconds = std::chrono::duration<double>(duration).count();
  total.server_cpu_s = server1 - server0;
  total.client_cpu_s = client1 - client0;
  for (Result& r : per_slot) {
    total.choose_us.insert(total.choose_us.end(), r.choose_us.begin(), r.choose_us.end());
    total.reward_us.insert(total.reward_us.end(), r.reward_us.begin(), r.reward_us.end());
    total.errors += r.errors;
  }
  return total;
}

void Print(const char* name, int concurrency, Result& r) {
  std::printf("%-10s c=%-3d %9.0f rpc/s  Choose p50/p99/p999 %7.1f %7.1f %7.1f us  "
              "Reward p50/p99/p999 %7.1f %7.1f %7.1f us  CPU/rpc server %5.1f client %5.1f us  "
              "errors %lld\n",
              name, concurrency, r.rps(), Percentile(r.choose_us, 0.5),
              Percentile(r.choose_us, 0.99), Percentile(r.choose_us, 0.999),
              Percentile(r.reward_us, 0.5), Percentile(r.reward_us, 0.99),
              Percentile(r.reward_us, 0.999), r.server_us_per_rpc(), r.client_us_per_rpc(),
              static_cast<long long>(r.errors));
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
    AddToken(&ctx);
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
    AddToken(&ctx);
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
    AddToken(&ctx);
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

// Parses a comma-separated list of integers >= min_value; false if any is not one.
bool ParseList(const std::string& text, int min_value, std::vector<int>* out) {
  if (text.empty()) return true;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int v;
    if (!absl::SimpleAtoi(item, &v) || v < min_value) return false;
    out->push_back(v);
  }
  return true;
}

// Starts null_server with `flags`, drives it at every level and prints each result as
// `name`. Empty if it cannot start.
std::vector<Result> DriveNullServer(const std::string& name, const std::vector<int>& levels,
                                    const std::vector<std::string>& flags) {
  std::vector<std::string> args = {absl::GetFlag(FLAGS_null_server), "--listen=127.0.0.1:0"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::string line;
  auto null = decision::testing::ChildProcess::Start(args, &line);
  if (!null.ok()) {
    std::fprintf(stderr, "load: %s\n", null.status().ToString().c_str());
    return {};
  }
  const std::string address = line.substr(line.rfind(' ') + 1);
  std::vector<Result> results;
  for (int c : levels) {
    results.push_back(Drive(address, "null", c, (*null)->pid()));
    Print(name.c_str(), c, results.back());
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int> levels, work_us;
  if (!ParseList(absl::GetFlag(FLAGS_concurrency), 1, &levels) || levels.empty()) {
    std::fprintf(stderr, "load: bad --concurrency\n");
    return 2;
  }
  if (!ParseList(absl::GetFlag(FLAGS_calibrate_work_us), 1, &work_us)) {
    std::fprintf(stderr, "load: bad --calibrate_work_us\n");
    return 2;
  }
  std::printf("load: %d experts (%d linear + uniform), K = %d, d = %d, reward delay %lld ms, "
              "%.0f%% unrewarded, %.0f s per level (+%.0f s warm-up)\n",
              absl::GetFlag(FLAGS_experts), absl::GetFlag(FLAGS_experts) - 1,
              absl::GetFlag(FLAGS_arms), absl::GetFlag(FLAGS_features),
              static_cast<long long>(absl::GetFlag(FLAGS_reward_delay_ms)),
              100 * absl::GetFlag(FLAGS_unrewarded_share), absl::GetFlag(FLAGS_duration_s),
              absl::GetFlag(FLAGS_warmup_s));
  std::vector<Result> real_results;
  std::vector<Result> null_results = DriveNullServer("null", levels, {});
  if (null_results.empty()) return 1;
  {
    const std::string dir = decision::testing::MakeTempDir();
    std::string line;
    std::vector<std::string> args = {absl::GetFlag(FLAGS_decisiond), "--listen=127.0.0.1:0",
                                     "--metrics_listen=", "--data_dir=" + dir, "--seed=1"};
    for (absl::string_view flag :
         absl::StrSplit(absl::GetFlag(FLAGS_decisiond_flags), ' ', absl::SkipEmpty())) {
      args.emplace_back(flag);
    }
    auto real = decision::testing::ChildProcess::Start(args, &line);
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
      real_results.push_back(Drive(address, "load", c, (*real)->pid()));
      Print("decisiond", c, real_results.back());
    }
  }
  std::printf("\nconcurrency  throughput decisiond/null  Choose p99 decisiond/null  "
              "Reward p99 decisiond/null  server CPU/rpc decisiond/null\n");
  for (size_t i = 0; i < levels.size(); ++i) {
    Result& n = null_results[i];
    Result& r = real_results[i];
    std::printf("%11d  %27.2f  %25.2f  %25.2f  %30.2f\n", levels[i], r.rps() / n.rps(),
                Percentile(r.choose_us, 0.99) / Percentile(n.choose_us, 0.99),
                Percentile(r.reward_us, 0.99) / Percentile(n.reward_us, 0.99),
                r.server_us_per_rpc() / n.server_us_per_rpc());
  }
  if (work_us.empty()) return 0;
  std::vector<std::vector<Result>> calibration;
  for (int w : work_us) {
    calibration.push_back(
        DriveNullServer(absl::StrCat("null+", w, "us"), levels, {absl::StrCat("--work_us=", w)}));
    if (calibration.back().empty()) return 1;
  }
  std::printf("\ncalibration: null_server whose handlers burn W us of CPU, against the plain "
              "null server above\n%10s", "W (us)");
  for (int c : levels) std::printf("  throughput c=%-3d  Choose p99 c=%-3d", c, c);
  std::printf("\n");
  for (size_t w = 0; w < work_us.size(); ++w) {
    std::printf("%10d", work_us[w]);
    for (size_t i = 0; i < levels.size(); ++i) {
      Result& n = null_results[i];
      Result& r = calibration[w][i];
      std::printf("  %16.2f  %16.2f", r.rps() / n.rps(),
                  Percentile(r.choose_us, 0.99) / Percentile(n.choose_us, 0.99));
    }
    std::printf("\n");
  }
  return 0;
}
