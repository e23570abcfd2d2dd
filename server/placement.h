// Which replica owns which problem, as the proxy routes (deploy/haproxy): the placement map
// file the proxy reads, one line per placed problem:
//   PROBLEM_ID REPLICA_ID
// blank lines and '#' comments ignored (HAProxy's map-file format; REPLICA_ID is the
// proxy's backend name for the replica, and decisiond's --replica_id). A problem not in
// the map goes where the proxy's consistent hash puts it; a replica cannot know where that
// is, so it serves what it holds.
//
// A replica given the map refuses every call for a problem the map places elsewhere
// (FAILED_PRECONDITION naming the owner), CreateProblem included: a misrouted call never
// creates or serves a copy of another replica's problem. The file is re-read on SIGHUP
// (a bad file keeps the map in force).
//
// Thread safety: every method may be called concurrently; Reload swaps the map whole.
#ifndef DECISION_SERVER_PLACEMENT_H_
#define DECISION_SERVER_PLACEMENT_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace decision::server {

// The metadata key that names a call's problem (the client library sets it); what the
// proxy routes on.
inline constexpr absl::string_view kProblemMetadata = "x-decision-problem";

// The map's text parsed: problem -> replica. INVALID_ARGUMENT naming the line for a line
// without exactly two fields, an id longer than 64 bytes, or a problem placed twice.
absl::StatusOr<absl::flat_hash_map<std::string, std::string>> ParsePlacementMap(
    absl::string_view text);

// The FAILED_PRECONDITION of an EndMove with to_replica `replica` for a problem that is not
// a copy left behind for it, saying `why`.
absl::Status NotLeftBehind(absl::string_view problem_id, absl::string_view replica,
                           absl::string_view why);
// That refusal where this replica has no placement map.
absl::Status NoPlacementMap(absl::string_view problem_id, absl::string_view replica);

class Placement {
 public:
  // `replica_id` is this replica's name in the map. With an empty `path` the map is empty
  // (every problem is served here). Errors: the file's (unreadable, INVALID_ARGUMENT).
  static absl::StatusOr<std::unique_ptr<Placement>> Open(std::string replica_id,
                                                         std::string path);

  // OK if this replica may serve `problem_id`; FAILED_PRECONDITION naming the owner if the
  // map places it on another replica.
  absl::Status Check(absl::string_view problem_id) const;
  // OK if the map places `problem_id` on `replica`, another replica than this one, and this
  // one did not claim it: what makes a copy held here one left behind by a move (EndMove
  // with to_replica replaces it with a stub naming `replica`). FAILED_PRECONDITION saying
  // why not otherwise, without a map too.
  absl::Status PlacedOn(absl::string_view problem_id, absl::string_view replica) const;
  // This replica committed the import of `problem_id` (DecisionService.ImportProblem): it
  // serves it whatever the map says until it restarts, since the map a replica reads may
  // be switched later than the proxy's (a ConfigMap syncs within about a minute). By its
  // restart the map names it.
  void Claim(absl::string_view problem_id);
  // Re-reads the file; on error the map in force stays. Claims stay.
  absl::Status Reload();
  size_t size() const;
  const std::string& replica_id() const { return replica_id_; }

 private:
  Placement(std::string replica_id, std::string path)
      : replica_id_(std::move(replica_id)), path_(std::move(path)) {}

  const std::string replica_id_;
  const std::string path_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const absl::flat_hash_map<std::string, std::string>> map_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> claimed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace decision::server

#endif  // DECISION_SERVER_PLACEMENT_H_
