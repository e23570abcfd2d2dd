// Who may call what: per-role bearer tokens read from a tokens file that holds only their
// SHA-256 hashes. The gRPC layer (grpc_service.cc) asks Authorize before every call; the
// health service is not ours and stays open for probes.
//
// Roles, and what each RPC needs (kMethodRoles in grpc_service.cc):
//   decide   Choose, ChooseSlate, ChooseBatch, Activate, Reward
//   observe  GetProblem, ListProblems, ListExperts, GetEstimates, GetTrainingJob
//   export   ExportLog, Explain (they carry the contexts seen)
//   admin    CreateProblem, RegisterExpert, RetireExpert, Promote, Demote, EvaluateModel,
//            SetRetention, DeleteEvents, TrainExperts, ListAuditLog, and a move's
//            BeginMove, ExportProblem, ImportProblem, EndMove
// A token has any set of roles; `admin` does not imply the others.
//
// The tokens file: one token per line, blank lines and '#' comments ignored:
//   NAME ROLES sha256:HEX [problems=P1,P2,...] [expires=RFC3339]
// e.g.
//   ad-server  decide          sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8 problems=home,search
//   grafana    observe         sha256:...
//   ops        admin,observe   sha256:... expires=2027-06-30T00:00:00Z
// NAME is what the audit log records: [A-Za-z0-9._-], at most 64 bytes, unique. HEX is the
// lower-case SHA-256 of the token (`decisionctl hash-token` prints it). Without problems=
// the token covers every problem. The token itself is never stored, printed or logged.
//
// Errors a call can get: UNAUTHENTICATED for a missing, unknown or expired token;
// PERMISSION_DENIED for a known token without the role or outside its problems.
//
// Thread safety: every method may be called concurrently; Reload swaps the table whole.
#ifndef DECISION_SERVER_AUTH_H_
#define DECISION_SERVER_AUTH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace decision::server {

enum class Role { kDecide = 0, kObserve = 1, kExport = 2, kAdmin = 3 };
const char* RoleName(Role role);

// The lower-case hex SHA-256 of `data`.
std::string Sha256Hex(absl::string_view data);

// What a call was granted: the token's name ("anonymous" in open mode) and the problems it
// covers (empty: all).
struct Grant {
  std::string name;
  std::vector<std::string> problems;
  bool Covers(absl::string_view problem_id) const;
};

struct TokenEntry {
  std::string name;
  unsigned roles = 0;  // bit (1 << Role)
  std::vector<std::string> problems;
  absl::Time expires = absl::InfiniteFuture();
};

// The parsed tokens file, keyed by the token's hash. INVALID_ARGUMENT names the line.
absl::StatusOr<absl::flat_hash_map<std::string, TokenEntry>> ParseTokens(absl::string_view text);

class Authorizer {
 public:
  // `tokens_path` empty: open mode, every call is granted as "anonymous" (development on
  // loopback; decisiond refuses it on other addresses unless told otherwise). Otherwise the
  // file is read now: an unreadable or malformed file is INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Open(const std::string& tokens_path);

  bool open() const { return path_.empty(); }
  // Re-reads the tokens file. On error the current table stays in force.
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);
  // Tokens in force (0 in open mode).
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

  // `authorization` is the call's "authorization" metadata value, or nullptr if it has
  // none; it must be "Bearer TOKEN". `problem_id` is the call's problem ("" for calls
  // without one, such as ListProblems: filter their answer with Grant::Covers).
  absl::StatusOr<Grant> Authorize(const std::string* authorization, Role role,
                                  absl::string_view problem_id, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Table = absl::flat_hash_map<std::string, TokenEntry>;
  explicit Authorizer(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Table> table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace decision::server

#endif  // DECISION_SERVER_AUTH_H_
