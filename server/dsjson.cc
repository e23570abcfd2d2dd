#include "server/dsjson.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace decision::server {
namespace {

// 17 significant digits: the double reads back exactly. JSON has no NaN or infinity, and
// the log holds none (validated at the join).
std::string Number(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.17g", v);
  return buffer;
}

}  // namespace

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          out += escaped;
        } else {
          out += c;  // UTF-8 bytes pass through (event ids are valid UTF-8)
        }
    }
  }
  out += "\"";
  return out;
}

std::string ToDsjson(const v1::LoggedSample& s, absl::Span<const double> distribution) {
  const int arm = s.arm();
  std::string out = absl::StrCat(
      "{\"_label_cost\":", Number(-s.reward()), ",\"_label_probability\":",
      Number(s.propensity()), ",\"_label_Action\":", arm + 1, ",\"_labelIndex\":", arm,
      ",\"EventId\":", JsonQuote(s.event_id()), ",\"Timestamp\":\"",
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(s.decided_at_ms()),
                       absl::UTCTimeZone()),
      "\",\"a\":[", arm + 1);
  std::string p = Number(s.propensity());
  if (!distribution.empty()) {
    // The other playable arms, ascending: the eligible ones, or every arm.
    const auto add = [&](int v) {
      if (v == arm) return;
      absl::StrAppend(&out, ",", v + 1);
      absl::StrAppend(&p, ",", Number(distribution[v]));
    };
    if (s.eligible_arms_size() > 0) {
      for (const int v : s.eligible_arms()) add(v);
    } else {
      for (int v = 0; v < static_cast<int>(distribution.size()); ++v) add(v);
    }
  }
  absl::StrAppend(&out, "],\"p\":[", p, "],\"c\":{");
  if (s.features_size() > 0) {
    out += "\"x\":{";
    for (int f = 0; f < s.features_size(); ++f) {
      absl::StrAppend(&out, f == 0 ? "" : ",", "\"x", f, "\":", Number(s.features(f)));
    }
    out += "}";
  }
  absl::StrAppend(&out, "},\"_decision\":{\"sequence\":", s.sequence(),
                  ",\"expert_id\":", s.expert_id());
  if (s.eligible_arms_size() > 0) {
    out += ",\"eligible_arms\":[";
    for (int i = 0; i < s.eligible_arms_size(); ++i) {
      absl::StrAppend(&out, i == 0 ? "" : ",", s.eligible_arms(i));
    }
    out += "]";
  }
  absl::StrAppend(&out, ",\"default_reward\":", s.default_reward() ? "true" : "false",
                  ",\"joined_at_ms\":", s.joined_at_ms());
  if (s.redacted()) out += ",\"redacted\":true";
  out += "}}";
  return out;
}

}  // namespace decision::server
