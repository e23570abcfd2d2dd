// decisionctl: the command-line client of the decision service.
//
//   decisionctl [--server=HOST:PORT] COMMAND [ARGS] [--flags]
//
// Commands: kCommands below, which --help prints.
//
// Security: the bearer token comes from the file --token_file or the environment variable
// DECISION_TOKEN (never from a flag value, which other users could read in the process
// list). --tls (with --tls_ca, --tls_cert/--tls_key for mutual TLS, --tls_server_name)
// connects over TLS.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <optional>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/decision_client.h"
#include "client/decisionctl.h"

// The commands and their arguments, for --help.
constexpr char kCommands[] = R"(commands:
   create-problem ID --arms=K --features=D [--estimator=median_of_means|clipped]
                  [--wait_ms=MS] [--default_reward=R] [--drop_unrewarded]
                  [--scoring_budget_us=US] [--divergence_refresh_turnover=F]
                  [--retention_max_samples=N] [--retention_max_age_ms=MS] [--auto_promote]
                  [--slate_learning=every_slot|first_slot] [--c2=X] [--c3=X] [--big_c=X]
                  [--auto_train [--training_sample=whole_log|bootstrap]
                                [--training_objective=likelihood|importance_weighted]]
   set-retention PROBLEM [--retention_max_samples=N] [--retention_max_age_ms=MS]
       what the store keeps of the problem's history (0: no limit; both 0: keep all)
   delete-events PROBLEM EVENT_ID...
       deletes these events' records and their samples' contexts (data protection)
   list-problems
   register-expert PROBLEM --name=NAME (--xgboost=FILE | --linear=FILE | --table=FILE
                  | --uniform) [--smoothing=ETA]
       --linear: one line per arm: "bias w_1 ... w_D" (spaces or commas)
       --table:  one line per row: K probabilities; --key_feature picks the row
       --xgboost: a multi:softprob model saved by XGBoost (JSON or UBJSON)
   list-experts PROBLEM
   retire-expert PROBLEM EXPERT_ID
   estimates PROBLEM
   choose PROBLEM --x=x1,x2,... [--event_id=ID] [--eligible=a1,a2,...] [--deferred]
   choose-slate PROBLEM --x=x1,x2,... --slots=N [--event_id=ID] [--eligible=...] [--deferred]
       one arm per slot, none twice; reward slot s as EVENT_ID/s
   promote PROBLEM EXPERT_ID         a shadow expert becomes selectable
   demote PROBLEM EXPERT_ID          back to shadow mode: estimated, never selected
   evaluate PROBLEM --xgboost=F|--linear=F|--table=F [--clip=100]
       off-policy estimates of a model over the retained log, without registering it
   explain PROBLEM EVENT_ID          why the decision was made
   activate PROBLEM EVENT_ID         a decision chosen with --deferred was shown
   reward PROBLEM EVENT_ID VALUE
   export PROBLEM [--format=csv|jsonl|dsjson] [--output=FILE] [--start=N] [--limit=N]
   train PROBLEM [--tree_experts=3] [--linear_experts=1] [--wait]
       queues a training job of experts from the problem's log on the server (they then
       backfill and become selectable like registered ones) and prints its job id;
       --wait polls the job until it ends, prints it, and exits 0 if it SUCCEEDED
   job PROBLEM JOB_ID
       a training job: its state, requested counts, the experts it registered, why it failed
   jobs PROBLEM
       every training job of the problem (TrainExperts and auto-training), oldest first
   audit [--start=N] [--limit=N]
       the audit log of administrative calls (needs an admin token)
   health
       grpc.health.v1.Health/Check of the server (open to every caller, for probes);
       exits 0 if SERVING
   hash-token
       reads a token on stdin and prints the line fragment "sha256:HEX" for decisiond's
       --tokens_file (the token itself is never stored)
   move-problem PROBLEM --to=HOST:PORT --to_replica=NAME [--place_cmd=CMD] [--page_bytes=N]
       moves a problem with everything it learned from --server (its owner) to another
       replica (docs/SCALING.md, "Moving a problem"): copies its records at a snapshot
       while it serves, fences it on the source (its calls answer UNAVAILABLE, which
       clients retry), copies what changed since, loads it on the target, checks the
       estimates match, runs CMD to switch the placement (with DECISION_PROBLEM and
       DECISION_REPLICA set; for example deploy/haproxy/place.sh), then records the move
       on the source and deletes its copy. A failure before the switch aborts the move
       (the source serves again); a failed CMD leaves the source fenced, for end-move.
       Without --place_cmd it stops before the switch: switch, then run end-move.
   end-move PROBLEM [--abort | --to_replica=NAME]
       on --server (the source): the move's last step, or --abort to serve it there again;
       with --to_replica, for a copy a restart left behind after the switch (the source
       restarted before its end-move): fences it and leaves the stub naming NAME, only
       where the replica's placement map places PROBLEM on NAME
   replay PROBLEM --data=CSV [--order=FILE] [--rounds=N] [--curve_csv=FILE] [--keep_schedule
          [--learn_each_round]]
       acts as an ad server over a labelled CSV (last column `label`): for each row,
       Choose with its features, reward 1 if the arm equals the label; prints the
       progressive loss as it goes.
)";

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "decisiond address");
ABSL_FLAG(int64_t, deadline_ms, 5000, "deadline of each RPC attempt");
ABSL_FLAG(int, arms, 0, "create-problem: number of arms");
ABSL_FLAG(int, features, 0, "create-problem: number of features");
ABSL_FLAG(std::string, estimator, "median_of_means", "create-problem: median_of_means or clipped");
ABSL_FLAG(int64_t, wait_ms, 0, "create-problem: reward wait time (0: server default 60000)");
ABSL_FLAG(double, default_reward, 0.0, "create-problem: reward of decisions never rewarded");
ABSL_FLAG(bool, drop_unrewarded, false, "create-problem: drop instead of default reward");
ABSL_FLAG(bool, auto_promote, false,
          "create-problem: promote a shadow expert once its lower bound passes the best "
          "selectable estimate");
ABSL_FLAG(std::string, training_sample, "whole_log",
          "create-problem: what each trained expert learns from: whole_log or bootstrap (a "
          "resample per expert, the paper's recipe)");
ABSL_FLAG(std::string, training_objective, "likelihood",
          "create-problem: what each trained expert is fitted to: likelihood (of every "
          "logged reward) or importance_weighted (the paper's: the rewarded arms as labels, "
          "weight reward / propensity)");
ABSL_FLAG(double, c2, 0.0,
          "create-problem: median-of-means group constant c2 (0: the server's default, 4)");
ABSL_FLAG(double, c3, 0.0,
          "create-problem: median-of-means width constant c3 (0: the server's default)");
ABSL_FLAG(double, big_c, 0.0,
          "create-problem: clipped estimator's constant C (0: the server's default, 1)");
ABSL_FLAG(std::string, slate_learning, "every_slot",
          "create-problem: which slots of a slate are learned: every_slot or first_slot");
ABSL_FLAG(int, slots, 0, "choose-slate: number of slots");
ABSL_FLAG(bool, auto_train, false,
          "create-problem: train experts from the log at every batch boundary");
ABSL_FLAG(int, tree_experts, 0,
          "train, create-problem: tree experts per batch (both counts 0: 3 trees and 1 "
          "linear; otherwise exactly these, e.g. --tree_experts=3 --linear_experts=0)");
ABSL_FLAG(int, linear_experts, 0,
          "train, create-problem: linear experts per batch (see --tree_experts)");
ABSL_FLAG(double, scoring_budget_us, 0.0,
          "create-problem: microseconds of CPU per decision the problem's experts may cost to "
          "score (0: no budget)");
ABSL_FLAG(double, divergence_refresh_turnover, -1.0,
          "create-problem: fraction of the divergence reservoir replaced that makes a batch "
          "boundary re-estimate the divergences of the experts already estimated (0: every "
          "boundary; negative: the server default, 0.5)");
ABSL_FLAG(int64_t, retention_max_samples, 0,
          "create-problem, set-retention: the most joined samples the store keeps (0: all)");
ABSL_FLAG(int64_t, retention_max_age_ms, 0,
          "create-problem, set-retention: the oldest sample or event kept, in ms (0: any)");
ABSL_FLAG(bool, wait, false, "train: poll the job until it ends; exit 0 if it SUCCEEDED");
ABSL_FLAG(std::string, name, "", "register-expert: expert name");
ABSL_FLAG(std::string, xgboost, "", "register-expert: XGBoost model file");
ABSL_FLAG(std::string, linear, "", "register-expert: linear softmax weights file");
ABSL_FLAG(std::string, table, "", "register-expert: probability table file");
ABSL_FLAG(bool, uniform, false, "register-expert: the uniform expert");
ABSL_FLAG(int, key_feature, 0, "register-expert --table: feature selecting the row");
ABSL_FLAG(double, temperature, 1.0, "register-expert --linear: softmax temperature");
ABSL_FLAG(double, smoothing, -1.0, "register-expert: smoothing eta (default: the problem's)");
ABSL_FLAG(std::string, event_id, "", "choose: caller event id (default: generated)");
ABSL_FLAG(std::string, format, "csv",
          "export: csv, jsonl or dsjson (Vowpal Wabbit's decision-service JSON)");
ABSL_FLAG(std::string, output, "", "export: output file (default: stdout)");
ABSL_FLAG(int64_t, start, 0, "export: first sample");
ABSL_FLAG(int64_t, limit, 0, "export: number of samples (0: all)");
ABSL_FLAG(int, max_attempts, 4,
          "attempts of a call the client retries when UNAVAILABLE (backoff from 50 ms, "
          "doubled each time; for example while a problem moves)");
// The flag is named --features for create-problem; choose takes --x.
ABSL_FLAG(std::string, x, "", "choose: comma-separated feature values");
ABSL_FLAG(bool, shadow, false,
          "register-expert: in shadow mode (estimated, never selected until `promote`)");
ABSL_FLAG(double, clip, 0.0, "evaluate: the weight clipped_ips clips at (0: 100)");
ABSL_FLAG(bool, deferred, false,
          "choose, choose-slate: the decision may not be shown; only `activate` makes it "
          "learnable");
ABSL_FLAG(std::string, eligible, "",
          "choose, choose-slate: comma-separated arm ids eligible for this request (default: "
          "every arm)");
ABSL_FLAG(std::string, token_file, "",
          "file holding the bearer token (default: the DECISION_TOKEN environment variable)");
ABSL_FLAG(bool, tls, false, "connect with TLS");
ABSL_FLAG(std::string, tls_ca, "", "--tls: PEM CA of the server's certificate (default: system)");
ABSL_FLAG(std::string, tls_cert, "", "--tls: PEM client certificate (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "--tls: PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "--tls: the name expected in the server's certificate (default: the host)");

namespace decision::ctl {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "decisionctl: %s\n", s.ToString().c_str());
  return 1;
}
int Usage(const std::string& message) {
  std::fprintf(stderr, "decisionctl: %s (see decisionctl --help)\n", message.c_str());
  return 2;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::vector<double>> ParseNumbers(absl::string_view text) {
  std::vector<double> out;
  const bool blank = absl::StripAsciiWhitespace(text).empty();
  // Spaces and tabs separate as many as there are; a comma separates one value from the
  // next, so an empty cell ("1,,2") is an error, not a shifted row.
  for (absl::string_view cell : absl::StrSplit(text, ',')) {
    if (absl::StripAsciiWhitespace(cell).empty() && !blank) {
      return absl::InvalidArgumentError(absl::StrCat("an empty cell in `", text, "`"));
    }
    for (absl::string_view value :
         absl::StrSplit(cell, absl::ByAnyChar(" \t"), absl::SkipWhitespace())) {
      double v;
      if (!absl::SimpleAtod(value, &v)) {
        return absl::InvalidArgumentError(absl::StrCat("`", value, "` is not a number"));
      }
      out.push_back(v);
    }
  }
  return out;
}

}  // namespace decision::ctl

namespace {

using decision::client::DecisionClient;
using decision::ctl::Fail;
using decision::ctl::ParseNumbers;
using decision::ctl::ReadFile;
using decision::ctl::Usage;
namespace v1 = decision::v1;

absl::StatusOr<std::vector<std::vector<double>>> ReadMatrix(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  std::vector<std::vector<double>> rows;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<std::vector<double>> row = ParseNumbers(line);
    if (!row.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": line ", line_number, ": ", row.status().message()));
    }
    rows.push_back(*std::move(row));
  }
  return rows;
}

// A CSV field (RFC 4180): quoted, its quotes doubled, when it holds a comma, a quote or a
// line break (an event id may).
std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\"", "\"\""}}), "\"");
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

const char* StatusName(v1::ExpertStatus s) {
  switch (s) {
    case v1::EXPERT_STATUS_BACKFILLING: return "backfilling";
    case v1::EXPERT_STATUS_ACTIVE: return "active";
    case v1::EXPERT_STATUS_RETIRED: return "retired";
    case v1::EXPERT_STATUS_FAILED: return "FAILED";
    case v1::EXPERT_STATUS_SHADOW: return "shadow";
    default: return "?";
  }
}

int CreateProblem(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("create-problem needs ID");
  v1::ProblemConfig config;
  config.set_num_arms(absl::GetFlag(FLAGS_arms));
  config.set_num_features(absl::GetFlag(FLAGS_features));
  const std::string estimator = absl::GetFlag(FLAGS_estimator);
  if (estimator == "clipped") {
    config.mutable_estimator()->set_kind(v1::ESTIMATOR_KIND_CLIPPED);
  } else if (estimator == "median_of_means") {
    config.mutable_estimator()->set_kind(v1::ESTIMATOR_KIND_MEDIAN_OF_MEANS);
  } else {
    return Usage("--estimator must be median_of_means or clipped");
  }
  // Unset (0) leaves the constant to the server; anything else, negatives included, is sent
  // for the server to check.
  if (const double c2 = absl::GetFlag(FLAGS_c2); c2 != 0.0) {
    config.mutable_estimator()->set_c2(c2);
  }
  if (const double c3 = absl::GetFlag(FLAGS_c3); c3 != 0.0) {
    config.mutable_estimator()->set_c3(c3);
  }
  if (const double big_c = absl::GetFlag(FLAGS_big_c); big_c != 0.0) {
    config.mutable_estimator()->set_big_c(big_c);
  }
  config.set_reward_wait_ms(absl::GetFlag(FLAGS_wait_ms));
  config.set_default_reward(absl::GetFlag(FLAGS_default_reward));
  config.set_drop_unrewarded(absl::GetFlag(FLAGS_drop_unrewarded));
  config.set_auto_promote(absl::GetFlag(FLAGS_auto_promote));
  const std::string slate_learning = absl::GetFlag(FLAGS_slate_learning);
  if (slate_learning == "first_slot") {
    config.set_slate_learning(v1::SLATE_LEARNING_FIRST_SLOT);
  } else if (slate_learning == "every_slot") {
    config.set_slate_learning(v1::SLATE_LEARNING_EVERY_SLOT);
  } else {
    return Usage("--slate_learning must be every_slot or first_slot");
  }
  config.mutable_auto_train()->set_enabled(absl::GetFlag(FLAGS_auto_train));
  config.mutable_auto_train()->set_tree_experts(absl::GetFlag(FLAGS_tree_experts));
  config.mutable_auto_train()->set_linear_experts(absl::GetFlag(FLAGS_linear_experts));
  const std::string training_sample = absl::GetFlag(FLAGS_training_sample);
  if (training_sample == "whole_log") {
    config.mutable_auto_train()->set_training_sample(v1::TRAINING_SAMPLE_WHOLE_LOG);
  } else if (training_sample == "bootstrap") {
    config.mutable_auto_train()->set_training_sample(v1::TRAINING_SAMPLE_BOOTSTRAP);
  } else {
    return Usage("--training_sample must be whole_log or bootstrap");
  }
  const std::string training_objective = absl::GetFlag(FLAGS_training_objective);
  if (training_objective == "likelihood") {
    config.mutable_auto_train()->set_training_objective(v1::TRAINING_OBJECTIVE_LIKELIHOOD);
  } else if (training_objective == "importance_weighted") {
    config.mutable_auto_train()->set_training_objective(
        v1::TRAINING_OBJECTIVE_IMPORTANCE_WEIGHTED);
  } else {
    return Usage("--training_objective must be likelihood or importance_weighted");
  }
  config.set_scoring_budget_us(absl::GetFlag(FLAGS_scoring_budget_us));
  if (const double turnover = absl::GetFlag(FLAGS_divergence_refresh_turnover); turnover >= 0) {
    config.set_divergence_refresh_turnover(turnover);
  }
  config.mutable_retention()->set_max_samples(absl::GetFlag(FLAGS_retention_max_samples));
  config.mutable_retention()->set_max_age_ms(absl::GetFlag(FLAGS_retention_max_age_ms));
  auto p = c.CreateProblem(args[0], config);
  if (!p.ok()) return Fail(p.status());
  std::printf("created problem %s: %d arms, %d features, wait %lld ms", p->problem_id().c_str(),
              p->config().num_arms(), p->config().num_features(),
              static_cast<long long>(p->config().reward_wait_ms()));
  if (p->config().scoring_budget_us() > 0) {
    std::printf(", scoring budget %g us per decision", p->config().scoring_budget_us());
  }
  std::printf("\n");
  return 0;
}

int ListProblems(DecisionClient& c) {
  auto list = c.ListProblems();
  if (!list.ok()) return Fail(list.status());
  std::printf("%-24s %6s %8s %8s %10s %10s %8s\n", "problem", "arms", "features", "experts",
              "decisions", "samples", "pending");
  for (const v1::Problem& p : list->problems()) {
    if (!p.error().empty()) {
      // It failed to load at start-up: no counts, only why.
      std::printf("%-24s FAILED: %s\n", p.problem_id().c_str(), p.error().c_str());
      continue;
    }
    std::printf("%-24s %6d %8d %8d %10lld %10lld %8lld\n", p.problem_id().c_str(),
                p.config().num_arms(), p.config().num_features(), p.experts(),
                static_cast<long long>(p.decisions()), static_cast<long long>(p.samples()),
                static_cast<long long>(p.pending()));
  }
  return 0;
}

// The model given by --xgboost, --linear, --table or --uniform (and --smoothing).
// INVALID_ARGUMENT for a usage error (not exactly one kind), or the file's error.
absl::StatusOr<v1::ExpertModel> ModelFromFlags() {
  v1::ExpertModel model;
  int kinds = 0;
  if (const std::string f = absl::GetFlag(FLAGS_xgboost); !f.empty()) {
    auto bytes = ReadFile(f);
    if (!bytes.ok()) return bytes.status();
    model.mutable_xgboost()->set_model(*bytes);
    ++kinds;
  }
  if (const std::string f = absl::GetFlag(FLAGS_linear); !f.empty()) {
    auto rows = ReadMatrix(f);
    if (!rows.ok()) return rows.status();
    auto* l = model.mutable_linear_softmax();
    size_t width = 0;
    for (size_t i = 0; i < rows->size(); ++i) {
      const std::vector<double>& row = (*rows)[i];
      if (row.empty()) continue;
      // Rows are flattened: one of another length would shift every later arm's weights.
      if (width == 0) width = row.size();
      if (row.size() != width) {
        return absl::InvalidArgumentError(absl::StrCat(
            f, ": row ", i + 1, " has ", row.size(), " numbers, the first row ", width,
            "; every arm's row is its bias and one weight per feature"));
      }
      l->add_bias(row[0]);
      l->mutable_weights()->Add(row.begin() + 1, row.end());
    }
    l->set_temperature(absl::GetFlag(FLAGS_temperature));
    ++kinds;
  }
  if (const std::string f = absl::GetFlag(FLAGS_table); !f.empty()) {
    auto rows = ReadMatrix(f);
    if (!rows.ok()) return rows.status();
    for (const auto& row : *rows) {
      model.mutable_table()->add_rows()->mutable_probabilities()->Add(row.begin(), row.end());
    }
    model.mutable_table()->set_key_feature(absl::GetFlag(FLAGS_key_feature));
    ++kinds;
  }
  if (absl::GetFlag(FLAGS_uniform)) {
    model.mutable_uniform();
    ++kinds;
  }
  if (kinds != 1) {
    return absl::InvalidArgumentError("give exactly one of --xgboost, --linear, --table, --uniform");
  }
  if (absl::GetFlag(FLAGS_smoothing) >= 0.0) model.set_smoothing(absl::GetFlag(FLAGS_smoothing));
  return model;
}

int RegisterExpert(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("register-expert needs PROBLEM");
  absl::StatusOr<v1::ExpertModel> model = ModelFromFlags();
  if (!model.ok()) return Usage(std::string(model.status().message()));
  auto e = c.RegisterExpert(args[0], absl::GetFlag(FLAGS_name), *model,
                            absl::GetFlag(FLAGS_shadow));
  if (!e.ok()) return Fail(e.status());
  std::printf("registered expert %d (%s, %s): %s, %lld samples to backfill\n", e->expert_id(),
              e->name().c_str(), e->kind().c_str(), StatusName(e->status()),
              static_cast<long long>(e->backfill_total()));
  return 0;
}

int ListExperts(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("list-experts needs PROBLEM");
  auto list = c.ListExperts(args[0]);
  if (!list.ok()) return Fail(list.status());
  std::printf("%6s  %-20s %-15s %-12s %9s %21s %12s\n", "expert", "name", "kind", "status",
              "smoothing", "backfilled", "cost_us/row");
  for (const v1::Expert& e : list->experts()) {
    std::printf("%6d  %-20s %-15s %-12s %9.3f %10lld/%-10lld %12.3f\n", e.expert_id(),
                e.name().c_str(), e.kind().c_str(), StatusName(e.status()), e.smoothing(),
                static_cast<long long>(e.backfilled()),
                static_cast<long long>(e.backfill_total()), e.score_cost_us());
    if (!e.error().empty()) std::printf("        why FAILED: %s\n", e.error().c_str());
  }
  return 0;
}

int SetRetention(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("set-retention needs PROBLEM");
  v1::RetentionConfig retention;
  retention.set_max_samples(absl::GetFlag(FLAGS_retention_max_samples));
  retention.set_max_age_ms(absl::GetFlag(FLAGS_retention_max_age_ms));
  auto p = c.SetRetention(args[0], retention);
  if (!p.ok()) return Fail(p.status());
  const v1::RetentionConfig& r = p->config().retention();
  std::printf("problem %s keeps %s samples and %s; the store has the samples from %lld\n",
              p->problem_id().c_str(),
              r.max_samples() > 0 ? absl::StrCat("at most ", r.max_samples()).c_str() : "all",
              r.max_age_ms() > 0 ? absl::StrCat("the last ", r.max_age_ms(), " ms").c_str()
                                 : "any age",
              static_cast<long long>(p->retained_from()));
  return 0;
}

int DeleteEvents(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() < 2) return Usage("delete-events needs PROBLEM EVENT_ID...");
  auto r = c.DeleteEvents(args[0], std::vector<std::string>(args.begin() + 1, args.end()));
  if (!r.ok()) return Fail(r.status());
  std::printf("deleted %lld events", static_cast<long long>(r->deleted()));
  if (r->not_found_size() > 0) {
    std::printf("; not found: %s", absl::StrJoin(r->not_found(), ", ").c_str());
  }
  std::printf("\n");
  return 0;
}

int EvaluateModel(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("evaluate needs PROBLEM");
  absl::StatusOr<v1::ExpertModel> model = ModelFromFlags();
  if (!model.ok()) return Usage(std::string(model.status().message()));
  auto e = c.EvaluateModel(args[0], *model, absl::GetFlag(FLAGS_clip));
  if (!e.ok()) return Fail(e.status());
  std::printf("over %lld samples: ips %.4f [%.4f, %.4f] (95%%), snips %.4f, clipped ips %.4f; "
              "effective sample size %.1f, mean weight %.3f, max weight %.1f\n",
              static_cast<long long>(e->samples()), e->ips(), e->ips_lower(), e->ips_upper(),
              e->snips(), e->clipped_ips(), e->effective_sample_size(), e->mean_weight(),
              e->max_weight());
  return 0;
}

int SetShadow(DecisionClient& c, const std::vector<char*>& args, bool shadow) {
  int id;
  if (args.size() != 2 || !absl::SimpleAtoi(args[1], &id)) {
    return Usage(shadow ? "demote needs PROBLEM EXPERT_ID" : "promote needs PROBLEM EXPERT_ID");
  }
  auto e = shadow ? c.Demote(args[0], id) : c.Promote(args[0], id);
  if (!e.ok()) return Fail(e.status());
  std::printf("expert %d is %s%s\n", e->expert_id(), StatusName(e->status()),
              e->shadow() && e->status() != v1::EXPERT_STATUS_SHADOW ? " (shadow)" : "");
  return 0;
}

int RetireExpert(DecisionClient& c, const std::vector<char*>& args) {
  int id;
  if (args.size() != 2 || !absl::SimpleAtoi(args[1], &id)) {
    return Usage("retire-expert needs PROBLEM EXPERT_ID");
  }
  auto e = c.RetireExpert(args[0], id);
  if (!e.ok()) return Fail(e.status());
  std::printf("expert %d is %s\n", e->expert_id(), StatusName(e->status()));
  return 0;
}

int Estimates(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("estimates needs PROBLEM");
  auto e = c.GetEstimates(args[0]);
  if (!e.ok()) return Fail(e.status());
  std::printf("problem %s: %lld samples, estimated regret %.1f\n", e->problem_id().c_str(),
              static_cast<long long>(e->samples()), e->estimated_regret());
  // Then its off-policy estimates (GetEstimates' off_policy): SNIPS, IPS's 95% lower bound
  // and the effective sample size of its importance weights; "-" where none is kept.
  std::printf("%6s %-12s %10s %10s %10s %10s %12s %8s %8s %8s\n", "expert", "status",
              "estimate", "width", "ucb", "selected", "eff. samples", "snips", "ips lb",
              "ips ess");
  for (const v1::ExpertEstimate& x : e->experts()) {
    std::printf("%6d %-12s %10.4f %10.4f %10.4f %10lld %12.1f", x.expert_id(),
                StatusName(x.status()), x.estimate(), x.width(), x.ucb(),
                static_cast<long long>(x.times_selected()), x.effective_sample_size());
    if (x.off_policy().samples() > 0) {
      std::printf(" %8.4f %8.4f %8.1f\n", x.off_policy().snips(), x.off_policy().ips_lower(),
                  x.off_policy().effective_sample_size());
    } else {
      std::printf(" %8s %8s %8s\n", "-", "-", "-");
    }
  }
  return 0;
}

// --x, --event_id, --deferred and --eligible of choose and choose-slate, into `request`.
// The usage error, if any.
template <typename Request>
std::optional<std::string> DecisionFromFlags(Request* request) {
  auto x = ParseNumbers(absl::GetFlag(FLAGS_x));
  if (!x.ok()) return std::string(x.status().message());
  request->mutable_features()->Add(x->begin(), x->end());
  request->set_event_id(absl::GetFlag(FLAGS_event_id));
  request->set_deferred(absl::GetFlag(FLAGS_deferred));
  const std::string eligible = absl::GetFlag(FLAGS_eligible);
  if (eligible.empty()) return std::nullopt;
  auto arms = ParseNumbers(eligible);
  if (!arms.ok()) return std::string(arms.status().message());
  request->mutable_eligible();  // set, even if every entry is refused below
  for (const double a : *arms) {
    if (a != std::floor(a) || std::abs(a) > 1e9) {
      return absl::StrCat("--eligible: ", Number(a), " is not an arm id");
    }
    request->mutable_eligible()->add_arms(static_cast<int32_t>(a));
  }
  return std::nullopt;
}

int ChooseSlate(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("choose-slate needs PROBLEM");
  v1::ChooseSlateRequest request;
  request.set_problem_id(args[0]);
  if (auto error = DecisionFromFlags(&request)) return Usage(*error);
  request.set_slots(absl::GetFlag(FLAGS_slots));
  auto r = c.ChooseSlate(std::move(request));
  if (!r.ok()) return Fail(r.status());
  for (int s = 0; s < r->slots_size(); ++s) {
    const v1::ChooseResponse& slot = r->slots(s);
    std::printf("slot=%d event_id=%s arm=%d propensity=%.6f expert=%d\n", s,
                slot.event_id().c_str(), slot.arm(), slot.propensity(), slot.expert_id());
  }
  return 0;
}

int Choose(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("choose needs PROBLEM");
  v1::ChooseRequest request;
  request.set_problem_id(args[0]);
  if (auto error = DecisionFromFlags(&request)) return Usage(*error);
  auto r = c.Choose(std::move(request));
  if (!r.ok()) return Fail(r.status());
  std::printf("event_id=%s arm=%d propensity=%.6f expert=%d\n", r->event_id().c_str(), r->arm(),
              r->propensity(), r->expert_id());
  return 0;
}

const char* OutcomeName(v1::DecisionOutcome o) {
  switch (o) {
    case v1::DECISION_OUTCOME_PENDING: return "pending";
    case v1::DECISION_OUTCOME_JOINED: return "joined";
    case v1::DECISION_OUTCOME_DEFAULT_REWARD: return "default reward";
    case v1::DECISION_OUTCOME_DROPPED: return "dropped";
    default: return "unknown";
  }
}

int Explain(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 2) return Usage("explain needs PROBLEM EVENT_ID");
  auto e = c.Explain(args[0], args[1]);
  if (!e.ok()) return Fail(e.status());
  std::printf("event %s of %s, decided %s: %s", e->event_id().c_str(), e->problem_id().c_str(),
              absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(e->decided_at_ms()),
                               absl::UTCTimeZone())
                  .c_str(),
              OutcomeName(e->outcome()));
  if (e->outcome() == v1::DECISION_OUTCOME_JOINED ||
      e->outcome() == v1::DECISION_OUTCOME_DEFAULT_REWARD) {
    std::printf(", reward %s (sample %lld)", Number(e->reward()).c_str(),
                static_cast<long long>(e->sequence()));
  }
  std::printf("\ncontext: %s\n",
              absl::StrJoin(e->features(), ",", [](std::string* out, double v) {
                out->append(Number(v));
              }).c_str());
  std::printf("eligible arms: %s\n",
              e->eligible_arms().empty() ? "all" : absl::StrJoin(e->eligible_arms(), ",").c_str());
  if (e->has_slate_slot()) {
    std::printf("slate slot %d%s\n", e->slate_slot(),
                e->unlearned_slot() ? " (not learned: the problem learns only slot 0)" : "");
  }
  std::printf("followed expert %d: estimate %s + width %s = UCB %s\n", e->expert_id(),
              Number(e->estimate()).c_str(), Number(e->width()).c_str(),
              Number(e->ucb()).c_str());
  if (e->runner_up_expert_id() >= 0) {
    std::printf("runner-up expert %d: UCB %s\n", e->runner_up_expert_id(),
                Number(e->runner_up_ucb()).c_str());
  } else {
    std::printf("runner-up: none\n");
  }
  std::printf("arm %d, propensity %s, draw %s\n", e->arm(), Number(e->propensity()).c_str(),
              Number(e->draw()).c_str());
  if (e->distribution().empty()) {
    std::printf("distribution: not available (the expert failed or was unloaded since)\n");
  } else {
    std::printf("distribution: %s; the draw %s arm %d\n",
                absl::StrJoin(e->distribution(), ",", [](std::string* out, double v) {
                  out->append(Number(v));
                }).c_str(),
                e->reproduced() ? "reproduces" : "does NOT reproduce", e->arm());
  }
  return 0;
}

int Activate(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 2) return Usage("activate needs PROBLEM EVENT_ID");
  auto first = c.Activate(args[0], args[1]);
  if (!first.ok()) return Fail(first.status());
  std::printf(*first ? "activated\n" : "already learnable (activated before, or not deferred)\n");
  return 0;
}

int Reward(DecisionClient& c, const std::vector<char*>& args) {
  double value;
  if (args.size() != 3 || !absl::SimpleAtod(args[2], &value)) {
    return Usage("reward needs PROBLEM EVENT_ID VALUE");
  }
  auto first = c.Reward(args[0], args[1], value);
  if (!first.ok()) return Fail(first.status());
  std::printf(*first ? "reward recorded\n" : "duplicate: the event already had a reward\n");
  return 0;
}

int Export(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("export needs PROBLEM");
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "csv" && format != "jsonl" && format != "dsjson") {
    return Usage("--format must be csv, jsonl or dsjson");
  }
  std::ofstream file;
  const std::string path = absl::GetFlag(FLAGS_output);
  if (!path.empty()) {
    file.open(path);
    if (!file) return Fail(absl::InternalError("cannot write " + path));
  }
  std::ostream& out = path.empty() ? std::cout : file;
  bool header = format == "csv";
  // The CSV header names the features. A redacted sample has none (its cells are empty),
  // so the rows before the first sample with features wait for it (they are small).
  int num_features = 0;
  std::vector<std::string> held;
  const auto write_header = [&] {
    out << "sequence,event_id,arm,expert_id,propensity,reward,default_reward,"
           "decided_at_ms,joined_at_ms,eligible_arms";
    for (int f = 0; f < num_features; ++f) out << ",x" << f;
    out << "\n";
    for (const std::string& row : held) out << row << std::string(num_features, ',') << "\n";
    held.clear();
    header = false;
  };
  absl::Status s = c.ExportLog(
      args[0], absl::GetFlag(FLAGS_start), absl::GetFlag(FLAGS_limit),
      [&](const v1::LoggedSample& x) {
        if (format == "dsjson") {
          out << x.dsjson() << "\n";
        } else if (format == "csv") {
          const std::string row = absl::StrCat(
              x.sequence(), ",", CsvField(x.event_id()), ",", x.arm(), ",", x.expert_id(), ",",
              Number(x.propensity()), ",", Number(x.reward()), ",", x.default_reward() ? 1 : 0,
              ",", x.decided_at_ms(), ",", x.joined_at_ms(), ",",
              absl::StrJoin(x.eligible_arms(), " "));
          if (header && x.redacted()) {
            held.push_back(row);
            return absl::OkStatus();
          }
          if (header) {
            num_features = x.features_size();
            write_header();
          }
          out << row;
          for (double f : x.features()) out << "," << Number(f);
          for (int f = x.features_size(); f < num_features; ++f) out << ",";
          out << "\n";
        } else {
          out << "{\"sequence\":" << x.sequence() << ",\"event_id\":" << JsonString(x.event_id())
              << ",\"arm\":" << x.arm() << ",\"expert_id\":" << x.expert_id()
              << ",\"propensity\":" << Number(x.propensity()) << ",\"reward\":"
              << Number(x.reward()) << ",\"default_reward\":"
              << (x.default_reward() ? "true" : "false")
              << ",\"decided_at_ms\":" << x.decided_at_ms()
              << ",\"joined_at_ms\":" << x.joined_at_ms() << ",\"features\":[";
          for (int f = 0; f < x.features_size(); ++f) {
            out << (f ? "," : "") << Number(x.features(f));
          }
          out << "],\"expert_propensities\":[";
          for (int k = 0; k < x.expert_propensities_size(); ++k) {
            out << (k ? "," : "") << Number(x.expert_propensities(k));
          }
          out << "]";
          if (x.eligible_arms_size() > 0) {
            out << ",\"eligible_arms\":[" << absl::StrJoin(x.eligible_arms(), ",") << "]";
          }
          if (x.redacted()) out << ",\"redacted\":true";
          out << "}\n";
        }
        return out ? absl::OkStatus() : absl::InternalError("write failed");
      },
      format == "dsjson" ? v1::EXPORT_FORMAT_DSJSON : v1::EXPORT_FORMAT_UNSPECIFIED);
  if (!s.ok()) return Fail(s);
  if (header && !held.empty()) write_header();  // only redacted samples
  // A full disk shows at the last flush, not at the last write.
  out.flush();
  if (!out) return Fail(absl::InternalError(absl::StrCat(
                 "cannot write ", path.empty() ? "the standard output" : path)));
  return 0;
}

const char* JobStateName(v1::TrainingJobState s) {
  switch (s) {
    case v1::TRAINING_JOB_STATE_QUEUED: return "QUEUED";
    case v1::TRAINING_JOB_STATE_RUNNING: return "RUNNING";
    case v1::TRAINING_JOB_STATE_SUCCEEDED: return "SUCCEEDED";
    case v1::TRAINING_JOB_STATE_FAILED: return "FAILED";
    default: return "UNSPECIFIED";
  }
}

bool JobEnded(const v1::TrainingJob& job) {
  return job.state() == v1::TRAINING_JOB_STATE_SUCCEEDED ||
         job.state() == v1::TRAINING_JOB_STATE_FAILED;
}

void PrintJob(const v1::TrainingJob& job) {
  std::string experts;
  for (int id : job.expert_ids()) absl::StrAppend(&experts, experts.empty() ? "" : ",", id);
  const auto when = [](int64_t ms) {
    return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(ms),
                            absl::UTCTimeZone());
  };
  std::printf("job %lld of %s: %s (%s) trees=%d linear=%d experts=[%s] skipped=%d "
              "interruptions=%d created=%s updated=%s%s%s\n",
              static_cast<long long>(job.job_id()), job.problem_id().c_str(),
              JobStateName(job.state()),
              job.origin() == v1::TRAINING_JOB_ORIGIN_AUTO_TRAIN ? "auto-training"
                                                                 : "TrainExperts",
              job.tree_experts(), job.linear_experts(), experts.c_str(), job.skipped_experts(),
              job.interruptions(), when(job.created_at_ms()).c_str(),
              when(job.updated_at_ms()).c_str(), job.error().empty() ? "" : " error: ",
              job.error().c_str());
  for (const std::string& why : job.skip_reasons()) std::printf("    skipped %s\n", why.c_str());
}

int Train(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("train needs PROBLEM");
  auto r = c.TrainExperts(args[0], absl::GetFlag(FLAGS_tree_experts),
                          absl::GetFlag(FLAGS_linear_experts));
  if (!r.ok()) return Fail(r.status());
  if (r->joined_queued_job()) {
    std::printf("training job %lld was already queued: joined it, with its counts (%d job(s) "
                "waiting)\n",
                static_cast<long long>(r->job_id()), r->queued_jobs());
  } else {
    std::printf("training job %lld queued (%d job(s) waiting)\n",
                static_cast<long long>(r->job_id()), r->queued_jobs());
  }
  if (!absl::GetFlag(FLAGS_wait)) {
    std::printf("poll it with: decisionctl job %s %lld\n", args[0],
                static_cast<long long>(r->job_id()));
    return 0;
  }
  // A job outlives a server restart: UNAVAILABLE (the server restarting) is waited out.
  std::string last;
  while (true) {
    auto job = c.GetTrainingJob(args[0], r->job_id());
    if (!job.ok() && !absl::IsUnavailable(job.status())) return Fail(job.status());
    if (!job.ok() && last != "unavailable") {
      // Said once, not left silent: the wait goes on until the server is back.
      std::fprintf(stderr, "decisionctl: job %lld: the server is unavailable (%s); still "
                   "waiting (a job outlives a restart; interrupt to stop waiting)\n",
                   static_cast<long long>(r->job_id()),
                   std::string(job.status().message()).c_str());
      last = "unavailable";
    }
    if (job.ok()) {
      const std::string now = absl::StrCat(JobStateName(job->state()), " ",
                                           job->expert_ids_size(), " experts");
      if (now != last) {
        std::printf("job %lld: %s\n", static_cast<long long>(r->job_id()), now.c_str());
        std::fflush(stdout);
        last = now;
      }
      if (JobEnded(*job)) {
        PrintJob(*job);
        return job->state() == v1::TRAINING_JOB_STATE_SUCCEEDED ? 0 : 1;
      }
    }
    absl::SleepFor(absl::Milliseconds(500));
  }
}

int Job(DecisionClient& c, const std::vector<char*>& args) {
  int64_t job_id;
  if (args.size() != 2 || !absl::SimpleAtoi(args[1], &job_id)) {
    return Usage("job needs PROBLEM JOB_ID");
  }
  auto job = c.GetTrainingJob(args[0], job_id);
  if (!job.ok()) return Fail(job.status());
  PrintJob(*job);
  return 0;
}

int Jobs(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("jobs needs PROBLEM");
  // Job ids are dense from 1: the first NOT_FOUND is the end.
  for (int64_t id = 1;; ++id) {
    auto job = c.GetTrainingJob(args[0], id);
    if (absl::IsNotFound(job.status()) && id > 1) return 0;
    if (absl::IsNotFound(job.status())) {
      // Unknown problem, or no job yet: GetProblem tells which.
      if (auto p = c.GetProblem(args[0]); !p.ok()) return Fail(p.status());
      std::printf("no training job\n");
      return 0;
    }
    if (!job.ok()) return Fail(job.status());
    PrintJob(*job);
  }
}

int Audit(DecisionClient& c) {
  auto r = c.ListAuditLog(absl::GetFlag(FLAGS_start), static_cast<int>(absl::GetFlag(FLAGS_limit)));
  if (!r.ok()) return Fail(r.status());
  std::printf("%8s %-24s %-16s %-16s %-20s %-18s %s\n", "seq", "time (UTC)", "caller", "method",
              "problem", "result", "detail");
  for (const v1::AuditEntry& e : r->entries()) {
    const std::string when =
        absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(e.at_ms()), absl::UTCTimeZone());
    std::printf("%8lld %-24s %-16s %-16s %-20s %-18s %s%s%s\n",
                static_cast<long long>(e.sequence()), when.c_str(), e.caller().c_str(),
                e.method().c_str(), e.problem_id().c_str(), e.code().c_str(), e.detail().c_str(),
                e.message().empty() ? "" : ": ", e.message().c_str());
  }
  std::printf("next: --start=%lld\n", static_cast<long long>(r->next_start()));
  return 0;
}

// grpc.health.v1 by hand (Debian ships no generated health stubs): an empty
// HealthCheckRequest, and a HealthCheckResponse whose field 1 is the status (1 = SERVING).
int Health(const decision::client::ClientOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  if (options.tls.enabled) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls.ca_file.empty()) {
      auto ca = ReadFile(options.tls.ca_file);
      if (!ca.ok()) return Fail(ca.status());
      ssl.pem_root_certs = *ca;
    }
    if (!options.tls.cert_file.empty()) {
      auto cert = ReadFile(options.tls.cert_file);
      auto key = ReadFile(options.tls.key_file);
      if (!cert.ok()) return Fail(cert.status());
      if (!key.ok()) return Fail(key.status());
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    if (!options.tls.server_name.empty()) args.SetSslTargetNameOverride(options.tls.server_name);
    credentials = grpc::SslCredentials(ssl);
  }
  grpc::GenericStub stub(grpc::CreateCustomChannel(options.address, credentials, args));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);  // a ByteBuffer with no slice is not a message
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(options.deadline_ms));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status status = done.get_future().get();
  if (!status.ok()) return Fail(decision::client::FromGrpc(status));
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  const bool serving = bytes == std::string("\x08\x01", 2);
  std::printf("%s\n", serving ? "SERVING" : "NOT_SERVING");
  return serving ? 0 : 1;
}

int HashToken() {
  std::string token;
  std::getline(std::cin, token);
  if (!token.empty() && token.back() == '\r') token.pop_back();
  if (token.empty()) return Usage("hash-token reads the token on stdin");
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(token.data(), token.size(), digest, &len, EVP_sha256(), nullptr);
  std::printf("sha256:");
  for (unsigned int i = 0; i < len; ++i) std::printf("%02x", digest[i]);
  std::printf("\n");
  return 0;
}


}  // namespace


int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      absl::StrCat("decisionctl [--server=HOST:PORT] COMMAND [ARGS] [--flags]\n\n", kCommands));
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2) return Usage("missing COMMAND");
  const std::string command = positional[1];
  const std::vector<char*> args(positional.begin() + 2, positional.end());
  if (command == "hash-token") return HashToken();
  decision::client::ClientOptions options;
  options.address = absl::GetFlag(FLAGS_server);
  options.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
  options.max_attempts = std::max(1, absl::GetFlag(FLAGS_max_attempts));
  if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
    auto token = ReadFile(file);
    if (!token.ok()) return Fail(token.status());
    options.token = std::string(absl::StripAsciiWhitespace(*token));
  } else if (const char* env = std::getenv("DECISION_TOKEN"); env != nullptr) {
    // As from the file: a secret mounted into the variable often ends with a newline.
    options.token = std::string(absl::StripAsciiWhitespace(env));
  }
  options.tls.enabled = absl::GetFlag(FLAGS_tls);
  options.tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls.server_name = absl::GetFlag(FLAGS_tls_server_name);
  if (command == "health") return Health(options);
  if (command == "move-problem") {
    // BeginMove waits for the calls in flight (at most 30 s) and writes what they left.
    options.deadline_ms = std::max<int64_t>(options.deadline_ms, 60'000);
  }
  DecisionClient client(options);
  if (!client.status().ok()) return Fail(client.status());
  if (command == "create-problem") return CreateProblem(client, args);
  if (command == "list-problems") return ListProblems(client);
  if (command == "register-expert") return RegisterExpert(client, args);
  if (command == "list-experts") return ListExperts(client, args);
  if (command == "retire-expert") return RetireExpert(client, args);
  if (command == "set-retention") return SetRetention(client, args);
  if (command == "delete-events") return DeleteEvents(client, args);
  if (command == "estimates") return Estimates(client, args);
  if (command == "choose") return Choose(client, args);
  if (command == "choose-slate") return ChooseSlate(client, args);
  if (command == "explain") return Explain(client, args);
  if (command == "activate") return Activate(client, args);
  if (command == "promote") return SetShadow(client, args, false);
  if (command == "demote") return SetShadow(client, args, true);
  if (command == "evaluate") return EvaluateModel(client, args);
  if (command == "reward") return Reward(client, args);
  if (command == "export") return Export(client, args);
  if (command == "train") return Train(client, args);
  if (command == "job") return Job(client, args);
  if (command == "jobs") return Jobs(client, args);
  if (command == "replay") return decision::ctl::Replay(client, args);
  if (command == "audit") return Audit(client);
  if (command == "move-problem") return decision::ctl::MoveProblem(client, options, args);
  if (command == "end-move") return decision::ctl::EndMove(client, args);
  return Usage("unknown command " + command);
}
