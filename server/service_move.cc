// DecisionService: moving a problem to another replica (docs/SCALING.md, "Moving a
// problem"; decisionctl move-problem drives the steps):
//   source  BeginMove      with catch_up: a snapshot, and the store notes every write to
//                          the problem from then on; it serves on
//   source  ExportProblem  the records at the snapshot, a page at a time
//   target  ImportProblem  the records under a new index, marked importing
//   source  BeginMove      fence: changes refused (UNAVAILABLE), calls in flight answered,
//                          everything answered written, learned and checkpointed
//   source  ExportProblem  with changes: the keys written since the snapshot (their values
//                          now, or deletions); without catch_up, the whole problem here
//   target  ImportProblem  those; then commit: the restart code loads the records, and the
//                          target serves the problem
//           (the placement map switches to the target: deploy/haproxy/place.sh)
//   source  EndMove        a durable stub naming the new owner replaces the records, or,
//                          on abort, the fence is lifted and the source serves again
// The generator's state travels with the records, so the target draws what the source
// would have drawn: after a move, the same requests get the same decisions.
#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/decision_service.h"
#include "server/validation.h"
#include "storage/format.h"

namespace decision::server {
namespace {

// The longest a fence waits for the calls in flight to be answered.
constexpr absl::Duration kFenceTimeout = absl::Seconds(30);
// An export page's keys and values, by default and at most (a larger record comes in
// parts): the most leaves room for the entries' framing under the default 4 MiB
// --max_message_bytes of the target.
constexpr int64_t kDefaultExportPageBytes = int64_t{1} << 20;
constexpr int64_t kMaxExportPageBytes = int64_t{3} << 20;
// The largest record an import puts together from parts (it holds the parts in memory).
constexpr int64_t kMaxImportRecordBytes = int64_t{256} << 20;

absl::Status IncompletePart(const ImportPart& part, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      why, " before the record of family ", part.family, " and key '",
      absl::CHexEscape(part.key), "' is whole (", part.value.size(), " of its ", part.size,
      " bytes came): a record's parts come in order, one after the other"));
}

// Adds entries[i], a part of a record (ProblemEntry.value_size), to `part`: the first
// starts it, each next one continues it where the last ended.
absl::Status AddImportPart(int i, const v1::ProblemEntry& e,
                           std::optional<ImportPart>* part) {
  const std::string what = absl::StrCat("entries[", i, "] (a part: value_offset ",
                                        e.value_offset(), ", value_size ", e.value_size(), ")");
  if (e.deleted() || e.range()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a deletion has no value to part"));
  }
  if (e.value_size() > kMaxImportRecordBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": a record of ", e.value_size(), " bytes is larger than the ",
        kMaxImportRecordBytes, " an import puts together"));
  }
  if (e.value_offset() < 0 || e.value().empty() ||
      e.value_offset() + static_cast<int64_t>(e.value().size()) > e.value_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": its ", e.value().size(), " bytes must be non-empty and within the value"));
  }
  if (e.value_offset() == 0) {
    if (part->has_value()) return IncompletePart(**part, what + " starts another record");
    *part = ImportPart{e.family(), e.key(), e.value(), e.value_size()};
    return absl::OkStatus();
  }
  if (!part->has_value() || (*part)->family != e.family() || (*part)->key != e.key() ||
      (*part)->size != e.value_size() ||
      static_cast<int64_t>((*part)->value.size()) != e.value_offset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": it does not continue a record of that family, key and size where its last "
        "part ended (parts come in order, the first at value_offset 0)"));
  }
  (*part)->value.append(e.value());
  return absl::OkStatus();
}

}  // namespace

absl::Status DecisionService::FenceForMove(Problem* p, absl::Status why) {
  DECISION_RETURN_IF_ERROR(p->Fence(std::move(why), kFenceTimeout));
  // A round that took the problem before the fence finishes with it first; later rounds
  // skip it (Problem::fenced).
  absl::MutexLock writes(&maintenance_mu_);
  absl::MutexLock pool(&pool_mu_);
  return absl::OkStatus();
}

absl::Status DecisionService::BeginMove(const v1::BeginMoveRequest& request,
                                        v1::BeginMoveResponse* response) {
  DECISION_RETURN_IF_ERROR(ValidateReplicaId(request.to_replica(), "to_replica"));
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("moves"));
  bool watched = false;  // the copy began at a snapshot: this call fences it
  {
    absl::MutexLock lock(&mu_);
    if (auto it = moving_.find(p->id()); it != moving_.end()) {
      if (request.catch_up() || it->second.fenced || it->second.fencing ||
          it->second.ending || !it->second.watched || it->second.to != request.to_replica()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "problem ", p->id(), " is already moving to replica ", it->second.to,
            " (EndMove with abort ends that move)"));
      }
      watched = true;
      it->second.fencing = true;
    } else {
      moving_[p->id()] = {request.to_replica(), false, request.catch_up(),
                          /*fencing=*/!request.catch_up()};
    }
  }
  if (request.catch_up()) {
    // The copy begins at a snapshot, and the store notes what is written from now on.
    if (absl::Status s = store_->WatchProblem(p->index()); !s.ok()) {
      absl::MutexLock lock(&mu_);
      moving_.erase(p->id());
      return s;
    }
    response->set_samples(p->Summary().samples());
    return absl::OkStatus();
  }
  absl::Status s = FenceForMove(p, absl::UnavailableError(absl::StrCat(
                                        "problem ", p->id(), " is moving to replica ",
                                        request.to_replica(), "; retry shortly")));
  // As Shutdown: every decision answered and every reward acknowledged is written, learned
  // and in the checkpoint, so that the records are the whole problem.
  if (s.ok()) s = p->FlushDecisions();
  if (s.ok()) s = p->FlushDecisions();
  if (s.ok()) s = p->WaitLearned();
  if (s.ok()) s = p->WriteLogChunks();
  if (s.ok()) s = p->Checkpoint();
  if (!s.ok()) {
    // The whole move ends: the mover starts it again.
    if (p->fenced()) p->Unfence();
    if (watched) store_->UnwatchProblem(p->index());
    absl::MutexLock lock(&mu_);
    moving_.erase(p->id());
    return s;
  }
  {
    absl::MutexLock lock(&mu_);
    // Still there: EndMove refuses a move that is being fenced.
    Moving& moving = moving_.at(p->id());
    moving.fencing = false;
    moving.fenced = true;
  }
  response->set_generator_state(p->GeneratorState());
  response->set_samples(p->Summary().samples());
  *response->mutable_estimates() = p->GetEstimates();
  return absl::OkStatus();
}

absl::Status DecisionService::ExportProblem(const v1::ExportProblemRequest& request,
                                            v1::ExportProblemResponse* response) {
  DECISION_ASSIGN_OR_RETURN(Problem * p, Find(request.problem_id()));
  Moving moving;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = moving_.find(p->id());
    if (it == moving_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "problem ", p->id(), " is not moving: call BeginMove first (its records change "
          "while it serves)"));
    }
    moving = it->second;
  }
  if (request.changes() && !(moving.watched && moving.fenced)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "problem ", p->id(), " has no changes to export: they are those since a catch_up "
        "BeginMove, once a second BeginMove fenced it"));
  }
  if (request.max_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_bytes is ", request.max_bytes(), "; it must be >= 0 (0: 1 MiB)"));
  }
  const int64_t max_bytes = request.max_bytes() == 0
                                ? kDefaultExportPageBytes
                                : std::min(request.max_bytes(), kMaxExportPageBytes);
  storage::Store::ExportCursor cursor;
  cursor.family = request.cursor().family();
  cursor.started = request.cursor().started();
  cursor.after = request.cursor().after();
  cursor.offset = request.cursor().offset();
  if (cursor.family < 0 || cursor.family >= storage::kProblemFamilies) {
    return absl::InvalidArgumentError(absl::StrCat("cursor.family is ", cursor.family,
                                                   "; it must be in [0, ",
                                                   storage::kProblemFamilies, ")"));
  }
  if (cursor.offset < 0 || (cursor.offset > 0 && !cursor.started)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cursor.offset is ", cursor.offset, "; it must be >= 0, and 0 unless started (it "
        "is where the record at cursor.after continues)"));
  }
  const auto add = [response](const storage::Store::ProblemEntry& e) {
    v1::ProblemEntry* out = response->add_entries();
    out->set_family(e.family);
    out->set_key(e.key);
    out->set_value(e.value);
    out->set_deleted(e.op == storage::Store::ProblemEntry::kDelete);
    if (e.op == storage::Store::ProblemEntry::kDeleteRange) {
      out->set_range(true);
      out->set_range_end(e.range_end);
    }
    out->set_value_offset(e.value_offset);
    out->set_value_size(e.value_size);
  };
  absl::StatusOr<bool> more =
      request.changes()
          ? store_->ExportProblemChanges(p->index(), &cursor, max_bytes, add)
          : store_->ExportProblemPage(p->index(), &cursor, max_bytes, add,
                                      /*at_snapshot=*/moving.watched);
  if (!more.ok()) return more.status();
  response->mutable_next()->set_family(std::min(cursor.family, storage::kProblemFamilies - 1));
  response->mutable_next()->set_started(cursor.started);
  response->mutable_next()->set_after(cursor.after);
  response->mutable_next()->set_offset(cursor.offset);
  response->set_done(!*more);
  return absl::OkStatus();
}

absl::Status DecisionService::ImportProblem(const v1::ImportProblemRequest& request,
                                            v1::ImportProblemResponse* response) {
  const std::string& id = request.problem_id();
  DECISION_RETURN_IF_ERROR(ValidateProblemId(id));
  std::mt19937_64 generator;
  if (request.commit()) {
    DECISION_ASSIGN_OR_RETURN(generator,
                              Problem::ParseGeneratorState(request.generator_state()));
  }
  DECISION_RETURN_IF_ERROR(CheckStoreWritable("imports"));
  // Imports and creations one at a time: the id is checked and the index taken together.
  absl::MutexLock create(&create_mu_);
  Import import;
  std::optional<uint32_t> discarded;  // an unfinished earlier import of the problem
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("the service is shutting down");
    if (problems_.contains(id) || failed_problems_.contains(id)) {
      return absl::AlreadyExistsError(
          absl::StrCat("this replica has problem ", id, " already: it cannot import it"));
    }
    auto it = imports_.find(id);
    if (request.first()) {
      if (it != imports_.end()) {
        discarded = it->second.index;
        imports_.erase(it);
      }
      if (const size_t n = problems_.size() + failed_problems_.size() + imports_.size();
          static_cast<int64_t>(n) >= options_.max_problems) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "this server has ", n, " problems, the most --max_problems (",
            options_.max_problems, ") allows"));
      }
      import.index = next_index_++;
    } else if (it == imports_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no import of problem ", id, " is in progress on this replica: its first page "
          "sets first"));
    } else {
      import = std::move(it->second);  // imports run one at a time (create_mu_)
    }
  }
  // The import's state is written back (or dropped) below, on every path.
  absl::Status s = absl::OkStatus();
  if (discarded.has_value()) s = store_->DeleteProblem(*discarded);
  if (s.ok() && request.first()) {
    // Marked importing: a restart before the commit deletes it.
    storage::v1::ProblemRecord marker;
    marker.set_problem_id(id);
    marker.set_importing(true);
    s = store_->PutProblem(import.index, marker);
  }
  std::vector<storage::Store::ProblemEntry> entries;
  for (int i = 0; s.ok() && i < request.entries_size(); ++i) {
    const v1::ProblemEntry& e = request.entries(i);
    import.bytes += static_cast<int64_t>(e.key().size() + e.value().size());
    std::string value;
    if (e.value_offset() != 0 || e.value_size() != 0) {
      s = AddImportPart(i, e, &import.part);
      if (!s.ok() || import.part->value.size() < static_cast<size_t>(import.part->size)) {
        continue;  // the record is not whole yet
      }
      value = std::move(import.part->value);
      import.part.reset();
    } else if (import.part.has_value()) {
      s = IncompletePart(*import.part, absl::StrCat("entries[", i, "] is another record"));
      break;
    } else {
      value = e.value();
    }
    ++import.entries;  // a record in parts counts once
    if (e.family() == 0 && !e.deleted() && !e.range()) {
      storage::v1::ProblemRecord record;
      if (!e.key().empty() || !record.ParseFromString(value) || record.problem_id() != id) {
        s = absl::InvalidArgumentError(absl::StrCat(
            "entries[", i, "]: not the problem record of ", id, " (an empty key and a "
            "ProblemRecord naming it)"));
        break;
      }
      import.record = std::move(record);
      continue;
    }
    storage::Store::ProblemEntry entry;
    entry.family = e.family();
    entry.key = e.key();
    entry.value = std::move(value);
    if (e.range()) {
      entry.op = storage::Store::ProblemEntry::kDeleteRange;
      entry.range_end = e.range_end();
    } else if (e.deleted()) {
      entry.op = storage::Store::ProblemEntry::kDelete;
    }
    entries.push_back(std::move(entry));
  }
  if (s.ok() && !entries.empty()) s = store_->ImportProblemEntries(import.index, entries);
  if (s.ok() && request.commit() && import.part.has_value()) {
    s = IncompletePart(*import.part, "the import commits");
  }
  if (s.ok() && !request.commit()) {
    response->set_entries(import.entries);
    response->set_bytes(import.bytes);
    absl::MutexLock lock(&mu_);
    imports_[id] = std::move(import);
    return absl::OkStatus();
  }
  if (s.ok() && !import.record.has_value()) {
    s = absl::InvalidArgumentError(absl::StrCat(
        "the import of problem ", id, " has no problem record (family 0) to commit"));
  }
  std::optional<uint32_t> stub;  // of the problem when it moved away from here before
  {
    absl::MutexLock lock(&mu_);
    if (auto it = moved_away_.find(id); it != moved_away_.end()) stub = it->second.index;
  }
  std::unique_ptr<Problem> loaded;
  if (s.ok()) {
    storage::v1::ProblemRecord& record = *import.record;
    record.clear_importing();
    record.clear_moved_to();
    // The old stub goes once the problem loads (a restart that finds both serves the
    // problem: DecisionService::Find looks at the served problems first).
    s = store_->PutProblem(import.index, record);
    if (s.ok()) {
      absl::StatusOr<std::unique_ptr<Problem>> p = Problem::Load(import.index, record,
                                                                 ProblemEnv());
      if (p.ok()) {
        loaded = *std::move(p);
      } else {
        s = absl::Status(p.status().code(),
                         absl::StrCat("the imported records of problem ", id,
                                      " do not load: ", p.status().message()));
      }
    }
  }
  if (!s.ok()) {
    // Nothing of the import is kept: the mover starts it again, or aborts the move.
    {
      absl::MutexLock lock(&mu_);
      imports_.erase(id);
    }
    if (absl::Status d = store_->DeleteProblem(import.index); !d.ok()) {
      std::fprintf(stderr, "decisiond: import of %s: its records stay until a restart: %s\n",
                   id.c_str(), d.ToString().c_str());
    }
    return s;
  }
  if (stub.has_value()) {
    if (absl::Status d = store_->DeleteProblem(*stub); !d.ok()) {
      std::fprintf(stderr, "decisiond: import of %s: the stub it replaces stays: %s\n",
                   id.c_str(), d.ToString().c_str());
    }
  }
  loaded->SetGenerator(generator);
  response->set_entries(import.entries);
  response->set_bytes(import.bytes);
  *response->mutable_problem() = loaded->Summary();
  *response->mutable_estimates() = loaded->GetEstimates();
  absl::MutexLock lock(&mu_);
  imports_.erase(id);
  moved_away_.erase(id);
  problems_[id] = std::move(loaded);
  return absl::OkStatus();
}

absl::Status DecisionService::EndMove(const v1::EndMoveRequest& request,
                                      v1::EndMoveResponse* response,
                                      const absl::Status& placed_on_target) {
  DECISION_RETURN_IF_ERROR(ValidateProblemId(request.problem_id()));
  Problem* p = nullptr;
  std::string to;
  bool watched = false, forced = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = moving_.find(request.problem_id());
    if (it == moving_.end()) {
      if (auto moved = moved_away_.find(request.problem_id()); moved != moved_away_.end()) {
        if (request.abort()) return MovedError(request.problem_id(), moved->second.to);
        return absl::OkStatus();  // a retry of an EndMove that succeeded
      }
      if (request.abort() || request.to_replica().empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "problem ", request.problem_id(), " is not moving from this replica (BeginMove); "
            "a copy left behind by a restart is ended with to_replica"));
      }
      // A copy left behind: this replica restarted after the switch and before EndMove.
      // It is fenced here and now, then replaced with the stub like any other.
      DECISION_RETURN_IF_ERROR(ValidateReplicaId(request.to_replica(), "to_replica"));
      auto live = problems_.find(request.problem_id());
      if (live == problems_.end()) {
        return absl::NotFoundError(
            absl::StrCat("problem '", request.problem_id(), "' does not exist"));
      }
      // Only the map tells a copy left behind from the live problem it would delete.
      DECISION_RETURN_IF_ERROR(placed_on_target);
      p = live->second.get();
      to = request.to_replica();
      moving_[request.problem_id()] = {to, false, false, /*fencing=*/true, /*ending=*/true};
      forced = true;
    } else {
      if (it->second.fencing) {
        return absl::FailedPreconditionError(absl::StrCat(
            "problem ", request.problem_id(), " is being fenced by a BeginMove: end its "
            "move once that returns"));
      }
      if (it->second.ending) {
        // Two at once (a mover's retry after its deadline, an operator's end-move) would
        // both delete it, or one abort what the other gives away.
        return absl::FailedPreconditionError(absl::StrCat(
            "problem ", request.problem_id(), " is being ended by another EndMove: call "
            "again once that returns (a finished move then answers OK)"));
      }
      if (!request.abort() && !it->second.fenced) {
        return absl::FailedPreconditionError(absl::StrCat(
            "problem ", request.problem_id(), " is not fenced: its move ends after the "
            "second BeginMove (the one without catch_up)"));
      }
      it->second.ending = true;
      to = it->second.to;
      watched = it->second.watched;
      p = problems_.at(request.problem_id()).get();
    }
  }
  // From here this call alone ends the move: on an error it stays as it was, for a retry.
  const auto failed = [&](absl::Status s) {
    absl::MutexLock lock(&mu_);
    if (auto it = moving_.find(request.problem_id()); it != moving_.end()) {
      it->second.ending = false;
    }
    return s;
  };
  if (forced) {
    absl::Status s = FenceForMove(
        p, absl::UnavailableError(absl::StrCat("problem ", p->id(), " moved to replica ", to)));
    absl::MutexLock lock(&mu_);
    if (!s.ok()) {
      moving_.erase(request.problem_id());
      return s;
    }
    Moving& moving = moving_[request.problem_id()];
    moving.fencing = false;
    moving.fenced = true;  // a retry after an error below finishes it
  }
  if (request.abort()) {
    if (watched) store_->UnwatchProblem(p->index());
    p->Unfence();
    p->MarkPoolWork();
    absl::MutexLock lock(&mu_);
    moving_.erase(request.problem_id());
    return absl::OkStatus();
  }
  if (absl::Status s = CheckStoreWritable("moves"); !s.ok()) return failed(s);
  if (watched) store_->UnwatchProblem(p->index());
  storage::v1::ProblemRecord stub = p->record();
  stub.set_moved_to(to);
  if (absl::Status s = store_->DeleteProblem(p->index(), &stub); !s.ok()) return failed(s);
  absl::MutexLock lock(&mu_);
  auto it = problems_.find(request.problem_id());
  moved_out_.push_back(std::move(it->second));
  problems_.erase(it);
  moving_.erase(request.problem_id());
  moved_away_[request.problem_id()] = {to, p->index()};
  // Its new owner exports it now. Nothing touches these series any more: every call that
  // could is refused by the fence, which stays, and the background rounds skip it.
  metrics_->RemoveProblem(request.problem_id());
  return absl::OkStatus();
}

void DecisionService::BeginMove(const v1::BeginMoveRequest& request,
                                v1::BeginMoveResponse* response, Done done) {
  OffReactor([this, &request, response] { return BeginMove(request, response); },
             std::move(done));
}

void DecisionService::ExportProblem(const v1::ExportProblemRequest& request,
                                    v1::ExportProblemResponse* response, Done done) {
  OffReactor([this, &request, response] { return ExportProblem(request, response); },
             std::move(done));
}

void DecisionService::ImportProblem(const v1::ImportProblemRequest& request,
                                    v1::ImportProblemResponse* response, Done done) {
  OffReactor([this, &request, response] { return ImportProblem(request, response); },
             std::move(done));
}

void DecisionService::EndMove(const v1::EndMoveRequest& request, v1::EndMoveResponse* response,
                              absl::Status placed_on_target, Done done) {
  OffReactor(
      [this, &request, response, placed = std::move(placed_on_target)] {
        return EndMove(request, response, placed);
      },
      std::move(done));
}

}  // namespace decision::server
