// Labelled classification data sets turned into bandit problems (VW's --cbify protocol):
// reveal the features, let the policy choose an arm in 0..K-1, pay 1 if it equals the label.
// Reads the CSV files of bench/data (header; numeric features first; last column `label`)
// and the fixed row orders in bench/data/orders (one 0-based row index per line).
#ifndef DECISION_BENCH_DATASET_H_
#define DECISION_BENCH_DATASET_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace decision::bench {

struct Dataset {
  int num_features = 0;
  int num_classes = 0;  // K = max label + 1
  std::vector<double> features;  // rows x num_features, row-major
  std::vector<int> labels;
  size_t size() const { return labels.size(); }
  absl::Span<const double> row(size_t i) const {
    return absl::MakeConstSpan(features).subspan(i * num_features, num_features);
  }
};

// Returns NOT_FOUND if the file cannot be opened, INVALID_ARGUMENT (with the line number)
// for a malformed line, a non-numeric value or a negative label.
absl::StatusOr<Dataset> LoadCsv(const std::string& path);

// Reads a permutation of [0, rows). INVALID_ARGUMENT if it is not one.
absl::StatusOr<std::vector<int>> LoadOrder(const std::string& path, size_t rows);

}  // namespace decision::bench

#endif  // DECISION_BENCH_DATASET_H_
