// decision_soak: a soak run of the real decisiond, bounded in time (not part of CI).
//
//   build/bench/decision_soak --decisiond=build/server/decisiond --out_dir=OUT
//       [--duration_s=600] [--warm_up_s=300] [--rate=500]
//
// (bench/soak.sh runs it pinned and renders OUT/soak.png.) It starts decisiond on loopback
// (port 0, metrics on port 0) with a fresh data directory and runs the load below for a
// warm-up of --warm_up_s seconds (with a SIGTERM restart half-way: the store's tables form
// and the bounded caches fill, as in a server that has run for a while), then for the
// measured --duration_s seconds, whose second and last tenths the flatness checks compare:
//   - paces Choose at --rate decisions/s from --threads client threads over two problems
//     fed with rows of bench/data: letter (26 arms, click-like reward 1 when the arm is the
//     row's label, auto-training on) and satimage (6 arms, reward uniform in [0, 1]); most
//     decisions get their reward after a random delay, --unrewarded_share never do (they
//     expire), a few satimage decisions get a deliberately late reward (the API answers
//     FAILED_PRECONDITION: counted as "late probes", not as errors) and a few acknowledged
//     rewards are sent again with another value (the API answers OK, first = false);
//   - registers experts at intervals (table, linear softmax, small XGBoost models built from
//     the data), retires satimage's down to a steady pool between registrations (letter's
//     auto-training retires its own, down to --letter_max_active), and calls TrainExperts;
//     with --expert_churn=false (a control: growth by design without the experts piling
//     up) it registers the first six only, waits until they are active, and then changes no
//     expert (no registration, retirement or TrainExperts, letter's auto-training off);
//   - sets a retention (--retention_samples) on both problems at a tenth of the duration,
//     and at every tenth deletes a few acknowledged events of each (DeleteEvents);
//   - restarts decisiond on the same data directory with SIGTERM at 40% of the measured run
//     and with SIGKILL at 70%; the client reconnects to the new address. RPCs that overlap the
//     time from the signal until one second after the new server is reachable are counted as
//     "injected", apart from the others; so are retries of rewards that failed in it, and
//     NOT_FOUND for a decision answered less than 1 s before the kill (decisiond documents
//     that a crash forgets the decisions not yet written, ~20 ms of them);
//   - samples decisiond's RSS, threads, open fds and store size every second.
// After the kill -9 restart and at the end (after one more clean restart) it exports both
// logs and checks that every reward acknowledged OK is there with its value, unless
// retention cut it or it was deleted on request (then it must not be there).
//
// Output in --out_dir: timeline.csv (one row per second), events.csv (restarts and checks,
// for the plot), summary.txt (the checks, PASS/FAIL, and the figures), decisiond.log
// (decisiond's stderr). Exit status 0 if every check passed, 1 if one failed, 2 if the run
// could not be set up.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/dataset.h"
#include "client/decision_client.h"
#include "core/xgboost_trainer.h"
#include "tests/decisiond_process.h"

ABSL_FLAG(std::string, decisiond, "", "decisiond binary (required)");
ABSL_FLAG(std::string, out_dir, "", "output directory, created if missing (required)");
ABSL_FLAG(std::string, data_dir, "",
          "decisiond's data directory, which must not exist yet (default: a fresh temporary "
          "directory, deleted at the end unless --keep_data)");
ABSL_FLAG(bool, keep_data, false, "keep the temporary data directory");
ABSL_FLAG(double, duration_s, 600, "seconds of load; every interval of the run scales with it");
ABSL_FLAG(double, warm_up_s, 300,
          "seconds of the same load on the fresh store before the measured run, with a SIGTERM "
          "restart half-way, so that RocksDB's tables and the bounded caches have formed when "
          "the flatness windows are taken (0: measure from the first second on an empty store; "
          "the live SST files settle about 300 s into the load)");
ABSL_FLAG(double, rate, 500, "decisions (Choose calls) per second, paced");
ABSL_FLAG(int, threads, 8, "load client threads (synchronous calls)");
ABSL_FLAG(uint64_t, seed, 1, "seed of the client's randomness and of decisiond's --seed");
ABSL_FLAG(std::string, letter_csv, "bench/data/letter.csv", "data of the first problem");
ABSL_FLAG(std::string, satimage_csv, "bench/data/satimage.csv", "data of the second problem");
ABSL_FLAG(double, letter_share, 0.7, "share of the decisions that go to the letter problem");
ABSL_FLAG(int, decisiond_cpu, -1, "pin decisiond to this CPU with taskset (-1: no pinning)");
ABSL_FLAG(std::string, decisiond_flags, "", "extra decisiond flags, space-separated");
ABSL_FLAG(int64_t, reward_delay_max_ms, 1000, "a reward is sent U(0, this) ms after its decision");
ABSL_FLAG(double, unrewarded_share, 0.1, "share of decisions never rewarded (they expire)");
ABSL_FLAG(double, late_share, 0.01,
          "share of satimage decisions rewarded 2 s after their wait time (late probes)");
ABSL_FLAG(double, duplicate_share, 0.01,
          "share of acknowledged rewards sent again with another value");
ABSL_FLAG(int64_t, rpc_deadline_ms, 2000, "deadline of every load RPC (no retries inside)");
ABSL_FLAG(int, auto_train_trees, 1, "tree experts per batch of the letter problem's auto-training");
ABSL_FLAG(int, auto_train_linear, 0,
          "gblinear experts per batch of the letter problem's auto-training");
ABSL_FLAG(double, letter_batch_multiplier, 50,
          "the letter problem's batch_multiplier b (batch boundaries, hence auto-training, "
          "every b sqrt(t) samples; decisiond's default 7 trains an expert every 10 s at this "
          "rate, and every join scores every expert ever trained)");
ABSL_FLAG(int, letter_max_active, 3,
          "the letter problem's auto_train.max_active_experts (0: decisiond's default, 32): "
          "the selectable experts its auto-training keeps, hence the models in memory (about "
          "1.7 MiB per tree expert); the default 3 is reached within the warm-up, so the "
          "measured run's live pool is steady, as satimage's is (6 was reached only late in "
          "the measured run)");
ABSL_FLAG(int64_t, retention_samples, 16384,
          "ProblemConfig.retention.max_samples set on both problems at a tenth of the duration "
          "(0: none); the store then keeps about that many samples of each");
ABSL_FLAG(int, deletes_per_hook, 5,
          "acknowledged events of each problem deleted (DeleteEvents) at each tenth of the "
          "duration");
ABSL_FLAG(bool, expert_churn, true,
          "register, retire and train experts during the run, with auto-training in the letter "
          "problem; false: one expert of each kind per problem at the start only, then none "
          "added or retired and no auto-training (the control for the RSS growth)");
ABSL_FLAG(double, flat_tolerance, 0.10,
          "RSS and fds are flat if the last window's mean is within this share of the second's");

namespace {

namespace v1 = decision::v1;
using Clock = std::chrono::steady_clock;
using decision::bench::Dataset;
using decision::client::DecisionClient;

constexpr int kCodes = 17;  // grpc::StatusCode 0 (OK) .. 16 (UNAUTHENTICATED)
constexpr const char* kCodeNames[kCodes] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};
// A decision answered less than this before a kill may be forgotten by it (decisiond writes
// deferred decisions within --maintenance_interval_ms, 20 ms by default).
// The problem with auto-training (the other, soak-satimage, has its pool held by the churn).
constexpr const char* kLetterId = "soak-letter";
constexpr auto kForgetHorizon = std::chrono::seconds(1);
// An injected window stays open this long after the new server is reachable.
constexpr auto kWindowGrace = std::chrono::seconds(1);
constexpr auto kRewardRetryDelay = std::chrono::milliseconds(200);
constexpr int kMaxRewardAttempts = 60;

int CodeIndex(absl::StatusCode code) {
  const int c = static_cast<int>(code);
  return c >= 0 && c < kCodes ? c : static_cast<int>(absl::StatusCode::kUnknown);
}

bool Retryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kCancelled;
}

// ---------------------------------------------------------------------------------------
// The problems and the experts built from their data.

struct ProblemSpec {
  std::string id;
  Dataset data;
  int64_t reward_wait_ms = 0;
  bool click_reward = false;  // reward 1 if arm == label, else 0; otherwise U(0, 1)
  bool late_probes = false;   // some decisions get a reward after their wait time
  bool auto_train = false;
  double batch_multiplier = 0;  // 0: decisiond's default
  int arms() const { return data.num_classes; }
  int features() const { return data.num_features; }
};

// Rows of `ds` drawn with replacement.
std::vector<size_t> SampleRows(const Dataset& ds, size_t n, std::mt19937_64& gen) {
  std::uniform_int_distribution<size_t> row(0, ds.size() - 1);
  std::vector<size_t> rows(n);
  for (size_t& r : rows) r = row(gen);
  return rows;
}

// A Gaussian classifier with a shared diagonal variance (equal priors) fitted on 300 random
// rows: logit_a(x) = sum_f x_f mu_af / s_f^2 - sum_f mu_af^2 / (2 s_f^2), which is linear,
// at a random temperature in [1, 4].
v1::ExpertModel CentroidLinearModel(const ProblemSpec& p, std::mt19937_64& gen) {
  const int k = p.arms(), d = p.features();
  std::vector<double> sum(static_cast<size_t>(k) * d, 0.0), mean(d, 0.0), sq(d, 0.0);
  std::vector<int> count(k, 0);
  const std::vector<size_t> rows = SampleRows(p.data, 300, gen);
  for (size_t r : rows) {
    const auto x = p.data.row(r);
    const int a = p.data.labels[r];
    ++count[a];
    for (int f = 0; f < d; ++f) {
      sum[a * d + f] += x[f];
      mean[f] += x[f] / rows.size();
      sq[f] += x[f] * x[f] / rows.size();
    }
  }
  v1::ExpertModel model;
  auto* l = model.mutable_linear_softmax();
  for (int a = 0; a < k; ++a) {
    double bias = 0.0;
    for (int f = 0; f < d; ++f) {
      const double var = std::max(sq[f] - mean[f] * mean[f], 1e-3);
      const double mu = count[a] > 0 ? sum[a * d + f] / count[a] : mean[f];
      l->add_weights(mu / var);
      bias -= mu * mu / (2 * var);
    }
    l->add_bias(bias);
  }
  l->set_temperature(std::uniform_real_distribution<double>(1.0, 4.0)(gen));
  return model;
}

// Label frequencies (add-one smoothed) of 500 random rows: per value of feature 0 if it is
// a small non-negative integer in every row (letter), else one row for every context.
v1::ExpertModel FrequencyTableModel(const ProblemSpec& p, std::mt19937_64& gen) {
  int keys = 0;
  for (size_t r = 0; r < p.data.size(); ++r) {
    const double v = p.data.row(r)[0];
    if (v < 0 || v >= 64 || v != std::floor(v)) {
      keys = 1;
      break;
    }
    keys = std::max(keys, static_cast<int>(v) + 1);
  }
  const bool keyed = keys > 1;
  std::vector<std::vector<double>> freq(keys, std::vector<double>(p.arms(), 1.0));
  for (size_t r : SampleRows(p.data, 500, gen)) {
    const int key = keyed ? static_cast<int>(p.data.row(r)[0]) : 0;
    freq[key][p.data.labels[r]] += 1.0;
  }
  v1::ExpertModel model;
  auto* t = model.mutable_table();
  t->set_key_feature(0);
  for (const std::vector<double>& row : freq) {
    double total = 0.0;
    for (double v : row) total += v;
    auto* out = t->add_rows();
    for (double v : row) out->add_probabilities(v / total);
  }
  return model;
}

// A small multi:softprob booster (depth 3, 5-10 rounds) trained with the project's trainer
// on 400 random labelled rows.
absl::StatusOr<v1::ExpertModel> SmallXgboostModel(const ProblemSpec& p, std::mt19937_64& gen) {
  decision::TrainingSet set;
  set.num_features = p.features();
  for (size_t r : SampleRows(p.data, 400, gen)) set.Add(p.data.row(r), p.data.labels[r], 1.0, 1.0);
  decision::XgboostTrainOptions options;
  options.rounds = std::uniform_int_distribution<int>(5, 10)(gen);
  options.max_depth = 3;
  options.seed = gen();
  absl::StatusOr<std::string> bytes = decision::TrainXgboostModel(set, p.arms(), options);
  if (!bytes.ok()) return bytes.status();
  v1::ExpertModel model;
  model.mutable_xgboost()->set_model(*std::move(bytes));
  return model;
}

// ---------------------------------------------------------------------------------------
// What the client saw: per-second RPC results, injected windows, acknowledged rewards.

// Time spans in which failures were provoked on purpose (a restart in progress).
class InjectionWindows {
 public:
  void Open(Clock::time_point t) {
    absl::MutexLock lock(&mu_);
    windows_.emplace_back(t, Clock::time_point::max());
  }
  void Close(Clock::time_point t) {
    absl::MutexLock lock(&mu_);
    windows_.back().second = t;
  }
  // Whether [a, b] overlaps a window (an open window extends to the end of time).
  bool Overlaps(Clock::time_point a, Clock::time_point b) const {
    absl::MutexLock lock(&mu_);
    for (const auto& [from, to] : windows_) {
      if (a <= to && b >= from) return true;
    }
    return false;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> windows_ ABSL_GUARDED_BY(mu_);
};

struct SecondCounts {
  std::array<int64_t, kCodes> run{};  // outside injected windows
  std::array<int64_t, kCodes> inj{};  // in them
  int64_t late_precondition = 0;      // late probes answered FAILED_PRECONDITION (expected)
  int64_t late_other = 0;             // late probes answered anything else
};

// RPC results by the second (since the load started) in which they completed.
class Stats {
 public:
  explicit Stats(Clock::time_point t0) : t0_(t0) {}
  int Second(Clock::time_point t) const {
    return std::max(0, static_cast<int>(std::chrono::duration<double>(t - t0_).count()));
  }
  void Record(Clock::time_point end, absl::StatusCode code, bool injected) {
    absl::MutexLock lock(&mu_);
    SecondCounts& s = seconds_[Second(end)];
    (injected ? s.inj : s.run)[CodeIndex(code)]++;
  }
  // The latency of a load RPC (Choose or Reward) that returned OK.
  void RecordLatency(Clock::time_point start, Clock::time_point end) {
    const double ms = std::chrono::duration<double, std::milli>(end - start).count();
    absl::MutexLock lock(&mu_);
    latencies_ms_[Second(end)].push_back(ms);
  }
  // The p50 and p99 of the latencies of `second` (NaN if none); forgets them.
  std::pair<double, double> TakeLatencyPercentiles(int second) {
    std::vector<double> v;
    {
      absl::MutexLock lock(&mu_);
      auto it = latencies_ms_.find(second);
      if (it == latencies_ms_.end()) return {NAN, NAN};
      v = std::move(it->second);
      latencies_ms_.erase(it);
    }
    auto at = [&v](double q) {
      const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
      std::nth_element(v.begin(), v.begin() + i, v.end());
      return v[i];
    };
    return {at(0.5), at(0.99)};
  }
  void RecordLateProbe(Clock::time_point end, bool precondition) {
    absl::MutexLock lock(&mu_);
    SecondCounts& s = seconds_[Second(end)];
    (precondition ? s.late_precondition : s.late_other)++;
  }
  SecondCounts Get(int second) const {
    absl::MutexLock lock(&mu_);
    auto it = seconds_.find(second);
    return it == seconds_.end() ? SecondCounts() : it->second;
  }
  SecondCounts Total() const {
    absl::MutexLock lock(&mu_);
    SecondCounts t;
    for (const auto& [second, s] : seconds_) {
      for (int c = 0; c < kCodes; ++c) {
        t.run[c] += s.run[c];
        t.inj[c] += s.inj[c];
      }
      t.late_precondition += s.late_precondition;
      t.late_other += s.late_other;
    }
    return t;
  }

 private:
  const Clock::time_point t0_;
  mutable absl::Mutex mu_;
  std::map<int, SecondCounts> seconds_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::vector<double>> latencies_ms_ ABSL_GUARDED_BY(mu_);
};

// Wall-clock milliseconds, as decisiond stamps samples (joined_at_ms).
int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct AckedReward {
  int problem;
  double value;
  int64_t at_ms;  // when the client was told (its sample was joined no later)
};
struct LateProbe {
  int problem;
  int64_t at_ms;  // when the late reward was refused (the event expired before)
};

// Rewards acknowledged OK, late probes answered FAILED_PRECONDITION, and what went wrong.
class Ledger {
 public:
  void Ack(const std::string& event_id, int problem, double value) {
    absl::MutexLock lock(&mu_);
    const int64_t now = WallMs();
    acked_[event_id] = {problem, value, now};
    std::deque<std::pair<int64_t, std::string>>& recent = recent_acked_[problem];
    recent.emplace_back(now, event_id);
    if (recent.size() > 4096) recent.pop_front();
  }
  void Late(const std::string& event_id, int problem) {
    absl::MutexLock lock(&mu_);
    late_[event_id] = {problem, WallMs()};
  }
  // Up to `count` events of `problem` acknowledged at least `min_age_ms` ago, among the
  // recent ones (so that retention has not cut them yet), for DeleteEvents. From now on
  // DeletionRequested(id) is true (a check that read the log meanwhile may have seen
  // either), for good if the call fails, since its outcome is then unknown.
  std::vector<std::string> ForDeletion(int problem, int count, int64_t min_age_ms) {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> ids;
    const int64_t before = WallMs() - min_age_ms;
    for (const auto& [at, id] : recent_acked_[problem]) {
      if (static_cast<int>(ids.size()) == count || at > before) break;
      if (acked_.contains(id) && !deleting_.contains(id)) ids.push_back(id);
    }
    deleting_.insert(ids.begin(), ids.end());
    return ids;
  }
  // Events deleted on request: no longer expected in the log, and never by their id.
  void Deleted(const std::vector<std::string>& ids, int problem) {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : ids) {
      acked_.erase(id);
      deleting_.erase(id);
      deleted_[id] = problem;
    }
    auto& recent = recent_acked_[problem];
    recent.erase(std::remove_if(recent.begin(), recent.end(),
                                [&](const auto& r) { return deleted_.contains(r.second); }),
                 recent.end());
  }
  absl::flat_hash_map<std::string, int> DeletedSnapshot() const {
    absl::MutexLock lock(&mu_);
    return deleted_;
  }
  // Whether DeleteEvents was asked for the event: done, in flight, or failed (its outcome
  // unknown).
  bool DeletionRequested(const std::string& event_id) const {
    absl::MutexLock lock(&mu_);
    return deleting_.contains(event_id) || deleted_.contains(event_id);
  }
  // Something the API does not allow, or an error outside an injected window.
  void Unexpected(const std::string& what) {
    absl::MutexLock lock(&mu_);
    ++unexpected_;
    if (examples_.size() < 20) examples_.push_back(what);
  }
  void Forgotten() {
    absl::MutexLock lock(&mu_);
    ++forgotten_;
  }
  absl::flat_hash_map<std::string, AckedReward> AckedSnapshot() const {
    absl::MutexLock lock(&mu_);
    return acked_;
  }
  absl::flat_hash_map<std::string, LateProbe> LateSnapshot() const {
    absl::MutexLock lock(&mu_);
    return late_;
  }
  int64_t unexpected() const {
    absl::MutexLock lock(&mu_);
    return unexpected_;
  }
  int64_t forgotten() const {
    absl::MutexLock lock(&mu_);
    return forgotten_;
  }
  std::vector<std::string> examples() const {
    absl::MutexLock lock(&mu_);
    return examples_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, AckedReward> acked_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, LateProbe> late_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> deleted_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> deleting_ ABSL_GUARDED_BY(mu_);
  // Per problem, the last acknowledged events (time, id), oldest first.
  std::map<int, std::deque<std::pair<int64_t, std::string>>> recent_acked_ ABSL_GUARDED_BY(mu_);
  int64_t unexpected_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t forgotten_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> examples_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------------------
// decisiond and the client's connection to it.

// One decisiond process (stderr appended to a log file, optionally pinned with taskset).
class Decisiond {
 public:
  static absl::StatusOr<std::unique_ptr<Decisiond>> Start(const std::string& binary,
                                                          const std::string& data_dir,
                                                          const std::string& log_path, int cpu,
                                                          uint64_t seed,
                                                          const std::string& extra_flags) {
    // sh execs taskset, which execs decisiond: the pid stays decisiond's.
    std::vector<std::string> argv = {"/bin/sh", "-c", "log=$1; shift; exec \"$@\" 2>>\"$log\"",
                                     "sh", log_path};
    if (cpu >= 0) {
      argv.insert(argv.end(), {"taskset", "-c", std::to_string(cpu)});
    }
    argv.insert(argv.end(), {binary, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                             "--data_dir=" + data_dir, absl::StrCat("--seed=", seed)});
    for (absl::string_view f : absl::StrSplit(extra_flags, ' ', absl::SkipEmpty())) {
      argv.emplace_back(f);
    }
    std::string line;
    auto child = decision::testing::ChildProcess::Start(argv, &line);
    if (!child.ok()) return child.status();
    // "decisiond listening on HOST:PORT metrics on HOST:PORT"
    const std::vector<std::string> words = absl::StrSplit(line, ' ');
    if (words.size() != 7 || words[1] != "listening") {
      return absl::InternalError("unexpected start line: " + line);
    }
    auto d = std::unique_ptr<Decisiond>(new Decisiond());
    d->child_ = *std::move(child);
    d->address_ = words[3];
    d->metrics_address_ = words[6];
    return d;
  }
  pid_t pid() const { return child_->pid(); }
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  int Terminate() { return child_->Terminate(); }
  void Kill() { child_->Kill(); }

 private:
  Decisiond() = default;
  std::unique_ptr<decision::testing::ChildProcess> child_;
  std::string address_, metrics_address_;
};

// The current client (replaced at every restart: the new server has a new port) and the
// incarnation of the server it talks to. Also what the sampler needs of that server.
class Connection {
 public:
  struct Current {
    std::shared_ptr<DecisionClient> client;
    int incarnation = 0;
  };
  Current Get() const {
    absl::MutexLock lock(&mu_);
    return current_;
  }
  void Set(const std::string& address, int64_t deadline_ms, pid_t pid,
           const std::string& metrics_address) {
    decision::client::ClientOptions options;
    options.address = address;
    options.deadline_ms = deadline_ms;
    options.max_attempts = 1;  // the soak counts every attempt and retries itself
    auto client = std::make_shared<DecisionClient>(options);
    absl::MutexLock lock(&mu_);
    current_ = {std::move(client), current_.incarnation + 1};
    pid_ = pid;
    metrics_address_ = metrics_address;
  }
  // The server is going away: the sampler stops reading it.
  void MarkDown() {
    absl::MutexLock lock(&mu_);
    pid_ = -1;
  }
  std::pair<pid_t, std::string> Process() const {
    absl::MutexLock lock(&mu_);
    return {pid_, metrics_address_};
  }

 private:
  mutable absl::Mutex mu_;
  Current current_ ABSL_GUARDED_BY(mu_);
  pid_t pid_ ABSL_GUARDED_BY(mu_) = -1;
  std::string metrics_address_ ABSL_GUARDED_BY(mu_);
};

// When each incarnation ended by SIGKILL, by incarnation number.
class Kills {
 public:
  void Add(int incarnation, Clock::time_point at) {
    absl::MutexLock lock(&mu_);
    kills_[incarnation] = at;
  }
  // Whether a decision answered by `incarnation` at `decided_at` may have been forgotten.
  bool MayForget(int incarnation, Clock::time_point decided_at) const {
    absl::MutexLock lock(&mu_);
    auto it = kills_.find(incarnation);
    return it != kills_.end() && decided_at >= it->second - kForgetHorizon;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<int, Clock::time_point> kills_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------------------
// The load: paced Choose, delayed Reward.

struct Shared {
  std::vector<ProblemSpec>* problems;
  Connection* connection;
  InjectionWindows* windows;
  Stats* stats;
  Ledger* ledger;
  Kills* kills;
  std::atomic<int64_t> decisions{0}, rewards_acked{0};
  // Decision slots skipped because the thread was over a second behind (a stalled call),
  // outside and inside injected windows.
  std::atomic<int64_t> skipped_run{0}, skipped_inj{0};
};

struct PendingReward {
  enum Kind { kNormal, kLate, kDuplicate };
  Clock::time_point due;
  int problem;
  std::string event_id;
  double value;
  Kind kind;
  int incarnation;  // that answered the decision
  Clock::time_point decided_at;
  int attempts = 0;
  bool injected = false;  // an earlier attempt failed in an injected window
  bool operator>(const PendingReward& o) const { return due > o.due; }
};

class LoadWorker {
 public:
  LoadWorker(Shared* shared, int index, int threads, double rate, Clock::time_point t0,
             Clock::time_point end, uint64_t seed)
      : s_(shared),
        index_(index),
        end_(end),
        gen_(seed * 7919 + index),
        period_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(threads / rate))),
        next_decision_(t0 + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(index / rate))),
        delay_max_ms_(absl::GetFlag(FLAGS_reward_delay_max_ms)),
        unrewarded_(absl::GetFlag(FLAGS_unrewarded_share)),
        late_(absl::GetFlag(FLAGS_late_share)),
        duplicate_(absl::GetFlag(FLAGS_duplicate_share)),
        letter_share_(absl::GetFlag(FLAGS_letter_share)) {}

  void Run() {
    while (true) {
      const auto now = Clock::now();
      if (now >= end_) return;  // rewards still queued are never sent: those decisions expire
      if (!queue_.empty() && queue_.top().due <= now) {
        PendingReward r = queue_.top();
        queue_.pop();
        SendReward(std::move(r));
        continue;
      }
      if (now >= next_decision_) {
        // More than a second behind (a stalled call): skip the missed slots, no burst.
        if (now - next_decision_ > std::chrono::seconds(1)) {
          const bool injected = s_->windows->Overlaps(next_decision_, now);
          while (now - next_decision_ > std::chrono::seconds(1)) {
            next_decision_ += period_;
            (injected ? s_->skipped_inj : s_->skipped_run)++;
          }
        }
        Decide();
        next_decision_ += period_;
        continue;
      }
      auto wake = std::min(next_decision_, end_);
      if (!queue_.empty()) wake = std::min(wake, queue_.top().due);
      std::this_thread::sleep_until(wake);
    }
  }

 private:
  void Decide() {
    const int p = std::bernoulli_distribution(letter_share_)(gen_) ? 0 : 1;
    const ProblemSpec& spec = (*s_->problems)[p];
    const size_t row = std::uniform_int_distribution<size_t>(0, spec.data.size() - 1)(gen_);
    const std::string event_id = absl::StrCat(p == 0 ? "L" : "S", index_, "-", counter_++);
    const Connection::Current c = s_->connection->Get();
    const auto start = Clock::now();
    absl::StatusOr<v1::ChooseResponse> r = c.client->Choose(spec.id, spec.data.row(row), event_id);
    const auto end = Clock::now();
    const bool injected = s_->windows->Overlaps(start, end);
    s_->stats->Record(end, r.status().code(), injected);
    if (r.ok()) s_->stats->RecordLatency(start, end);
    if (!r.ok()) {
      if (!injected)
        s_->ledger->Unexpected(absl::StrCat("Choose ", event_id, ": ", r.status().ToString()));
      return;
    }
    s_->decisions++;
    if (r->event_id() != event_id || r->arm() < 0 || r->arm() >= spec.arms() ||
        !(r->propensity() > 0.0 && r->propensity() <= 1.0)) {
      s_->ledger->Unexpected(absl::StrCat("bad decision: ", r->ShortDebugString()));
      return;
    }
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(gen_);
    if (u < unrewarded_) return;
    PendingReward pr;
    pr.problem = p;
    pr.event_id = event_id;
    pr.incarnation = c.incarnation;
    pr.decided_at = end;
    if (spec.late_probes && u < unrewarded_ + late_) {
      pr.kind = PendingReward::kLate;
      pr.value = 1.0;
      pr.due = end + std::chrono::milliseconds(spec.reward_wait_ms + 2000);
    } else {
      pr.kind = PendingReward::kNormal;
      pr.value = spec.click_reward ? (r->arm() == spec.data.labels[row] ? 1.0 : 0.0)
                                   : std::uniform_real_distribution<double>(0.0, 1.0)(gen_);
      pr.due = end + std::chrono::milliseconds(
                         std::uniform_int_distribution<int64_t>(0, delay_max_ms_)(gen_));
    }
    queue_.push(std::move(pr));
  }

  void SendReward(PendingReward pr) {
    const ProblemSpec& spec = (*s_->problems)[pr.problem];
    const Connection::Current c = s_->connection->Get();
    const auto start = Clock::now();
    absl::StatusOr<bool> r = c.client->Reward(spec.id, pr.event_id, pr.value);
    const auto end = Clock::now();
    const absl::StatusCode code = r.status().code();
    bool injected = pr.injected || s_->windows->Overlaps(start, end);
    // A duplicate follows an acknowledged reward: its event is durable, never forgotten.
    const bool forgotten = code == absl::StatusCode::kNotFound &&
                           pr.kind != PendingReward::kDuplicate &&
                           s_->kills->MayForget(pr.incarnation, pr.decided_at);
    if (forgotten) {
      injected = true;
      s_->ledger->Forgotten();
    }
    const bool retry = Retryable(code) && ++pr.attempts < kMaxRewardAttempts;
    if (pr.kind == PendingReward::kLate && !retry && !forgotten) {
      // The API: a reward after the wait time is FAILED_PRECONDITION (counted, not learned).
      const bool precondition = code == absl::StatusCode::kFailedPrecondition;
      s_->stats->RecordLateProbe(end, precondition);
      if (precondition) {
        s_->ledger->Late(pr.event_id, pr.problem);
      } else {
        s_->ledger->Unexpected(absl::StrCat("late reward of ", pr.event_id, " answered ",
                                            r.ok() ? "OK" : r.status().ToString()));
      }
      return;
    }
    s_->stats->Record(end, code, injected);
    if (r.ok()) s_->stats->RecordLatency(start, end);
    if (r.ok()) {
      if (pr.kind == PendingReward::kNormal) {
        s_->ledger->Ack(pr.event_id, pr.problem, pr.value);
        s_->rewards_acked++;
        if (*r && std::bernoulli_distribution(duplicate_)(gen_)) {
          PendingReward dup = pr;
          dup.kind = PendingReward::kDuplicate;
          dup.value = 1.0 - pr.value;
          dup.attempts = 0;
          dup.injected = false;
          dup.due = end + std::chrono::milliseconds(100);
          queue_.push(std::move(dup));
        }
      } else if (*r) {
        s_->ledger->Unexpected(
            absl::StrCat("second reward of ", pr.event_id, " answered first=true"));
      }
      return;
    }
    if (retry) {
      pr.injected = injected;
      pr.due = end + kRewardRetryDelay;
      queue_.push(std::move(pr));
      return;
    }
    if (!injected) {
      s_->ledger->Unexpected(absl::StrCat("Reward ", pr.event_id, ": ", r.status().ToString()));
    }
  }

  Shared* s_;
  const int index_;
  const Clock::time_point end_;
  std::mt19937_64 gen_;
  const Clock::duration period_;
  Clock::time_point next_decision_;
  const int64_t delay_max_ms_;
  const double unrewarded_, late_, duplicate_, letter_share_;
  int64_t counter_ = 0;
  std::priority_queue<PendingReward, std::vector<PendingReward>, std::greater<PendingReward>>
      queue_;
};

// ---------------------------------------------------------------------------------------
// Expert churn, training and the retention hook, on their own thread.

struct ChurnCounts {
  std::atomic<int> registered{0}, retired{0}, trainings{0}, retention_calls{0};
  std::atomic<int> retention_set{0}, delete_calls{0}, deleted{0}, delete_not_found{0};
};

class Churn {
 public:
  Churn(Shared* shared, ChurnCounts* counts, uint64_t seed)
      : s_(shared), counts_(counts), gen_(seed * 104729 + 17) {}

  // Registers one expert of `kind` (0 table, 1 linear softmax, 2 XGBoost) in problem p.
  void Register(int p, int kind) {
    const ProblemSpec& spec = (*s_->problems)[p];
    absl::StatusOr<v1::ExpertModel> model;
    const char* names[] = {"table", "linear", "xgboost"};
    switch (kind) {
      case 0:
        model = FrequencyTableModel(spec, gen_);
        break;
      case 1:
        model = CentroidLinearModel(spec, gen_);
        break;
      default:
        model = SmallXgboostModel(spec, gen_);
        break;
    }
    if (!model.ok()) {
      s_->ledger->Unexpected(absl::StrCat("building a model: ", model.status().ToString()));
      return;
    }
    const std::string name = absl::StrCat("soak-", names[kind], "-", ++serial_);
    if (Call("RegisterExpert",
             [&](DecisionClient& c) { return c.RegisterExpert(spec.id, name, *model).status(); })) {
      counts_->registered++;
    }
  }

  // Retires random active experts other than the uniform one until at most `keep` are
  // active, never the last selectable one (retiring it is FAILED_PRECONDITION by the API).
  // Call it for a problem without auto-training only: auto-training retires experts on its
  // own, which could leave the chosen one the last between the listing and the retirement.
  void RetireDownTo(int p, int keep) {
    const ProblemSpec& spec = (*s_->problems)[p];
    std::vector<int> candidates;
    int active = 0;
    Call("ListExperts", [&](DecisionClient& c) {
      absl::StatusOr<v1::ListExpertsResponse> r = c.ListExperts(spec.id);
      if (r.ok()) {
        for (const v1::Expert& e : r->experts()) {
          if (e.status() != v1::EXPERT_STATUS_ACTIVE) continue;
          ++active;
          if (e.expert_id() != 0) candidates.push_back(e.expert_id());
        }
      }
      return r.status();
    });
    std::shuffle(candidates.begin(), candidates.end(), gen_);
    for (int id : candidates) {
      if (active <= std::max(keep, 1)) return;
      if (Call("RetireExpert",
               [&](DecisionClient& c) { return c.RetireExpert(spec.id, id).status(); })) {
        counts_->retired++;
        --active;
      }
    }
  }

  // Waits until problem p has no backfilling expert (a registered expert is active once its
  // probabilities over the stored log are computed); false if that takes over `timeout`.
  bool WaitActive(int p, Clock::duration timeout) {
    const ProblemSpec& spec = (*s_->problems)[p];
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int backfilling = -1;
      Call("ListExperts", [&](DecisionClient& c) {
        absl::StatusOr<v1::ListExpertsResponse> r = c.ListExperts(spec.id);
        if (r.ok()) {
          backfilling = 0;
          for (const v1::Expert& e : r->experts()) {
            backfilling += e.status() == v1::EXPERT_STATUS_BACKFILLING;
          }
        }
        return r.status();
      });
      if (backfilling == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  void Train(int p) {
    const ProblemSpec& spec = (*s_->problems)[p];
    if (Call("TrainExperts",
             [&](DecisionClient& c) { return c.TrainExperts(spec.id, 1, 1).status(); })) {
      counts_->trainings++;
    }
  }

  // Retention and deletion on request: the first call sets --retention_samples on every
  // problem (SetRetention); every call deletes --deletes_per_hook acknowledged events of
  // each (DeleteEvents), among those acknowledged at least 5 s ago (their deliberate second
  // rewards, 100 ms after the first, are done). Verify then expects neither the cut samples
  // nor the deleted events.
  void Retention() {
    const int call = ++counts_->retention_calls;
    const int64_t max_samples = absl::GetFlag(FLAGS_retention_samples);
    for (size_t p = 0; p < s_->problems->size(); ++p) {
      const ProblemSpec& spec = (*s_->problems)[p];
      if (call == 1 && max_samples > 0) {
        v1::RetentionConfig retention;
        retention.set_max_samples(max_samples);
        if (Call("SetRetention", [&](DecisionClient& c) {
              return c.SetRetention(spec.id, retention).status();
            })) {
          counts_->retention_set++;
        }
      }
      const std::vector<std::string> ids = s_->ledger->ForDeletion(
          static_cast<int>(p), absl::GetFlag(FLAGS_deletes_per_hook), 5000);
      if (ids.empty()) continue;
      absl::StatusOr<v1::DeleteEventsResponse> r;
      if (!Call("DeleteEvents", [&](DecisionClient& c) {
            r = c.DeleteEvents(spec.id, ids);
            return r.status();
          })) {
        continue;
      }
      counts_->delete_calls++;
      counts_->deleted += static_cast<int>(r->deleted());
      counts_->delete_not_found += r->not_found_size();
      s_->ledger->Deleted(ids, static_cast<int>(p));
    }
  }

 private:
  // One control RPC through the current client, counted; false if it failed.
  bool Call(const char* what, const std::function<absl::Status(DecisionClient&)>& call) {
    const Connection::Current c = s_->connection->Get();
    const auto start = Clock::now();
    const absl::Status status = call(*c.client);
    const auto end = Clock::now();
    const bool injected = s_->windows->Overlaps(start, end);
    s_->stats->Record(end, status.code(), injected);
    if (!status.ok() && !injected) {
      s_->ledger->Unexpected(absl::StrCat(what, ": ", status.ToString()));
    }
    return status.ok();
  }

  Shared* s_;
  ChurnCounts* counts_;
  std::mt19937_64 gen_;
  int serial_ = 0;
};

// ---------------------------------------------------------------------------------------
// Sampling decisiond every second.

struct ResourceSample {
  double rss_kb = NAN, threads = NAN, fds = NAN, sst_bytes = NAN, storage_size_bytes = NAN,
         dir_bytes = NAN, samples = NAN;
  double experts = NAN;        // experts in the problems' logs (backfill complete)
  double problem_bytes = NAN;  // decision_problem_memory_bytes, every part and problem
  double unloaded = NAN;       // decision_experts_unloaded: retired experts without a model
  // decision_store_memory_bytes{part="memtables"} and {part="block_cache"}: RocksDB's
  // memtables (64 MiB budget, freed by flushes) and block cache (32 MiB, point lookups).
  double memtable_bytes = NAN, block_cache_bytes = NAN;
  double table_reader_bytes = NAN;  // {part="table_readers"}: index and filter blocks
  // decision_allocator_bytes{kind="in_use"} and {kind="free"} (glibc's mallinfo2, every 5 s
  // in decisiond): the heap's live allocations (the parts above included) and the free
  // chunks the allocator holds. NaN for a decisiond without the metric.
  double heap_in_use = NAN, heap_free = NAN;
  // decision_experts{state="active"} over the problems, and the experts whose model is in
  // memory (decision_experts less the failed ones and decision_experts_unloaded).
  double experts_active = NAN, experts_loaded = NAN;
  double letter_active = NAN;  // of them, the auto-training problem's (soak-letter)
  double sst_files = NAN;  // decision_store_sst_files, every family: one fd each
  double other_fds = NAN;  // fds - sst_files: what a leak of descriptors would grow
  double cpu_s = NAN;          // user + system CPU seconds of the process so far
  double cpu_pct = NAN;        // of one core, over the last second
  double latency_p50_ms = NAN, latency_p99_ms = NAN;  // of the load RPCs in the last second
};

// User + system CPU seconds of a process so far (/proc/<pid>/stat); NaN if unreadable.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 > stat.size()) return NAN;
  // Fields after the command name (which may hold spaces) start after the last ')'.
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(paren + 2), ' ');
  int64_t utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return NAN;
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

// The sum of every sample of a metric family in a Prometheus text page; NaN if absent.
double MetricSum(const std::string& page, const std::string& name) {
  double total = NAN;
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    double v;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) continue;
    total = std::isnan(total) ? v : total + v;
  }
  return total;
}

// The label `label` of a Prometheus sample line ("" if absent).
std::string Label(absl::string_view line, absl::string_view label) {
  const std::string key = absl::StrCat(label, "=\"");
  const size_t at = line.find(key);
  if (at == absl::string_view::npos) return "";
  const size_t from = at + key.size();
  return std::string(line.substr(from, line.find('"', from) - from));
}

// The sum of the samples of metric `name` with every label of `labels` at its value; NaN
// if none.
double MetricWithLabels(
    const std::string& page, const std::string& name,
    std::initializer_list<std::pair<absl::string_view, absl::string_view>> labels) {
  double total = NAN;
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(absl::StrCat(name, "{"), 0) != 0) continue;
    bool match = true;
    for (const auto& [label, value] : labels) match = match && Label(line, label) == value;
    if (!match) continue;
    double v;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) continue;
    total = std::isnan(total) ? v : total + v;
  }
  return total;
}

double MetricWithLabel(const std::string& page, const std::string& name,
                       absl::string_view label, absl::string_view value) {
  return MetricWithLabels(page, name, {{label, value}});
}

// What decisiond reports of the memory its problems keep (decision_problem_memory_bytes:
// the samples in memory and the estimators' state, summed over parts and problems), and the
// experts in the estimators (decision_expert_backfill_progress = 1).
void ReadProblemMemory(const std::string& page, ResourceSample* s) {
  double bytes = 0, experts = 0;
  bool any = false;
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    const bool is_memory = line.rfind("decision_problem_memory_bytes{", 0) == 0;
    const bool is_expert = line.rfind("decision_expert_backfill_progress{", 0) == 0;
    if (!is_memory && !is_expert) continue;
    double v;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) continue;
    if (is_memory) {
      bytes += v;
      any = true;
    }
    if (is_expert && v >= 1.0) experts += 1;
  }
  if (!any) return;
  s->problem_bytes = bytes;
  s->experts = experts;
}

// The sizes of the *.sst files and of all files under dir.
std::pair<double, double> DirectoryBytes(const std::string& dir) {
  double sst = 0, all = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code size_ec;
    if (!it->is_regular_file(size_ec)) continue;
    const double size = static_cast<double>(it->file_size(size_ec));
    if (size_ec) continue;  // deleted meanwhile (compaction)
    all += size;
    if (it->path().extension() == ".sst") sst += size;
  }
  return {sst, all};
}

// sst_bytes comes from the metric when decisiond exports it, else from the files.
constexpr const char* kLiveSstMetric = "decision_store_live_sst_bytes";

ResourceSample SampleResources(pid_t pid, const std::string& metrics_address,
                               const std::string& data_dir, bool* sst_from_metric) {
  ResourceSample s;
  const auto [sst_files, all_files] = DirectoryBytes(data_dir);
  s.dir_bytes = all_files;
  s.sst_bytes = sst_files;
  if (pid <= 0) return s;
  s.cpu_s = ProcessCpuSeconds(pid);
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    double v;
    if (line.rfind("VmRSS:", 0) == 0 &&
        absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(6, line.size() - 6 - 3)), &v)) {
      s.rss_kb = v;
    } else if (line.rfind("Threads:", 0) == 0 &&
               absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(8)), &v)) {
      s.threads = v;
    }
  }
  std::error_code ec;
  double fds = 0;
  for (auto it = std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"), ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++fds;
  }
  if (!ec) s.fds = fds;
  absl::StatusOr<std::string> page = decision::testing::HttpGet(metrics_address, "/metrics");
  if (page.ok()) {
    const double live = MetricSum(*page, kLiveSstMetric);
    if (!std::isnan(live)) {
      s.sst_bytes = live;
      *sst_from_metric = true;
    }
    s.storage_size_bytes = MetricSum(*page, "decision_storage_size_bytes");
    s.samples = MetricSum(*page, "decision_samples");
    s.unloaded = MetricSum(*page, "decision_experts_unloaded");
    s.memtable_bytes =
        MetricWithLabel(*page, "decision_store_memory_bytes", "part", "memtables");
    s.block_cache_bytes =
        MetricWithLabel(*page, "decision_store_memory_bytes", "part", "block_cache");
    s.table_reader_bytes =
        MetricWithLabel(*page, "decision_store_memory_bytes", "part", "table_readers");
    s.heap_in_use = MetricWithLabel(*page, "decision_allocator_bytes", "kind", "in_use");
    s.heap_free = MetricWithLabel(*page, "decision_allocator_bytes", "kind", "free");
    s.experts_active = MetricWithLabel(*page, "decision_experts", "state", "active");
    s.letter_active = MetricWithLabels(*page, "decision_experts",
                                       {{"problem", kLetterId}, {"state", "active"}});
    s.experts_loaded = MetricSum(*page, "decision_experts") -
                       MetricWithLabel(*page, "decision_experts", "state", "failed") -
                       MetricSum(*page, "decision_experts_unloaded");
    s.sst_files = MetricSum(*page, "decision_store_sst_files");
    s.other_fds = s.fds - s.sst_files;  // NaN if either is
    ReadProblemMemory(*page, &s);
  }
  return s;
}

std::string Num(double v) { return std::isnan(v) ? "NaN" : absl::StrFormat("%.0f", v); }
std::string Ms(double v) { return std::isnan(v) ? "NaN" : absl::StrFormat("%.2f", v); }

// Samples every second from t0 and writes timeline.csv, one row per second, two seconds
// late (so that the RPCs of a second have completed).
class Sampler {
 public:
  Sampler(Shared* shared, Clock::time_point t0, std::string data_dir, std::string path)
      : s_(shared), t0_(t0), data_dir_(std::move(data_dir)), path_(std::move(path)) {}

  void Run(int last_second) {
    out_.open(path_);
    bool header = false;
    for (int t = 1; t <= last_second + 2; ++t) {
      std::this_thread::sleep_until(t0_ + std::chrono::seconds(t));
      const auto [pid, metrics] = s_->connection->Process();
      bool from_metric = false;
      ResourceSample r = SampleResources(pid, metrics, data_dir_, &from_metric);
      if (pid == last_pid_ && !std::isnan(r.cpu_s) && !std::isnan(last_cpu_s_)) {
        r.cpu_pct = 100 * (r.cpu_s - last_cpu_s_);
      }
      last_pid_ = pid;
      last_cpu_s_ = r.cpu_s;
      {
        absl::MutexLock lock(&mu_);
        samples_[t] = r;
        injected_[t] =
            s_->windows->Overlaps(t0_ + std::chrono::seconds(t - 1), t0_ + std::chrono::seconds(t));
        incarnation_[t] = s_->connection->Get().incarnation;
        if (from_metric) sst_from_metric_ = true;
      }
      if (!header && t >= 2) {
        WriteHeader();
        header = true;
      }
      if (t >= 3 && t - 2 <= last_second) WriteRow(t - 2);
    }
    out_.close();
  }

  bool sst_from_metric() const {
    absl::MutexLock lock(&mu_);
    return sst_from_metric_;
  }
  // Means over seconds (from, to], ignoring NaN.
  double Mean(int from, int to, double ResourceSample::*field) const {
    absl::MutexLock lock(&mu_);
    double sum = 0;
    int n = 0;
    for (auto it = samples_.upper_bound(from); it != samples_.end() && it->first <= to; ++it) {
      if (!std::isnan(it->second.*field)) sum += it->second.*field, ++n;
    }
    return n > 0 ? sum / n : NAN;
  }
  double Max(double ResourceSample::*field) const {
    absl::MutexLock lock(&mu_);
    double m = NAN;
    for (const auto& [t, s] : samples_) {
      if (!std::isnan(s.*field) && !(s.*field <= m)) m = s.*field;
    }
    return m;
  }
  double At(int t, double ResourceSample::*field) const {
    absl::MutexLock lock(&mu_);
    auto it = samples_.find(t);
    return it == samples_.end() ? NAN : it->second.*field;
  }

 private:
  void WriteHeader() {
    out_ << "# decision_soak timeline: one row per second t of the load; resources sampled at "
            "t, RPC results counted over (t-1, t].\n"
         << "# sst_bytes: "
         << (sst_from_metric()
                 ? absl::StrCat("decisiond's metric ", kLiveSstMetric)
                 : absl::StrCat("sum of the *.sst files in the data dir (decisiond exports no ",
                                kLiveSstMetric,
                                "; files of compacted tables count until "
                                "RocksDB deletes them)"))
         << "; storage_size_bytes: decisiond's decision_storage_size_bytes (SST + memtables); "
            "dir_bytes: every file in the data dir (WAL, logs, manifests too).\n"
         << "# run_CODE: RPCs outside injected windows by gRPC code; inj_CODE: in them; "
            "late_*: deliberately late rewards (FAILED_PRECONDITION expected); cpu_pct: "
            "decisiond's CPU over the second (100 = one core); latency_*: client-side "
            "latency of the Choose and Reward calls that returned OK in the second; experts: "
            "experts the problems' estimators cover; problem_bytes: the memory decisiond "
            "reports its problems keep (decision_problem_memory_bytes, all parts); "
            "unloaded: retired experts whose model decisiond unloaded "
            "(decision_experts_unloaded); memtable_bytes, block_cache_bytes: RocksDB's "
            "memtables and block cache (decision_store_memory_bytes); sst_files: the live SST "
            "files, which RocksDB keeps open (decision_store_sst_files); table_reader_bytes: "
            "RocksDB's index and filter blocks outside the block cache; heap_in_use_bytes, "
            "heap_free_bytes: the allocator's live allocations (everything above included) "
            "and the free chunks it holds (decision_allocator_bytes, every 5 s); "
            "experts_active, experts_loaded: the active experts (decision_experts) and those "
            "whose model is in memory (less the failed ones and decision_experts_unloaded); "
            "letter_active: the active experts of soak-letter, the auto-training problem.\n";
    out_ << "t,incarnation,injected,rss_kb,threads,fds,sst_bytes,storage_size_bytes,dir_bytes,"
            "samples,rpcs,run_errors,inj_errors,late_precondition,late_other,cpu_pct,"
            "latency_p50_ms,latency_p99_ms,experts,problem_bytes,unloaded,memtable_bytes,"
            "block_cache_bytes,sst_files,table_reader_bytes,heap_in_use_bytes,heap_free_bytes,"
            "experts_active,experts_loaded,letter_active";
    for (const char* prefix : {"run_", "inj_"}) {
      for (const char* name : kCodeNames) out_ << "," << prefix << name;
    }
    out_ << "\n";
  }
  void WriteRow(int t) {
    const SecondCounts c = s_->stats->Get(t - 1);  // completions in [t-1, t)
    const auto [p50, p99] = s_->stats->TakeLatencyPercentiles(t - 1);
    ResourceSample r;
    bool injected;
    int incarnation;
    {
      absl::MutexLock lock(&mu_);
      samples_[t].latency_p50_ms = p50;
      samples_[t].latency_p99_ms = p99;
      r = samples_[t];
      injected = injected_[t];
      incarnation = incarnation_[t];
    }
    int64_t rpcs = 0, run_errors = 0, inj_errors = 0;
    for (int k = 0; k < kCodes; ++k) {
      rpcs += c.run[k] + c.inj[k];
      if (k > 0) run_errors += c.run[k], inj_errors += c.inj[k];
    }
    out_ << t << "," << incarnation << "," << (injected ? 1 : 0) << "," << Num(r.rss_kb) << ","
         << Num(r.threads) << "," << Num(r.fds) << "," << Num(r.sst_bytes) << ","
         << Num(r.storage_size_bytes) << "," << Num(r.dir_bytes) << "," << Num(r.samples) << ","
         << rpcs + c.late_precondition + c.late_other << "," << run_errors << "," << inj_errors
         << "," << c.late_precondition << "," << c.late_other << "," << Num(r.cpu_pct) << ","
         << Ms(p50) << "," << Ms(p99) << "," << Num(r.experts) << "," << Num(r.problem_bytes)
         << "," << Num(r.unloaded) << "," << Num(r.memtable_bytes) << ","
         << Num(r.block_cache_bytes) << "," << Num(r.sst_files) << ","
         << Num(r.table_reader_bytes) << "," << Num(r.heap_in_use) << "," << Num(r.heap_free)
         << "," << Num(r.experts_active) << "," << Num(r.experts_loaded) << ","
         << Num(r.letter_active);
    for (int64_t v : c.run) out_ << "," << v;
    for (int64_t v : c.inj) out_ << "," << v;
    out_ << "\n";
    out_.flush();
  }

  Shared* s_;
  const Clock::time_point t0_;
  const std::string data_dir_, path_;
  std::ofstream out_;
  pid_t last_pid_ = -1;
  double last_cpu_s_ = NAN;
  mutable absl::Mutex mu_;
  std::map<int, ResourceSample> samples_ ABSL_GUARDED_BY(mu_);
  std::map<int, bool> injected_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> incarnation_ ABSL_GUARDED_BY(mu_);
  bool sst_from_metric_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------------------
// The durability check: every acknowledged reward is in the exported log, with its value.

struct VerifyResult {
  std::string when;
  int64_t acked_checked = 0, acked_missing = 0, acked_wrong = 0;
  int64_t late_checked = 0, late_missing = 0, late_not_default = 0;
  int64_t logged = 0, duplicates = 0, gaps = 0;
  // Retention and deletion: events before a problem's first kept sample (not expected),
  // events too close to it to tell (not checked), deleted events checked and found by id
  // (an error), redacted samples in the log, and the first sequence kept per problem.
  // Acknowledged events deleted on request while the log was read are not checked.
  int64_t cut = 0, near_cut = 0, deleted_checked = 0, deleted_present = 0, redacted = 0,
          deleted_meanwhile = 0;
  std::vector<int64_t> first_kept;
  std::string export_error;
  std::vector<std::string> examples;
  double seconds = 0;
  bool ok() const {
    return export_error.empty() && acked_missing == 0 && acked_wrong == 0 && late_missing == 0 &&
           late_not_default == 0 && duplicates == 0 && gaps == 0 && deleted_present == 0;
  }
};

// Exports both problems' logs and checks them against what the client was told:
//   - a reward acknowledged OK (first = true, or first = false after a retry of an attempt
//     whose outcome was unknown) is learned: its event is in the log, not as a default
//     reward, with the value sent (every attempt of an event sends the same value; the
//     deliberate second rewards with another value must not have changed it);
//   - a late probe answered FAILED_PRECONDITION expired: its event is in the log with the
//     default reward (the problems do not drop unrewarded decisions);
//   - the log has no event twice and its sequences are r..n-1, r the first sample retention
//     keeps (0 without a cut);
//   - an event deleted on request (DeleteEvents) is not in the log by its id (its sample
//     is there redacted, unless retention cut it).
// Retention: samples are numbered in the order they were joined, so an event acknowledged
// (or refused as late) before the first kept sample was joined is cut and not expected;
// one after it is expected. Events within kCutMarginMs of that time are not checked (the
// client's and decisiond's stamps differ by a call's latency, joins by a few ms of order).
// The snapshot is taken before the export starts, so everything in it was acknowledged
// before the export began.
constexpr int64_t kCutMarginMs = 5000;
VerifyResult Verify(const std::string& when, Shared* s) {
  VerifyResult v;
  v.when = when;
  const auto start = Clock::now();
  const absl::flat_hash_map<std::string, AckedReward> acked = s->ledger->AckedSnapshot();
  const absl::flat_hash_map<std::string, LateProbe> late = s->ledger->LateSnapshot();
  const absl::flat_hash_map<std::string, int> deleted = s->ledger->DeletedSnapshot();
  auto example = [&](const std::string& e) {
    if (v.examples.size() < 10) v.examples.push_back(e);
  };
  std::vector<absl::flat_hash_set<std::string>> seen(s->problems->size());
  // Per problem: the first sample kept, and when it was joined (-1: nothing cut).
  std::vector<int64_t> first_joined_ms(s->problems->size(), -1);
  v.first_kept.assign(s->problems->size(), 0);
  const std::shared_ptr<DecisionClient> client = s->connection->Get().client;
  for (size_t p = 0; p < s->problems->size(); ++p) {
    const std::string& id = (*s->problems)[p].id;
    int64_t next = -1;
    const absl::Status exported = client->ExportLog(id, 0, 0, [&](const v1::LoggedSample& sample) {
      ++v.logged;
      if (next < 0) {  // the first sample kept
        next = sample.sequence();
        v.first_kept[p] = next;
        if (next > 0) first_joined_ms[p] = sample.joined_at_ms();
      }
      if (sample.redacted()) {
        ++v.redacted;
        next = sample.sequence() + 1;
        return absl::OkStatus();
      }
      if (sample.sequence() != next) {
        ++v.gaps;
        example(
            absl::StrCat(id, ": sequence ", sample.sequence(), " where ", next, " was expected"));
      }
      next = sample.sequence() + 1;
      if (!seen[p].insert(sample.event_id()).second) {
        ++v.duplicates;
        example(absl::StrCat(id, ": event ", sample.event_id(), " logged twice"));
      }
      if (auto it = acked.find(sample.event_id()); it != acked.end()) {
        if (sample.default_reward() || sample.reward() != it->second.value) {
          ++v.acked_wrong;
          example(absl::StrFormat("%s: event %s logged with reward %.17g%s, acknowledged %.17g", id,
                                  sample.event_id(), sample.reward(),
                                  sample.default_reward() ? " (default)" : "", it->second.value));
        }
      } else if (deleted.contains(sample.event_id())) {
        ++v.deleted_present;
        example(absl::StrCat(id, ": event ", sample.event_id(),
                             " was deleted on request but is logged by its id"));
      } else if (auto l = late.find(sample.event_id()); l != late.end()) {
        if (!sample.default_reward()) {
          ++v.late_not_default;
          example(absl::StrCat(id, ": late-rewarded event ", sample.event_id(),
                               " was learned, not expired"));
        }
      }
      return absl::OkStatus();
    });
    if (!exported.ok()) {
      v.export_error = absl::StrCat(id, ": ", exported.ToString());
      break;
    }
  }
  // Whether an event of problem p told at `at_ms` is expected: false if retention cut it
  // (or may have: near the cut, not checked).
  const auto expected = [&](int p, int64_t at_ms) {
    if (first_joined_ms[p] < 0) return true;
    if (at_ms < first_joined_ms[p] - kCutMarginMs) {
      ++v.cut;
      return false;
    }
    if (at_ms <= first_joined_ms[p] + kCutMarginMs) {
      ++v.near_cut;
      return false;
    }
    return true;
  };
  for (const auto& [event_id, a] : acked) {
    if (seen[a.problem].contains(event_id)) {
      ++v.acked_checked;
      continue;
    }
    if (!expected(a.problem, a.at_ms)) continue;
    if (s->ledger->DeletionRequested(event_id)) {
      ++v.deleted_meanwhile;  // DeleteEvents ran while the log was read: either is right
      continue;
    }
    ++v.acked_checked;
    ++v.acked_missing;
    example(absl::StrFormat("%s: acknowledged reward of %s (%.17g) missing from the log",
                            (*s->problems)[a.problem].id, event_id, a.value));
  }
  for (const auto& [event_id, l] : late) {
    if (seen[l.problem].contains(event_id)) {
      ++v.late_checked;
      continue;
    }
    if (!expected(l.problem, l.at_ms)) continue;
    ++v.late_checked;
    ++v.late_missing;
    example(absl::StrCat((*s->problems)[l.problem].id, ": expired event ", event_id,
                         " (late reward refused) missing from the log"));
  }
  v.deleted_checked = static_cast<int64_t>(deleted.size());
  v.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return v;
}

std::string Describe(const VerifyResult& v) {
  std::string out = absl::StrFormat(
      "%s: %d acknowledged rewards checked, %d missing, %d with another value or a default "
      "reward; %d late-refused events checked, %d missing, %d learned; log: %d samples "
      "(first kept: %s; %d redacted), %d duplicate events, %d sequence gaps; retention: %d "
      "events cut, %d near the cut not checked; %d events deleted on request, %d of them "
      "logged by their id, %d more deleted while the log was read (not checked); export "
      "%.1f s%s",
      v.when, v.acked_checked, v.acked_missing, v.acked_wrong, v.late_checked, v.late_missing,
      v.late_not_default, v.logged, absl::StrJoin(v.first_kept, ", "), v.redacted,
      v.duplicates, v.gaps, v.cut, v.near_cut, v.deleted_checked, v.deleted_present,
      v.deleted_meanwhile,
      v.seconds, v.export_error.empty() ? "" : absl::StrCat("; export failed: ", v.export_error));
  for (const std::string& e : v.examples) absl::StrAppend(&out, "\n      ", e);
  return out;
}

// ---------------------------------------------------------------------------------------
// The run.

struct Restart {
  std::string kind;     // "SIGTERM" or "SIGKILL"
  double at_s = 0;      // signal, seconds since the load started
  double stop_s = 0;    // signal to exit
  double start_s = 0;   // exec to listening
  int exit_status = 0;  // SIGTERM: decisiond's exit status
  std::string error;    // could not restart
};

class Soak {
 public:
  int Run();

 private:
  absl::Status Setup();
  absl::Status StartServer();
  Restart DoRestart(bool kill, const char* kind);
  void Event(const std::string& what) {
    const double t = std::chrono::duration<double>(Clock::now() - t0_).count();
    events_ << absl::StrFormat("%.2f,%s\n", t, what);
    events_.flush();
    std::printf("[%7.1f s] %s\n", t, what.c_str());
    std::fflush(stdout);
  }
  int WriteSummary();

  std::string out_dir_, data_dir_, log_path_;
  bool temp_data_ = false;
  double duration_s_ = 0;
  double warm_up_s_ = 0;
  std::vector<ProblemSpec> problems_;
  std::unique_ptr<Decisiond> server_;
  Connection connection_;
  InjectionWindows windows_;
  Ledger ledger_;
  Kills kills_;
  ChurnCounts churn_counts_;
  Clock::time_point t0_;
  std::unique_ptr<Stats> stats_;
  std::unique_ptr<Shared> shared_;
  std::unique_ptr<Sampler> sampler_;
  std::ofstream events_;
  std::vector<Restart> restarts_;
  std::vector<VerifyResult> verifications_;
  std::vector<std::string> setup_notes_;
  std::string final_experts_;
};

absl::Status Soak::StartServer() {
  auto d = Decisiond::Start(absl::GetFlag(FLAGS_decisiond), data_dir_, log_path_,
                            absl::GetFlag(FLAGS_decisiond_cpu), absl::GetFlag(FLAGS_seed),
                            absl::GetFlag(FLAGS_decisiond_flags));
  if (!d.ok()) return d.status();
  server_ = *std::move(d);
  connection_.Set(server_->address(), absl::GetFlag(FLAGS_rpc_deadline_ms), server_->pid(),
                  server_->metrics_address());
  return absl::OkStatus();
}

absl::Status Soak::Setup() {
  out_dir_ = absl::GetFlag(FLAGS_out_dir);
  duration_s_ = absl::GetFlag(FLAGS_duration_s);
  warm_up_s_ = absl::GetFlag(FLAGS_warm_up_s);
  if (absl::GetFlag(FLAGS_decisiond).empty() || out_dir_.empty()) {
    return absl::InvalidArgumentError("--decisiond and --out_dir are required");
  }
  if (!(duration_s_ >= 20) || !(absl::GetFlag(FLAGS_rate) > 0) ||
      absl::GetFlag(FLAGS_threads) < 1) {
    return absl::InvalidArgumentError("need --duration_s >= 20, --rate > 0, --threads >= 1");
  }
  if (!(warm_up_s_ == 0 || warm_up_s_ >= 10)) {
    return absl::InvalidArgumentError("need --warm_up_s = 0 or >= 10");
  }
  std::filesystem::create_directories(out_dir_);
  log_path_ = out_dir_ + "/decisiond.log";
  std::filesystem::remove(log_path_);
  data_dir_ = absl::GetFlag(FLAGS_data_dir);
  if (data_dir_.empty()) {
    data_dir_ = decision::testing::MakeTempDir();
    temp_data_ = true;
  } else if (std::filesystem::exists(data_dir_)) {
    return absl::InvalidArgumentError(absl::StrCat("--data_dir ", data_dir_, " already exists"));
  }
  struct Source {
    const char* id;
    std::string path;
    int64_t wait_ms;
    bool click, late, auto_train;
  };
  for (const Source& src :
       {Source{kLetterId, absl::GetFlag(FLAGS_letter_csv), 30'000, true, false, true},
        Source{"soak-satimage", absl::GetFlag(FLAGS_satimage_csv), 10'000, false, true, false}}) {
    absl::StatusOr<Dataset> ds = decision::bench::LoadCsv(src.path);
    if (!ds.ok()) return ds.status();
    ProblemSpec p;
    p.id = src.id;
    p.data = *std::move(ds);
    p.reward_wait_ms = src.wait_ms;
    p.click_reward = src.click;
    p.late_probes = src.late;
    // The letter problem keeps its batch schedule (divergence refreshes) in both modes.
    p.auto_train = src.auto_train && absl::GetFlag(FLAGS_expert_churn);
    if (src.auto_train) p.batch_multiplier = absl::GetFlag(FLAGS_letter_batch_multiplier);
    problems_.push_back(std::move(p));
  }
  events_.open(out_dir_ + "/events.csv");
  events_ << "t,event\n";
  if (absl::Status s = StartServer(); !s.ok()) return s;
  const std::shared_ptr<DecisionClient> client = connection_.Get().client;
  for (const ProblemSpec& p : problems_) {
    v1::ProblemConfig config;
    config.set_num_arms(p.arms());
    config.set_num_features(p.features());
    config.set_reward_wait_ms(p.reward_wait_ms);
    if (p.batch_multiplier > 0) config.set_batch_multiplier(p.batch_multiplier);
    if (p.auto_train) {
      config.mutable_auto_train()->set_enabled(true);
      config.mutable_auto_train()->set_tree_experts(absl::GetFlag(FLAGS_auto_train_trees));
      config.mutable_auto_train()->set_linear_experts(absl::GetFlag(FLAGS_auto_train_linear));
      config.mutable_auto_train()->set_max_active_experts(absl::GetFlag(FLAGS_letter_max_active));
    }
    if (auto r = client->CreateProblem(p.id, config); !r.ok()) return r.status();
    setup_notes_.push_back(absl::StrFormat(
        "%s: %d arms, %d features, %d rows of data, wait %d ms, reward %s%s%s%s", p.id, p.arms(),
        p.features(), p.data.size(), p.reward_wait_ms,
        p.click_reward ? "1 if the arm is the row's label, else 0" : "uniform in [0, 1]",
        p.auto_train ? absl::StrFormat(", auto-training %d tree + %d linear experts per batch"
                                       " (max_active_experts %d)",
                                       absl::GetFlag(FLAGS_auto_train_trees),
                                       absl::GetFlag(FLAGS_auto_train_linear),
                                       absl::GetFlag(FLAGS_letter_max_active))
                     : "",
        p.batch_multiplier > 0
            ? absl::StrFormat(", batch boundaries every %g sqrt(t) samples", p.batch_multiplier)
            : "",
        p.late_probes ? ", late probes" : ""));
  }
  return absl::OkStatus();
}

Restart Soak::DoRestart(bool kill, const char* kind) {
  Restart r;
  r.kind = kind;
  const auto signal_at = Clock::now();
  r.at_s = std::chrono::duration<double>(signal_at - t0_).count();
  windows_.Open(signal_at);
  connection_.MarkDown();
  Event(absl::StrCat(r.kind, " restart"));
  const int incarnation = connection_.Get().incarnation;
  if (kill) {
    kills_.Add(incarnation, signal_at);
    server_->Kill();
  } else {
    r.exit_status = server_->Terminate();
  }
  const auto stopped = Clock::now();
  r.stop_s = std::chrono::duration<double>(stopped - signal_at).count();
  if (absl::Status s = StartServer(); !s.ok()) {
    r.error = s.ToString();
    Event("restart failed: " + r.error);
    return r;
  }
  r.start_s = std::chrono::duration<double>(Clock::now() - stopped).count();
  Event(absl::StrFormat("%s: stopped in %.2f s (exit status %d), listening again %.2f s later",
                        r.kind, r.stop_s, kill ? -9 : r.exit_status, r.start_s));
  std::this_thread::sleep_for(kWindowGrace);
  windows_.Close(Clock::now());
  Event("injected window closed");
  return r;
}

int Soak::Run() {
  if (absl::Status s = Setup(); !s.ok()) {
    std::fprintf(stderr, "decision_soak: %s\n", s.ToString().c_str());
    return 2;
  }
  // The load runs for the warm-up and then the measured run; t counts from its start.
  const double d = duration_s_, warm = warm_up_s_, total = warm + d;
  t0_ = Clock::now() + std::chrono::seconds(1);
  stats_ = std::make_unique<Stats>(t0_);
  shared_ = std::make_unique<Shared>();
  shared_->problems = &problems_;
  shared_->connection = &connection_;
  shared_->windows = &windows_;
  shared_->stats = stats_.get();
  shared_->ledger = &ledger_;
  shared_->kills = &kills_;
  const auto at_s = [&](double s) {
    return t0_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  const auto at = [&](double fraction) { return at_s(warm + fraction * d); };  // measured run
  const auto end = at_s(total);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);

  // One expert of each kind in each problem before the load starts (without churn, the
  // only ones: the load starts once they are active).
  const bool expert_churn = absl::GetFlag(FLAGS_expert_churn);
  Churn churn(shared_.get(), &churn_counts_, seed);
  for (int p = 0; p < 2; ++p) {
    for (int kind = 0; kind < 3; ++kind) churn.Register(p, kind);
  }
  if (!expert_churn) {
    for (int p = 0; p < 2; ++p) {
      if (!churn.WaitActive(p, std::chrono::seconds(60))) {
        std::fprintf(stderr, "decision_soak: %s: experts still backfilling after 60 s\n",
                     problems_[p].id.c_str());
        return 2;
      }
    }
  }

  sampler_ = std::make_unique<Sampler>(shared_.get(), t0_, data_dir_, out_dir_ + "/timeline.csv");
  const int last_second = static_cast<int>(std::ceil(total));
  std::thread sampler([&] { sampler_->Run(last_second); });

  std::vector<std::unique_ptr<LoadWorker>> workers;
  std::vector<std::thread> worker_threads;
  const int threads = absl::GetFlag(FLAGS_threads);
  for (int i = 0; i < threads; ++i) {
    workers.push_back(std::make_unique<LoadWorker>(shared_.get(), i, threads,
                                                   absl::GetFlag(FLAGS_rate), t0_, end, seed));
  }
  for (auto& w : workers) worker_threads.emplace_back([&w] { w->Run(); });

  // The churn schedule, periodic in fractions of the duration: registrations every 1/30
  // (cycling through the problems and the three kinds), TrainExperts every 1/8 (alternating
  // problems), the retention hook every 1/10. Without churn: the hook only. Experts come and
  // go at a steady pool size, so that memory that grows with the experts ever registered
  // shows (the live ones cost memory by design): half-way between two registrations,
  // satimage's pool is retired down to kSatimagePool active experts (the uniform one and
  // the three of the start); letter's auto-training retires its own. The schedule is
  // anchored at the start of the measured run (the k-th action at k periods after it, k >=
  // 1), so that the measured run's is the same with or without a warm-up (its checks after
  // the kill -9 restart fall between two retention hooks); the warm-up gets the same actions
  // at the same pace (k < 0).
  std::vector<std::pair<double, std::function<void()>>> schedule;  // seconds, action
  const auto every = [&](double period, double offset, const std::function<void(int)>& action) {
    const int first = -static_cast<int>(std::floor((warm + offset) / period));
    // Shifted by a multiple of 6, so that k's parity and (k / 2) % 3 stay those of k >= 0.
    const int shift = 6 * ((5 - first) / 6);
    for (int k = first; warm + k * period + offset < total - 1e-9; ++k) {
      const double second = warm + k * period + offset;
      if (k == 0 || second <= 0) continue;
      schedule.emplace_back(second, [action, k, shift] { action(k + shift); });
    }
  };
  constexpr int kSatimagePool = 4;
  if (expert_churn) {
    every(d / 30, 0, [&churn](int i) { churn.Register(i % 2, (i / 2) % 3); });
    every(d / 30, d / 60, [&churn](int) { churn.RetireDownTo(1, kSatimagePool); });
    every(d / 8, 0.02 * d, [&churn](int i) { churn.Train(i % 2); });
  }
  every(d / 10, 0.03 * d, [&churn](int) { churn.Retention(); });
  std::stable_sort(schedule.begin(), schedule.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::thread churner([&] {
    for (auto& [second, action] : schedule) {
      std::this_thread::sleep_until(at_s(second));
      action();
    }
  });

  Event(absl::StrFormat("load started: %.0f decisions/s from %d threads for %.0f s%s",
                        absl::GetFlag(FLAGS_rate), threads, total,
                        warm > 0 ? absl::StrFormat(" (a %.0f s warm-up, then %.0f s measured)",
                                                   warm, d)
                                 : ""));
  if (warm > 0) {
    // The warm-up: the store's tables form at its flushes (the restart flushes every
    // family), and the memtables and block cache fill, before the first window.
    std::this_thread::sleep_until(at_s(warm / 2));
    restarts_.push_back(DoRestart(/*kill=*/false, "SIGTERM (warm-up)"));
    std::this_thread::sleep_until(at_s(warm));
    Event("measured run starts");
  }
  for (int tenth = 1; tenth <= 10; ++tenth) {
    const double fraction = tenth / 10.0;
    if (tenth == 4) {
      std::this_thread::sleep_until(at(0.4));
      restarts_.push_back(DoRestart(/*kill=*/false, "SIGTERM"));
    } else if (tenth == 7) {
      std::this_thread::sleep_until(at(0.7));
      restarts_.push_back(DoRestart(/*kill=*/true, "SIGKILL"));
      if (restarts_.back().error.empty()) {
        Event("checking acknowledged rewards after the kill -9 restart");
        verifications_.push_back(Verify("after the kill -9 restart", shared_.get()));
        Event(verifications_.back().ok() ? "check passed" : "check FAILED");
      }
    }
    std::this_thread::sleep_until(at(fraction));
    Event(absl::StrFormat("%.0f%%: %d decisions, %d rewards acknowledged, %d unexpected",
                          100 * fraction, shared_->decisions.load(), shared_->rewards_acked.load(),
                          ledger_.unexpected()));
  }
  for (std::thread& t : worker_threads) t.join();
  churner.join();
  sampler.join();
  Event("load stopped");

  // The end: a clean restart, then the whole check again.
  {
    Restart r;
    r.kind = "SIGTERM (final)";
    const auto signal_at = Clock::now();
    r.at_s = std::chrono::duration<double>(signal_at - t0_).count();
    connection_.MarkDown();
    r.exit_status = server_->Terminate();
    r.stop_s = std::chrono::duration<double>(Clock::now() - signal_at).count();
    const auto start = Clock::now();
    if (absl::Status s = StartServer(); !s.ok()) {
      r.error = s.ToString();
    } else {
      r.start_s = std::chrono::duration<double>(Clock::now() - start).count();
    }
    Event(
        absl::StrFormat("final SIGTERM: stopped in %.2f s (exit status %d), listening again "
                        "%.2f s later%s",
                        r.stop_s, r.exit_status, r.start_s, r.error.empty() ? "" : " FAILED"));
    restarts_.push_back(r);
  }
  if (restarts_.back().error.empty()) {
    verifications_.push_back(Verify("at the end, after a clean restart", shared_.get()));
    Event(verifications_.back().ok() ? "final check passed" : "final check FAILED");
    const std::shared_ptr<DecisionClient> client = connection_.Get().client;
    for (const ProblemSpec& p : problems_) {
      auto experts = client->ListExperts(p.id);
      auto problem = client->GetProblem(p.id);
      int active = 0, retired = 0, backfilling = 0;
      if (experts.ok()) {
        for (const v1::Expert& e : experts->experts()) {
          active += e.status() == v1::EXPERT_STATUS_ACTIVE;
          retired += e.status() == v1::EXPERT_STATUS_RETIRED;
          backfilling += e.status() == v1::EXPERT_STATUS_BACKFILLING;
        }
      }
      absl::StrAppendFormat(
          &final_experts_,
          "  %s: %d decisions, %d samples, %d pending; %d experts (%d active, "
          "%d retired, %d backfilling)\n",
          p.id, problem.ok() ? problem->decisions() : -1, problem.ok() ? problem->samples() : -1,
          problem.ok() ? problem->pending() : -1, experts.ok() ? experts->experts_size() : -1,
          active, retired, backfilling);
    }
    connection_.MarkDown();
    const int status = server_->Terminate();
    if (status != 0) {
      Restart r;
      r.kind = "SIGTERM (last stop)";
      r.exit_status = status;
      restarts_.push_back(r);
    }
  }
  const int rc = WriteSummary();
  if (temp_data_ && !absl::GetFlag(FLAGS_keep_data)) {
    std::error_code ec;
    std::filesystem::remove_all(data_dir_, ec);
  }
  return rc;
}

int Soak::WriteSummary() {
  const double d = duration_s_;
  // The flatness windows: the brief's "second minute" and "last minute" of a 10-minute run,
  // i.e. tenths of the measured run (after the warm-up, which ends at second m):
  // (m + w, m + 2w] against (m + d - w, m + d].
  const int w = std::max(1, static_cast<int>(std::lround(d / 10)));
  const int m = static_cast<int>(std::lround(warm_up_s_));
  const int e0 = m + w, e1 = m + 2 * w;
  const int last = static_cast<int>(std::ceil(warm_up_s_ + d));
  const double tolerance = absl::GetFlag(FLAGS_flat_tolerance);
  std::string out;
  std::vector<std::pair<std::string, bool>> checks;

  auto flat = [&](const char* name, double ResourceSample::*field, const char* unit, double scale) {
    const double early = sampler_->Mean(e0, e1, field);
    const double late = sampler_->Mean(last - w, last, field);
    const bool ok =
        !std::isnan(early) && !std::isnan(late) && std::abs(late - early) <= tolerance * early;
    checks.emplace_back(
        absl::StrFormat("%s flat: mean over (%d, %d] s %.1f %s, over (%d, %d] s "
                        "%.1f %s (%+.1f%%, tolerance %.0f%%)",
                        name, last - w, last, late / scale, unit, e0, e1, early / scale, unit,
                        100 * (late / early - 1), 100 * tolerance),
        ok);
  };
  flat("RSS", &ResourceSample::rss_kb, "MiB", 1024.0);
  flat("fds", &ResourceSample::fds, "", 1.0);

  const SecondCounts total = stats_->Total();
  int64_t run_errors = 0, inj_errors = 0, rpcs = 0;
  std::string run_codes, inj_codes, ok_line;
  for (int c = 0; c < kCodes; ++c) {
    rpcs += total.run[c] + total.inj[c];
    if (c == 0) continue;
    run_errors += total.run[c];
    inj_errors += total.inj[c];
    if (total.run[c] > 0) absl::StrAppendFormat(&run_codes, " %s %d", kCodeNames[c], total.run[c]);
    if (total.inj[c] > 0) absl::StrAppendFormat(&inj_codes, " %s %d", kCodeNames[c], total.inj[c]);
  }
  checks.emplace_back(
      absl::StrFormat("no error outside the injected windows: %d (%s); %d API-contract "
                      "violations or unexpected failures",
                      run_errors, run_codes.empty() ? "none" : run_codes.substr(1),
                      ledger_.unexpected()),
      run_errors == 0 && ledger_.unexpected() == 0);
  for (const VerifyResult& v : verifications_) {
    checks.emplace_back(absl::StrCat("every acknowledged reward present ", Describe(v)), v.ok());
  }
  if (verifications_.size() < 2) {
    checks.emplace_back("every acknowledged reward present: a check did not run (restart failed)",
                        false);
  }
  for (const Restart& r : restarts_) {
    if (!r.error.empty()) {
      checks.emplace_back(absl::StrCat(r.kind, " restart failed: ", r.error), false);
    } else if (r.kind != "SIGKILL") {
      checks.emplace_back(
          absl::StrFormat("%s: decisiond exited with status %d", r.kind, r.exit_status),
          r.exit_status == 0);
    }
  }

  bool all = true;
  absl::StrAppend(&out, "decision_soak summary\n\nchecks:\n");
  for (const auto& [text, ok] : checks) {
    absl::StrAppend(&out, ok ? "  PASS  " : "  FAIL  ", text, "\n");
    all = all && ok;
  }
  absl::StrAppendFormat(
      &out,
      "  retention: max_samples %d set on %d problems at the first of %d retention rounds; "
      "DeleteEvents: %d calls, %d events deleted, %d not found (already cut)\n",
      absl::GetFlag(FLAGS_retention_samples), churn_counts_.retention_set.load(),
      churn_counts_.retention_calls.load(), churn_counts_.delete_calls.load(),
      churn_counts_.deleted.load(), churn_counts_.delete_not_found.load());
  const bool expert_churn = absl::GetFlag(FLAGS_expert_churn);
  absl::StrAppend(&out, "\nresult: ", all ? "PASS" : "FAIL",
                  expert_churn ? " (expert churn)" : " (fixed experts, --expert_churn=false)",
                  "\n\nrun:\n");
  absl::StrAppend(
      &out,
      expert_churn
          ? "  mode: expert churn (--expert_churn=true): registrations, retirements and "
            "TrainExperts during the run, auto-training in soak-letter\n"
          : "  mode: fixed experts (--expert_churn=false): one expert of each kind per problem "
            "registered before the load, active before it started; no registration, "
            "retirement, TrainExperts or auto-training after that\n");
  absl::StrAppendFormat(&out,
                        "  %.0f s of load%s at %.0f decisions/s from %d threads (rpc deadline "
                        "%d ms, no client retries), decisiond %s%s%s\n",
                        d,
                        m > 0 ? absl::StrFormat(" after a %d s warm-up on the fresh store (the "
                                                "same load, a SIGTERM restart half-way)", m)
                              : " from a fresh store",
                        absl::GetFlag(FLAGS_rate), absl::GetFlag(FLAGS_threads),
                        absl::GetFlag(FLAGS_rpc_deadline_ms), absl::GetFlag(FLAGS_decisiond),
                        absl::GetFlag(FLAGS_decisiond_cpu) >= 0
                            ? absl::StrCat(" pinned to CPU ", absl::GetFlag(FLAGS_decisiond_cpu))
                            : "",
                        absl::GetFlag(FLAGS_decisiond_flags).empty()
                            ? ""
                            : " " + absl::GetFlag(FLAGS_decisiond_flags));
  for (const std::string& n : setup_notes_) absl::StrAppend(&out, "  ", n, "\n");
  absl::StrAppendFormat(
      &out,
      "  rewards: %.0f%% of decisions unrewarded (expire), the rest after U(0, %d) ms; %.0f%% of "
      "satimage decisions rewarded 2 s after their wait time; %.0f%% of acknowledged rewards "
      "sent again with another value\n",
      100 * absl::GetFlag(FLAGS_unrewarded_share), absl::GetFlag(FLAGS_reward_delay_max_ms),
      100 * absl::GetFlag(FLAGS_late_share), 100 * absl::GetFlag(FLAGS_duplicate_share));
  absl::StrAppendFormat(&out,
                        "  decisions answered %d, rewards acknowledged %d; decision slots "
                        "skipped by a thread over 1 s behind its pace: %d outside injected "
                        "windows, %d in them\n",
                        shared_->decisions.load(), shared_->rewards_acked.load(),
                        shared_->skipped_run.load(), shared_->skipped_inj.load());
  absl::StrAppendFormat(&out,
                        "  experts registered %d (tables, linear softmax, small XGBoost), "
                        "retired %d, TrainExperts calls %d\n",
                        churn_counts_.registered.load(), churn_counts_.retired.load(),
                        churn_counts_.trainings.load());
  absl::StrAppend(&out, final_experts_);
  for (const Restart& r : restarts_) {
    absl::StrAppendFormat(&out, "  %s at %.1f s: stopped in %.2f s, listening again %.2f s later",
                          r.kind, r.at_s, r.stop_s, r.start_s);
    if (r.at_s < warm_up_s_ + d) {
      // RSS shortly before the signal against RSS after the restart (which rebuilds the
      // state from the store): a drop beyond the caches hints at memory the process leaked.
      const int signal = static_cast<int>(r.at_s);
      const int ready = static_cast<int>(std::ceil(r.at_s + r.stop_s + r.start_s));
      const int half = std::max(1, w / 2);
      absl::StrAppendFormat(
          &out, "; RSS mean over (%d, %d] s %.1f MiB, over (%d, %d] s %.1f MiB", signal - half,
          signal, sampler_->Mean(signal - half, signal, &ResourceSample::rss_kb) / 1024,
          ready + half, ready + 2 * half,
          sampler_->Mean(ready + half, ready + 2 * half, &ResourceSample::rss_kb) / 1024);
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppendFormat(&out,
                        "  decisions forgotten by the kill (answered < 1 s before it, reward "
                        "NOT_FOUND; documented): %d\n",
                        ledger_.forgotten());
  absl::StrAppendFormat(&out, "\nRPC results (%d in all):\n  outside injected windows: OK %d%s\n",
                        rpcs, total.run[0], run_codes.empty() ? ", no error" : run_codes);
  absl::StrAppendFormat(&out, "  in injected windows: OK %d%s\n", total.inj[0],
                        inj_codes.empty() ? ", no error" : inj_codes);
  absl::StrAppendFormat(&out,
                        "  late probes: FAILED_PRECONDITION %d (expected), anything else %d\n",
                        total.late_precondition, total.late_other);
  for (const std::string& e : ledger_.examples()) absl::StrAppend(&out, "    ", e, "\n");

  auto mib = [](double kb) { return kb / 1024.0; };
  absl::StrAppendFormat(&out,
                        "\nresources (windows: tenths of the measured run, %d s each; t counts "
                        "from the start of the load%s):\n",
                        w, m > 0 ? absl::StrFormat(", the warm-up's %d s included", m) : "");
  absl::StrAppendFormat(&out,
                        "  RSS mean (%d, %d] s: %.1f MiB; (%d, %d] s: %.1f MiB; max %.1f MiB\n", e0,
                        e1, mib(sampler_->Mean(e0, e1, &ResourceSample::rss_kb)), last - w,
                        last, mib(sampler_->Mean(last - w, last, &ResourceSample::rss_kb)),
                        mib(sampler_->Max(&ResourceSample::rss_kb)));
  auto early = [&](double ResourceSample::*field) { return sampler_->Mean(e0, e1, field); };
  auto late = [&](double ResourceSample::*field) { return sampler_->Mean(last - w, last, field); };
  const double rss_growth_mib =
      (late(&ResourceSample::rss_kb) - early(&ResourceSample::rss_kb)) / 1024;
  const double log_growth_mib =
      (late(&ResourceSample::problem_bytes) - early(&ResourceSample::problem_bytes)) / (1 << 20);
  const double memtable_growth_mib =
      (late(&ResourceSample::memtable_bytes) - early(&ResourceSample::memtable_bytes)) /
      (1 << 20);
  const double block_cache_growth_mib =
      (late(&ResourceSample::block_cache_bytes) - early(&ResourceSample::block_cache_bytes)) /
      (1 << 20);
  const double rest_mib =
      rss_growth_mib - log_growth_mib - memtable_growth_mib - block_cache_growth_mib;
  const double experts_added = late(&ResourceSample::experts) - early(&ResourceSample::experts);
  absl::StrAppendFormat(
      &out,
      "  between the two windows: joined samples %.0f -> %.0f, experts estimated %.0f -> "
      "%.0f (models unloaded %.0f -> %.0f); RSS %+.1f MiB, of which what decisiond reports its problems keep "
      "(decision_problem_memory_bytes: samples in memory, estimators) %+.1f MiB, RocksDB's "
      "memtables %+.1f MiB and block cache %+.1f MiB, the rest "
      "(models, allocator, anything leaked) %+.1f MiB%s\n",
      early(&ResourceSample::samples), late(&ResourceSample::samples),
      early(&ResourceSample::experts), late(&ResourceSample::experts),
      early(&ResourceSample::unloaded), late(&ResourceSample::unloaded), rss_growth_mib,
      log_growth_mib, memtable_growth_mib, block_cache_growth_mib, rest_mib,
      experts_added >= 1 ? absl::StrFormat(" (%.2f MiB per expert added)", rest_mib / experts_added)
                         : "");
  // The rest, split by the allocator's own figures: live allocations outside the parts
  // above (models, predictions, scratch, table readers, ...), and RSS outside the live
  // heap (free memory the allocator holds, code, stacks).
  const auto growth_mib = [&](double ResourceSample::*field) {
    return (late(field) - early(field)) / (1 << 20);
  };
  const double in_use_growth = growth_mib(&ResourceSample::heap_in_use);
  if (!std::isnan(in_use_growth)) {
    const double other_in_use = in_use_growth - log_growth_mib - memtable_growth_mib -
                                block_cache_growth_mib -
                                growth_mib(&ResourceSample::table_reader_bytes);
    absl::StrAppendFormat(
        &out,
        "  the allocator's heap (decision_allocator_bytes): in use %.1f -> %.1f MiB (%+.1f), "
        "of which the table readers %+.1f MiB and the live allocations outside every part "
        "above %+.1f MiB; free chunks it holds %.1f -> %.1f MiB; RSS outside the heap in "
        "use %+.1f MiB\n",
        early(&ResourceSample::heap_in_use) / (1 << 20),
        late(&ResourceSample::heap_in_use) / (1 << 20), in_use_growth,
        growth_mib(&ResourceSample::table_reader_bytes), other_in_use,
        early(&ResourceSample::heap_free) / (1 << 20),
        late(&ResourceSample::heap_free) / (1 << 20), rss_growth_mib - in_use_growth);
  }
  if (!std::isnan(early(&ResourceSample::experts_loaded))) {
    absl::StrAppendFormat(&out,
                          "  experts (means over the windows): active %.1f -> %.1f (%s's %.1f -> "
                          "%.1f), models in memory %.1f -> %.1f\n",
                          early(&ResourceSample::experts_active),
                          late(&ResourceSample::experts_active), kLetterId,
                          early(&ResourceSample::letter_active),
                          late(&ResourceSample::letter_active),
                          early(&ResourceSample::experts_loaded),
                          late(&ResourceSample::experts_loaded));
  }
  absl::StrAppendFormat(
      &out,
      "  decisiond CPU (100%% = one core) mean %.0f%% then %.0f%%; load RPC "
      "latency, mean of the per-second p50 / p99: %.2f / %.1f ms then %.2f / "
      "%.1f ms\n",
      early(&ResourceSample::cpu_pct), late(&ResourceSample::cpu_pct),
      early(&ResourceSample::latency_p50_ms), early(&ResourceSample::latency_p99_ms),
      late(&ResourceSample::latency_p50_ms), late(&ResourceSample::latency_p99_ms));
  absl::StrAppendFormat(&out,
                        "  fds mean (%d, %d] s: %.1f; (%d, %d] s: %.1f; max %.0f; of them live SST "
                        "files (decision_store_sst_files) %.1f then %.1f, the others %.1f then "
                        "%.1f\n",
                        e0, e1, sampler_->Mean(e0, e1, &ResourceSample::fds), last - w, last,
                        sampler_->Mean(last - w, last, &ResourceSample::fds),
                        sampler_->Max(&ResourceSample::fds),
                        sampler_->Mean(e0, e1, &ResourceSample::sst_files),
                        sampler_->Mean(last - w, last, &ResourceSample::sst_files),
                        sampler_->Mean(e0, e1, &ResourceSample::other_fds),
                        sampler_->Mean(last - w, last, &ResourceSample::other_fds));
  if (m >= 2 * w) {
    absl::StrAppendFormat(
        &out,
        "  (not a check) the fresh store's (%d, %d] s, in the warm-up: RSS %.1f MiB, fds %.1f "
        "(live SST files %.1f)\n",
        w, 2 * w, mib(sampler_->Mean(w, 2 * w, &ResourceSample::rss_kb)),
        sampler_->Mean(w, 2 * w, &ResourceSample::fds),
        sampler_->Mean(w, 2 * w, &ResourceSample::sst_files));
  }
  absl::StrAppendFormat(&out, "  threads mean (%d, %d] s: %.1f; (%d, %d] s: %.1f; max %.0f\n", e0,
                        e1, sampler_->Mean(e0, e1, &ResourceSample::threads), last - w, last,
                        sampler_->Mean(last - w, last, &ResourceSample::threads),
                        sampler_->Max(&ResourceSample::threads));
  absl::StrAppendFormat(
      &out, "  SST bytes (%s) at %d s: %.1f MiB, at %d s: %.1f MiB, max %.1f MiB\n",
      sampler_->sst_from_metric() ? kLiveSstMetric : "sum of *.sst files; no live-SST metric",
      e1, sampler_->At(e1, &ResourceSample::sst_bytes) / (1 << 20), last,
      sampler_->At(last, &ResourceSample::sst_bytes) / (1 << 20),
      sampler_->Max(&ResourceSample::sst_bytes) / (1 << 20));
  absl::StrAppendFormat(&out, "  data dir at %d s: %.1f MiB (SST, WAL, manifests, logs)\n", last,
                        sampler_->At(last, &ResourceSample::dir_bytes) / (1 << 20));

  std::ofstream(out_dir_ + "/summary.txt") << out;
  std::printf("\n%s", out.c_str());
  return all ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "decision_soak --decisiond=PATH --out_dir=DIR [--duration_s=600]: a bounded soak run of "
      "decisiond (see bench/README.md, Soak)");
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  Soak soak;
  return soak.Run();
}
