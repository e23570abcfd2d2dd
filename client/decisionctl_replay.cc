// decisionctl replay: an ad server over a labelled data set (decisionctl.cc lists the
// command's flags).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/decision_client.h"
#include "client/decisionctl.h"

ABSL_FLAG(std::string, data, "", "replay: labelled CSV");
ABSL_FLAG(std::string, order, "", "replay: row order file (default: file order)");
ABSL_FLAG(int64_t, rounds, 0, "replay: stop after N rounds (0: all)");
ABSL_FLAG(std::string, curve_csv, "", "replay: write the progressive loss per round");
ABSL_FLAG(bool, keep_schedule, false,
          "replay: at each batch boundary, wait until its divergence refresh and training jobs "
          "are done and the new experts are backfilled before the next round (the paper's "
          "batched schedule, as if training kept up with the traffic)");
ABSL_FLAG(bool, learn_each_round, false,
          "replay --keep_schedule: also wait after every reward until decisiond has learned it, "
          "so that each Choose sees every earlier reward (as bench/regret does); without it, "
          "learning trails the requests as it does under real traffic, and the replay waits "
          "only at the batch boundaries");

namespace decision::ctl {
namespace {

using client::DecisionClient;

// After a reward (--keep_schedule): waits until every acknowledged reward is learned, and
// if a batch boundary is due, until the boundary's refresh and training jobs are done and
// no expert is backfilling. *next_job is the first job id not seen finished (job ids are
// dense per problem). *problem_out: the problem after the boundary's refresh (its
// next_batch_at is the next boundary).
absl::Status KeepSchedule(DecisionClient& c, const std::string& problem, int64_t* next_job,
                          v1::Problem* problem_out) {
  // Polls back off from 1 ms to 16 ms: a boundary's training takes up to seconds, and
  // polls every 2 ms cost the server (which shares its core with training in the
  // benchmarks) several percent of its CPU.
  int pause_ms = 1;
  const auto pause = [&pause_ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    pause_ms = std::min(pause_ms * 2, 16);
  };
  absl::StatusOr<v1::Problem> p = c.GetProblem(problem);  // waits for learning
  if (p.ok()) *problem_out = *p;
  if (!p.ok() || p->samples() < p->next_batch_at()) return p.status();
  while (p.ok() && p->samples() >= p->next_batch_at()) {
    pause();
    p = c.GetProblem(problem);
  }
  if (!p.ok()) return p.status();
  *problem_out = *p;
  // With auto-training the boundary's job is queued just after the refresh: wait for it
  // to appear (bounded, in case queueing it failed), then for every job to finish.
  const bool auto_train = p->config().auto_train().enabled();
  const auto appear_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool seen_new = false;
  for (;;) {
    absl::StatusOr<v1::TrainingJob> job = c.GetTrainingJob(problem, *next_job);
    if (absl::IsNotFound(job.status())) {
      if (!auto_train || seen_new || std::chrono::steady_clock::now() > appear_by) break;
      pause();
      continue;
    }
    seen_new = true;
    if (!job.ok()) return job.status();
    if (job->state() == v1::TRAINING_JOB_STATE_SUCCEEDED ||
        job->state() == v1::TRAINING_JOB_STATE_FAILED) {
      ++*next_job;
    } else {
      pause();
    }
  }
  for (;;) {
    absl::StatusOr<v1::ListExpertsResponse> experts = c.ListExperts(problem);
    if (!experts.ok()) return experts.status();
    bool backfilling = false;
    for (const v1::Expert& e : experts->experts()) {
      backfilling |= e.status() == v1::EXPERT_STATUS_BACKFILLING;
    }
    if (!backfilling) return absl::OkStatus();
    pause();
  }
}

}  // namespace

int Replay(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("replay needs PROBLEM");
  const std::string data = absl::GetFlag(FLAGS_data);
  if (data.empty()) return Usage("replay needs --data=CSV (features, then the label)");
  if (absl::GetFlag(FLAGS_learn_each_round) && !absl::GetFlag(FLAGS_keep_schedule)) {
    return Usage("--learn_each_round needs --keep_schedule");
  }
  // Every row is checked against the problem before the first Choose: a bad one found
  // part-way would leave the rounds before it rewarded, which cannot be undone.
  absl::StatusOr<v1::Problem> problem = c.GetProblem(args[0]);
  if (!problem.ok()) return Fail(problem.status());
  const int arms = problem->config().num_arms();
  const size_t num_features = static_cast<size_t>(problem->config().num_features());
  auto rows = ReadFile(data);
  if (!rows.ok()) return Fail(rows.status());
  std::vector<std::vector<double>> features;
  std::vector<int> labels;
  bool first_line = true;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*rows, '\n')) {
    ++line_number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const auto bad = [&](absl::string_view why) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat(data, ": line ", line_number, ": ", why, ": ", line.substr(0, 80))));
    };
    auto values = ParseNumbers(line);
    if (first_line) {
      first_line = false;
      // The header (column names); a first line of numbers is a row without one.
      if (!values.ok()) continue;
      return bad("the first line is numbers; the CSV needs a header line");
    }
    if (!values.ok()) return bad(values.status().message());
    if (values->size() != num_features + 1) {
      return bad(absl::StrCat(values->size(), " columns; problem ", args[0], " has ",
                              num_features, " features, then the label"));
    }
    const double label = values->back();
    if (!(label >= 0 && label < arms && label == std::floor(label))) {
      return bad(absl::StrCat("label ", label, " is not an arm of problem ", args[0], " (0 to ",
                              arms - 1, ")"));
    }
    labels.push_back(static_cast<int>(label));
    values->pop_back();
    features.push_back(*std::move(values));
  }
  if (labels.empty()) return Fail(absl::InvalidArgumentError(data + ": no data rows"));
  std::vector<int> order;
  if (const std::string f = absl::GetFlag(FLAGS_order); !f.empty()) {
    auto text = ReadFile(f);
    if (!text.ok()) return Fail(text.status());
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipWhitespace())) {
      int i;
      if (!absl::SimpleAtoi(line, &i) || i < 0 || i >= static_cast<int>(labels.size())) {
        return Fail(absl::InvalidArgumentError(absl::StrCat("bad order line: ", line)));
      }
      order.push_back(i);
    }
  } else {
    for (size_t i = 0; i < labels.size(); ++i) order.push_back(static_cast<int>(i));
  }
  if (order.empty()) {
    return Fail(absl::InvalidArgumentError(absl::GetFlag(FLAGS_order) + ": no rows"));
  }
  int64_t rounds = static_cast<int64_t>(order.size());
  if (absl::GetFlag(FLAGS_rounds) > 0) rounds = std::min(rounds, absl::GetFlag(FLAGS_rounds));
  std::ofstream curve;
  const std::string curve_path = absl::GetFlag(FLAGS_curve_csv);
  if (!curve_path.empty()) {
    curve.open(curve_path);
    curve << "round,progressive_loss\n";
    if (!curve) return Fail(absl::InvalidArgumentError("cannot write " + curve_path));
  }
  double total = 0.0;
  const bool tty = isatty(fileno(stderr));
  const bool keep_schedule = absl::GetFlag(FLAGS_keep_schedule);
  const bool learn_each_round = absl::GetFlag(FLAGS_learn_each_round);
  int64_t next_job = 1;
  // --keep_schedule: the problem's joined samples before this replay's rounds (others may
  // reward it too), and the next boundary; the replay's round t reaches it once
  // samples_before + t >= boundary_at, and the boundary then resynchronises both.
  int64_t samples_before = 0;
  int64_t boundary_at = 0;
  if (keep_schedule) {
    samples_before = problem->samples();
    boundary_at = problem->next_batch_at();
  }
  for (int64_t t = 1; t <= rounds; ++t) {
    const int row = order[t - 1];
    auto d = c.Choose(args[0], features[row]);
    if (!d.ok()) return Fail(d.status());
    const double reward = d->arm() == labels[row] ? 1.0 : 0.0;
    auto first = c.Reward(args[0], d->event_id(), reward);
    if (!first.ok()) return Fail(first.status());
    if (keep_schedule && (learn_each_round || samples_before + t >= boundary_at)) {
      v1::Problem p;
      if (absl::Status s = KeepSchedule(c, args[0], &next_job, &p); !s.ok()) return Fail(s);
      samples_before = p.samples() - t;
      boundary_at = p.next_batch_at();
    }
    total += reward;
    const double loss = 1.0 - total / t;
    if (curve.is_open()) curve << t << "," << loss << "\n";
    if (tty && (t % 50 == 0 || t == rounds)) {
      const int width = 40;
      const int filled = static_cast<int>(width * t / rounds);
      std::fprintf(stderr, "\r[%s%s] %lld/%lld  progressive loss %.4f",
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                   static_cast<long long>(t), static_cast<long long>(rounds), loss);
    }
    if (t % 1000 == 0 || t == rounds) {
      if (tty) std::fprintf(stderr, "\n");
      std::printf("round %lld progressive loss %.4f\n", static_cast<long long>(t), loss);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace decision::ctl
