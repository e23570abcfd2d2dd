// decisionctl's parts: decisionctl.cc parses the command line and runs one subcommand per
// function; the longer subcommands have files of their own (decisionctl_replay.cc,
// decisionctl_move.cc), which share these helpers with it. Internal to the CLI: the client
// library is client/decision_client.h.
#ifndef DECISION_CLIENT_DECISIONCTL_H_
#define DECISION_CLIENT_DECISIONCTL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/decision_client.h"

namespace decision::ctl {

// Prints the error and returns the exit code of a failed call (1).
int Fail(const absl::Status& s);
// Prints what is wrong with the command line and returns its exit code (2).
int Usage(const std::string& message);
absl::StatusOr<std::string> ReadFile(const std::string& path);
// The numbers of a line, separated by commas, spaces or tabs.
absl::StatusOr<std::vector<double>> ParseNumbers(absl::string_view text);

// replay PROBLEM (decisionctl_replay.cc).
int Replay(client::DecisionClient& c, const std::vector<char*>& args);
// move-problem PROBLEM and end-move PROBLEM (decisionctl_move.cc).
int MoveProblem(client::DecisionClient& source, const client::ClientOptions& options,
                const std::vector<char*>& args);
int EndMove(client::DecisionClient& c, const std::vector<char*>& args);

}  // namespace decision::ctl

#endif  // DECISION_CLIENT_DECISIONCTL_H_
