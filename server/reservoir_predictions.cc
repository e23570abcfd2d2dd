#include "server/reservoir_predictions.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace decision::server {

int64_t ReservoirPredictions::BytesOf(const Entry& e) {
  return static_cast<int64_t>(e.stamps.capacity() * sizeof(uint64_t) +
                              e.predictions->capacity() * sizeof(double));
}

absl::StatusOr<ReservoirPredictions::Shared> ReservoirPredictions::Predict(
    int expert, const std::shared_ptr<const Expert>& model, absl::Span<const double> contexts,
    absl::Span<const uint64_t> stamps, absl::Span<const std::vector<int32_t>> eligible) {
  const size_t rows = stamps.size();
  const size_t k = static_cast<size_t>(model->num_arms());
  const size_t d = static_cast<size_t>(model->num_features());
  if (contexts.size() != rows * d) {
    return absl::InvalidArgumentError(absl::StrCat(contexts.size(), " context values for ", rows,
                                                   " rows of ", d, " features"));
  }
  if (!eligible.empty() && eligible.size() != rows) {
    return absl::InvalidArgumentError(
        absl::StrCat(eligible.size(), " eligible-arm sets for ", rows, " rows"));
  }
  // The eligible arms of the rows predicted (every row, or the changed ones).
  std::vector<absl::Span<const int32_t>> row_eligible;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(expert);
  if (it != entries_.end() && it->second.model != model) {
    bytes_ -= BytesOf(it->second);
    entries_.erase(it);
    it = entries_.end();
  }
  if (it == entries_.end()) {
    auto fresh = std::make_shared<std::vector<double>>(rows * k);
    rows_predicted_ += static_cast<int64_t>(rows);
    if (rows > 0) {
      row_eligible.assign(eligible.begin(), eligible.end());
      DECISION_RETURN_IF_ERROR(
          model->PredictBatchEligible(contexts, rows, row_eligible, absl::MakeSpan(*fresh)));
    }
    Entry entry{model, std::vector<uint64_t>(stamps.begin(), stamps.end()), fresh};
    if (bytes_ + BytesOf(entry) <= budget_bytes_) {
      bytes_ += BytesOf(entry);
      entries_.emplace(expert, std::move(entry));
    }
    return Shared(std::move(fresh));
  }
  Entry& entry = it->second;
  bytes_ -= BytesOf(entry);
  const size_t before = entry.stamps.size();
  std::vector<size_t> changed;
  std::vector<double> changed_contexts;
  for (size_t i = 0; i < rows; ++i) {
    if (i < before && entry.stamps[i] == stamps[i]) continue;
    changed.push_back(i);
    changed_contexts.insert(changed_contexts.end(), contexts.begin() + i * d,
                            contexts.begin() + (i + 1) * d);
    if (!eligible.empty()) row_eligible.push_back(eligible[i]);
  }
  rows_predicted_ += static_cast<int64_t>(changed.size());
  rows_reused_ += static_cast<int64_t>(rows - changed.size());
  if (!changed.empty() || entry.predictions->size() != rows * k) {
    std::vector<double> fresh(changed.size() * k);
    if (!changed.empty()) {
      if (absl::Status s = model->PredictBatchEligible(changed_contexts, changed.size(),
                                                       row_eligible, absl::MakeSpan(fresh));
          !s.ok()) {
        entries_.erase(it);
        return s;
      }
    }
    // A result handed out earlier is never written: copy on write.
    if (entry.predictions.use_count() > 1) {
      entry.predictions = std::make_shared<std::vector<double>>(*entry.predictions);
    }
    entry.stamps.resize(rows, 0);  // 0 is never a stamp: new rows count as changed
    entry.predictions->resize(rows * k);
    for (size_t c = 0; c < changed.size(); ++c) {
      std::copy(fresh.begin() + c * k, fresh.begin() + (c + 1) * k,
                entry.predictions->begin() + changed[c] * k);
      entry.stamps[changed[c]] = stamps[changed[c]];
    }
  }
  Shared out = entry.predictions;
  if (bytes_ + BytesOf(entry) <= budget_bytes_) {
    bytes_ += BytesOf(entry);
  } else {
    entries_.erase(it);  // grew past the budget (the reservoir filled up)
  }
  return out;
}

bool ReservoirPredictions::WouldKeep(int expert, size_t rows, size_t k) const {
  const int64_t need = static_cast<int64_t>(rows * (sizeof(uint64_t) + k * sizeof(double)));
  absl::MutexLock lock(&mu_);
  int64_t others = bytes_;
  const auto it = entries_.find(expert);
  if (it != entries_.end()) others -= BytesOf(it->second);  // replaced (another model) or resized
  return others + need <= budget_bytes_;
}

void ReservoirPredictions::Drop(int expert) {
  absl::MutexLock lock(&mu_);
  const auto it = entries_.find(expert);
  if (it == entries_.end()) return;
  bytes_ -= BytesOf(it->second);
  entries_.erase(it);
}

int64_t ReservoirPredictions::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

int64_t ReservoirPredictions::rows_predicted() const {
  absl::MutexLock lock(&mu_);
  return rows_predicted_;
}

int64_t ReservoirPredictions::rows_reused() const {
  absl::MutexLock lock(&mu_);
  return rows_reused_;
}

}  // namespace decision::server
