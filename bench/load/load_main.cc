// load: drives a mix of Choose and Reward at fixed concurrency levels against decisiond and,
// in the same run, against null_server (the same API with trivial handlers), and prints, per
// concurrency level, one table of both servers' figures and their ratios decisiond/null.
//
//   build/bench/load --concurrency=1,8,32 --duration_s=10
//   build/bench/load --experts_from=DIR --contexts=bench/data/letter.csv   # XGBoost experts
//
// The client uses gRPC's callback API: each of `concurrency` slots keeps one RPC in flight
// and issues the next from the completion of the last (the closed loop), or, with
// --rate=R, at its share of R pairs per second (paced: the same offered rate for both
// servers, where the closed loop gives each its own throughput). A slot sends the Reward of
// one of its own earlier decisions once that reward is due (--reward_delay_ms after the
// decision), otherwise a new Choose. A share of decisions (--unrewarded_share) never gets a reward.
// Both servers run as child processes on loopback, on this same machine, pinned to
// --server_cpus while this client runs on --client_cpus (sched_setaffinity: a child inherits
// the mask of the thread that forks it, and every thread it starts inherits it in turn). The
// CPU time each server and this client spend is read from /proc.
//
// A "pair" is one Choose and one Reward: pairs/s and CPU per pair count RPCs / 2 (with the
// default 10% of decisions unrewarded there are 1.9 RPCs per decision). While it measures,
// load reads decisiond's /metrics once a second for its learning lag
// (decision_learning_lag_samples, decision_learning_delay_seconds) and prints n/a where
// decisiond has none, and its own time for Choose, from the handler's entry to its answer
// (decision_rpc_latency_seconds{method="Choose"}): what of the Choose latency the client
// sees is decisiond's work, and what is gRPC, the kernel and waiting for a CPU.
//
// --experts_from=DIR registers the XGBoost models of DIR (bench/make_tree_experts.sh makes 32
// trained on letter) instead of the synthetic linear experts; --contexts=CSV draws the
// contexts from a labelled data set's rows instead of uniformly from [0, 1).
//
// --calibrate_work_us=5,10,20 also drives null_server --work_us=W for each W (handlers that
// burn W us of CPU before answering) and prints their ratios to the plain null server: what
// a server that adds W us of work per RPC gets from gRPC on this machine, the scale against
// which decisiond's ratio is read.
#include <grpcpp/grpcpp.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "decision/v1/decision.grpc.pb.h"
#include "bench/load/pacer.h"
#include "tests/decisiond_process.h"

ABSL_FLAG(std::string, decisiond, DECISIOND_BINARY, "decisiond binary");
ABSL_FLAG(std::string, null_server, NULL_SERVER_BINARY, "null_server binary");
ABSL_FLAG(std::string, concurrency, "1,8,32", "comma-separated concurrency levels");
ABSL_FLAG(double, duration_s, 10.0, "measured seconds per concurrency level and server");
ABSL_FLAG(double, warmup_s, 2.0, "unmeasured seconds before each measurement");
ABSL_FLAG(int, experts, 32, "experts in the problem (the uniform one plus linear ones)");
ABSL_FLAG(std::string, experts_from, "",
          "directory of XGBoost models (*.ubj, *.json; one file per expert, as decisionctl "
          "register-expert --xgboost reads them): registered instead of the linear experts, "
          "--experts ignored; their classes and features must be --arms and --features "
          "(bench/make_tree_experts.sh makes 32 trained on letter: K = 26, d = 16)");
ABSL_FLAG(std::string, contexts, "",
          "labelled CSV (header line, last column the label, dropped): each Choose sends a "
          "random row's features (default: uniform in [0, 1)); use the data the --experts_from "
          "models were trained on, e.g. bench/data/letter.csv, so that they take realistic paths");
ABSL_FLAG(std::string, server_cpus, "0",
          "CPUs the servers (decisiond, null_server) are pinned to, e.g. 0 or 0-1 or 0,2 "
          "(empty: not pinned)");
ABSL_FLAG(std::string, client_cpus, "1",
          "CPUs this load generator is pinned to (empty: not pinned)");
ABSL_FLAG(int, arms, 26, "arms K");
ABSL_FLAG(int, features, 16, "features d");
ABSL_FLAG(int64_t, reward_delay_ms, 0, "delay between a decision and its reward");
ABSL_FLAG(double, unrewarded_share, 0.1, "share of decisions that never get a reward");
ABSL_FLAG(double, rate, 0.0,
          "offered Choose+Reward pairs per second, each slot pacing its RPCs to its share "
          "(0: closed loop, each slot's next RPC goes out when its last is answered). A rate "
          "both servers sustain compares them at the same work per second: in the closed loop "
          "the faster server also batches more per wake-up, on both sides of the connection");
ABSL_FLAG(int, channels, 4, "gRPC channels (connections) the client threads share");
ABSL_FLAG(uint64_t, seed, 1, "seed of the features and of the linear experts");
ABSL_FLAG(bool, auto_train, false,
          "create the problem with auto-training: experts are trained and backfilled at every "
          "batch boundary while the load runs (rewards are Bernoulli(0.3), so they learn noise, "
          "at the full cost)");
ABSL_FLAG(double, divergence_refresh_turnover, -1.0,
          "the problem's divergence_refresh_turnover (negative: the server's default, 0.5; 0: "
          "re-estimate the divergences at every batch boundary)");
ABSL_FLAG(std::string, decisiond_background_cpus, "",
          "CPUs for decisiond's background threads (decisiond --background_cpus): decisiond "
          "is started on --server_cpus plus these, with its request threads on "
          "--server_cpus; the null server stays on --server_cpus alone. decisiond's CPU then "
          "includes its background threads' on these CPUs (the server-busy row reads low), "
          "and the client-busy row shows them where these are the client's CPUs");
ABSL_FLAG(std::string, decisiond_flags, "",
          "extra decisiond flags, space-separated (e.g. \"--durable_choose\")");
ABSL_FLAG(std::string, token, "",
          "bearer token sent on every call (for a decisiond with --tokens_file; a decisiond "
          "without one ignores it)");
ABSL_FLAG(std::string, via_haproxy, "",
          "also drive decisiond through HAProxy running this configuration "
          "(deploy/haproxy/haproxy.cfg), on the server CPUs, with the problem placed on "
          "decisiond: the proxy's cost per pair and its latency");
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

// The learning lag metrics load reads from decisiond's /metrics while it measures, with
// their unit. Gauges (one value per problem; the largest is taken) or histograms (the mean
// over the measured window, from _sum and _count).
constexpr std::pair<const char*, const char*> kLagMetrics[] = {
    {"decision_learning_lag_samples", "samples"},
    {"decision_learning_delay_seconds", "s"},
};
constexpr int kNumLagMetrics = sizeof(kLagMetrics) / sizeof(kLagMetrics[0]);

// What the scrapes of one measurement saw of one lag metric.
struct LagSeries {
  std::vector<double> gauge;  // the largest value of each scrape that had the gauge
  double sum0 = 0, count0 = 0, sum1 = 0, count1 = 0;  // histogram, first and last scrape
  bool histogram = false;
  std::string Format() const {
    char buf[64];
    if (!gauge.empty()) {
      double total = 0, max = gauge[0];
      for (double v : gauge) total += v, max = std::max(max, v);
      std::snprintf(buf, sizeof(buf), "%.4g / %.4g", total / gauge.size(), max);
      return buf;
    }
    if (histogram && count1 > count0) {
      std::snprintf(buf, sizeof(buf), "%.4g / -", (sum1 - sum0) / (count1 - count0));
      return buf;
    }
    return "n/a";
  }
};

struct Result {
  double seconds = 0.0;
  std::vector<double> choose_us, reward_us;
  int64_t errors = 0;
  double server_cpu_s = 0.0;  // CPU time of the server process while measured
  double proxy_cpu_s = 0.0;   // CPU time of the proxy process, if any, while measured
  double client_cpu_s = 0.0;  // CPU time of this process while measured
  // Busy time of the servers' CPUs while measured (/proc/stat), for what ran there besides
  // the server: other processes, and interrupts not charged to a process. 0: unpinned.
  double server_cpus_busy_s = 0.0;
  int server_cpu_count = 0;
  double client_cpus_busy_s = 0.0;  // the same for this client's CPUs
  int client_cpu_count = 0;
  bool lag_read = false;      // whether /metrics was read (decisiond only)
  LagSeries lag[kNumLagMetrics];
  // decisiond's own time for Choose, from its entry into the handler to its answer
  // (decision_rpc_latency_seconds{method="Choose"}): cumulative bucket counts by upper
  // bound (s), at the first and the last scrape.
  std::vector<std::pair<double, double>> handler0, handler1;
  double rpcs() const { return static_cast<double>(choose_us.size() + reward_us.size()); }
  double rps() const { return rpcs() / seconds; }
  // A pair is a Choose and a Reward: two RPCs.
  double pairs_per_s() const { return rps() / 2; }
  double server_us_per_rpc() const { return 1e6 * server_cpu_s / rpcs(); }
  double client_us_per_rpc() const { return 1e6 * client_cpu_s / rpcs(); }
  double server_us_per_pair() const { return 2 * server_us_per_rpc(); }
  double proxy_us_per_pair() const { return 2e6 * proxy_cpu_s / rpcs(); }
  double client_us_per_pair() const { return 2 * client_us_per_rpc(); }
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

// Busy (not idle, not waiting for I/O) seconds of the CPUs in `set` since boot, from
// /proc/stat: user, nice, system, irq, softirq and steal.
double BusySeconds(const cpu_set_t& set) {
  std::ifstream in("/proc/stat");
  std::string line;
  double busy = 0;
  while (std::getline(in, line)) {
    int cpu;
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 9 || !absl::ConsumePrefix(&f[0], "cpu") || !absl::SimpleAtoi(f[0], &cpu) ||
        cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &set)) {
      continue;
    }
    for (int i : {1, 2, 3, 6, 7, 8}) {  // user nice system (idle iowait) irq softirq steal
      int64_t ticks;
      if (absl::SimpleAtoi(f[i], &ticks)) busy += static_cast<double>(ticks);
    }
  }
  return busy / sysconf(_SC_CLK_TCK);
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return absl::StrCat(one, " ", five, " ", fifteen);
}

// Pins the calling thread to `set` for its lifetime, then gives it its mask back: a child
// forked meanwhile keeps `set`, and so do the threads it starts.
class ScopedAffinity {
 public:
  explicit ScopedAffinity(const cpu_set_t* set) : active_(set != nullptr) {
    if (!active_) return;
    sched_getaffinity(0, sizeof(saved_), &saved_);
    ok_ = sched_setaffinity(0, sizeof(*set), set) == 0;
  }
  ~ScopedAffinity() {
    if (active_) sched_setaffinity(0, sizeof(saved_), &saved_);
  }
  bool ok() const { return !active_ || ok_; }

 private:
  const bool active_;
  bool ok_ = false;
  cpu_set_t saved_;
};

// The server and client CPU sets (null if not pinned), parsed in main.
const cpu_set_t* server_cpus = nullptr;
const cpu_set_t* client_cpus = nullptr;

// Starts a server child process on the server CPUs, and on `extra` too if not null.
absl::StatusOr<std::unique_ptr<decision::testing::ChildProcess>> StartServer(
    const std::vector<std::string>& args, std::string* line,
    const cpu_set_t* extra = nullptr) {
  cpu_set_t both;
  const cpu_set_t* cpus = server_cpus;
  if (server_cpus != nullptr && extra != nullptr) {
    CPU_OR(&both, server_cpus, extra);
    cpus = &both;
  }
  ScopedAffinity pin(cpus);
  if (!pin.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot pin the servers to --server_cpus=", absl::GetFlag(FLAGS_server_cpus),
        extra != nullptr ? " plus --decisiond_background_cpus" : ""));
  }
  return decision::testing::ChildProcess::Start(args, line);
}

// The values of the series of metric `name` in a Prometheus text exposition.
std::vector<double> MetricValues(absl::string_view text, absl::string_view name) {
  std::vector<double> values;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&line, name) || line.empty() || (line[0] != '{' && line[0] != ' ')) {
      continue;
    }
    if (line[0] == '{') {
      const size_t close = line.rfind('}');
      if (close == absl::string_view::npos) continue;
      line.remove_prefix(close + 1);
    }
    const std::vector<absl::string_view> rest = absl::StrSplit(line, ' ', absl::SkipEmpty());
    double v;
    if (!rest.empty() && absl::SimpleAtod(rest[0], &v)) values.push_back(v);
  }
  return values;
}

// The cumulative buckets (upper bound in s, count) of decision_rpc_latency_seconds for
// `method`, in the exposition's order (ascending), +Inf last.
std::vector<std::pair<double, double>> HandlerBuckets(absl::string_view text,
                                                      absl::string_view method) {
  std::vector<std::pair<double, double>> buckets;
  const std::string label = absl::StrCat("method=\"", method, "\"");
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&line, "decision_rpc_latency_seconds_bucket{") ||
        !absl::StrContains(line, label)) {
      continue;
    }
    const size_t le = line.find("le=\"");
    const size_t close = line.rfind('}');
    if (le == absl::string_view::npos || close == absl::string_view::npos || close < le) continue;
    const absl::string_view bound = line.substr(le + 4, line.find('"', le + 4) - (le + 4));
    double upper, count;
    if (bound == "+Inf") {
      upper = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(bound, &upper)) {
      continue;
    }
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(close + 1)), &count)) continue;
    buckets.emplace_back(upper, count);
  }
  return buckets;
}

// One read of /metrics into the lag series; `first`: the histogram's start values.
void ScrapeLag(const std::string& metrics_address, bool first, Result* r) {
  // A read that takes over 2 s is skipped: the measurement goes on.
  const absl::StatusOr<std::string> got =
      decision::testing::HttpGet(metrics_address, "/metrics", std::chrono::seconds(2));
  if (!got.ok() || got->empty()) return;
  const std::string& text = *got;
  r->lag_read = true;
  if (std::vector<std::pair<double, double>> b = HandlerBuckets(text, "Choose"); !b.empty()) {
    if (first) r->handler0 = b;
    r->handler1 = std::move(b);
  }
  for (int m = 0; m < kNumLagMetrics; ++m) {
    const std::string name = kLagMetrics[m].first;
    LagSeries& lag = r->lag[m];
    if (const std::vector<double> g = MetricValues(text, name); !g.empty()) {
      lag.gauge.push_back(*std::max_element(g.begin(), g.end()));
    }
    const std::vector<double> sums = MetricValues(text, name + "_sum");
    const std::vector<double> counts = MetricValues(text, name + "_count");
    if (sums.empty() || counts.empty()) continue;
    double sum = 0, count = 0;
    for (double v : sums) sum += v;
    for (double v : counts) count += v;
    lag.histogram = true;
    if (first) lag.sum0 = sum, lag.count0 = count;
    lag.sum1 = sum, lag.count1 = count;
  }
}

// The rows of a labelled CSV (header line, label last) without their label.
absl::StatusOr<std::vector<std::vector<double>>> ReadContexts(const std::string& path,
                                                              int features) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::vector<std::vector<double>> rows;
  std::string line;
  for (bool header = true; std::getline(in, line); header = false) {
    if (header || absl::StripAsciiWhitespace(line).empty()) continue;
    std::vector<double> row;
    for (absl::string_view cell : absl::StrSplit(line, ',')) {
      double v;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(cell), &v)) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": `", cell, "` is not a number"));
      }
      row.push_back(v);
    }
    row.pop_back();  // the label
    if (static_cast<int>(row.size()) != features) {
      return absl::InvalidArgumentError(absl::StrCat(path, " has ", row.size(),
                                                     " features per row, --features is ",
                                                     features));
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " has no row"));
  return rows;
}

// The --contexts rows, read in main (empty: uniform features).
std::vector<std::vector<double>> contexts;

// One slot of the load: keeps one RPC in flight with the callback API, issuing the next
// one from the completion of the last. It sends the Reward of one of its own earlier
// decisions once that reward is due, otherwise a new Choose. With a `pacer`, its RPCs start
// `interval` apart (a slot that fell behind its schedule sends at once until it has caught
// up).
class Slot {
 public:
  Slot(v1::DecisionService::Stub* stub, const std::string& problem, int index,
       Clock::time_point measure_from, Clock::time_point end, Result* result,
       std::function<void()> finished, decision::bench::Pacer* pacer, Clock::duration interval,
       Clock::time_point first)
      : stub_(stub), index_(index), measure_from_(measure_from), end_(end), result_(result),
        finished_(std::move(finished)), pacer_(pacer), interval_(interval), next_at_(first),
        gen_(absl::GetFlag(FLAGS_seed) * 1000 + index),
        delay_(std::chrono::milliseconds(absl::GetFlag(FLAGS_reward_delay_ms))),
        unrewarded_(absl::GetFlag(FLAGS_unrewarded_share)) {
    choose_.set_problem_id(problem);
    for (int f = 0; f < absl::GetFlag(FLAGS_features); ++f) choose_.add_features(0.0);
    reward_.set_problem_id(problem);
    problem_ = problem;
  }

  void Start() {
    if (pacer_ == nullptr) return Next();
    pacer_->At(next_at_, [this] { Next(); });
  }

  void Next() {
    const auto now = Clock::now();
    if (now >= end_) return finished_();
    ctx_ = std::make_unique<grpc::ClientContext>();
    ctx_->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    AddToken(ctx_.get());
    // What the client library sends, and a proxy routes on.
    ctx_->AddMetadata("x-decision-problem", problem_);
    start_ = Clock::now();
    if (!due_.empty() && due_.front().first <= now) {
      reward_.set_event_id(due_.front().second);
      reward_.set_value(std::bernoulli_distribution(0.3)(gen_) ? 1.0 : 0.0);
      due_.pop_front();
      stub_->async()->Reward(ctx_.get(), &reward_, &reward_response_,
                             [this](grpc::Status s) { Done(s, false); });
    } else {
      if (contexts.empty()) {
        for (int f = 0; f < choose_.features_size(); ++f) choose_.set_features(f, feature_(gen_));
      } else {
        const std::vector<double>& row =
            contexts[std::uniform_int_distribution<size_t>(0, contexts.size() - 1)(gen_)];
        for (int f = 0; f < choose_.features_size(); ++f) choose_.set_features(f, row[f]);
      }
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
    if (pacer_ != nullptr && (next_at_ += interval_) > now) {
      return pacer_->At(next_at_, [this] { Next(); });
    }
    Next();
  }

  v1::DecisionService::Stub* stub_;
  std::string problem_;
  const int index_;
  const Clock::time_point measure_from_, end_;
  Result* result_;  // this slot's own
  std::function<void()> finished_;
  decision::bench::Pacer* const pacer_;  // null: closed loop
  const Clock::duration interval_;
  Clock::time_point next_at_;  // when the slot's next RPC is due (paced)
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

// Drives the server at `address` at one concurrency level. With a `metrics_address`, reads
// the learning lag from it once a second while it measures (at 0.5, 1.5, ... s: about a
// millisecond of the server's CPU each, under 0.01 us per pair).
Result Drive(const std::string& address, const std::string& problem, int concurrency,
             pid_t server, const std::string& metrics_address = "", pid_t proxy = 0) {
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
  // Paced: each slot sends one RPC every `interval` (a pair is two RPCs), the slots'
  // schedules staggered across one interval.
  const double rate = absl::GetFlag(FLAGS_rate);
  std::unique_ptr<decision::bench::Pacer> pacer =
      rate > 0 ? std::make_unique<decision::bench::Pacer>() : nullptr;
  const auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(rate > 0 ? concurrency / (2 * rate) : 0.0));
  std::vector<std::unique_ptr<Slot>> slots;
  for (int w = 0; w < concurrency; ++w) {
    slots.push_back(std::make_unique<Slot>(
        stubs[w % stubs.size()].get(), problem, w, measure_from, end, &per_slot[w],
        [&] {
          absl::MutexLock lock(&mu);
          --running;
        },
        pacer.get(), interval, start + interval * w / concurrency));
  }
  Result total;
  for (auto& slot : slots) slot->Start();
  std::this_thread::sleep_until(measure_from);
  const double server0 = ProcessCpuSeconds(server), client0 = ProcessCpuSeconds(getpid());
  const double proxy0 = proxy > 0 ? ProcessCpuSeconds(proxy) : 0.0;
  const double busy0 = server_cpus != nullptr ? BusySeconds(*server_cpus) : 0.0;
  const double client_busy0 = client_cpus != nullptr ? BusySeconds(*client_cpus) : 0.0;
  if (!metrics_address.empty()) {
    bool first = true;
    for (auto at = measure_from + std::chrono::milliseconds(500); at < end;
         at += std::chrono::seconds(1)) {
      std::this_thread::sleep_until(at);
      ScrapeLag(metrics_address, first, &total);
      first = false;
    }
  }
  std::this_thread::sleep_until(end);
  const double server1 = ProcessCpuSeconds(server), client1 = ProcessCpuSeconds(getpid());
  const double proxy1 = proxy > 0 ? ProcessCpuSeconds(proxy) : 0.0;
  const double busy1 = server_cpus != nullptr ? BusySeconds(*server_cpus) : 0.0;
  const double client_busy1 = client_cpus != nullptr ? BusySeconds(*client_cpus) : 0.0;
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(+[](int* n) { return *n == 0; }, &running));
  }
  total.seconds = std::chrono::duration<double>(duration).count();
  total.server_cpu_s = server1 - server0;
  total.proxy_cpu_s = proxy1 - proxy0;
  total.client_cpu_s = client1 - client0;
  total.server_cpus_busy_s = busy1 - busy0;
  total.server_cpu_count = server_cpus != nullptr ? CPU_COUNT(server_cpus) : 0;
  total.client_cpus_busy_s = client_busy1 - client_busy0;
  total.client_cpu_count = client_cpus != nullptr ? CPU_COUNT(client_cpus) : 0;
  for (Result& r : per_slot) {
    total.choose_us.insert(total.choose_us.end(), r.choose_us.begin(), r.choose_us.end());
    total.reward_us.insert(total.reward_us.end(), r.reward_us.begin(), r.reward_us.end());
    total.errors += r.errors;
  }
  return total;
}

void Print(const char* name, int concurrency, Result& r);

// A loopback port free now (bound to port 0 and released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof(a);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0) {
    port = ntohs(a.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

// HAProxy with --via_haproxy's configuration in front of the decisiond at `address` (every
// replica of the configuration is that decisiond; the problem "load" is placed on
// decisiond-0), on the server CPUs; each level driven through it. Empty on failure.
std::vector<Result> DriveViaHaproxy(const std::string& dir, const std::string& address,
                                    pid_t decisiond, const std::vector<int>& levels) {
  const std::string map = dir + "/placement.map";
  std::ofstream(map) << "load decisiond-0\n";
  const int port = FreePort(), runtime = FreePort();
  setenv("HAPROXY_BIND", absl::StrCat("127.0.0.1:", port).c_str(), 1);
  setenv("HAPROXY_RUNTIME", absl::StrCat("ipv4@127.0.0.1:", runtime).c_str(), 1);
  setenv("HAPROXY_MAP", map.c_str(), 1);
  for (const char* replica : {"DECISIOND_0", "DECISIOND_1", "DECISIOND_2"}) {
    setenv(replica, address.c_str(), 1);
  }
  const std::string cfg = absl::GetFlag(FLAGS_via_haproxy);
  std::string line;
  // The shell checks the configuration, says so on stdout (what Start waits for), then
  // becomes HAProxy (the same pid, whose CPU is measured).
  auto proxy = StartServer({"/bin/sh", "-c",
                            absl::StrCat("haproxy -c -q -f '", cfg, "' && echo ready && ",
                                         "exec haproxy -db -f '", cfg, "' >", dir,
                                         "/haproxy.log 2>&1")},
                           &line);
  if (!proxy.ok() || line.find("ready") == std::string::npos) {
    std::fprintf(stderr, "load: HAProxy did not start (%s)\n",
                 proxy.ok() ? line.c_str() : proxy.status().ToString().c_str());
    return {};
  }
  const std::string proxy_address = absl::StrCat("127.0.0.1:", port);
  auto stub = v1::DecisionService::NewStub(
      grpc::CreateChannel(proxy_address, grpc::InsecureChannelCredentials()));
  bool up = false;
  for (int i = 0; i < 100 && !up; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    ctx.AddMetadata("x-decision-problem", "load");
    v1::GetProblemRequest request;
    request.set_problem_id("load");
    v1::Problem response;
    up = stub->GetProblem(&ctx, request, &response).ok();
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!up) {
    std::fprintf(stderr, "load: no answer through HAProxy at %s\n", proxy_address.c_str());
    return {};
  }
  std::vector<Result> results;
  for (int c : levels) {
    results.push_back(Drive(proxy_address, "load", c, decisiond, "", (*proxy)->pid()));
    Print("via proxy", c, results.back());
  }
  return results;
}

// One line per measurement, as it ends (per RPC, as before the per-level tables).
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

// The table of one concurrency level: decisiond straight, and through the proxy.
void PrintProxyLevel(int concurrency, Result& d, Result& p) {
  std::printf("\nconcurrency %d, through HAProxy%22s %12s %12s %16s\n", concurrency, "",
              "straight", "via proxy", "proxy/straight");
  auto row = [](const char* what, double straight, double proxied) {
    std::printf("  %-48s %12.1f %12.1f %16.2f\n", what, straight, proxied,
                straight > 0 ? proxied / straight : 0.0);
  };
  row("Choose+Reward pairs/s", d.pairs_per_s(), p.pairs_per_s());
  row("decisiond CPU per pair (us)", d.server_us_per_pair(), p.server_us_per_pair());
  row("HAProxy CPU per pair (us)", 0.0, p.proxy_us_per_pair());
  row("client CPU per pair (us)", d.client_us_per_pair(), p.client_us_per_pair());
  row("Choose p50 (us)", Percentile(d.choose_us, 0.5), Percentile(p.choose_us, 0.5));
  row("Choose p99 (us)", Percentile(d.choose_us, 0.99), Percentile(p.choose_us, 0.99));
  row("Reward p50 (us)", Percentile(d.reward_us, 0.5), Percentile(p.reward_us, 0.5));
  row("Reward p99 (us)", Percentile(d.reward_us, 0.99), Percentile(p.reward_us, 0.99));
  std::printf("  errors: %lld straight, %lld via proxy\n", static_cast<long long>(d.errors),
              static_cast<long long>(p.errors));
}

// The table of one concurrency level: null, decisiond, and decisiond/null.
void PrintLevel(int concurrency, Result& n, Result& r) {
  std::printf("\nconcurrency %d%38s %12s %12s %16s\n", concurrency, "", "null", "decisiond",
              "decisiond/null");
  auto row = [](const char* what, double null_value, double real_value, const char* extra) {
    std::printf("  %-48s %12.1f %12.1f %16.2f%s\n", what, null_value, real_value,
                null_value > 0 ? real_value / null_value : 0.0, extra);
  };
  row("Choose+Reward pairs/s", n.pairs_per_s(), r.pairs_per_s(), "");
  char diff[48];
  std::snprintf(diff, sizeof(diff), "  (%+.1f us)", r.server_us_per_pair() - n.server_us_per_pair());
  row("server CPU per pair (us)", n.server_us_per_pair(), r.server_us_per_pair(), diff);
  row("client CPU per pair (us)", n.client_us_per_pair(), r.client_us_per_pair(), "");
  row("Choose p50 (us)", Percentile(n.choose_us, 0.5), Percentile(r.choose_us, 0.5), "");
  row("Choose p99 (us)", Percentile(n.choose_us, 0.99), Percentile(r.choose_us, 0.99), "");
  row("Choose p999 (us)", Percentile(n.choose_us, 0.999), Percentile(r.choose_us, 0.999), "");
  row("Reward p50 (us)", Percentile(n.reward_us, 0.5), Percentile(r.reward_us, 0.5), "");
  row("Reward p99 (us)", Percentile(n.reward_us, 0.99), Percentile(r.reward_us, 0.99), "");
  // What else the pinned CPUs did while measured (a shared machine): other processes, and
  // interrupts not charged to a process (part of them the run's own loopback traffic).
  if (n.server_cpu_count > 0) {
    auto other = [](const Result& x) {
      return 100 * std::max(0.0, x.server_cpus_busy_s - x.server_cpu_s) /
             (x.seconds * x.server_cpu_count);
    };
    std::printf("  %-48s %12.1f %12.1f\n", "server CPUs busy outside the server (%)", other(n),
                other(r));
  }
  if (n.client_cpu_count > 0) {
    auto other = [](const Result& x) {
      return 100 * std::max(0.0, x.client_cpus_busy_s - x.client_cpu_s) /
             (x.seconds * x.client_cpu_count);
    };
    std::printf("  %-48s %12.1f %12.1f\n", "client CPUs busy outside the client (%)", other(n),
                other(r));
  }
  std::printf("  %-48s %12lld %12lld\n", "errors", static_cast<long long>(n.errors),
              static_cast<long long>(r.errors));
  for (int m = 0; m < kNumLagMetrics; ++m) {
    const std::string what = absl::StrCat("learning lag, ", kLagMetrics[m].second,
                                          " (mean / max of 1/s reads)");
    std::printf("  %-48s %12s %12s\n", what.c_str(), "-",
                r.lag_read ? r.lag[m].Format().c_str() : "n/a");
  }
  // Where decisiond's Choose time goes: in its handler, or around it (gRPC, the kernel,
  // waiting for a CPU). The histogram's buckets are a factor of 2 apart.
  if (!r.handler1.empty() && r.handler0.size() == r.handler1.size()) {
    const double total = r.handler1.back().second - r.handler0.back().second;
    double p99 = 0;
    std::string over;
    for (size_t b = 0; b < r.handler1.size() && total > 0; ++b) {
      const double below = r.handler1[b].second - r.handler0[b].second;
      if (p99 == 0 && below >= 0.99 * total) p99 = r.handler1[b].first;
      const double upper = r.handler1[b].first;
      if (std::abs(upper - 0.00064) < 1e-7 || std::abs(upper - 0.00128) < 1e-7) {
        absl::StrAppendFormat(&over, "%s%.2f%% > %.2f ms", over.empty() ? "" : ", ",
                              100 * (total - below) / total, 1e3 * upper);
      }
    }
    std::printf("  %-48s %12s %12s\n", "Choose in decisiond's handler: p99 at most (ms)", "-",
                p99 > 0 && std::isfinite(p99) ? absl::StrFormat("%.2f", 1e3 * p99).c_str()
                                                : "n/a");
    std::printf("  %-48s %12s %12s\n", "Choose in decisiond's handler: share slower", "-",
                over.empty() ? "n/a" : over.c_str());
  }
  std::fflush(stdout);
}

// The XGBoost model files of --experts_from, in name order.
absl::StatusOr<std::vector<std::filesystem::path>> ModelFiles(const std::string& dir) {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string ext = entry.path().extension().string();
    if (entry.is_regular_file() && (ext == ".ubj" || ext == ".json")) {
      files.push_back(entry.path());
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat("no XGBoost model (*.ubj, *.json) in ", dir));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Creates the problem and registers its experts (--experts_from's models, or experts-1
// random linear ones); waits until every one is active.
bool SetUpProblem(v1::DecisionService::Stub& stub, const std::string& problem,
                  const std::vector<std::filesystem::path>& models) {
  const int k = absl::GetFlag(FLAGS_arms), d = absl::GetFlag(FLAGS_features);
  // Registering an XGBoost model loads it in decisiond's sandbox first: allow a minute.
  auto deadline = [] {
    return std::chrono::system_clock::now() + std::chrono::seconds(60);
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
    req.mutable_config()->mutable_auto_train()->set_enabled(absl::GetFlag(FLAGS_auto_train));
    if (const double turnover = absl::GetFlag(FLAGS_divergence_refresh_turnover); turnover >= 0) {
      req.mutable_config()->set_divergence_refresh_turnover(turnover);
    }
    v1::Problem resp;
    if (grpc::Status s = stub.CreateProblem(&ctx, req, &resp); !s.ok()) {
      std::fprintf(stderr, "load: CreateProblem: %s\n", s.error_message().c_str());
      return false;
    }
  }
  std::vector<v1::RegisterExpertRequest> experts;
  for (const std::filesystem::path& file : models) {
    std::ifstream in(file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in) {
      std::fprintf(stderr, "load: cannot read %s\n", file.c_str());
      return false;
    }
    v1::RegisterExpertRequest req;
    req.set_name(file.stem().string().substr(0, 128));
    req.mutable_model()->mutable_xgboost()->set_model(std::move(bytes));
    experts.push_back(std::move(req));
  }
  std::mt19937_64 gen(absl::GetFlag(FLAGS_seed));
  std::normal_distribution<double> weight(0.0, 1.0);
  for (int e = 1; models.empty() && e < absl::GetFlag(FLAGS_experts); ++e) {
    v1::RegisterExpertRequest req;
    req.set_name(absl::StrCat("linear-", e));
    auto* l = req.mutable_model()->mutable_linear_softmax();
    for (int i = 0; i < k * d; ++i) l->add_weights(weight(gen));
    for (int i = 0; i < k; ++i) l->add_bias(0.0);
    experts.push_back(std::move(req));
  }
  for (v1::RegisterExpertRequest& req : experts) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    AddToken(&ctx);
    req.set_problem_id(problem);
    v1::Expert resp;
    if (grpc::Status s = stub.RegisterExpert(&ctx, req, &resp); !s.ok()) {
      std::fprintf(stderr, "load: RegisterExpert %s: %s\n", req.name().c_str(),
                   s.error_message().c_str());
      return false;
    }
  }
  for (int attempt = 0; attempt < 2400; ++attempt) {
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
  std::fprintf(stderr, "load: the experts did not all become active within 120 s\n");
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
  auto null = StartServer(args, &line);
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
  absl::SetProgramUsageMessage(
      "load [--concurrency=1,8,32] [--duration_s=10] [--experts_from=DIR --contexts=CSV] ...\n"
      "Drives Choose+Reward pairs against decisiond and, in the same run, against null_server "
      "(both pinned to --server_cpus, this client to --client_cpus) and prints, per "
      "concurrency level, pairs/s, server and client CPU per pair, Choose and Reward "
      "latencies, decisiond's learning lag, and the ratios decisiond/null. See "
      "bench/README.md.");
  absl::ParseCommandLine(argc, argv);
  // Pinned first: every thread of this process (gRPC's too) starts after this and inherits it.
  cpu_set_t server_set, client_set;
  const std::string server_cpu_list = absl::GetFlag(FLAGS_server_cpus),
                    client_cpu_list = absl::GetFlag(FLAGS_client_cpus);
  if (!server_cpu_list.empty()) {
    if (!decision::testing::ParseCpus(server_cpu_list, &server_set)) {
      std::fprintf(stderr, "load: bad --server_cpus\n");
      return 2;
    }
    server_cpus = &server_set;
  }
  if (!client_cpu_list.empty()) {
    if (!decision::testing::ParseCpus(client_cpu_list, &client_set)) {
      std::fprintf(stderr, "load: bad --client_cpus\n");
      return 2;
    }
    client_cpus = &client_set;
    if (sched_setaffinity(0, sizeof(client_set), &client_set) != 0) {
      std::fprintf(stderr,
                   "load: cannot pin to --client_cpus=%s (this machine has %ld CPUs; empty "
                   "--server_cpus= --client_cpus= run unpinned)\n",
                   client_cpu_list.c_str(), sysconf(_SC_NPROCESSORS_ONLN));
      return 2;
    }
  }
  std::vector<int> levels, work_us;
  if (!ParseList(absl::GetFlag(FLAGS_concurrency), 1, &levels) || levels.empty()) {
    std::fprintf(stderr, "load: bad --concurrency\n");
    return 2;
  }
  if (!(absl::GetFlag(FLAGS_rate) >= 0)) {
    std::fprintf(stderr, "load: bad --rate (pairs per second, 0 for the closed loop)\n");
    return 2;
  }
  if (!ParseList(absl::GetFlag(FLAGS_calibrate_work_us), 1, &work_us)) {
    std::fprintf(stderr, "load: bad --calibrate_work_us\n");
    return 2;
  }
  std::vector<std::filesystem::path> models;
  if (const std::string dir = absl::GetFlag(FLAGS_experts_from); !dir.empty()) {
    auto files = ModelFiles(dir);
    if (!files.ok()) {
      std::fprintf(stderr, "load: %s\n", files.status().ToString().c_str());
      return 2;
    }
    models = *std::move(files);
  }
  if (const std::string file = absl::GetFlag(FLAGS_contexts); !file.empty()) {
    auto rows = ReadContexts(file, absl::GetFlag(FLAGS_features));
    if (!rows.ok()) {
      std::fprintf(stderr, "load: %s\n", rows.status().ToString().c_str());
      return 2;
    }
    contexts = *std::move(rows);
  }
  const std::string experts =
      models.empty() ? absl::StrCat(absl::GetFlag(FLAGS_experts), " experts (",
                                    absl::GetFlag(FLAGS_experts) - 1, " linear + uniform)")
                     : absl::StrCat(models.size() + 1, " experts (", models.size(),
                                    " XGBoost from ", absl::GetFlag(FLAGS_experts_from),
                                    " + uniform)");
  std::printf("load: %s, K = %d, d = %d, contexts %s, reward delay %lld ms, %.0f%% unrewarded, "
              "%.0f s per level (+%.0f s warm-up)\n",
              experts.c_str(), absl::GetFlag(FLAGS_arms), absl::GetFlag(FLAGS_features),
              contexts.empty() ? "uniform in [0, 1)"
                               : absl::StrCat("from ", absl::GetFlag(FLAGS_contexts)).c_str(),
              static_cast<long long>(absl::GetFlag(FLAGS_reward_delay_ms)),
              100 * absl::GetFlag(FLAGS_unrewarded_share), absl::GetFlag(FLAGS_duration_s),
              absl::GetFlag(FLAGS_warmup_s));
  std::printf("load: servers on CPU %s, this client on CPU %s; a pair is a Choose and a Reward "
              "(RPCs / 2); load average at start %s\n",
              server_cpu_list.empty() ? "any" : server_cpu_list.c_str(),
              client_cpu_list.empty() ? "any" : client_cpu_list.c_str(), LoadAverage().c_str());
  if (const std::string b = absl::GetFlag(FLAGS_decisiond_background_cpus); !b.empty()) {
    std::printf("load: decisiond's background threads on CPU %s (--background_cpus)\n",
                b.c_str());
  }
  if (const double rate = absl::GetFlag(FLAGS_rate); rate > 0) {
    std::printf("load: paced at %.0f pairs/s offered (--rate): each slot sends an RPC every "
                "concurrency / (2 x rate) s\n",
                rate);
  }
  std::vector<Result> real_results;
  std::vector<Result> null_results = DriveNullServer("null", levels, {});
  if (null_results.empty()) return 1;
  {
    const std::string dir = decision::testing::MakeTempDir();
    std::string line;
    std::vector<std::string> args = {absl::GetFlag(FLAGS_decisiond), "--listen=127.0.0.1:0",
                                     "--metrics_listen=127.0.0.1:0", "--data_dir=" + dir,
                                     "--seed=1"};
    // A model larger than decisiond's default request cap (4 MiB; trees trained on a
    // large log reach 6 MB) needs a larger cap; a --max_message_bytes among
    // --decisiond_flags, which come after, overrides this one.
    uintmax_t largest = 0;
    for (const std::filesystem::path& model : models) {
      std::error_code ec;
      const uintmax_t bytes = std::filesystem::file_size(model, ec);
      if (!ec) largest = std::max(largest, bytes);
    }
    if (largest > (uintmax_t{4} << 20) - (64 << 10)) {
      args.push_back(absl::StrCat("--max_message_bytes=", largest + (uintmax_t{1} << 20)));
    }
    const std::string background = absl::GetFlag(FLAGS_decisiond_background_cpus);
    cpu_set_t background_set;
    if (!background.empty()) {
      if (server_cpus == nullptr || !decision::testing::ParseCpus(background, &background_set)) {
        std::fprintf(stderr, "load: bad --decisiond_background_cpus (it needs --server_cpus)\n");
        return 2;
      }
      args.push_back("--background_cpus=" + background);
    }
    for (absl::string_view flag :
         absl::StrSplit(absl::GetFlag(FLAGS_decisiond_flags), ' ', absl::SkipEmpty())) {
      args.emplace_back(flag);
    }
    auto real = StartServer(args, &line, background.empty() ? nullptr : &background_set);
    if (!real.ok()) {
      std::fprintf(stderr, "load: %s\n", real.status().ToString().c_str());
      return 1;
    }
    // "decisiond listening on HOST:PORT metrics on HOST:PORT" (or "metrics on disabled").
    const std::vector<std::string> words = absl::StrSplit(line, ' ');
    const std::string address = words.size() > 3 ? words[3] : "";
    const std::string metrics =
        words.size() > 6 && absl::StrContains(words[6], ':') ? words[6] : "";
    auto stub = v1::DecisionService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    if (!SetUpProblem(*stub, "load", models)) return 1;
    for (int c : levels) {
      real_results.push_back(Drive(address, "load", c, (*real)->pid(), metrics));
      Print("decisiond", c, real_results.back());
    }
    if (!absl::GetFlag(FLAGS_via_haproxy).empty()) {
      std::vector<Result> proxied = DriveViaHaproxy(dir, address, (*real)->pid(), levels);
      if (proxied.empty()) return 1;
      for (size_t i = 0; i < levels.size(); ++i) {
        PrintProxyLevel(levels[i], real_results[i], proxied[i]);
      }
    }
  }
  for (size_t i = 0; i < levels.size(); ++i) {
    PrintLevel(levels[i], null_results[i], real_results[i]);
  }
  std::printf("\nload average at the end %s\n", LoadAverage().c_str());
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
