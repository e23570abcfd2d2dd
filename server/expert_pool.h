// The experts of one problem: for each, its stored record (model, state), the loaded model,
// its metrics and, while it is backfilled, the propensities gathered so far. Plain state
// like PendingTable: no lock (Problem guards it), no I/O.
//
// Expert states (storage::v1::ExpertState) and their transitions:
//   registered -> BACKFILLING -> ACTIVE (backfill complete: D-UCB estimates and selects it)
//   BACKFILLING or ACTIVE -> RETIRED (RetireExpert, or auto-training's RetireDominated)
//   any -> FAILED (quarantined), two ways:
//     - its model fails on a context (an error, or a probability outside (0, 1]) in a
//       Choose, a join, a backfill or a divergence refresh. The FAILED record (the stored
//       state plus `failure`) is written by the next maintenance round, and a restart keeps
//       it quarantined without loading the model;
//     - at a restart, its stored model no longer loads (in memory only: the stored state is
//       kept, so a restart that can load the model again restores it).
//   A FAILED expert is never selected. Its model is a uniform stand-in, so the joins and
//   the backfill go on: the samples joined after the failure carry 1/K in its column, and
//   the experts registered after it get estimated. Its divergences stay frozen at their
//   last values, which weigh the samples it chose while healthy. The estimates of the
//   other experts depend only on their own columns, the chooser's logged propensity and
//   those divergences: they are exact, as if the failed expert had stopped being selected.
//   WART: if a model that failed to load at a restart loads again later, its probabilities
//   over the stretch of the log it was down for stay 1/K.
// A retired expert that was still backfilling finishes its backfill, so that it is
// estimated like every other, but is never selected. An expert retired once estimated is
// frozen: its estimate at retirement is stored with its record and reported from then on,
// and the joins score it with the uniform stand-in (free), since no other expert's estimate
// reads its column (only their own and the chooser's logged propensity). The estimator
// frees its row and fixes its divergence pairs (Estimator::Retire); its model is still
// scored on the reservoir for the pairs of experts registered later, until no kept sample
// is one it chose: then its model is unloaded (Problem::UnloadQuietExperts, record
// unloaded_at_sample), since no later expert's window holds one of its samples. Ids are
// dense: expert k is the k-th registered. D-UCB estimates experts [0, n) once they finish
// backfilling, in id order.
#ifndef DECISION_SERVER_EXPERT_POOL_H_
#define DECISION_SERVER_EXPERT_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/estimator.h"
#include "core/expert.h"
#include "decision/v1/decision.pb.h"
#include "server/metrics.h"
#include "storage/records.pb.h"

namespace decision::server {

struct ExpertSlot {
  // Its stored record, without the model's payload (storage::DropModelPayload): the loaded
  // `model` is what scores, and the payload stays in the store, written once at
  // registration (Store::PutExpert). A tree model's bytes are about 100 bytes a node, six
  // times its compiled form (core/xgboost_forest.h).
  storage::v1::ExpertRecord record;
  std::shared_ptr<const Expert> model;
  Metrics::ExpertMetrics metrics;
  // While not yet estimated: its propensities of samples [0, backfilled) are stored as its
  // backfill chunks, and those of samples learned since registration, [backfill_total,
  // ...), are in `tail` (memory: 8 bytes per sample learned while it backfills).
  int64_t backfilled = 0;
  std::vector<double> tail;
  // Its estimator rows (Estimator::NewExpertRows), fed each backfilled chunk as it is
  // scored, so that completing the backfill need not read the samples again. Null after a
  // restart in the middle of a backfill: the completion then reads them from the store.
  // Touched by the backfill (one thread) only.
  std::unique_ptr<ExpertRows> rows;
  // False while its record is being written at registration: nothing but the joins (its
  // tail) touches it yet, and it is dropped if the write fails. Only the last slot can be.
  bool durable = true;
  // Non-empty: the expert FAILED (why). `model` is then the uniform stand-in, and it is
  // never selectable.
  std::string failure;
  // A runtime quarantine whose FAILED record is not written yet (Problem::PersistFailures).
  bool failure_unwritten = false;
  // Choose calls that selected it and have not yet put their decision in the pending table
  // (or given up): with the pending table's count (PendingTable::ChosenBy), what says
  // whether a sample it chose may still come.
  int selections_in_flight = 0;
  // Whether a sample it chose may be stored: false from its registration in this process
  // until one is written; at a restart, whether D-UCB's counts hold a sample it chose
  // (Recovery::Finish).
  bool may_have_chosen = true;
  // Frozen, with no selection in flight and no decision pending: every sample it chose is
  // below this sequence (-1: not yet seen so).
  int64_t quiet_below = -1;
};

class ExpertPool {
 public:
  int size() const { return static_cast<int>(slots_.size()); }
  ExpertSlot& at(int id) { return slots_[id]; }
  const ExpertSlot& at(int id) const { return slots_[id]; }
  void Add(ExpertSlot slot) { slots_.push_back(std::move(slot)); }
  // REQUIRES: the last slot is not durable (its registration failed).
  void DropLast() { slots_.pop_back(); }
  // Experts whose records are written: a prefix of the ids.
  int durable_size() const {
    return !slots_.empty() && !slots_.back().durable ? size() - 1 : size();
  }

  // The models of experts [0, n), shared: they may be evaluated without the owner's lock.
  std::vector<std::shared_ptr<const Expert>> Models(int n) const;
  std::vector<std::shared_ptr<const Expert>> Models() const { return Models(size()); }
  // The models the joins score with: Models(), except that an expert retired with its
  // estimate kept (Frozen) gets `stand_in`: nothing reads its column any more.
  std::vector<std::shared_ptr<const Expert>> JoinModels(
      const std::shared_ptr<const Expert>& stand_in) const;
  // Whether expert `id` is retired with its estimate kept at retirement (record
  // retired_mean/retired_width): that estimate is reported, not the live one.
  bool Frozen(int id) const {
    return slots_[id].record.status() == storage::v1::EXPERT_STATE_RETIRED &&
           slots_[id].record.has_retired_mean();
  }
  // Whether expert `id`'s model is unloaded (frozen, and no kept sample is one it chose):
  // `model` is the uniform stand-in.
  bool Unloaded(int id) const { return slots_[id].record.has_unloaded_at_sample(); }

  // The record of expert `id` retired, to be written. NOT_FOUND for an unknown id.
  // `selectable` is the number of experts D-UCB may select now: retiring the last one of an
  // ACTIVE expert is FAILED_PRECONDITION. An expert already retired returns its record
  // unchanged.
  absl::StatusOr<storage::v1::ExpertRecord> RetiredRecord(const std::string& problem_id, int id,
                                                          int selectable) const;

  // Whether expert `id` counts against the problem's scoring budget (scoring_cost.h): it is
  // scored by its own model at every join, being ACTIVE or BACKFILLING and not FAILED
  // (a FAILED expert is scored by the uniform stand-in). RETIRED experts do not count: they
  // are to be scored by the stand-in too.
  bool CountsAgainstBudget(int id) const;
  // Microseconds of CPU per join to score the experts that count: the sum of their
  // records' score_cost_us.
  double ScoringCostUs() const;

  // Its status as the API reports it: FAILED, SHADOW (an ACTIVE expert in shadow mode),
  // or its stored state.
  v1::ExpertStatus WireStatus(int id) const;
  // The wire form of expert `id`; `estimated` says whether D-UCB estimates it already.
  v1::Expert ToWire(const std::string& problem_id, int id, bool estimated) const;

 private:
  std::vector<ExpertSlot> slots_;
};

}  // namespace decision::server

#endif  // DECISION_SERVER_EXPERT_POOL_H_
