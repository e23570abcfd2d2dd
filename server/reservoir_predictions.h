// Every expert's predictions on the divergence reservoir, kept from one divergence
// computation to the next.
//
// A refresh needs each expert's R x K distributions on the reservoir's R contexts, and the
// divergences of a new expert need them for every expert again. Between two refreshes at
// t1 < t2 the reservoir rewrites about R ln(t2 / t1) of its rows (5-10% at the default batch
// schedule), so predicting all R rows for every expert at every boundary repeats ~95% of the
// work. Here each expert's predictions are kept with the reservoir stamps of the rows they
// were made on (ContextReservoir::stamps): a call predicts only the rows whose stamp changed.
// A row's prediction does not depend on which other rows are predicted with it, so the
// result is the same as predicting all R rows (tests/reservoir_predictions_test.cc).
//
// Memory is bounded: an expert is kept only while the total stays within the budget given
// at construction; the others are predicted in full at every call, as without the cache
// (WouldKeep tells them apart beforehand).
//
// Thread safety: thread-safe. A call holds the cache's lock while its model predicts, so
// calls are serialised (they come from the maintenance work of one problem).
#ifndef DECISION_SERVER_RESERVOIR_PREDICTIONS_H_
#define DECISION_SERVER_RESERVOIR_PREDICTIONS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/expert.h"

namespace decision::server {

class ReservoirPredictions {
 public:
  explicit ReservoirPredictions(int64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  using Shared = std::shared_ptr<const std::vector<double>>;

  // `model`'s predictions (rows x K, row-major) on `contexts` (rows x num_features,
  // row-major), where rows = stamps.size() and row i carries stamps[i]. Rows whose stamp is
  // the one they had at the last call for the same `expert` and the same model object come
  // from the cache; the others are predicted in one PredictBatch, restricted to their
  // eligible arms (`eligible`: empty, or one entry per row, empty for every arm; a row's
  // stamp covers its eligible arms, written with it). The result is shared with
  // the cache, not copied, and never changes: a later call that changes rows while a result
  // is still held writes a copy. Returns the model's error (the expert's entry is dropped
  // then) or INVALID_ARGUMENT for sizes that do not match.
  absl::StatusOr<Shared> Predict(int expert, const std::shared_ptr<const Expert>& model,
                                 absl::Span<const double> contexts,
                                 absl::Span<const uint64_t> stamps,
                                 absl::Span<const std::vector<int32_t>> eligible = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whether Predict(expert, ...) on `rows` rows of `k` arms would keep its result within
  // the budget (a resized entry's spare capacity aside): a caller that holds what Predict
  // returns for several experts at once asks first, and predicts the others in pieces.
  bool WouldKeep(int expert, size_t rows, size_t k) const ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets expert `expert`'s predictions (and its model: the entry holds it).
  void Drop(int expert) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Rows predicted and rows served from the cache, since construction.
  int64_t rows_predicted() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t rows_reused() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::shared_ptr<const Expert> model;  // the object the predictions were made by
    std::vector<uint64_t> stamps;
    std::shared_ptr<std::vector<double>> predictions;  // never null
  };
  static int64_t BytesOf(const Entry& e);

  const int64_t budget_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rows_predicted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rows_reused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace decision::server

#endif  // DECISION_SERVER_RESERVOIR_PREDICTIONS_H_
