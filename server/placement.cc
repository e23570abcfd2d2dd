#include "server/placement.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace decision::server {

absl::StatusOr<absl::flat_hash_map<std::string, std::string>> ParsePlacementMap(
    absl::string_view text) {
  absl::flat_hash_map<std::string, std::string> map;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement map line ", number, ": ", fields.size(),
          " fields; expected \"PROBLEM_ID REPLICA_ID\""));
    }
    if (fields[0].size() > 64 || fields[1].size() > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement map line ", number, ": an id longer than 64 bytes"));
    }
    if (!map.emplace(fields[0], fields[1]).second) {
      return absl::InvalidArgumentError(absl::StrCat("placement map line ", number,
                                                     ": problem ", fields[0],
                                                     " is placed twice"));
    }
  }
  return map;
}

absl::StatusOr<std::unique_ptr<Placement>> Placement::Open(std::string replica_id,
                                                           std::string path) {
  std::unique_ptr<Placement> p(new Placement(std::move(replica_id), std::move(path)));
  {
    absl::MutexLock lock(&p->mu_);
    p->map_ = std::make_shared<const absl::flat_hash_map<std::string, std::string>>();
  }
  if (!p->path_.empty()) {
    if (absl::Status s = p->Reload(); !s.ok()) return s;
  }
  return p;
}

absl::Status Placement::Reload() {
  if (path_.empty()) return absl::OkStatus();
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read the placement map ", path_));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<absl::flat_hash_map<std::string, std::string>> parsed =
      ParsePlacementMap(text.str());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", parsed.status().message()));
  }
  auto map = std::make_shared<const absl::flat_hash_map<std::string, std::string>>(
      *std::move(parsed));
  absl::MutexLock lock(&mu_);
  map_ = std::move(map);
  return absl::OkStatus();
}

void Placement::Claim(absl::string_view problem_id) {
  absl::MutexLock lock(&mu_);
  claimed_.insert(std::string(problem_id));
}

absl::Status NotLeftBehind(absl::string_view problem_id, absl::string_view replica,
                           absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat(
      "problem ", problem_id, " is not a copy left behind for replica ", replica, ": ", why,
      "; nothing was changed (a copy left behind is one this replica's placement map "
      "places on the replica it moved to)"));
}

absl::Status NoPlacementMap(absl::string_view problem_id, absl::string_view replica) {
  return NotLeftBehind(problem_id, replica, "this replica has no placement map (--placement_map)");
}

absl::Status Placement::PlacedOn(absl::string_view problem_id,
                                 absl::string_view replica) const {
  const auto refused = [&](absl::string_view why) {
    return NotLeftBehind(problem_id, replica, why);
  };
  if (path_.empty()) return NoPlacementMap(problem_id, replica);
  if (replica == replica_id_) return refused("that is this replica");
  std::shared_ptr<const absl::flat_hash_map<std::string, std::string>> map;
  {
    absl::MutexLock lock(&mu_);
    if (claimed_.contains(problem_id)) return refused("this replica imported it (a move)");
    map = map_;
  }
  const auto it = map->find(problem_id);
  if (it == map->end()) return refused("the placement map does not place it");
  if (it->second != replica) {
    return refused(absl::StrCat("the placement map places it on replica ", it->second));
  }
  return absl::OkStatus();
}

size_t Placement::size() const {
  absl::MutexLock lock(&mu_);
  return map_->size();
}

absl::Status Placement::Check(absl::string_view problem_id) const {
  if (path_.empty()) return absl::OkStatus();  // no map: every call, without the lock
  std::shared_ptr<const absl::flat_hash_map<std::string, std::string>> map;
  {
    absl::MutexLock lock(&mu_);
    map = map_;
  }
  const auto it = map->find(problem_id);
  if (it == map->end() || it->second == replica_id_) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    if (claimed_.contains(problem_id)) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "problem ", problem_id, " is placed on replica ", it->second, ", not on this one (",
      replica_id_, "): call it there, or through the proxy with the ", kProblemMetadata,
      " metadata set"));
}

}  // namespace decision::server
