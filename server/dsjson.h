// Vowpal Wabbit's Decision Service JSON (DSJSON), the log format of VW's decision-service
// tools and of Azure Personalizer, for one logged sample: ExportLog with
// format = EXPORT_FORMAT_DSJSON. The mapping (README, "Standard log export"):
//
//   _label_cost         -reward (VW minimises a cost; the default reward when none came)
//   _label_probability  the propensity the arm was drawn with
//   _label_Action       arm + 1 (VW's actions are 1-based)
//   _labelIndex         arm (the 0-based action index)
//   a                   the actions that could be played, 1-based: the chosen one first, then
//                       the other eligible arms ascending (every arm without eligibility)
//   p                   the chooser's probability of each action in `a`
//   c                   the context: {"x": {"x0": f0, "x1": f1, ...}} (namespace x)
//   EventId, Timestamp  the event id; the decision's time, ISO 8601 UTC
//   _decision           this service's fields, which VW ignores: sequence, expert_id,
//                       eligible_arms (0-based, absent without eligibility),
//                       default_reward, joined_at_ms, redacted
//
// `a` and `p` list every eligible arm when the chooser's distribution is known (re-scored by
// the server from the chooser's model); otherwise only the chosen arm and its propensity.
// Numbers are written with 17 significant digits: they read back bit for bit.
#ifndef DECISION_SERVER_DSJSON_H_
#define DECISION_SERVER_DSJSON_H_

#include <string>

#include "absl/types/span.h"
#include "decision/v1/decision.pb.h"

namespace decision::server {

// One DSJSON line (no newline) for `sample`. `distribution` is the chooser's distribution
// over every arm for the sample's context under its eligible arms, or empty when unknown.
std::string ToDsjson(const v1::LoggedSample& sample, absl::Span<const double> distribution);

// `s` as a JSON string literal, quotes included (control characters as \u00XX).
std::string JsonQuote(const std::string& s);

}  // namespace decision::server

#endif  // DECISION_SERVER_DSJSON_H_
