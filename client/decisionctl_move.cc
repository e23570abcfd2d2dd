// decisionctl move-problem and end-move: moving a problem between replicas
// (docs/SCALING.md, "Moving a problem"; decisionctl.cc lists the commands' flags).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/decision_client.h"
#include "client/decisionctl.h"

ABSL_FLAG(std::string, to, "", "move-problem: the target replica's address (HOST:PORT)");
ABSL_FLAG(std::string, to_replica, "", "move-problem: the target's name in the placement map");
ABSL_FLAG(std::string, place_cmd, "",
          "move-problem: shell command that places the problem on the target (env "
          "DECISION_PROBLEM, DECISION_REPLICA); empty: stop before the switch");
ABSL_FLAG(int64_t, page_bytes, 1 << 20, "move-problem: bytes of records per page");
ABSL_FLAG(bool, catch_up, true,
          "move-problem: copy at a snapshot while the problem serves, then fence it and copy "
          "only what changed since (false: fence, then copy everything)");
ABSL_FLAG(bool, abort, false, "end-move: serve the problem on the source again");

namespace decision::ctl {
namespace {

using client::DecisionClient;

// Milliseconds since `start`.
double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

int MoveProblem(DecisionClient& source, const decision::client::ClientOptions& options,
                const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("move-problem PROBLEM --to=HOST:PORT --to_replica=NAME");
  const std::string problem = args[0];
  const std::string to_replica = absl::GetFlag(FLAGS_to_replica);
  if (absl::GetFlag(FLAGS_to).empty() || to_replica.empty()) {
    return Usage("move-problem needs --to (the target's address) and --to_replica (its name)");
  }
  decision::client::ClientOptions target_options = options;
  target_options.address = absl::GetFlag(FLAGS_to);
  DecisionClient target(target_options);
  if (!target.status().ok()) return Fail(target.status());
  const bool catch_up = absl::GetFlag(FLAGS_catch_up);
  const auto start = std::chrono::steady_clock::now();
  v1::ImportProblemRequest import;
  import.set_problem_id(problem);
  import.set_first(true);
  int64_t records = 0, bytes = 0;
  v1::Estimates target_estimates;
  // Pages of records (or, with `changes`, of what changed since the snapshot) from the
  // source to the target; the last one commits when `commit_state` is given.
  const auto copy = [&](bool changes, const std::string* commit_state) -> absl::Status {
    v1::ExportProblemRequest page;
    page.set_problem_id(problem);
    page.set_max_bytes(absl::GetFlag(FLAGS_page_bytes));
    page.set_changes(changes);
    for (bool done = false; !done;) {
      absl::StatusOr<v1::ExportProblemResponse> exported = source.ExportProblem(page);
      if (!exported.ok()) return exported.status();
      done = exported->done();
      *page.mutable_cursor() = exported->next();
      import.mutable_entries()->Swap(exported->mutable_entries());
      if (done && commit_state != nullptr) {
        import.set_commit(true);
        import.set_generator_state(*commit_state);
      }
      absl::StatusOr<v1::ImportProblemResponse> imported = target.ImportProblem(import);
      if (!imported.ok()) return imported.status();
      records = imported->entries();
      bytes = imported->bytes();
      if (import.commit()) target_estimates = imported->estimates();
      import.clear_entries();
      import.set_first(false);
    }
    return absl::OkStatus();
  };
  const auto abort = [&](const absl::Status& why) {
    std::fprintf(stderr, "decisionctl: move-problem: %s\n", why.ToString().c_str());
    if (absl::Status s = source.EndMove(problem, /*abort=*/true); !s.ok()) {
      std::fprintf(stderr, "decisionctl: the move could not be aborted (%s): run "
                   "`decisionctl end-move %s --abort` on the source\n",
                   s.ToString().c_str(), problem.c_str());
    } else {
      std::fprintf(stderr, "decisionctl: move aborted: %s serves %s again\n",
                   options.address.c_str(), problem.c_str());
    }
    return 1;
  };
  // 1, 2. With the catch-up: the copy at a snapshot, while the problem serves.
  if (catch_up) {
    absl::StatusOr<v1::BeginMoveResponse> snapshot =
        source.BeginMove(problem, to_replica, /*catch_up=*/true);
    if (!snapshot.ok()) return Fail(snapshot.status());
    if (absl::Status s = copy(/*changes=*/false, nullptr); !s.ok()) return abort(s);
    std::printf("copied %lld records (%.1f MB) at a snapshot (%lld samples) in %.0f ms, "
                "serving meanwhile\n",
                static_cast<long long>(records), bytes / 1e6,
                static_cast<long long>(snapshot->samples()), MsSince(start));
  }
  // The fence: from here the problem is unavailable until the placement switches.
  const auto fenced_at = std::chrono::steady_clock::now();
  absl::StatusOr<v1::BeginMoveResponse> begun = source.BeginMove(problem, to_replica, false);
  if (!begun.ok()) return catch_up ? abort(begun.status()) : Fail(begun.status());
  std::printf("fenced %s on %s (%lld samples) in %.0f ms\n", problem.c_str(),
              options.address.c_str(), static_cast<long long>(begun->samples()),
              MsSince(fenced_at));
  // 3. What changed since the snapshot (or everything), and the load on the target.
  const int64_t before = records;
  if (absl::Status s = copy(/*changes=*/catch_up, &begun->generator_state()); !s.ok()) {
    return abort(s);
  }
  std::printf("copied %lld %s (%.1f MB in all) to %s at %.0f ms after the fence; it serves "
              "%s\n",
              static_cast<long long>(records - before), catch_up ? "changes" : "records",
              bytes / 1e6, target_options.address.c_str(), MsSince(fenced_at),
              problem.c_str());
  // The target learned what the source had: the same estimates, bit for bit.
  if (target_estimates.SerializeAsString() != begun->estimates().SerializeAsString()) {
    std::fprintf(stderr, "decisionctl: the target's estimates of %s differ from the source's "
                 "at the fence: the placement is not switched and the source stays fenced. "
                 "Run `decisionctl end-move %s --abort` on the source to serve it there "
                 "again.\n", problem.c_str(), problem.c_str());
    return 1;
  }
  std::printf("estimates identical on both replicas (%lld samples)\n",
              static_cast<long long>(target_estimates.samples()));
  // 4. The placement switch.
  const std::string place = absl::GetFlag(FLAGS_place_cmd);
  if (place.empty()) {
    std::printf("switch the placement of %s to %s, then run `decisionctl end-move %s` on "
                "the source (%s stays fenced until then)\n",
                problem.c_str(), to_replica.c_str(), problem.c_str(), options.address.c_str());
    return 0;
  }
  setenv("DECISION_PROBLEM", problem.c_str(), 1);
  setenv("DECISION_REPLICA", to_replica.c_str(), 1);
  if (int rc = std::system(place.c_str()); rc != 0) {
    std::fprintf(stderr, "decisionctl: --place_cmd failed (status %d): %s is served by %s but "
                 "the placement still names its source, which keeps it fenced. Fix the "
                 "placement and run `decisionctl end-move %s`, or run `decisionctl end-move "
                 "%s --abort` on the source to serve it there again.\n",
                 rc, problem.c_str(), target_options.address.c_str(), problem.c_str(),
                 problem.c_str());
    return 1;
  }
  const double unavailable_ms = MsSince(fenced_at);
  // 5, 6. The source records the move and deletes its copy.
  if (absl::Status s = source.EndMove(problem, /*abort=*/false); !s.ok()) {
    std::fprintf(stderr, "decisionctl: the placement switched, but the source did not record "
                 "the move (%s): run `decisionctl end-move %s` on it\n", s.ToString().c_str(),
                 problem.c_str());
    return 1;
  }
  std::printf("moved %s to %s: unavailable for %.0f ms (fence to placement switch), %.0f ms "
              "in all\n", problem.c_str(), to_replica.c_str(), unavailable_ms, MsSince(start));
  return 0;
}

int EndMove(DecisionClient& c, const std::vector<char*>& args) {
  if (args.size() != 1) return Usage("end-move PROBLEM [--abort | --to_replica=NAME]");
  if (absl::Status s = c.EndMove(args[0], absl::GetFlag(FLAGS_abort),
                                 absl::GetFlag(FLAGS_to_replica));
      !s.ok()) {
    return Fail(s);
  }
  std::printf(absl::GetFlag(FLAGS_abort) ? "move of %s aborted: this replica serves it\n"
                                         : "%s moved: this replica's copy is deleted\n",
              args[0]);
  return 0;
}

}  // namespace decision::ctl
